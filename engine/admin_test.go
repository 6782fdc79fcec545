package engine_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"runtime"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/slidegate/slidegate/engine"
	"github.com/slidegate/slidegate/internal/backendtest"
	"github.com/slidegate/slidegate/internal/reference"
)

func TestInspectAndResetKey(t *testing.T) {
	ctx := context.Background()
	for _, alg := range []engine.Algorithm{engine.SlidingLog, engine.SlidingCounter} {
		t.Run(alg.String(), func(t *testing.T) {
			clk := engine.NewManualClock()
			lim, err := engine.New(engine.Policy{Limit: 3, Window: 10 * time.Second, Algorithm: alg}, engine.WithClock(clk))
			if err != nil {
				t.Fatal(err)
			}
			defer lim.Close()
			if _, ok, _ := lim.InspectKey(ctx, "k"); ok {
				t.Fatal("a key that never asked has state")
			}
			clk.Set(time.Second)
			lim.AllowN("k", 2)
			clk.Set(4 * time.Second)
			st, ok, err := lim.InspectKey(ctx, "k")
			if err != nil || !ok {
				t.Fatalf("InspectKey: %v %v", ok, err)
			}
			d, _ := lim.AllowN("k", 1) // what a request sees, for comparison
			if st.Used != 2 || st.Remaining != 1 || st.At != int64(4*time.Second) || d.Remaining != 0 {
				t.Fatalf("state %+v; then a request: %+v", st, d)
			}
			if alg == engine.SlidingLog && (st.Oldest != 3*time.Second || st.Reset != 7*time.Second) {
				t.Fatalf("log state %+v, want oldest 3s ago, reset 7s", st)
			}
			// Inspecting changed nothing: the request above used the last slot.
			if d, _ := lim.AllowN("k", 1); d.Allowed {
				t.Fatalf("a fourth request was allowed: %+v", d)
			}
			if had, _ := lim.ResetKey(ctx, "k"); !had {
				t.Fatal("ResetKey found nothing")
			}
			if had, _ := lim.ResetKey(ctx, "k"); had {
				t.Fatal("ResetKey twice found state")
			}
			if _, ok, _ := lim.InspectKey(ctx, "k"); ok {
				t.Fatal("state after a reset")
			}
			if d, _ := lim.AllowN("k", 3); !d.Allowed || d.At < int64(4*time.Second) {
				t.Fatalf("after a reset: %+v, want the full limit at an instant no earlier than before", d)
			}
			if st := lim.Stats(); st.Keys != 1 {
				t.Fatalf("stats after reset and a request: %+v", st)
			}
		})
	}
}

// Inspections in a tight loop change no decision: every decision made
// meanwhile replays exactly through the reference.
func TestInspectStress(t *testing.T) {
	perG := 2000
	if raceEnabled {
		perG = 600
	}
	for _, procs := range stressProcs {
		t.Run(fmt.Sprintf("GOMAXPROCS=%d", procs), func(t *testing.T) {
			defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(procs))
			p := engine.Policy{Limit: 3, Window: 30 * time.Microsecond}
			lim, err := engine.New(p, engine.WithShards(1), engine.WithSweepInterval(0))
			if err != nil {
				t.Fatal(err)
			}
			stop := backendtest.Loop(func() {
				for _, k := range stressKeys {
					lim.InspectKey(context.Background(), k)
				}
				lim.Sweep()
			})
			recs := make([][]reference.Record, 8)
			var wg sync.WaitGroup
			for g := range recs {
				wg.Add(1)
				go func() {
					defer wg.Done()
					r := rand.New(rand.NewPCG(uint64(g), 3))
					for range perG {
						key := stressKeys[r.IntN(len(stressKeys))]
						n := 1 + r.IntN(p.Limit)
						d, _ := lim.AllowN(key, n)
						recs[g] = append(recs[g], record(key, n, d))
					}
				}()
			}
			wg.Wait()
			stop()
			lim.Close()
			all := slices.Concat(recs...)
			if rep := reference.VerifyLog(p.Limit, int64(p.Window), all); !rep.OK() {
				t.Fatalf("%d mismatches, %d over-admissions; e.g. %v", rep.Mismatches, rep.OverAdmissions, rep.Examples)
			}
		})
	}
}
