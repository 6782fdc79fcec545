package engine_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/slidegate/slidegate/internal/leakcheck"

	"github.com/slidegate/slidegate/engine"
)

// TestGroupSetPolicyReserveStress: SetPolicy changes the limit and the
// window of two limiters in a tight loop while goroutines reserve, cancel,
// wait and allow through two groups over them (in both orders) on shared
// keys, and through each limiter alone, with sweeps running, windows of
// tens to hundreds of microseconds, at GOMAXPROCS 1, 4 and 32. Every slot
// admitted on a key of a limiter (a group's or a limiter's Allow accepted,
// a reservation not given back, a wait that returned nil) must have fitted
// one of the limiter's policies that may have applied to it, counting the
// slots decided before it, as in TestSetPolicyReserveStress. Once every
// slot has passed, a sweep leaves no key in either limiter.
func TestGroupSetPolicyReserveStress(t *testing.T) {
	defer leakcheck.VerifyNone(t, leakcheck.IgnoreCurrent())
	for _, procs := range []int{1, 4, 32} {
		t.Run(fmt.Sprint("GOMAXPROCS=", procs), func(t *testing.T) {
			defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(procs))
			groupSetPolicyReserveStress(t, uint64(procs))
		})
	}
}

// stressLimiter is one limiter of the group stress with its policy
// history: started is the newest policy whose SetPolicy has begun, done
// the newest whose SetPolicy has returned.
type stressLimiter struct {
	lim           *engine.Limiter
	hist          []reign
	set           int
	started, done atomic.Int32
}

func groupSetPolicyReserveStress(t *testing.T, seed uint64) {
	rng := rand.New(rand.NewPCG(seed, 11))
	limits := []int{1, 2, 3, 5}
	windows := []time.Duration{30 * time.Microsecond, 100 * time.Microsecond, 300 * time.Microsecond, 700 * time.Microsecond}
	clk := engine.NewMonotonicClock()
	ls := make([]*stressLimiter, 2)
	for i := range ls {
		hist := make([]reign, 1, 4096)
		hist[0] = reign{p: engine.Policy{Name: fmt.Sprint("p", i), Limit: 3 + i, Window: time.Duration(100*(i+1)) * time.Microsecond}, to: 1<<63 - 1}
		for len(hist) < cap(hist) {
			hist = append(hist, reign{p: engine.Policy{Name: fmt.Sprint("p", i), Limit: limits[rng.IntN(len(limits))], Window: windows[rng.IntN(len(windows))]}})
		}
		lim, err := engine.New(hist[0].p, engine.WithClock(clk), engine.WithShards(2), engine.WithSweepInterval(time.Millisecond))
		if err != nil {
			t.Fatal(err)
		}
		defer lim.Close()
		ls[i] = &stressLimiter{lim: lim, hist: hist}
	}
	// Two groups over the same limiters, in both orders: their keys' bits
	// are taken in one global order whatever the group's.
	g01, err := engine.NewGroupOf(ls[0].lim, ls[1].lim)
	if err != nil {
		t.Fatal(err)
	}
	g10, err := engine.NewGroupOf(ls[1].lim, ls[0].lim)
	if err != nil {
		t.Fatal(err)
	}

	stop := make(chan struct{})
	var bg sync.WaitGroup
	for _, l := range ls {
		bg.Add(2)
		go func() {
			defer bg.Done()
			for i := 1; i < len(l.hist); i++ {
				select {
				case <-stop:
					return
				default:
				}
				l.hist[i].from = l.lim.Now()
				l.started.Store(int32(i))
				if err := l.lim.SetPolicy(l.hist[i].p); err != nil {
					t.Errorf("SetPolicy(%+v): %v", l.hist[i].p, err)
					return
				}
				l.done.Store(int32(i))
				l.hist[i].to = 1<<63 - 1
				l.hist[i-1].to = l.lim.Now()
				l.set = i
				for range 2 {
					runtime.Gosched()
				}
			}
		}()
		go func() {
			defer bg.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				l.lim.Sweep()
				runtime.Gosched()
			}
		}()
	}

	const goroutines, keys = 12, 3
	perG := 300
	if raceEnabled {
		perG = 200
	}
	// slots[g][i]: the slots goroutine g admitted on limiter i.
	slots := make([][2][]slot, goroutines)
	var wg sync.WaitGroup
	for g := range goroutines {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var mine [2][]slot
			type held1 struct {
				r  *engine.Reservation
				is [2]int // in mine[0] and mine[1]
			}
			var held []held1
			for i := range perG {
				// Keys shared by the groups and the limiters alone: the
				// group's key of limiter j is k<(g+i+j)%keys>.
				var k [2]string
				for j := range k {
					k[j] = fmt.Sprint("k", (g+i+j)%keys)
				}
				n := 1 + (g+i)%2
				if i%4 == 0 {
					runtime.Gosched() // lets the policies change at GOMAXPROCS 1
				}
				var vlo [2]int32
				for j, l := range ls {
					vlo[j] = l.done.Load()
				}
				// add records a slot on both limiters; it returns where.
				add := func(at, made int64, lims [2]int, cancelled bool) [2]int {
					var where [2]int
					for j, l := range ls {
						mine[j] = append(mine[j], slot{key: k[j], n: n, at: at, made: made, limit: lims[j],
							vlo: vlo[j], vhi: l.started.Load(), cancelled: cancelled})
						where[j] = len(mine[j]) - 1
					}
					return where
				}
				grp, gk := g01, []string{k[0], k[1]}
				if (g+i)%3 == 0 {
					grp, gk = g10, []string{k[1], k[0]}
				}
				switch i % 6 {
				case 0, 1:
					r, err := grp.ReserveN(gk, n)
					if errors.Is(err, engine.ErrInvalidCost) || errors.Is(err, engine.ErrQueueFull) {
						continue // a limit was below n, or a queue long
					}
					if err != nil {
						t.Errorf("Group.ReserveN: %v", err)
						return
					}
					held = append(held, held1{r, add(r.At(), r.Made(), [2]int{}, false)})
					if i%6 == 1 && len(held) > 2 {
						// Cancel an older one, which later reservations of
						// the keys may follow.
						h := held[0]
						held = held[1:]
						if h.r.Cancel() {
							mine[0][h.is[0]].cancelled = true
							mine[1][h.is[1]].cancelled = true
						}
					}
				case 2:
					// A deadline (the slot must come before it), or a cancel
					// at a moment that knows nothing of the slot.
					d := time.Duration(i%4) * 100 * time.Microsecond
					ctx, cancel := context.WithTimeout(context.Background(), d)
					if i%10 >= 5 {
						ctx, cancel = context.WithCancel(context.Background())
						time.AfterFunc(d, cancel)
					}
					r, err := grp.WaitReserved(ctx, gk, n)
					cancel()
					switch {
					case err == nil:
						if now := clk.Now(); now < r.At() {
							t.Errorf("Group.WaitReserved returned at %d, before its slot at %d", now, r.At())
						}
						add(r.At(), r.Made(), [2]int{}, false)
					case r != nil && (errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled)):
						add(r.At(), r.Made(), [2]int{}, true) // given back while it slept
					case errors.Is(err, context.DeadlineExceeded), errors.Is(err, context.Canceled), errors.Is(err, engine.ErrInvalidCost), errors.Is(err, engine.ErrQueueFull):
					default:
						t.Errorf("Group.WaitReserved: %v", err)
						return
					}
				case 3:
					gd, err := grp.AllowN(gk, n)
					if errors.Is(err, engine.ErrInvalidCost) {
						continue
					}
					if err != nil {
						t.Errorf("Group.AllowN: %v", err)
						return
					}
					if gd.Allowed {
						var lims [2]int
						at := gd.Limits[0].At
						for j := range lims {
							// gd.Limits is in the group's policy order.
							lims[j] = gd.Limits[j].Limit
							if at != gd.Limits[j].At {
								t.Errorf("Group.AllowN: limits decided at %d and %d", at, gd.Limits[j].At)
							}
						}
						if grp == g10 {
							lims[0], lims[1] = lims[1], lims[0]
						}
						add(at, at, lims, false)
					}
				default:
					// One limiter alone, on a key a group uses.
					j := (g + i) % 2
					l := ls[j]
					if i%6 == 4 {
						d, err := l.lim.AllowN(k[j], n)
						if errors.Is(err, engine.ErrInvalidCost) {
							continue
						}
						if err != nil {
							t.Errorf("AllowN: %v", err)
							return
						}
						if d.Allowed {
							mine[j] = append(mine[j], slot{key: k[j], n: n, at: d.At, made: d.At, limit: d.Limit, vlo: vlo[j], vhi: l.started.Load()})
						}
						continue
					}
					r, err := l.lim.ReserveN(k[j], n)
					if errors.Is(err, engine.ErrInvalidCost) || errors.Is(err, engine.ErrQueueFull) {
						continue
					}
					if err != nil {
						t.Errorf("ReserveN: %v", err)
						return
					}
					mine[j] = append(mine[j], slot{key: k[j], n: n, at: r.At(), made: r.Made(), vlo: vlo[j], vhi: l.started.Load()})
				}
			}
			slots[g] = mine
		}()
	}
	wg.Wait()
	close(stop)
	bg.Wait()

	var newest int64
	checked := 0
	for j, l := range ls {
		hist := l.hist[:l.set+1]
		t.Logf("limiter %d: %d policies set", j, l.set)
		perKey := map[string][]slot{}
		for _, ss := range slots {
			for _, s := range ss[j] {
				if !s.cancelled {
					perKey[s.key] = append(perKey[s.key], s)
					newest = max(newest, s.at)
				}
			}
		}
		for key, ss := range perKey {
			for _, s := range ss {
				if fitsSomePolicy(s, ss, hist) {
					checked++
					continue
				}
				t.Errorf("limiter %d, %s: a slot of cost %d at %d (decided at %d, policies %d..%d, limit %d) fits none of the policies that may have applied",
					j, key, s.n, s.at, s.made, s.vlo, s.vhi, s.limit)
			}
		}
	}
	t.Logf("%d slots checked", checked)

	// Every slot passed and every entry expired: a sweep drops every key
	// of both limiters, and a group reserves on an empty log at once.
	deadline := time.Now().Add(time.Minute)
	for clk.Now() <= newest+int64(700*time.Microsecond) && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	for j, l := range ls {
		l.lim.Sweep()
		if st := l.lim.Stats(); st.Keys != 0 {
			t.Errorf("limiter %d: %d keys left after every entry expired and a sweep", j, st.Keys)
		}
	}
	r, err := g01.ReserveN([]string{"k0", "k1"}, 1)
	if err != nil || r.At() != r.Made() {
		t.Errorf("group Reserve after the sweep: %v, %v; want a slot at once", r, err)
	}
}
