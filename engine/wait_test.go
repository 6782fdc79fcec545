package engine_test

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"slices"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/slidegate/slidegate/engine"
	"github.com/slidegate/slidegate/internal/leakcheck"
	"github.com/slidegate/slidegate/internal/reference"
)

// Waiters are admitted in the order they called, each at its own slot.
// The newest waiter's slot, given back when its ctx is cancelled, goes to
// the next waiter; a cancelled waiter with others behind it gives its
// slot to nobody who came after them. synctest's clock makes the instants
// exact.
func TestWaitOrderAndCancel(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const w = time.Second
		lim, err := engine.New(engine.Policy{Limit: 1, Window: w})
		if err != nil {
			t.Fatal(err)
		}
		defer lim.Close()
		if d := lim.Allow("k"); !d.Allowed {
			t.Fatalf("first Allow refused: %+v", d)
		}
		type done struct {
			who int
			at  int64
			err error
		}
		out := make(chan done, 5)
		start := func(who int, ctx context.Context) {
			go func() {
				err := lim.Wait(ctx, "k")
				out <- done{who, lim.Now(), err}
			}()
			synctest.Wait() // who has reserved before the next one calls
		}
		cancelled := func(who int, cancel context.CancelFunc) {
			t.Helper()
			cancel()
			if got := <-out; got.who != who || !errors.Is(got.err, context.Canceled) {
				t.Fatalf("first to return: %+v; want waiter %d with context.Canceled", got, who)
			}
		}
		ctx2, cancel2 := context.WithCancel(t.Context())
		ctx4, cancel4 := context.WithCancel(t.Context())
		start(1, t.Context()) // slot at 1 s
		start(2, ctx2)        // slot at 2 s; cancelled below
		start(3, t.Context()) // slot at 3 s
		cancelled(2, cancel2) // 3 keeps its slot: it was told it already
		start(4, ctx4)        // slot at 4 s, not 2's: 3 came first
		cancelled(4, cancel4) // the newest waiter's slot is given back
		start(5, t.Context()) // the slot waiter 4 gave back, at 4 s
		for _, want := range []done{{1, int64(w), nil}, {3, int64(3 * w), nil}, {5, int64(4 * w), nil}} {
			if got := <-out; got != want {
				t.Fatalf("got %+v, want %+v", got, want)
			}
		}
		// An Allow while nobody waits, at 4 s: 5's slot fills the window.
		if d := lim.Allow("k"); d.Allowed || d.RetryAfter != w {
			t.Fatalf("Allow at 4 s: %+v; want refused for 1 s", d)
		}
	})
}

// A wait whose slot would come after the context's deadline returns at
// once, reserving nothing; one that the deadline interrupts gives its slot
// back.
func TestWaitDeadline(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		lim, err := engine.New(engine.Policy{Limit: 2, Window: time.Minute})
		if err != nil {
			t.Fatal(err)
		}
		defer lim.Close()
		if _, err := lim.AllowN("k", 2); err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
		defer cancel()
		t0 := time.Now()
		err = lim.Wait(ctx, "k")
		if !errors.Is(err, engine.ErrWaitTooLong) || !errors.Is(err, context.DeadlineExceeded) || time.Since(t0) != 0 {
			t.Fatalf("Wait with a 30 s deadline for a slot in 60 s: %v after %v; want ErrWaitTooLong at once", err, time.Since(t0))
		}
		r, err := lim.Reserve("k")
		if err != nil || r.At() != int64(time.Minute) {
			t.Fatalf("Reserve after the refused wait: %v, %v; want the slot at 1 m", r, err)
		}
		r.Cancel()
	})
}

// Stress: goroutines wait, reserve, cancel and allow on few keys with
// windows of microseconds at several GOMAXPROCS; every slot admitted
// (waits that returned nil, reservations not given back, allows) must
// keep every window at the limit, and no Allow is admitted ahead of a
// pending reservation.
func TestWaitStress(t *testing.T) {
	defer leakcheck.VerifyNone(t, leakcheck.IgnoreCurrent()) // no waiter is left behind
	for _, procs := range []int{1, 4, 32} {
		t.Run(fmt.Sprint("GOMAXPROCS=", procs), func(t *testing.T) {
			defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(procs))
			p := engine.Policy{Limit: 5, Window: 300 * time.Microsecond}
			lim, err := engine.New(p, engine.WithShards(2), engine.WithSweepInterval(time.Millisecond))
			if err != nil {
				t.Fatal(err)
			}
			defer lim.Close()
			const goroutines, perG, keys = 12, 300, 2
			admitted := make([][]reference.Record, goroutines)
			// pending: reservations with the instant they were made at
			// and the least instant they stayed pending to (their slot,
			// or the clock read before a successful cancel).
			type span struct {
				key             string
				made, until, at int64
			}
			pending := make([][]span, goroutines)
			var wg sync.WaitGroup
			for g := range goroutines {
				wg.Add(1)
				go func() {
					defer wg.Done()
					var recs []reference.Record
					for i := range perG {
						key := fmt.Sprint("k", (g+i)%keys)
						n := 1 + i%2
						switch i % 4 {
						case 0, 1:
							r, err := lim.ReserveN(key, n)
							if err != nil {
								t.Errorf("ReserveN: %v", err)
								return
							}
							if i%8 == 1 {
								if c := lim.Now(); r.CancelAt(c) {
									pending[g] = append(pending[g], span{key, r.Made(), min(c, r.At()), r.At()})
									continue
								}
							}
							pending[g] = append(pending[g], span{key, r.Made(), r.At(), r.At()})
							recs = append(recs, reference.Record{Key: key, Cost: n, At: r.At(), Allowed: true})
						case 2:
							ctx, cancel := context.WithTimeout(context.Background(), time.Duration(i%3)*100*time.Microsecond)
							r, err := lim.WaitReserved(ctx, key, n)
							cancel()
							if err == nil {
								recs = append(recs, reference.Record{Key: key, Cost: n, At: r.At(), Allowed: true})
								if now := lim.Now(); now < r.At() {
									t.Errorf("WaitN returned at %d, before its slot at %d", now, r.At())
								}
							} else if !errors.Is(err, context.DeadlineExceeded) {
								t.Errorf("WaitN: %v", err)
							}
						default:
							d, err := lim.AllowN(key, n)
							if err != nil {
								t.Errorf("AllowN: %v", err)
								return
							}
							if d.Allowed {
								recs = append(recs, reference.Record{Key: key, Cost: n, At: d.At, Allowed: true, Remaining: -1})
							}
						}
					}
					admitted[g] = recs
				}()
			}
			wg.Wait()
			perKey := map[string][]int64{}
			for _, rs := range admitted {
				for _, r := range rs {
					for range r.Cost {
						perKey[r.Key] = append(perKey[r.Key], r.At)
					}
				}
			}
			// No reservation went ahead of a waiter: one made after a
			// reservation that was never given back (at a later instant:
			// decisions on a key are serialized) has a slot no earlier.
			for _, as := range pending {
				for _, a := range as {
					if a.until != a.at {
						continue // given back
					}
					for _, bs := range pending {
						for _, b := range bs {
							if b.key == a.key && b.made > a.made && b.at < a.at {
								t.Fatalf("%s: a slot at %d reserved at %d went ahead of one at %d reserved at %d", a.key, b.at, b.made, a.at, a.made)
							}
						}
					}
				}
			}
			// No Allow went ahead of a waiter: none was admitted at an
			// instant after a reservation was made and before its slot
			// while it was pending.
			for _, rs := range admitted {
				for _, r := range rs {
					if r.Remaining != -1 {
						continue
					}
					for _, ps := range pending {
						for _, sp := range ps {
							if sp.key == r.Key && sp.made < r.At && r.At < sp.until {
								t.Fatalf("%s: an Allow admitted at %d went ahead of a slot at %d reserved at %d", r.Key, r.At, sp.at, sp.made)
							}
						}
					}
				}
			}
			for key, es := range perKey {
				slices.Sort(es)
				for i := p.Limit; i < len(es); i++ {
					if es[i]-es[i-p.Limit] < int64(p.Window) {
						t.Fatalf("%s: %d entries in (%d − W, %d]", key, p.Limit+1, es[i], es[i])
					}
				}
			}
		})
	}
}

// Each goroutine's slots on a key come in the order it reserved them, and
// every slot comes after every slot reserved before it on the key.
func TestWaitFIFO(t *testing.T) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(8))
	lim, err := engine.New(engine.Policy{Limit: 3, Window: 100 * time.Microsecond})
	if err != nil {
		t.Fatal(err)
	}
	defer lim.Close()
	type slot struct{ made, at int64 }
	slots := make([][]slot, 8)
	var wg sync.WaitGroup
	for g := range slots {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 500 {
				r, err := lim.Reserve("k")
				if err != nil {
					t.Error(err)
					return
				}
				if n := len(slots[g]); n > 0 && r.At() < slots[g][n-1].at {
					t.Errorf("goroutine %d: slot %d after one at %d", g, r.At(), slots[g][n-1].at)
				}
				slots[g] = append(slots[g], slot{r.Made(), r.At()})
			}
		}()
	}
	wg.Wait()
	var all []slot
	for _, s := range slots {
		all = append(all, s...)
	}
	// Reservations are serialized at non-decreasing instants: in that
	// order the slots never go back.
	slices.SortFunc(all, func(a, b slot) int {
		if a.made != b.made {
			return int(a.made - b.made)
		}
		return int(a.at - b.at)
	})
	m := reference.NewReserveLog(3, int64(100*time.Microsecond))
	for i, s := range all {
		if at, _, _ := m.Reserve("k", 1, s.made, 1<<62); at != s.at {
			t.Fatalf("slot %d made at %d: at %d, the model says %d", i, s.made, s.at, at)
		}
	}
}

// A slot given back is never waited for as if it were still there, and a
// slot waited for is never given back: Wait on a cancelled reservation
// returns ErrGivenBack (at once, or when another waiter's ctx gives it
// back), and CancelAt at an earlier instant after Wait returned nil keeps
// the slot in the log.
func TestWaitGivenBack(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		lim, err := engine.New(engine.Policy{Limit: 1, Window: time.Second})
		if err != nil {
			t.Fatal(err)
		}
		defer lim.Close()
		lim.Allow("k")
		r, err := lim.Reserve("k")
		if err != nil || !r.Cancel() {
			t.Fatalf("Reserve and Cancel: %v, %v", r, err)
		}
		if err := r.Wait(t.Context()); !errors.Is(err, engine.ErrGivenBack) {
			t.Fatalf("Wait on a cancelled reservation: %v; want ErrGivenBack", err)
		}
		// Two waiters on one reservation; the first one's ctx ends.
		r, err = lim.Reserve("k")
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(t.Context())
		errs := make(chan error, 2)
		go func() { errs <- r.Wait(ctx) }()
		go func() { errs <- r.Wait(t.Context()) }()
		synctest.Wait()
		cancel()
		got := []error{<-errs, <-errs}
		if !errors.Is(got[0], context.Canceled) || !errors.Is(got[1], engine.ErrGivenBack) {
			t.Fatalf("waiters returned %v; want context.Canceled, then ErrGivenBack", got)
		}
	})
	clk := engine.NewManualClock()
	lim, err := engine.New(engine.Policy{Limit: 1, Window: time.Second}, engine.WithClock(clk), engine.WithSweepInterval(0))
	if err != nil {
		t.Fatal(err)
	}
	defer lim.Close()
	lim.Allow("k")
	r, err := lim.Reserve("k")
	if err != nil || r.At() != int64(time.Second) {
		t.Fatalf("Reserve: %v, %v; want the slot at 1 s", r, err)
	}
	clk.Set(time.Second)
	if err := r.Wait(t.Context()); err != nil {
		t.Fatalf("Wait once the slot came: %v", err)
	}
	if r.CancelAt(int64(time.Second) / 2) {
		t.Fatal("CancelAt an earlier instant gave back a slot that Wait had admitted")
	}
	if d := lim.Allow("k"); d.Allowed {
		t.Fatalf("Allow at 1 s: %+v; want refused, the slot at 1 s is in the log", d)
	}
}
