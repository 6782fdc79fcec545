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
	keys := []string{"a", "k1234567", "client-000004211", "a-key-of-twenty-four-by", "long-" + strings.Repeat("x", shard.LongKeyBytes)}
	return replayStress(t, cfg, goroutines, perG, seed, func(r *rand.Rand, i int) (string, int, int64, bool) {
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
		return keys[r.IntN(len(keys))], n, 0, r.IntN(2) == 0
	})
}

// replayStress has goroutines decide perG requests each on a store of
// cfg, while sweeps and restocks run in a tight loop, each request chosen by pick
// (the goroutine's i-th): its key (a fresh copy is decided), its cost,
// how far before the clock's reading its instant goes (0: the reading,
// taken just before the call) and whether the call may say monotonic. Every decision must replay through the reference,
// and Stats must count the instants the rings hold at the end.
func replayStress(t *testing.T, cfg shard.Config, goroutines, perG int, seed uint64, pick func(r *rand.Rand, i int) (string, int, int64, bool)) reference.Report {
	t.Helper()
	s := newStore(t, cfg)
	epoch := time.Now()
	now := func() int64 { return int64(time.Since(epoch)) }
	// The stock is remade in the same loop (stock.go): blocks taken
	// from a batch while the next one replaces it.
	stopSweeps := backendtest.Loop(func() {
		s.Sweep(now())
		s.Restock()
	})
	recs := make([][]reference.Record, goroutines)
	var wg sync.WaitGroup
	for g := range goroutines {
		wg.Go(func() {
			r := rand.New(rand.NewPCG(seed, uint64(g)))
			out := make([]reference.Record, 0, perG)
			for i := range perG {
				key, n, back, monotonic := pick(r, i)
				k := strings.Clone(key)
				var res shard.Result
				if err := s.Decide(k, n, max(now()-back, 0), monotonic, &res); err != nil {
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
	if st, held := s.Stats().StoredInstants, s.HeldInstants(); st != held {
		t.Errorf("%+v: Stats counts %d instants, the rings hold %d", cfg, st, held)
	}
	return verifyLog(t, cfg.Limit, cfg.Window, recs, goroutines*perG)
}

// wmKeys are keys of every first-block layout: up to 8 bytes (a 32-byte
// block), 9 to 16 (a 40-byte half of a pair), 17 to 24, and a long key
// (kept as a digest, a 24-byte block like a hashed key's).
var wmKeys = []string{"a", "k1234567", "client-0000042", "client-000004211", "a-key-of-twenty-four-by", "long-" + strings.Repeat("x", shard.LongKeyBytes)}

// A key's second request of cost 1 stores its instant in the watermark
// instead of growing the first block, and every reader and writer sees
// both entries: a decision, Peek, Stats, a refusal that raises the
// watermark, a group request, a reservation, Drop and a sweep.
func TestWatermarkEntry(t *testing.T) {
	const w = int64(time.Hour)
	for _, hashed := range []bool{false, true} {
		for _, key := range wmKeys {
			name := fmt.Sprintf("hashed=%v/%d bytes", hashed, len(key))
			s := newStore(t, shard.Config{Limit: 3, Window: w, Shards: 1, HashedKeys: hashed})
			var r shard.Result
			decide := func(n int, now int64, monotonic, want bool, wantAt int64) {
				t.Helper()
				if err := s.Decide(strings.Clone(key), n, now, monotonic, &r); err != nil || r.Allowed != want || r.At != wantAt {
					t.Fatalf("%s: Decide(%d, %d, %v) = %+v, %v; want allowed %v at %d\n%s", name, n, now, monotonic, r, err, want, wantAt, s.KeyStates())
				}
			}
			decide(1, 10, true, true, 10)
			c := s.RingCap(key)
			decide(1, 20, true, true, 20)
			if !s.WMHoldsEntry(key) || s.RingCap(key) != c {
				t.Fatalf("%s: second request: watermark holds an entry %v, ring %d (was %d); want the first block, its entry in wm", name, s.WMHoldsEntry(key), s.RingCap(key), c)
			}
			if r.Remaining != 1 || r.Reset != w-10 {
				t.Fatalf("%s: second request: %+v, want 1 remaining, reset %d", name, r, w-10)
			}
			if st := s.Stats(); st.StoredInstants != 2 || s.HeldInstants() != 2 {
				t.Fatalf("%s: %d instants in Stats, %d held; want 2", name, st.StoredInstants, s.HeldInstants())
			}
			var pr shard.Result
			if oldest, ok, err := s.Peek(key, 30, &pr); err != nil || !ok || oldest != 10 || pr.Remaining != 1 {
				t.Fatalf("%s: Peek: oldest %d, %v, %v, %+v; want oldest 10, 1 remaining", name, oldest, ok, err, pr)
			}
			// A refusal of cost 3 raises the watermark: the entry moves
			// into a grown block first, and both entries still count.
			decide(3, 40, true, false, 40)
			if s.WMHoldsEntry(key) || s.HeldInstants() != 2 {
				t.Fatalf("%s: after a refusal raised wm: holds an entry %v, %d instants held", name, s.WMHoldsEntry(key), s.HeldInstants())
			}
			if r.RetryAfter != w-(40-20) {
				t.Fatalf("%s: refusal of cost 3: %+v, want retry after %d (the entry at 20 expires)", name, r, w-20)
			}
			decide(1, 30, false, true, 40) // a caller's earlier instant goes at the watermark
			decide(1, 50, false, false, 50)
			// Fresh key: two entries, the second in wm, then a group
			// request and a reservation (neither takes hashed keys).
			if !hashed {
				key2 := "2" + key[1:] // the same length: the same first block

				for i := range 2 {
					if err := s.Decide(key2, 1, int64(100+i), true, &r); err != nil || !r.Allowed {
						t.Fatalf("%s: %+v, %v", name, r, err)
					}
				}
				if !s.WMHoldsEntry(key2) {
					t.Fatalf("%s: %q: second entry not in wm", name, key2)
				}
				other := newStore(t, shard.Config{Limit: 3, Window: w, Shards: 1})
				rs := make([]shard.Result, 2)
				ok, err := shard.DecideGroupCosts([]*shard.Store{s, other}, []string{key2, "x"}, []int{2, 1}, 150, true, rs)
				if err != nil || ok || rs[0].Allowed || rs[0].Remaining != 1 || rs[0].At != 150 {
					t.Fatalf("%s: group of cost 2 on a key holding 2 of 3: %v, %v, %+v; want refused, 1 remaining", name, ok, err, rs)
				}
				ok, err = shard.DecideGroupCosts([]*shard.Store{s, other}, []string{key2, "x"}, []int{1, 1}, 160, true, rs)
				if err != nil || !ok || rs[0].Remaining != 0 {
					t.Fatalf("%s: group of cost 1: %v, %v, %+v; want allowed, 0 remaining", name, ok, err, rs)
				}
				at, st, err := s.Reserve(key2, 1, 170, 1<<50, nil, &r)
				if err != nil || st != shard.Reserved || at != 100+w {
					t.Fatalf("%s: Reserve: %d, %v, %v; want reserved at %d (the first entry's expiry)", name, at, st, err, 100+w)
				}
				if st := s.Stats(); st.StoredInstants != s.HeldInstants() {
					t.Fatalf("%s: %d instants in Stats, %d held", name, st.StoredInstants, s.HeldInstants())
				}
			}
			// Drop a key whose wm holds an entry: the next one decides
			// no earlier than that entry.
			key3 := "3" + key[1:]
			for i := range 2 {
				s.Decide(key3, 1, int64(300+i), true, &r)
			}
			if !s.WMHoldsEntry(key3) {
				t.Fatalf("%s: %q: second entry not in wm", name, key3)
			}
			if ok, err := s.Drop(key3, 0); !ok || err != nil {
				t.Fatalf("%s: Drop: %v, %v", name, ok, err)
			}
			if err := s.Decide(key3, 1, 5, false, &r); err != nil || !r.Allowed || r.At != 301 {
				t.Fatalf("%s: after Drop: %+v, %v; want allowed at 301", name, r, err)
			}
			s.Decide(key3, 1, 5, false, &r)
			if !s.WMHoldsEntry(key3) {
				t.Fatalf("%s: %q: second entry not in wm", name, key3)
			}
			// A sweep once every entry expired drops every key.
			if want, n := s.Stats().Keys, s.Sweep(301+w+1+w); n != want || want < 2 {
				t.Fatalf("%s: swept %d keys of %d\n%s", name, n, want, s.KeyStates())
			}
			if st := s.Stats(); st.StoredInstants != 0 || st.Keys != 0 {
				t.Fatalf("%s: after the sweep: %+v", name, st)
			}
		}
	}
}

// TestWatermarkEntryStress: keys at their first, second and third
// entries, where the watermark holds the newest one, decided by many
// goroutines with refusals of cost > 1 and caller-given instants (which
// raise the watermark, so move the entry out of it) racing accepts that
// put an entry into it, and sweeps in a tight loop dropping keys so that
// they start again from their first block. Every decision replays
// exactly through the reference.
func TestWatermarkEntryStress(t *testing.T) {
	goroutines, perG := 12, 3000
	if raceEnabled {
		perG = 1000
	}
	for _, procs := range []int{2, 32} {
		for _, hashed := range []bool{false, true} {
			t.Run(fmt.Sprintf("GOMAXPROCS=%d/hashed=%v", procs, hashed), func(t *testing.T) {
				defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(procs))
				r := rand.New(rand.NewPCG(uint64(procs), 38))
				for trial := range 3 {
					cfg := shard.Config{Limit: 2 + r.IntN(4), Window: int64(1+r.IntN(30)) * int64(time.Microsecond), Shards: 2, HashedKeys: hashed}
					bothOutcomes(t, cfg.Window, func(w int64) reference.Report {
						c := cfg
						c.Window = w
						return replayStress(t, c, goroutines, perG, uint64(trial), wmEntryPick(c))
					})
				}
			})
		}
	}
}

// wmEntryPick chooses TestWatermarkEntryStress's requests: cost 1 at the
// clock's reading mostly, some of cost > 1 (refused on a busy key: they
// raise wm) and some at instants the caller gives, which raise it too and
// may lie behind it.
func wmEntryPick(cfg shard.Config) func(r *rand.Rand, i int) (string, int, int64, bool) {
	return func(r *rand.Rand, _ int) (string, int, int64, bool) {
		k, n, back, monotonic := wmKeys[r.IntN(len(wmKeys))], 1, int64(0), true
		switch r.IntN(8) {
		case 0:
			n = 2 + r.IntN(cfg.Limit-1)
		case 1:
			back = r.Int64N(cfg.Window)
			monotonic = false
		case 2:
			monotonic = false
		}
		return k, n, back, monotonic
	}
}
