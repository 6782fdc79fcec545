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

// TestAppendReplay stresses an accept's in-place append against the
// refusals that read the same ring: the append writes the slots, meta
// and the releasing ctl while readers load them without the busy bit. Many
// goroutines decide a few keys with windows of microseconds (so entries
// expire and rings wrap), at limits whose rings are small (slot 0 in
// meta), narrow and grown, and with a window long enough for wide slots;
// every decision is replayed in At order through the reference model,
// which checks every field, Reset and RetryAfter included (read from the
// slots by refusals).
func TestAppendReplay(t *testing.T) {
	cases := []struct {
		limit   int
		window  time.Duration
		maxCost int
	}{
		{2, 40 * time.Microsecond, 1},
		{5, 60 * time.Microsecond, 2},
		{40, 300 * time.Microsecond, 3},
		{60, 48 * time.Hour, 3}, // wide slots: the window never ends in the run
	}
	perG := 2000
	if raceEnabled {
		perG = 400
	}
	for _, procs := range stressProcs {
		for _, c := range cases {
			t.Run(fmt.Sprintf("GOMAXPROCS=%d/L=%d/W=%v", procs, c.limit, c.window), func(t *testing.T) {
				defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(procs))
				appendReplay(t, engine.Policy{Limit: c.limit, Window: c.window}, c.maxCost, perG)
			})
		}
	}
}

// appendReplay runs appendReplayOnce with policy p and, on a machine too
// busy to fill its window (every decision allowed), again with a window
// ten times longer, up to four times; every run must replay exactly.
func appendReplay(t *testing.T, p engine.Policy, maxCost, perG int) {
	t.Helper()
	for range 4 {
		rep := appendReplayOnce(t, p, maxCost, perG)
		if rep.Allowed > 0 && rep.Refused > 0 {
			return
		}
		t.Logf("%+v: the run did not exercise both outcomes (%d allowed, %d refused); again with a longer window", p, rep.Allowed, rep.Refused)
		p.Window *= 10
	}
	t.Fatalf("%+v: no window exercised both outcomes", p)
}

// appendReplayOnce is one run of appendReplay: it fails the test on any
// replay mismatch and returns the replay's report.
func appendReplayOnce(t *testing.T, p engine.Policy, maxCost, perG int) reference.Report {
	t.Helper()
	const goroutines, keys = 16, 2
	lim, err := engine.New(p, engine.WithShards(1), engine.WithSweepInterval(0))
	if err != nil {
		t.Fatal(err)
	}
	recs := make([][]reference.Record, goroutines)
	var wg sync.WaitGroup
	for g := range goroutines {
		wg.Go(func() {
			r := rand.New(rand.NewPCG(uint64(g), 7))
			out := make([]reference.Record, 0, perG)
			for range perG {
				key := fmt.Sprint("key-", r.IntN(keys))
				n := 1 + r.IntN(maxCost)
				d, err := lim.AllowN(key, n)
				if err != nil {
					t.Errorf("AllowN: %v", err)
					return
				}
				out = append(out, record(key, n, d))
			}
			recs[g] = out
		})
	}
	wg.Wait()
	if err := lim.Close(); err != nil {
		t.Fatal(err)
	}
	var all []reference.Record
	for _, rs := range recs {
		all = append(all, rs...)
	}
	rep := reference.VerifyLog(p.Limit, int64(p.Window), all)
	if rep.Decisions != goroutines*perG {
		t.Fatalf("verified %d decisions, want %d", rep.Decisions, goroutines*perG)
	}
	if !rep.OK() {
		t.Fatalf("replay: %d mismatches, %d over-admissions, %d under-admissions; e.g.\n%v",
			rep.Mismatches, rep.OverAdmissions, rep.UnderAdmissions, rep.Examples)
	}
	return rep
}
