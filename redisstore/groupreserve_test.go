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
