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

// TestSetPolicyReserveStress: SetPolicy changes the limit and the window
// in a tight loop while goroutines Allow, Reserve, Cancel and Wait on few
// keys and sweeps run, with windows of tens to hundreds of microseconds,
// at GOMAXPROCS 1, 4 and 32. Every slot admitted (an Allow accepted, a
// reservation not given back, a Wait that returned nil) must have fitted
// the policy it was decided under: with its cost, the window of that
// policy ending at its instant held at most the limit, counting the slots
// decided before it (made at an earlier instant) that the store could not
// have dropped. A policy is a candidate for a decision when it was in
// force at some moment of the call. Once every slot has passed, a sweep
// must leave no key behind.
func TestSetPolicyReserveStress(t *testing.T) {
	defer leakcheck.VerifyNone(t, leakcheck.IgnoreCurrent())
	for _, procs := range []int{1, 4, 32} {
		t.Run(fmt.Sprint("GOMAXPROCS=", procs), func(t *testing.T) {
			defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(procs))
			setPolicyReserveStress(t, uint64(procs))
		})
	}
}

// slot is one admitted request of the stress.
type slot struct {
	key       string
	n         int
	at, made  int64
	limit     int   // the Decision's limit (0: unknown, a reservation)
	vlo, vhi  int32 // the policies that may have applied: hist[vlo..vhi]
	cancelled bool
}

// reign is one policy of the stress's history and when it was in force:
// from a reading before its SetPolicy to a reading after the next one's.
type reign struct {
	p        engine.Policy
	from, to int64
}

func setPolicyReserveStress(t *testing.T, seed uint64) {
	rng := rand.New(rand.NewPCG(seed, 7))
	limits := []int{1, 2, 3, 5}
	windows := []time.Duration{30 * time.Microsecond, 100 * time.Microsecond, 300 * time.Microsecond, 700 * time.Microsecond}
	hist := make([]reign, 1, 8192)
	hist[0] = reign{p: engine.Policy{Limit: 3, Window: 100 * time.Microsecond}}
	for len(hist) < cap(hist) {
		hist = append(hist, reign{p: engine.Policy{Limit: limits[rng.IntN(len(limits))], Window: windows[rng.IntN(len(windows))]}})
	}
	lim, err := engine.New(hist[0].p, engine.WithShards(2), engine.WithSweepInterval(time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	defer lim.Close()
	hist[0].to = 1<<63 - 1

	// started is the newest policy whose SetPolicy has begun, done the
	// newest whose SetPolicy has returned.
	var started, done atomic.Int32
	stop := make(chan struct{})
	var bg sync.WaitGroup
	bg.Add(2)
	set := 0
	go func() {
		defer bg.Done()
		for i := 1; i < len(hist); i++ {
			select {
			case <-stop:
				return
			default:
			}
			hist[i].from = lim.Now()
			started.Store(int32(i))
			if err := lim.SetPolicy(hist[i].p); err != nil {
				t.Errorf("SetPolicy(%+v): %v", hist[i].p, err)
				return
			}
			done.Store(int32(i))
			hist[i].to = 1<<63 - 1
			hist[i-1].to = lim.Now()
			set = i
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
			lim.Sweep()
			runtime.Gosched()
		}
	}()

	const goroutines, keys = 12, 3
	perG := 400
	if raceEnabled {
		perG = 250
	}
	slots := make([][]slot, goroutines)
	var wg sync.WaitGroup
	for g := range goroutines {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var mine []slot
			type held1 struct {
				r *engine.Reservation
				i int // in mine
			}
			var held []held1
			for i := range perG {
				key := fmt.Sprint("k", (g+i)%keys)
				n := 1 + (g+i)%2
				if i%4 == 0 {
					runtime.Gosched() // lets the policy change at GOMAXPROCS 1
				}
				vlo := done.Load()
				switch i % 5 {
				case 0, 1:
					r, err := lim.ReserveN(key, n)
					vhi := started.Load()
					if errors.Is(err, engine.ErrInvalidCost) || errors.Is(err, engine.ErrQueueFull) {
						continue // the limit was below n, or the queue long
					}
					if err != nil {
						t.Errorf("ReserveN: %v", err)
						return
					}
					mine = append(mine, slot{key: key, n: n, at: r.At(), made: r.Made(), vlo: vlo, vhi: vhi})
					held = append(held, held1{r, len(mine) - 1})
					if i%5 == 1 && len(held) > 2 {
						// Cancel an older one, which later reservations of
						// the key may follow.
						h := held[0]
						held = held[1:]
						if h.r.Cancel() {
							mine[h.i].cancelled = true
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
					r, err := lim.WaitReserved(ctx, key, n)
					cancel()
					vhi := started.Load()
					switch {
					case err == nil:
						if now := lim.Now(); now < r.At() {
							t.Errorf("WaitReserved returned at %d, before its slot at %d", now, r.At())
						}
						mine = append(mine, slot{key: key, n: n, at: r.At(), made: r.Made(), vlo: vlo, vhi: vhi})
					case r != nil && (errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled)):
						// Given back while it slept.
						mine = append(mine, slot{key: key, n: n, at: r.At(), made: r.Made(), vlo: vlo, vhi: vhi, cancelled: true})
					case errors.Is(err, context.DeadlineExceeded), errors.Is(err, context.Canceled), errors.Is(err, engine.ErrInvalidCost), errors.Is(err, engine.ErrQueueFull):
					default:
						t.Errorf("WaitReserved: %v", err)
						return
					}
				default:
					d, err := lim.AllowN(key, n)
					vhi := started.Load()
					if errors.Is(err, engine.ErrInvalidCost) {
						continue
					}
					if err != nil {
						t.Errorf("AllowN: %v", err)
						return
					}
					if d.Allowed {
						mine = append(mine, slot{key: key, n: n, at: d.At, made: d.At, limit: d.Limit, vlo: vlo, vhi: vhi})
					}
				}
			}
			slots[g] = mine
		}()
	}
	wg.Wait()
	close(stop)
	bg.Wait()
	hist = hist[:set+1]
	t.Logf("%d policies set", set)

	perKey := map[string][]slot{}
	var newest int64
	for _, ss := range slots {
		for _, s := range ss {
			if !s.cancelled {
				perKey[s.key] = append(perKey[s.key], s)
				newest = max(newest, s.at)
			}
		}
	}
	checked := 0
	for key, ss := range perKey {
		for _, g := range ss {
			if fitsSomePolicy(g, ss, hist) {
				checked++
				continue
			}
			t.Errorf("%s: a slot of cost %d at %d (decided at %d, policies %d..%d, limit %d) fits none of the policies that may have applied", key, g.n, g.at, g.made, g.vlo, g.vhi, g.limit)
		}
	}
	t.Logf("%d slots checked", checked)

	// Every slot passed and every entry expired: a sweep drops every key,
	// reserved ones included, and a fresh decision sees an empty log.
	deadline := time.Now().Add(time.Minute)
	for lim.Now() <= newest+int64(700*time.Microsecond) && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	lim.Sweep()
	if st := lim.Stats(); st.Keys != 0 {
		t.Errorf("%d keys left after every entry expired and a sweep", st.Keys)
	}
	final := hist[len(hist)-1].p
	for k := range keys {
		key := fmt.Sprint("k", k)
		if d := lim.Allow(key); !d.Allowed || d.Remaining != final.Limit-1 {
			t.Errorf("%s after the sweep: %+v, want allowed with %d remaining", key, d, final.Limit-1)
		}
		r, err := lim.Reserve(key)
		if err != nil || (final.Limit > 1 && r.At() != r.Made()) {
			t.Errorf("%s: Reserve after the sweep: %v, %v", key, r, err)
		}
	}
}

// fitsSomePolicy reports whether slot g fitted one of the policies that
// may have applied to it, counting the slots of ss made before it.
func fitsSomePolicy(g slot, ss []slot, hist []reign) bool {
	for v := g.vlo; v <= g.vhi && int(v) < len(hist); v++ {
		p := hist[v].p
		if g.limit != 0 && p.Limit != g.limit {
			continue
		}
		used := g.n
		for _, e := range ss {
			if e.made >= g.made || e.at > g.at || e.at <= g.at-int64(p.Window) || mayBeDropped(e, g.made, hist) {
				continue
			}
			used += e.n
		}
		if used <= p.Limit {
			return true
		}
	}
	return false
}

// mayBeDropped reports whether the store may have dropped entry e before
// a decision at t: some policy in force between e's instant and t had
// expired it (an accept drops the expired entries, a sweep an idle key).
func mayBeDropped(e slot, t int64, hist []reign) bool {
	for _, r := range hist {
		if r.to < e.at || r.from > t {
			continue
		}
		if e.at+int64(r.p.Window) <= min(t, r.to) {
			return true
		}
	}
	return false
}
