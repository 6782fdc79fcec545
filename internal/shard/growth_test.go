package shard_test

import (
	"fmt"
	"math/rand/v2"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/slidegate/slidegate/internal/backendtest"
	"github.com/slidegate/slidegate/internal/reference"
	"github.com/slidegate/slidegate/internal/shard"
)

// growths decides requests of cost 1 for key at the instants at(0),
// at(1), … until the key holds want instants, and returns the ring's
// capacity after each growth.
func growths(t *testing.T, s *shard.Store, key string, want int, at func(i int) int64) []int {
	t.Helper()
	var caps []int
	last := 0
	for i := range want {
		var r shard.Result
		if err := s.Decide(key, 1, at(i), true, &r); err != nil {
			t.Fatal(err)
		}
		if !r.Allowed {
			t.Fatalf("request %d of %q refused", i+1, key)
		}
		if c := s.RingCap(key); c != last {
			caps = append(caps, c)
			last = c
		}
	}
	return caps
}

// A key whose requests come fast (its live entries span less than a
// quarter of the window) grows its ring four-fold, and to the limit once
// four-fold would reach half of it: each growth is an allocation on the
// decision path. A key as slow as its window allows doubles, as before.
func TestRingGrowthFollowsRate(t *testing.T) {
	const limit = 100
	window := int64(time.Minute)
	for _, key := range []string{"k123456", "client-000004211", "a-key-of-twenty-four-by"} {
		s := newStore(t, shard.Config{Limit: limit, Window: window})
		fast := growths(t, s, key, limit, func(i int) int64 { return int64(i) * int64(time.Millisecond) })
		if fast[len(fast)-1] != limit {
			t.Fatalf("%q: capacities %v, want the limit at the end", key, fast)
		}
		// Rings of fewer than three instants double; from then on each
		// growth quadruples or reaches the limit.
		if len(fast) > 5 {
			t.Errorf("%q: a fast key grew %d times to its limit (capacities %v), want at most 4 growths", key, len(fast)-1, fast)
		}
		for i := 1; i < len(fast)-1; i++ {
			if fast[i-1] >= 3 && fast[i] < 4*fast[i-1] {
				t.Errorf("%q: a fast key grew from %d to %d (capacities %v), want four-fold", key, fast[i-1], fast[i], fast)
			}
		}

		// Ten live entries spread over the window: every growth sees a
		// span of at least a quarter of it.
		slow := newStore(t, shard.Config{Limit: limit, Window: window})
		caps := growths(t, slow, key, 10, func(i int) int64 { return int64(i) * window / 10 })
		for i := 1; i < len(caps); i++ {
			if c := caps[i]; c > 2*caps[i-1]+2 {
				t.Errorf("%q: a slow key grew from %d to %d (capacities %v), want about double", key, caps[i-1], c, caps)
			}
		}
	}
}

// Rings growing four-fold, to the limit, or double, on windows of
// microseconds (so that a key's rate crosses a quarter of its window
// back and forth), while sweeps drop idle keys and goroutines on up to
// 32 procs decide a few keys of every kind (short, 9 to 16 bytes, longer,
// long keys' digests; hashed keys too). Every decision, replayed per key
// through the reference model, must match.
func TestFastGrowthStress(t *testing.T) {
	goroutines, perG, trials := 8, 4000, 3
	if raceEnabled {
		perG, trials = 2000, 2
	}
	if testing.Short() {
		trials = 1
	}
	for _, procs := range []int{2, 8, 32} {
		for _, hashed := range []bool{false, true} {
			t.Run(fmt.Sprintf("GOMAXPROCS=%d/hashed=%v", procs, hashed), func(t *testing.T) {
				defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(procs))
				r := rand.New(rand.NewPCG(uint64(procs), 41))
				for trial := range trials {
					limit := 16 + r.IntN(100)
					window := int64(100+r.IntN(1900)) * int64(time.Microsecond)
					growthStress(t, shard.Config{Limit: limit, Window: window, Shards: 2, HashedKeys: hashed}, goroutines, perG, uint64(trial))
				}
			})
		}
	}
}

// growthStress runs growthStressOnce until a run both allows and refuses
// (bothOutcomes).
func growthStress(t *testing.T, cfg shard.Config, goroutines, perG int, seed uint64) {
	t.Helper()
	bothOutcomes(t, cfg.Window, func(w int64) reference.Report {
		c := cfg
		c.Window = w
		return growthStressOnce(t, c, goroutines, perG, seed)
	})
}

func growthStressOnce(t *testing.T, cfg shard.Config, goroutines, perG int, seed uint64) reference.Report {
	t.Helper()
	s := newStore(t, cfg)
	epoch := time.Now()
	now := func() int64 { return int64(time.Since(epoch)) }
	stopSweeps := backendtest.Loop(func() { s.Sweep(now()) })
	keys := []string{"a", "k1234567", "client-000004211", "a-key-of-twenty-four-by", "long-" + strings.Repeat("x", shard.LongKeyBytes)}
	recs := make([][]reference.Record, goroutines)
	var wg sync.WaitGroup
	for g := range goroutines {
		wg.Go(func() {
			r := rand.New(rand.NewPCG(seed, uint64(g)))
			out := make([]reference.Record, 0, perG)
			for i := range perG {
				k := strings.Clone(keys[r.IntN(len(keys))])
				n := 1
				switch r.IntN(16) {
				case 0:
					n = cfg.Limit // refused unless the key's window is empty
				case 1, 2, 3:
					n = 1 + r.IntN(cfg.Limit/3)
				}
				if i%512 == 0 {
					// Now and then a pause, so that keys go idle, are
					// swept, and grow again from their first block.
					time.Sleep(time.Duration(cfg.Window))
				}
				var res shard.Result
				if err := s.Decide(k, n, now(), r.IntN(2) == 0, &res); err != nil {
					t.Error(err)
					return
				}
				out = append(out, logRecord(k, n, res))
			}
			recs[g] = out
		})
	}
	wg.Wait()
	stopSweeps()
	return verifyLog(t, cfg.Limit, cfg.Window, recs, goroutines*perG)
}
