package redisstore

import (
	"context"
	"encoding/binary"
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

// TestGroupLongRingEntryAhead: a ring read in part whose newest entry
// lies ahead of now, with a free slot after it, is refused by a group
// decision (no request goes before an entry ahead, as before a
// reservation). The group script's fast path reads that newest entry
// beyond the first RPRE bytes, in a block of slots (tailRead): reading
// another slot of the block instead would append after it.
func TestGroupLongRingEntryAhead(t *testing.T) {
	url := standaloneURL(t)
	ps := []engine.Policy{
		{Name: "hot", Limit: 1000, Window: 10 * time.Second},
		{Name: "other", Limit: 1000, Window: 10 * time.Second},
	}
	clk := engine.NewManualClock()
	clk.Set(time.Second)
	st, ls, g := openGroup(t, url, ps, suiteOptions(t, clk)...)
	defer st.Close()
	ctx := context.Background()
	refs := []engine.Ref{{Policy: 0, Key: "h"}, {Policy: 1, Key: "v"}}
	const entries = 100
	for range entries {
		clk.Advance(time.Millisecond)
		if gd, err := g.DecideGroup(ctx, nil, engine.GroupRequest{Refs: refs, N: 1}); err != nil || !gd.Allowed {
			t.Fatalf("filling: %+v, %v", gd, err)
		}
	}
	c := rawClient(t, standaloneAddr(t))
	key := ls[0].Key("h")
	ring, err := c.Do(ctx, c.B().Get().Key(key).Build()).AsBytes()
	if err != nil {
		t.Fatal(err)
	}
	// 4-byte slots; the ring grew by doubling: 128 slots, the newest in
	// slot 99, past the first RPRE bytes and not first in its block.
	const S, p = 4, entries - 1
	if len(ring) != 24+128*S || binary.LittleEndian.Uint32(ring[20:]) != entries || binary.LittleEndian.Uint32(ring[16:]) != 0 {
		t.Fatalf("ring of %d bytes, header %x: not the layout the test sets up", len(ring), ring[:24])
	}
	base := int64(binary.LittleEndian.Uint64(ring[0:]))
	ahead := clk.Now()/1000 + int64(time.Second/time.Microsecond)
	e := binary.LittleEndian.AppendUint32(nil, uint32(ahead-base))
	if err := c.Do(ctx, c.B().Setrange().Key(key).Offset(24+p*S).Value(string(e)).Build()).Error(); err != nil {
		t.Fatal(err)
	}
	clk.Advance(time.Millisecond)
	gd, err := g.DecideGroup(ctx, nil, engine.GroupRequest{Refs: refs, N: 1})
	if err != nil || gd.Allowed {
		t.Fatalf("with an entry ahead: %+v, %v; want refused", gd, err)
	}
}
