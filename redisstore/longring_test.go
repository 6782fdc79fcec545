package redisstore

import (
	"context"
	"encoding/binary"
	"fmt"
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

// TestGroupBatchLongRingRepeats: one script call decides up to batchMax
// group requests on one long ring, as a hot key (a route's limit) brings
// them, each with a user's limit beside it. The call reads the ring's
// first bytes and its block of slots once and gives the ring its TTL
// once (LM in lua.go), while every decision is the one the reference
// models make at the call's instant: appends that cross blocks of slots
// and grow the ring, refusals by a user's limit and then by the route's,
// and single decisions on the ring between them, which write it by code
// of their own. Each batch is one call and leaves the ring a TTL it
// granted; decisions alone after the batches read what they wrote. On
// the Functions path and on EVALSHA.
func TestGroupBatchLongRingRepeats(t *testing.T) {
	for _, fn := range []bool{true, false} {
		name := "fcall"
		if !fn {
			name = "evalsha"
		}
		t.Run(name, func(t *testing.T) {
			if fn && functionsOff {
				t.Skip("SLIDEGATE_REDIS_EVALSHA: the EVALSHA path")
			}
			testGroupBatchLongRingRepeats(t, fn)
		})
	}
}

func testGroupBatchLongRingRepeats(t *testing.T, fn bool) {
	ps := []engine.Policy{
		{Name: "route", Limit: 200, Window: time.Minute},
		{Name: "user", Limit: 5, Window: time.Minute},
	}
	// A server of its own: commandstats count this test's commands only.
	srv := ownRedis(t)
	off := functionsOff
	functionsOff = !fn
	st, ls, g := openGroup(t, "redis://"+srv.addr, ps, WithKeyPrefix(testPrefix(t)), WithRefusalCache(0))
	functionsOff = off
	defer st.Close()
	ctx := context.Background()
	c := rawClient(t, srv.addr)
	defer c.Close()
	route := ls[0].Key("r")
	var recs []reference.GroupRecord
	group := func(user string) (reference.GroupRecord, error) {
		refs := []engine.Ref{{Policy: 0, Key: "r"}, {Policy: 1, Key: user}}
		gd, err := g.DecideGroup(ctx, nil, engine.GroupRequest{Refs: refs, N: 1})
		if err == nil && (gd.Limits[0].Fallback || gd.Limits[1].Fallback) {
			err = fmt.Errorf("a fallback decision: %+v", gd)
		}
		return backendtest.GroupRecord(refs, 1, gd), err
	}
	// Past the 64 slots a call reads whole: 90 entries, one call each.
	for i := range 90 {
		rec, err := group(fmt.Sprintf("p%d", i))
		if err != nil || !rec.Allowed {
			t.Fatalf("filling the ring: %+v, %v", rec, err)
		}
		recs = append(recs, rec)
	}
	const batches, singles = 10, 2
	byUser, byRoute := 0, 0 // batched group requests refused by each limit
	pexpires := int64(0)    // in the batches' calls
	for b := range batches {
		// Each batch's users hold one entry already (their own keys then
		// set their TTL with their writes: the ring's grants are the
		// batch's only PEXPIREs).
		users := make([]string, 3)
		for j := range users {
			users[j] = fmt.Sprintf("u%d-%d", b, j)
			d, err := ls[1].Decide(ctx, users[j], 1)
			if err != nil || !d.Allowed {
				t.Fatalf("a user's first request: %+v, %v", d, err)
			}
			recs = append(recs, backendtest.SingleRecord(1, users[j], 1, d))
		}
		if err := c.Do(ctx, c.B().Pexpire().Key(route).Milliseconds(1000).Build()).Error(); err != nil {
			t.Fatal(err)
		}
		ln, _ := holdLane(t, ls[0], "r")
		type result struct {
			rec reference.GroupRecord
			err error
		}
		res := make(chan result, batchMax)
		for i := range batchMax {
			go func() {
				if i < singles {
					d, err := ls[0].Decide(ctx, "r", 1)
					res <- result{backendtest.SingleRecord(0, "r", 1, d), err}
					return
				}
				rec, err := group(users[i%len(users)])
				res <- result{rec, err}
			}()
		}
		awaitQueued(t, ln, batchMax)
		calls0, pexpire0 := st.calls.Load(), cmdCalls(t, srv.addr, "pexpire")
		leaveAll(st, ln)
		allowed := 0
		for range batchMax {
			r := <-res
			if r.err != nil {
				t.Fatal(r.err)
			}
			if len(r.rec.Keys) == 2 {
				switch {
				case r.rec.Allowed:
					allowed++
				case !r.rec.Limits[0].Allowed:
					byRoute++
				default:
					byUser++
				}
			}
			recs = append(recs, r.rec)
		}
		pexpires += cmdCalls(t, srv.addr, "pexpire") - pexpire0
		if calls := st.calls.Load() - calls0; calls != 1 {
			t.Fatalf("batch %d: %d script calls for %d queued decisions, want 1", b, calls, batchMax)
		}
		if allowed > 0 {
			// The ring's TTL was cut to a second before the batch: an
			// append of the batch granted the policy's.
			pttl, err := c.Do(ctx, c.B().Pttl().Key(route).Build()).AsInt64()
			if err != nil {
				t.Fatal(err)
			}
			if pttl < ps[0].Window.Milliseconds()-10_000 {
				t.Fatalf("batch %d: %d group requests appended to the ring, which expires in %d ms: none granted its TTL", b, allowed, pttl)
			}
		}
	}
	// At most one grant per stretch of the call that no single decision
	// interrupts, and one per single decision (its own code).
	if n, most := pexpires, int64(batches*(2*singles+1)); n > most {
		t.Errorf("%d PEXPIREs in %d batches of %d decisions on one ring, want at most %d: the call granted its TTL more than once a stretch", n, batches, batchMax, most)
	}
	// Decisions alone, one call each, read what the batches wrote.
	for i := range 20 {
		rec, err := group(fmt.Sprintf("q%d", i))
		if err != nil {
			t.Fatal(err)
		}
		recs = append(recs, rec)
	}
	if byUser == 0 || byRoute == 0 {
		t.Errorf("batched group requests refused by a user's limit %d times and by the route's %d: the batches did not exercise both", byUser, byRoute)
	}
	backendtest.VerifyGroupAt(t, ps, recs, time.Microsecond)
}
