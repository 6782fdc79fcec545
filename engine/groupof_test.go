package engine_test

import (
	"context"
	"errors"
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

// A group over existing limiters shares their logs both ways.
func TestGroupOfSharesState(t *testing.T) {
	clk := engine.NewManualClock()
	perSecond, _ := engine.New(engine.Policy{Name: "per_second", Limit: 2, Window: time.Second}, engine.WithClock(clk))
	perHour, _ := engine.New(engine.Policy{Name: "per_hour", Limit: 3, Window: time.Hour}, engine.WithClock(clk))
	defer perSecond.Close()
	defer perHour.Close()
	g, err := engine.NewGroupOf(perSecond, perHour)
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	if d := perHour.Allow("u"); !d.Allowed || d.Remaining != 2 {
		t.Fatalf("limiter alone: %+v", d)
	}
	gd, _ := g.AllowN([]string{"u", "u"}, 1)
	if !gd.Allowed || gd.Limits[0].Remaining != 1 || gd.Limits[1].Remaining != 1 {
		t.Fatalf("group after one hourly request: %+v", gd)
	}
	if d := perSecond.Allow("u"); !d.Allowed || d.Remaining != 0 {
		t.Fatalf("the group's request is in the per-second log: %+v", d)
	}
	gd, _ = g.AllowN([]string{"u", "u"}, 1)
	if gd.Allowed || gd.Binding != 0 {
		t.Fatalf("per-second full: %+v", gd)
	}
	if d := perHour.Allow("u"); !d.Allowed || d.Remaining != 0 {
		t.Fatalf("the refused group request was not logged by the hourly limit: %+v", d)
	}
	if g.Policies()[1].Name != "per_hour" {
		t.Fatalf("policies %+v", g.Policies())
	}
}

func TestGroupOfBadInput(t *testing.T) {
	p := engine.Policy{Limit: 1, Window: time.Second}
	a, _ := engine.New(p)
	b, _ := engine.New(p)
	shared := engine.NewMonotonicClock()
	c, _ := engine.New(p, engine.WithClock(shared))
	d, _ := engine.New(p, engine.WithClock(shared))
	for _, l := range []*engine.Limiter{a, b, c, d} {
		defer l.Close()
	}
	for _, ls := range [][]*engine.Limiter{nil, {nil}, {c, nil}, {a, b}, {c, c}} {
		if _, err := engine.NewGroupOf(ls...); err == nil {
			t.Errorf("NewGroupOf(%d limiters) accepted", len(ls))
		} else if !errors.Is(err, engine.ErrInvalidOption) && !errors.Is(err, engine.ErrInvalidPolicy) {
			t.Errorf("NewGroupOf: %v", err)
		}
	}
	if _, err := engine.NewGroupOf(d, c); err != nil {
		t.Fatalf("one shared monotonic clock: %v", err)
	}
}

// Groups over the same limiters in opposite orders, and the limiters on
// their own, all at once, with sweeps in a tight loop: no deadlock, and
// every decision of every kind replays exactly through one reference per
// limiter.
func TestGroupOfOverlappingGroupsReplay(t *testing.T) {
	perG := 1500
	if raceEnabled {
		perG = 500
	}
	for _, procs := range stressProcs {
		t.Run(fmt.Sprintf("GOMAXPROCS=%d", procs), func(t *testing.T) {
			defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(procs))
			clk := engine.NewMonotonicClock()
			ps := []engine.Policy{
				{Name: "a", Limit: 2, Window: 20 * time.Microsecond},
				{Name: "b", Limit: 4, Window: 60 * time.Microsecond, Algorithm: engine.SlidingCounter},
				{Name: "c", Limit: 5, Window: 100 * time.Microsecond},
			}
			lims := make([]*engine.Limiter, len(ps))
			for i, p := range ps {
				l, err := engine.New(p, engine.WithClock(clk), engine.WithShards(1), engine.WithSweepInterval(0))
				if err != nil {
					t.Fatal(err)
				}
				lims[i] = l
			}
			// Group x is a, b, c; group y is c, b, a: opposite orders.
			x, err := engine.NewGroupOf(lims[0], lims[1], lims[2])
			if err != nil {
				t.Fatal(err)
			}
			y, err := engine.NewGroupOf(lims[2], lims[1], lims[0])
			if err != nil {
				t.Fatal(err)
			}
			yToGlobal := []int{2, 1, 0}
			stop := backendtest.Loop(func() {
				for _, l := range lims {
					l.Sweep()
				}
			})
			recs := make([][]reference.GroupRecord, 9)
			var wg sync.WaitGroup
			for w := range recs {
				wg.Add(1)
				go func() {
					defer wg.Done()
					r := rand.New(rand.NewPCG(uint64(w), uint64(procs)))
					dst := make([]engine.Decision, 4)
					for range perG {
						switch w % 3 {
						case 0, 1: // a request over some of x's or y's limiters
							g, toGlobal := x, []int{0, 1, 2}
							if w%3 == 1 {
								g, toGlobal = y, yToGlobal
							}
							refs := backendtest.RandomRefs(r, 3, stressKeys[:3])
							n := 1 + r.IntN(backendtest.MinLimit(g.Policies(), refs))
							gd, err := g.DecideGroup(context.Background(), dst, engine.GroupRequest{Refs: refs, N: n})
							if err != nil {
								t.Errorf("DecideGroup: %v", err)
								return
							}
							rec := backendtest.GroupRecord(refs, n, gd)
							for i := range rec.Policies {
								rec.Policies[i] = toGlobal[rec.Policies[i]]
							}
							recs[w] = append(recs[w], rec)
						case 2: // one limiter on its own
							i := r.IntN(3)
							key := stressKeys[r.IntN(3)]
							n := 1 + r.IntN(2)
							d, _ := lims[i].AllowN(key, n)
							recs[w] = append(recs[w], backendtest.SingleRecord(i, key, n, d))
						}
					}
				}()
			}
			wg.Wait()
			stop()
			for _, l := range lims {
				l.Close()
			}
			all := slices.Concat(recs...)
			backendtest.VerifyGroup(t, ps, all)
		})
	}
}

// Two groups over the same two limiters in opposite orders, deciding the
// same key: the write bits are taken in one global order (store ID, key),
// so this cannot deadlock. Taking them in each group's policy order does.
func TestGroupOfOppositeOrdersNoDeadlock(t *testing.T) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(8))
	clk := engine.NewMonotonicClock()
	p := engine.Policy{Limit: 1 << 20, Window: time.Hour}
	a, _ := engine.New(p, engine.WithClock(clk))
	c, _ := engine.New(p, engine.WithClock(clk))
	defer a.Close()
	defer c.Close()
	x, _ := engine.NewGroupOf(a, c)
	y, _ := engine.NewGroupOf(c, a)
	done := make(chan struct{})
	go func() {
		defer close(done)
		var wg sync.WaitGroup
		for w := range 8 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				g := x
				if w%2 == 1 {
					g = y
				}
				for range 20000 {
					if _, err := g.AllowN([]string{"k", "k"}, 1); err != nil {
						t.Error(err)
						return
					}
				}
			}()
		}
		wg.Wait()
	}()
	select {
	case <-done:
	case <-time.After(2 * time.Minute): // liveness, not speed: the work takes well under a second
		t.Fatal("deadlock: groups over the same limiters in opposite orders never finished")
	}
}
