package engine_test

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/slidegate/slidegate/engine"
	"github.com/slidegate/slidegate/internal/reference"
)

// Step table on explicit instants: L = 2 per 10 s.
func TestReserveSteps(t *testing.T) {
	lim, err := engine.New(engine.Policy{Limit: 2, Window: 10 * time.Second}, engine.WithSweepInterval(0))
	if err != nil {
		t.Fatal(err)
	}
	defer lim.Close()
	s := int64(time.Second)
	res := map[string]*engine.Reservation{}
	steps := []struct {
		op      string // "r" reserve, "a" allow, "c" cancel
		name    string // the reservation a step makes or cancels
		now     int64
		wantAt  int64 // reserve: the slot; allow: the decision instant
		wantOK  bool  // allow: admitted; cancel: given back
		wantRA  int64 // allow: RetryAfter
		comment string
	}{
		{"r", "a", 0, 0, true, 0, "an empty log: the slot is now"},
		{"r", "b", 0, 0, true, 0, "room for two"},
		{"r", "c", 0, 10 * s, true, 0, "full: when the first leaves"},
		{"r", "d", s, 10 * s, true, 0, "the second leaves then too"},
		{"r", "e", s, 20 * s, true, 0, "behind both"},
		{"a", "", 5 * s, 5 * s, false, 15 * s, "a waiter is queued: no going ahead of it"},
		{"c", "e", 6 * s, 0, true, 0, "the newest reservation is popped"},
		{"a", "", 6 * s, 6 * s, false, 14 * s, "still behind c and d, until 20 s"},
		{"c", "c", 7 * s, 0, true, 0, "one in the middle"},
		{"a", "", 7 * s, 7 * s, false, 3 * s, "behind d only: at 10 s a and b have left"},
		{"c", "c", 8 * s, 0, false, 0, "a reservation is given back once"},
		{"a", "", 10 * s, 10 * s, true, 0, "d's instant has come; room for one more"},
		{"c", "d", 11 * s, 0, false, 0, "too late: d's instant has come"},
		{"a", "", 11 * s, 11 * s, false, 9 * s, "d and the allow at 10 s fill the window"},
	}
	for i, st := range steps {
		switch st.op {
		case "r":
			r, err := lim.ReserveNAt("k", 1, st.now)
			if err != nil || r.At() != st.wantAt {
				t.Fatalf("step %d (%s): reserve at %v: %v, %v; want slot %v", i, st.comment, time.Duration(st.now), r, err, time.Duration(st.wantAt))
			}
			res[st.name] = r
		case "a":
			d, err := lim.AllowNAt("k", 1, st.now)
			if err != nil || d.Allowed != st.wantOK || d.At != st.wantAt || int64(d.RetryAfter) != st.wantRA {
				t.Fatalf("step %d (%s): allow at %v: %+v, %v; want allowed %v, RetryAfter %v", i, st.comment, time.Duration(st.now), d, err, st.wantOK, time.Duration(st.wantRA))
			}
		case "c":
			if got := res[st.name].CancelAt(st.now); got != st.wantOK {
				t.Fatalf("step %d (%s): cancel %s at %v: %v, want %v", i, st.comment, st.name, time.Duration(st.now), got, st.wantOK)
			}
		}
	}
}

// Random traces on one limiter against the reservation model: reserves,
// allows and cancels of costs up to 3 on a few keys, at instants that
// mostly move forward (sometimes back, sometimes on exact boundaries);
// every field of every decision must match.
func TestReserveMatchesReference(t *testing.T) {
	for seed := range uint64(40) {
		t.Run(fmt.Sprint(seed), func(t *testing.T) {
			r := rand.New(rand.NewPCG(seed, 33))
			limit := 1 + r.IntN(5)
			w := int64(1000)
			opts := []engine.Option{engine.WithSweepInterval(0), engine.WithShards(1)}
			if seed%3 == 1 {
				opts = append(opts, engine.WithHashedKeys())
			}
			if seed%5 == 2 {
				w = int64(100 * time.Hour) // wide slots
			}
			lim, err := engine.New(engine.Policy{Limit: limit, Window: time.Duration(w)}, opts...)
			if err != nil {
				t.Fatal(err)
			}
			defer lim.Close()
			m := reference.NewReserveLog(limit, w)
			m.MaxAhead = int64(engine.MaxReserveAhead)
			type resv struct {
				key string
				n   int
				r   *engine.Reservation
			}
			var live []resv
			now := int64(0)
			for step := range 3000 {
				switch r.IntN(10) {
				case 0:
					now = max(0, now-r.Int64N(w/4))
				case 1:
					now += w
				default:
					now += r.Int64N(w / 5)
				}
				key := fmt.Sprint("k", r.IntN(3))
				n := 1 + r.IntN(min(3, limit))
				switch op := r.IntN(10); {
				case op < 4:
					d, err := lim.AllowNAt(key, n, now)
					want, at := m.Allow(key, n, now)
					if err != nil || d.Allowed != want.Allowed || d.Remaining != want.Remaining || int64(d.RetryAfter) != want.RetryAfter ||
						int64(d.Reset) != want.Reset || d.At != at {
						t.Fatalf("step %d: allow(%s, %d) at %d: got %+v, want %+v at %d; entries %v", step, key, n, now, d, want, at, m.Entries(key))
					}
				case op < 8:
					res, err := lim.ReserveNAt(key, n, now)
					at, ok, made := m.Reserve(key, n, now, 1<<62)
					if !ok {
						if !errors.Is(err, engine.ErrQueueFull) {
							t.Fatalf("step %d: reserve(%s, %d) at %d: %v, %v; want ErrQueueFull (slot %d made %d)", step, key, n, now, res, err, at, made)
						}
						continue
					}
					if err != nil || res.At() != at || res.Made() != made {
						t.Fatalf("step %d: reserve(%s, %d) at %d: got %v, %v; want slot %d made %d; entries %v", step, key, n, now, res, err, at, made, m.Entries(key))
					}
					live = append(live, resv{key, n, res})
				default:
					if len(live) == 0 {
						continue
					}
					i := r.IntN(len(live))
					c := live[i]
					live = append(live[:i], live[i+1:]...)
					got := c.r.CancelAt(now)
					if want := m.Cancel(c.key, c.n, c.r.At(), now); got != want {
						t.Fatalf("step %d: cancel(%s, %d) of the slot at %d at %d: got %v, want %v", step, c.key, c.n, c.r.At(), now, got, want)
					}
				}
			}
		})
	}
}

func TestReserveBadInput(t *testing.T) {
	lim, err := engine.New(engine.Policy{Limit: 3, Window: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	defer lim.Close()
	for _, n := range []int{0, -1, 4} {
		if r, err := lim.ReserveN("k", n); !errors.Is(err, engine.ErrInvalidCost) || r != nil {
			t.Errorf("ReserveN(%d) = %v, %v; want ErrInvalidCost", n, r, err)
		}
		if err := lim.WaitN(t.Context(), "k", n); !errors.Is(err, engine.ErrInvalidCost) {
			t.Errorf("WaitN(%d) = %v; want ErrInvalidCost", n, err)
		}
	}
	//lint:ignore SA1012 a nil context is the input under test
	if err := lim.WaitN(nil, "k", 1); !errors.Is(err, engine.ErrNilContext) { //nolint:staticcheck
		t.Errorf("WaitN(nil ctx) = %v; want ErrNilContext", err)
	}
	if _, err := lim.ReserveNAt("k", 1, -1); !errors.Is(err, engine.ErrInvalidInstant) {
		t.Errorf("ReserveNAt(-1) = %v; want ErrInvalidInstant", err)
	}
	// Nothing was reserved: the whole limit is there.
	if d, err := lim.AllowN("k", 3); err != nil || !d.Allowed {
		t.Errorf("AllowN(3) after bad input = %+v, %v; want allowed", d, err)
	}
	c, err := engine.New(engine.Policy{Limit: 3, Window: time.Hour, Algorithm: engine.SlidingCounter})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := c.Reserve("k"); !errors.Is(err, engine.ErrNotReservable) {
		t.Errorf("counter Reserve = %v; want ErrNotReservable", err)
	}
	if err := c.Wait(t.Context(), "k"); !errors.Is(err, engine.ErrNotReservable) {
		t.Errorf("counter Wait = %v; want ErrNotReservable", err)
	}
}

// A group reserves at the earliest instant every limit fits, all or
// nothing, and a cancel gives the slot back to every limit.
func TestGroupReserve(t *testing.T) {
	s := int64(time.Second)
	g, err := engine.NewGroup([]engine.Policy{
		{Name: "short", Limit: 2, Window: 10 * time.Second},
		{Name: "long", Limit: 3, Window: 30 * time.Second},
	}, engine.WithSweepInterval(0))
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	keys := []string{"u", "u"}
	want := []int64{0, 0, 10 * s, 30 * s, 30 * s, 40 * s, 60 * s}
	var rs []*engine.Reservation
	for i, w := range want {
		r, err := g.ReserveNAt(keys, 1, 0)
		if err != nil || r.At() != w {
			t.Fatalf("reservation %d: %v, %v; want the slot at %v", i, r, err, time.Duration(w))
		}
		rs = append(rs, r)
	}
	// Each limit holds the slots: an allow on the long limit alone, via a
	// group of one of its keys, is refused until the newest slot.
	if gd, err := g.AllowNAt(keys, 1, 5*s); err != nil || gd.Allowed {
		t.Fatalf("group allow with waiters: %+v, %v; want refused", gd, err)
	}
	// Cancel the newest: the next reservation takes its slot.
	if !rs[6].CancelAt(s) {
		t.Fatal("cancel of the newest slot failed")
	}
	if r, err := g.ReserveNAt(keys, 1, 2*s); err != nil || r.At() != 60*s {
		t.Fatalf("after the pop: %v, %v; want 60 s", r, err)
	}
	// Bad input reserves nothing.
	if _, err := g.ReserveNAt([]string{"u"}, 1, 3*s); !errors.Is(err, engine.ErrInvalidKeys) {
		t.Fatalf("one key for two policies: %v", err)
	}
	if _, err := g.ReserveNAt(keys, 3, 3*s); !errors.Is(err, engine.ErrInvalidCost) {
		t.Fatalf("cost above the smallest limit: %v", err)
	}
	//lint:ignore SA1012 a nil context is the input under test
	if err := g.WaitN(nil, keys, 1); !errors.Is(err, engine.ErrNilContext) { //nolint:staticcheck
		t.Fatalf("nil ctx: %v", err)
	}
}

// A group of limiters shares their logs: a reservation through the group
// counts in each limiter, and a limiter's own Allow is refused while the
// group's slot is pending.
func TestGroupOfReserve(t *testing.T) {
	clk := engine.NewManualClock()
	a, _ := engine.New(engine.Policy{Limit: 1, Window: time.Second}, engine.WithClock(clk), engine.WithSweepInterval(0))
	b, _ := engine.New(engine.Policy{Limit: 1, Window: time.Minute}, engine.WithClock(clk), engine.WithSweepInterval(0))
	defer a.Close()
	defer b.Close()
	g, err := engine.NewGroupOf(b, a)
	if err != nil {
		t.Fatal(err)
	}
	if d := b.Allow("x"); !d.Allowed {
		t.Fatal(d)
	}
	r, err := g.Reserve([]string{"x", "x"})
	if err != nil || r.At() != int64(time.Minute) {
		t.Fatalf("group slot: %v, %v; want 1 m (b is full until then)", r, err)
	}
	clk.Set(30 * time.Second)
	if d := a.Allow("x"); d.Allowed || d.RetryAfter != 31*time.Second {
		t.Fatalf("a's Allow while the group's slot is pending: %+v; want refused for 31 s (one second after the slot)", d)
	}
	if !r.Cancel() {
		t.Fatal("cancel failed")
	}
	if d := a.Allow("x"); !d.Allowed {
		t.Fatalf("a's Allow after the cancel: %+v", d)
	}
}

// A cancel in the middle of a key's queue lets no later waiter go ahead of
// the earlier ones: A, B and C reserve, B cancels, and D's slot comes no
// earlier than C's. The room B gave back lies in the windows that held
// B's slot, those ending before B's slot + W: D uses it when it fits
// there after C, and otherwise it goes unused.
func TestReserveOrderAfterMidQueueCancel(t *testing.T) {
	s := int64(time.Second)
	for _, tc := range []struct {
		name   string
		limit  int
		sent   []int64 // allowed before the reservations
		wantAt []int64 // A's, B's and C's slots
		wantD  int64
	}{
		// One per 10 s: A at 0, B at 10, C at 20. B's room lies in the
		// windows ending before 20, all before C: D comes 10 s after C.
		{"room before the newest slot", 1, nil, []int64{0, 10 * s, 20 * s}, 30 * s},
		// Two per 10 s, sent at 0 and 5: A at 10, B at 15, C at 20 (with
		// B, D would come at 25); with B gone, D fits at 20 beside C.
		{"room at the newest slot", 2, []int64{0, 5 * s}, []int64{10 * s, 15 * s, 20 * s}, 20 * s},
	} {
		t.Run(tc.name, func(t *testing.T) {
			lim, err := engine.New(engine.Policy{Limit: tc.limit, Window: 10 * time.Second}, engine.WithSweepInterval(0))
			if err != nil {
				t.Fatal(err)
			}
			defer lim.Close()
			for _, at := range tc.sent {
				if d, err := lim.AllowNAt("k", 1, at); err != nil || !d.Allowed {
					t.Fatalf("Allow at %v: %+v, %v", time.Duration(at), d, err)
				}
			}
			now := max(0, tc.wantAt[0]-s)
			var rs []*engine.Reservation
			for i, want := range tc.wantAt {
				r, err := lim.ReserveNAt("k", 1, now)
				if err != nil || r.At() != want {
					t.Fatalf("reservation %c: %v, %v; want the slot at %v", 'A'+i, r, err, time.Duration(want))
				}
				rs = append(rs, r)
			}
			if !rs[1].CancelAt(now) {
				t.Fatal("B's cancel failed")
			}
			d, err := lim.ReserveNAt("k", 1, now)
			if err != nil {
				t.Fatal(err)
			}
			if d.At() < rs[2].At() {
				t.Fatalf("D's slot at %v is before C's at %v: D went ahead of a waiter that arrived first", time.Duration(d.At()), time.Duration(rs[2].At()))
			}
			if d.At() != tc.wantD {
				t.Fatalf("D's slot at %v, want %v", time.Duration(d.At()), time.Duration(tc.wantD))
			}
		})
	}
}

// A reservation is given back whatever the limit in force: one of cost 2
// made under a limit of 2 is cancelled after SetPolicy lowered it to 1,
// on a limiter and on a group, and its room is free again.
func TestCancelAfterLoweredLimit(t *testing.T) {
	s := int64(time.Second)
	p := engine.Policy{Limit: 2, Window: 10 * time.Second}
	clk := engine.NewManualClock()
	a, _ := engine.New(p, engine.WithClock(clk), engine.WithSweepInterval(0))
	b, _ := engine.New(p, engine.WithClock(clk), engine.WithSweepInterval(0))
	defer a.Close()
	defer b.Close()
	g, err := engine.NewGroupOf(a, b)
	if err != nil {
		t.Fatal(err)
	}
	if d, err := a.AllowNAt("k", 2, 0); err != nil || !d.Allowed {
		t.Fatalf("AllowN(2): %+v, %v", d, err)
	}
	r, err := a.ReserveNAt("k", 2, 0)
	if err != nil || r.At() != 10*s {
		t.Fatalf("ReserveN(2): %v, %v; want the slot at 10 s", r, err)
	}
	gr, err := g.ReserveNAt([]string{"g", "g"}, 2, 0)
	if err != nil || gr.At() != 0 {
		t.Fatalf("group ReserveN(2): %v, %v; want the slot at 0", gr, err)
	}
	gr2, err := g.ReserveNAt([]string{"g", "g"}, 2, 0)
	if err != nil || gr2.At() != 10*s {
		t.Fatalf("group ReserveN(2): %v, %v; want the slot at 10 s", gr2, err)
	}
	for _, l := range []*engine.Limiter{a, b} {
		if err := l.SetPolicy(engine.Policy{Limit: 1, Window: 10 * time.Second}); err != nil {
			t.Fatal(err)
		}
	}
	if !r.CancelAt(s) {
		t.Fatal("the cost-2 reservation was not given back under a limit of 1")
	}
	if !gr2.CancelAt(s) {
		t.Fatal("the group's cost-2 reservation was not given back under limits of 1")
	}
	// Only the entries at 0 are left: the next slot is when they leave.
	if r, err := a.ReserveNAt("k", 1, 2*s); err != nil || r.At() != 10*s {
		t.Fatalf("ReserveN(1) after the cancel: %v, %v; want the slot at 10 s", r, err)
	}
	if r, err := g.ReserveNAt([]string{"g", "g"}, 1, 2*s); err != nil || r.At() != 10*s {
		t.Fatalf("group ReserveN(1) after the cancel: %v, %v; want the slot at 10 s", r, err)
	}
}
