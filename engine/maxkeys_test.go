package engine_test

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/slidegate/slidegate/engine"
	"github.com/slidegate/slidegate/internal/backendtest"
	"github.com/slidegate/slidegate/internal/reference"
)

// At the cap, a new key is refused and reported as an overflow; keys
// already tracked keep their exact limits; a swept key makes room.
func TestMaxKeysRefusesNewKeys(t *testing.T) {
	lim, err := engine.New(engine.Policy{Limit: 2, Window: 10}, engine.WithMaxKeys(2), engine.WithSweepInterval(0))
	if err != nil {
		t.Fatal(err)
	}
	defer lim.Close()
	at := func(key string, now int64) engine.Decision {
		t.Helper()
		d, err := lim.AllowNAt(key, 1, now)
		if err != nil {
			t.Fatal(err)
		}
		return d
	}
	if d := at("a", 0); !d.Allowed || d.Overflow {
		t.Fatalf("a: %+v", d)
	}
	if d := at("b", 1); !d.Allowed || d.Overflow {
		t.Fatalf("b: %+v", d)
	}
	d := at("c", 2) // the third key
	if d.Allowed || !d.Overflow || d.RetryAfter != 10 || d.Remaining != 0 {
		t.Fatalf("c at the cap: %+v, want a refused overflow with RetryAfter = W", d)
	}
	// Tracked keys are untouched and exact.
	if d := at("a", 3); !d.Allowed || d.Remaining != 0 || d.Overflow {
		t.Fatalf("a again: %+v", d)
	}
	if d := at("a", 4); d.Allowed || d.RetryAfter != 6 {
		t.Fatalf("a over its limit: %+v", d)
	}
	if st := lim.Stats(); st.Keys != 2 || st.Overflows != 1 {
		t.Fatalf("stats %+v, want 2 keys and 1 overflow", st)
	}
	// b's log is empty from 11 on, a's from 13: sweeping at 12 drops b.
	if n := lim.SweepAt(12); n != 1 {
		t.Fatalf("swept %d, want 1", n)
	}
	if d := at("c", 12); !d.Allowed || d.Overflow {
		t.Fatalf("c after a sweep made room: %+v", d)
	}
}

func TestMaxKeysAdmitsUntracked(t *testing.T) {
	lim, err := engine.New(engine.Policy{Limit: 3, Window: 10},
		engine.WithMaxKeys(1), engine.WithOverflow(engine.OverflowAllow), engine.WithSweepInterval(0))
	if err != nil {
		t.Fatal(err)
	}
	defer lim.Close()
	if d, _ := lim.AllowNAt("a", 1, 0); !d.Allowed || d.Overflow {
		t.Fatalf("a: %+v", d)
	}
	for i := range 5 { // untracked: never limited, never stored
		d, _ := lim.AllowNAt("b", 2, int64(i))
		if !d.Allowed || !d.Overflow || d.Remaining != 1 {
			t.Fatalf("b #%d: %+v, want an admitted overflow", i, d)
		}
	}
	if st := lim.Stats(); st.Keys != 1 || st.Overflows != 5 || st.StoredInstants != 1 {
		t.Fatalf("stats %+v", st)
	}
}

func TestMaxKeysOptions(t *testing.T) {
	for _, o := range []engine.Option{engine.WithMaxKeys(-1), engine.WithOverflow(engine.Overflow(7))} {
		if _, err := engine.New(engine.Policy{Limit: 1, Window: time.Second}, o); !errors.Is(err, engine.ErrInvalidOption) {
			t.Errorf("New with a bad option: %v, want ErrInvalidOption", err)
		}
	}
	for s, want := range map[string]engine.Overflow{"": engine.OverflowRefuse, "refuse": engine.OverflowRefuse, "Allow": engine.OverflowAllow} {
		if got, err := engine.ParseOverflow(s); err != nil || got != want {
			t.Errorf("ParseOverflow(%q) = %v, %v", s, got, err)
		}
	}
	if _, err := engine.ParseOverflow("drop"); !errors.Is(err, engine.ErrInvalidOption) {
		t.Errorf("ParseOverflow(drop): %v", err)
	}
}

// Stats is kept on the write path: it matches what the keys hold through
// creation, growth, expiry within a ring, and sweeps.
func TestStatsCountersFollowWrites(t *testing.T) {
	lim, err := engine.New(engine.Policy{Limit: 4, Window: 10}, engine.WithSweepInterval(0))
	if err != nil {
		t.Fatal(err)
	}
	defer lim.Close()
	want := reference.NewLog(4, 10)
	held := map[string][]int64{}
	r := rand.New(rand.NewPCG(1, 2))
	var now int64
	for i := range 5000 {
		now += int64(r.IntN(4))
		key := fmt.Sprint(r.IntN(50))
		n := 1 + r.IntN(2)
		d, _ := lim.AllowNAt(key, n, now)
		want.Decide(key, n, d.At)
		if d.Allowed {
			// The ring keeps what was live at this accept, plus n.
			q := held[key]
			for len(q) > 0 && q[0] <= d.At-10 {
				q = q[1:]
			}
			for range n {
				q = append(q, d.At)
			}
			held[key] = q
		}
		if i%500 == 0 {
			dropped := lim.SweepAt(now)
			for k, q := range held {
				if q[len(q)-1] <= now-10 {
					delete(held, k)
					dropped--
				}
			}
			if dropped != 0 {
				t.Fatalf("the sweep dropped %d keys more than the idle ones", dropped)
			}
		}
		var instants int64
		for _, q := range held {
			instants += int64(len(q))
		}
		if st := lim.Stats(); st.Keys != len(held) || st.StoredInstants != instants {
			t.Fatalf("step %d: stats %+v, want %d keys, %d instants", i, st, len(held), instants)
		}
	}
}

// Many goroutines create distinct keys against a small cap while sweeps
// run in a tight loop: the cap is never exceeded, and every decision that
// was not an overflow replays exactly through the reference.
func TestMaxKeysStress(t *testing.T) {
	const maxKeys = 16
	perG := 3000
	if raceEnabled {
		perG = 800
	}
	for _, procs := range stressProcs {
		for _, alg := range []engine.Algorithm{engine.SlidingLog, engine.SlidingCounter} {
			t.Run(fmt.Sprintf("GOMAXPROCS=%d/%v", procs, alg), func(t *testing.T) {
				defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(procs))
				p := engine.Policy{Limit: 3, Window: 20 * time.Microsecond, Algorithm: alg}
				lim, err := engine.New(p, engine.WithShards(4), engine.WithMaxKeys(maxKeys), engine.WithSweepInterval(0))
				if err != nil {
					t.Fatal(err)
				}
				var most atomic.Int64
				stop := backendtest.Loop(func() {
					lim.Sweep()
					if k := int64(lim.Stats().Keys); k > most.Load() {
						most.Store(k)
					}
				})
				recs := make([][]reference.Record, 12)
				var overflows atomic.Int64
				var wg sync.WaitGroup
				for g := range recs {
					wg.Add(1)
					go func() {
						defer wg.Done()
						r := rand.New(rand.NewPCG(uint64(g), uint64(procs)))
						for range perG {
							key := fmt.Sprint("k", r.IntN(64))
							n := 1 + r.IntN(p.Limit)
							d, err := lim.AllowN(key, n)
							if err != nil {
								t.Errorf("AllowN: %v", err)
								return
							}
							if d.Overflow {
								overflows.Add(1)
								continue
							}
							recs[g] = append(recs[g], record(key, n, d))
						}
					}()
				}
				wg.Wait()
				stop()
				lim.Close()
				if m := most.Load(); m > maxKeys {
					t.Fatalf("the limiter held %d keys, cap %d", m, maxKeys)
				}
				if overflows.Load() == 0 {
					t.Fatal("the run never reached the cap")
				}
				all := slices.Concat(recs...)
				var rep reference.Report
				if alg == engine.SlidingLog {
					rep = reference.VerifyLog(p.Limit, int64(p.Window), all)
				} else {
					rep = reference.VerifyCounter(p.Limit, int64(p.Window), all)
				}
				if !rep.OK() {
					t.Fatalf("%d mismatches, %d over-admissions, %d under-admissions; e.g.\n%v",
						rep.Mismatches, rep.OverAdmissions, rep.UnderAdmissions, rep.Examples)
				}
				if st := lim.Stats(); st.Overflows != overflows.Load() {
					t.Fatalf("Stats.Overflows %d, counted %d", st.Overflows, overflows.Load())
				}
			})
		}
	}
}
