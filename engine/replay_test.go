package engine_test

import (
	"fmt"
	"math/rand/v2"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/slidegate/slidegate/engine"
	"github.com/slidegate/slidegate/internal/reference"
)

// Parallel replay: many goroutines hammer few keys on the real monotonic
// clock; every decision's At is recorded, and replaying all of them in At
// order through the plain reference model must reproduce every field, with
// no window over the limit and no refusal that would have fitted.
func TestParallelReplay(t *testing.T) {
	for _, procs := range []int{1, 2, 8} {
		for _, costs := range []int{1, 3} {
			t.Run(fmt.Sprintf("GOMAXPROCS=%d/maxcost=%d", procs, costs), func(t *testing.T) {
				defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(procs))
				parallelReplay(t, engine.SlidingLog, costs)
			})
		}
	}
}

func parallelReplay(t *testing.T, alg engine.Algorithm, maxCost int) {
	// A short window, so that entries expire during the run and the
	// boundary is crossed many times. On a machine too busy to fill it
	// (every decision allowed), the run is repeated with a window ten
	// times longer; every run is replayed and must be exact.
	for _, w := range []time.Duration{200 * time.Microsecond, 2 * time.Millisecond, 20 * time.Millisecond, 200 * time.Millisecond} {
		rep := parallelReplayWindow(t, alg, maxCost, w)
		if rep.Allowed > 0 && rep.Refused > 0 {
			t.Logf("window %v: %d decisions: %d allowed, %d refused", w, rep.Decisions, rep.Allowed, rep.Refused)
			return
		}
		t.Logf("window %v: the run did not exercise both outcomes (%d allowed, %d refused); again with a longer window", w, rep.Allowed, rep.Refused)
	}
	t.Fatal("no window exercised both outcomes")
}

// parallelReplayWindow runs one parallel replay with window w and fails
// t on any decision the reference model does not reproduce.
func parallelReplayWindow(t *testing.T, alg engine.Algorithm, maxCost int, w time.Duration) reference.Report {
	const (
		goroutines = 16
		perG       = 3000
		keys       = 3
	)
	p := engine.Policy{Limit: 20, Window: w, Algorithm: alg}
	lim, err := engine.New(p, engine.WithShards(2), engine.WithSweepInterval(time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	recs := make([][]reference.Record, goroutines)
	var wg sync.WaitGroup
	for g := range goroutines {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := rand.New(rand.NewPCG(uint64(g), 99))
			out := make([]reference.Record, 0, perG)
			for range perG {
				key := fmt.Sprintf("key-%d", r.IntN(keys))
				n := 1 + r.IntN(maxCost)
				d, err := lim.AllowN(key, n)
				if err != nil {
					t.Errorf("AllowN: %v", err)
					return
				}
				out = append(out, record(key, n, d))
			}
			recs[g] = out
		}()
	}
	wg.Wait()
	if err := lim.Close(); err != nil {
		t.Fatal(err)
	}
	var all []reference.Record
	for _, rs := range recs {
		all = append(all, rs...)
	}
	var rep reference.Report
	if alg == engine.SlidingLog {
		rep = reference.VerifyLog(p.Limit, int64(p.Window), all)
	} else {
		rep = reference.VerifyCounter(p.Limit, int64(p.Window), all)
	}
	if rep.Decisions != goroutines*perG {
		t.Fatalf("window %v: verified %d decisions, want %d", w, rep.Decisions, goroutines*perG)
	}
	if !rep.OK() {
		t.Fatalf("window %v: replay: %d mismatches, %d over-admissions, %d under-admissions; e.g.\n%v",
			w, rep.Mismatches, rep.OverAdmissions, rep.UnderAdmissions, rep.Examples)
	}
	return rep
}

// Per goroutine, a key's At never decreases: each goroutine's own
// decisions on one key happen in order, so their instants must too.
func TestAtNondecreasingPerGoroutine(t *testing.T) {
	lim, err := engine.New(engine.Policy{Limit: 5, Window: time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer lim.Close()
	var wg sync.WaitGroup
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var last int64
			for i := range 5000 {
				d, _ := lim.AllowN("hot", 1+i%2)
				if d.At < last {
					t.Errorf("At went back from %d to %d", last, d.At)
					return
				}
				last = d.At
			}
		}()
	}
	wg.Wait()
}
