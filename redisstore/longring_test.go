package redisstore

import (
	"context"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/slidegate/slidegate/engine"
	"github.com/slidegate/slidegate/internal/backendtest"
	"github.com/slidegate/slidegate/internal/reference"
)

// TestGroupLongRings replays requests over rings longer than the group
// script reads whole (RPRE bytes: a hot key of hundreds of entries that
// wraps, grows and is refused, beside one-request clients that move
// between their bucket and their own key, and a counter) on a caller clock
// that runs dense and sparse and now and then steps back, against one
// reference model per policy; now and then every entry expires before
// the next request.
func TestGroupLongRings(t *testing.T) {
	url := standaloneURL(t)
	ps := []engine.Policy{
		{Name: "hot", Limit: 700, Window: 2 * time.Second},
		{Name: "warm", Limit: 150, Window: 400 * time.Millisecond},
		{Name: "small", Limit: 3, Window: 100 * time.Millisecond},
		{Name: "ctr", Limit: 50, Window: time.Second, Algorithm: engine.SlidingCounter},
	}
	clk := engine.NewManualClock()
	clk.Set(time.Second)
	st, _, g := openGroup(t, url, ps, suiteOptions(t, clk)...)
	defer st.Close()
	r := rand.New(rand.NewPCG(27, 6))
	small := []string{"a", "b", "c", "d"}
	var recs []reference.GroupRecord
	peak := [2]int{} // the most entries held by the hot and the warm key
	ctx := context.Background()
	for i := range 2500 {
		// Phases of dense and sparse traffic: rings fill, wrap, drain and
		// grow again.
		step := int64(2)
		if i/400%2 == 1 {
			step = 12
		}
		pause := i%400 == 399
		switch {
		case pause:
			// Every entry expires: the next append starts a drained ring
			// again at a new base.
			clk.Advance(ps[0].Window + time.Millisecond)
		case r.IntN(40) == 0:
			clk.Advance(-time.Duration(r.Int64N(60)) * time.Millisecond)
		default:
			clk.Advance(time.Duration(r.Int64N(step*1000)) * time.Microsecond)
		}
		var refs []engine.Ref
		if r.IntN(4) != 0 {
			refs = append(refs, engine.Ref{Policy: 0, Key: "h"})
		}
		if r.IntN(2) == 0 {
			refs = append(refs, engine.Ref{Policy: 1, Key: []string{"w", "w2"}[r.IntN(2)]})
		}
		if r.IntN(3) == 0 {
			refs = append(refs, engine.Ref{Policy: 2, Key: small[r.IntN(len(small))]})
		}
		if r.IntN(4) == 0 || len(refs) == 0 {
			refs = append(refs, engine.Ref{Policy: 3, Key: "x"})
		}
		n := 1
		if r.IntN(6) == 0 {
			n = 1 + r.IntN(min(backendtest.MinLimit(ps, refs), 5))
		}
		if pause {
			refs, n = []engine.Ref{{Policy: 0, Key: "h"}, {Policy: 1, Key: "w"}}, 3
		}
		gd, err := g.DecideGroup(ctx, nil, engine.GroupRequest{Refs: refs, N: n})
		if err != nil {
			t.Fatal(err)
		}
		for j, ref := range refs {
			if ref.Policy < 2 && gd.Allowed {
				peak[ref.Policy] = max(peak[ref.Policy], ps[ref.Policy].Limit-gd.Limits[j].Remaining)
			}
		}
		recs = append(recs, backendtest.GroupRecord(refs, n, gd))
	}
	// Beyond 64 slots ((RPRE - 24) / 4 in lua.go) a ring is read in part.
	const whole = 64
	if peak[0] <= 4*whole || peak[1] <= whole {
		t.Fatalf("the hot and warm keys held at most %v entries: the trace did not make long rings", peak)
	}
	backendtest.VerifyGroupAt(t, ps, recs, time.Microsecond)
}
