package redisstore

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/slidegate/slidegate/engine"
)

// A group reserves at the earliest instant every limit fits, all or
// nothing; a decision meanwhile is refused; a cancel gives the slot back
// to every limit. The engine's TestGroupReserve, on Redis.
func TestGroupReserve(t *testing.T) {
	for _, tc := range []struct{ name, url string }{{"standalone", standaloneURL(t)}, {"cluster", clusterURL(t)}} {
		t.Run(tc.name, func(t *testing.T) {
			clk := engine.NewManualClock()
			clk.Set(time.Second)
			st, err := Open(tc.url, WithKeyPrefix(testPrefix(t)), WithClock(clk), WithRefusalCache(0), WithTimeout(5*time.Second))
			if err != nil {
				t.Fatal(err)
			}
			defer st.Close()
			short, _ := st.Limiter(engine.Policy{Name: "short", Limit: 2, Window: 10 * time.Second})
			long, _ := st.Limiter(engine.Policy{Name: "long", Limit: 3, Window: 30 * time.Second})
			g, err := NewGroup(short, long)
			if err != nil {
				t.Fatal(err)
			}
			ctx := context.Background()
			refs := []engine.Ref{{Policy: 0, Key: "u"}, {Policy: 1, Key: "u"}}
			s := int64(time.Second)
			var rs []*GroupReservation
			for i, w := range []int64{0, 0, 10 * s, 30 * s, 30 * s, 40 * s, 60 * s} {
				r, err := g.ReserveRefsN(ctx, refs, 1, -1)
				if err != nil || r.At()-s != w {
					t.Fatalf("reservation %d: %v, %v; want the slot at %v", i, r, err, time.Duration(w))
				}
				rs = append(rs, r)
			}
			clk.Set(6 * time.Second)
			if gd, err := g.DecideGroup(ctx, nil, engine.GroupRequest{Refs: refs, N: 1}); err != nil || gd.Allowed {
				t.Fatalf("group decision with waiters: %+v, %v; want refused", gd, err)
			}
			if d, err := short.Decide(ctx, "u", 1); err != nil || d.Allowed {
				t.Fatalf("a limiter's own decision with waiters: %+v, %v; want refused", d, err)
			}
			if ok, err := rs[6].Cancel(ctx); err != nil || !ok {
				t.Fatalf("cancel of the newest: %v, %v", ok, err)
			}
			if r, err := g.ReserveRefsN(ctx, refs, 1, -1); err != nil || r.At()-s != 60*s {
				t.Fatalf("after the pop: %v, %v; want 60 s", r, err)
			}
			if _, err := g.ReserveRefsN(ctx, refs, 3, -1); !errors.Is(err, engine.ErrInvalidCost) {
				t.Fatalf("cost above the smallest limit: %v", err)
			}
			if _, err := g.ReserveRefsN(ctx, refs, 1, time.Second); !errors.Is(err, engine.ErrWaitTooLong) {
				t.Fatalf("a slot a minute away with a second's bound: %v", err)
			}
		})
	}
}

// WaitRefsN waits as Limiter.WaitN does: a nil or done context, a slot
// after the deadline and a wait cancelled while the slot lies ahead
// each leave nothing reserved; a slot that comes is waited for.
func TestGroupWaitRefs(t *testing.T) {
	for _, tc := range []struct{ name, url string }{{"standalone", standaloneURL(t)}, {"cluster", clusterURL(t)}} {
		t.Run(tc.name, func(t *testing.T) {
			st, err := Open(tc.url, WithKeyPrefix(testPrefix(t)), WithRefusalCache(0), WithTimeout(5*time.Second))
			if err != nil {
				t.Fatal(err)
			}
			defer st.Close()
			hour, _ := st.Limiter(engine.Policy{Name: "hour", Limit: 1, Window: time.Hour})
			brief, _ := st.Limiter(engine.Policy{Name: "brief", Limit: 1, Window: 50 * time.Millisecond})
			long, _ := st.Limiter(engine.Policy{Name: "long", Limit: 10, Window: time.Hour})
			g, err := NewGroup(hour, brief, long)
			if err != nil {
				t.Fatal(err)
			}
			bg := context.Background()
			//lint:ignore SA1012 a nil context is the input under test
			if err := g.WaitRefsN(nil, []engine.Ref{{Policy: 0, Key: "u"}}, 1); !errors.Is(err, engine.ErrNilContext) { //nolint:staticcheck
				t.Fatalf("nil context: %v", err)
			}
			done, cancel := context.WithCancel(bg)
			cancel()
			if err := g.WaitRefsN(done, []engine.Ref{{Policy: 0, Key: "u"}}, 1); !errors.Is(err, context.Canceled) {
				t.Fatalf("done context: %v", err)
			}

			// One request fills "hour": the next slot is an hour away.
			refs := []engine.Ref{{Policy: 0, Key: "u"}, {Policy: 2, Key: "u"}}
			if err := g.WaitRefsN(bg, refs, 1); err != nil {
				t.Fatalf("first wait: %v", err)
			}
			short, cancelShort := context.WithTimeout(bg, time.Minute)
			defer cancelShort()
			if err := g.WaitRefsN(short, refs, 1); !errors.Is(err, engine.ErrWaitTooLong) || !errors.Is(err, context.DeadlineExceeded) {
				t.Fatalf("a slot an hour away with a minute's deadline: %v", err)
			}
			waiting, cancelWait := context.WithCancel(bg)
			go func() {
				time.Sleep(20 * time.Millisecond)
				cancelWait()
			}()
			if err := g.WaitRefsN(waiting, refs, 1); !errors.Is(err, context.Canceled) {
				t.Fatalf("a wait cancelled before its slot: %v", err)
			}
			// Neither wait left its slot: the next one is still the
			// first request's expiry, not an hour after it.
			r, err := g.ReserveRefsN(bg, refs, 1, -1)
			if err != nil || r.Delay() > time.Hour {
				t.Fatalf("the next slot: %v, %v; want within an hour", r, err)
			}

			// "brief" frees its slot 50 ms on: the second wait waits for it.
			refs = []engine.Ref{{Policy: 1, Key: "u"}}
			for i := range 2 {
				if err := g.WaitRefsN(bg, refs, 1); err != nil {
					t.Fatalf("wait %d on a brief window: %v", i, err)
				}
			}
		})
	}
}
