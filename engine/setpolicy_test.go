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

// The scenario: limit 10, 10 used; lowered to 5, nothing more is
// allowed; back to 10, nothing more in that window; a window later, 10.
func TestSetPolicyKeepsTheLog(t *testing.T) {
	for _, alg := range []engine.Algorithm{engine.SlidingLog, engine.SlidingCounter} {
		t.Run(alg.String(), func(t *testing.T) {
			const w = time.Minute
			clk := engine.NewManualClock()
			lim, err := engine.New(engine.Policy{Name: "p", Limit: 10, Window: w, Algorithm: alg}, engine.WithClock(clk))
			if err != nil {
				t.Fatal(err)
			}
			defer lim.Close()
			allowed := func(n int) int {
				t.Helper()
				got := 0
				for range n {
					clk.Advance(time.Millisecond)
					if d := lim.Allow("abuser"); d.Allowed {
						got++
					}
				}
				return got
			}
			if got := allowed(10); got != 10 {
				t.Fatalf("%d of the first 10 allowed", got)
			}
			if err := lim.SetPolicy(engine.Policy{Name: "p", Limit: 5, Window: w, Algorithm: alg}); err != nil {
				t.Fatal(err)
			}
			if got := allowed(10); got != 0 {
				t.Fatalf("after lowering the limit to 5: %d more allowed, want 0", got)
			}
			d := lim.Allow("abuser")
			if d.Allowed || d.Limit != 5 || d.Remaining != 0 || d.RetryAfter <= 0 {
				t.Fatalf("at limit 5: %+v", d)
			}
			if err := lim.SetPolicy(engine.Policy{Name: "p", Limit: 10, Window: w, Algorithm: alg}); err != nil {
				t.Fatal(err)
			}
			if got := allowed(10); got != 0 {
				t.Fatalf("back at limit 10: %d more allowed in the same window, want 0", got)
			}
			if p := lim.Policy(); p.Limit != 10 {
				t.Fatalf("Policy() = %+v", p)
			}
			// Two windows on, both algorithms have forgotten everything.
			clk.Advance(2 * w)
			if got := allowed(12); got != 10 {
				t.Fatalf("two windows later: %d of 12 allowed, want 10", got)
			}
		})
	}
}

// What a limiter cannot change in place is refused, and changes nothing.
func TestSetPolicyRefusesWhatItCannotKeep(t *testing.T) {
	log := engine.Policy{Limit: 3, Window: time.Hour}
	counter := engine.Policy{Limit: 3, Window: time.Hour, Algorithm: engine.SlidingCounter}
	long := engine.Policy{Limit: 3, Window: 48 * time.Hour}
	for _, c := range []struct {
		from, to engine.Policy
		want     error
	}{
		{log, counter, engine.ErrPolicyChange},
		{counter, log, engine.ErrPolicyChange},
		{counter, engine.Policy{Limit: 3, Window: time.Minute, Algorithm: engine.SlidingCounter}, engine.ErrPolicyChange},
		{log, long, engine.ErrPolicyChange},
		{log, engine.Policy{Limit: 0, Window: time.Hour}, engine.ErrInvalidPolicy},
		{log, engine.Policy{Limit: engine.MaxLogLimit + 1, Window: time.Hour}, engine.ErrInvalidPolicy},
	} {
		lim, err := engine.New(c.from, engine.WithSweepInterval(0))
		if err != nil {
			t.Fatal(err)
		}
		if err := lim.SetPolicy(c.to); !errors.Is(err, c.want) {
			t.Errorf("%+v to %+v: %v, want %v", c.from, c.to, err, c.want)
		}
		if p := lim.Policy(); p != c.from {
			t.Errorf("after a refused change: %+v, want %+v", p, c.from)
		}
		if d, _ := lim.AllowN("k", 3); !d.Allowed || d.Limit != 3 {
			t.Errorf("after a refused change: %+v", d)
		}
		lim.Close()
	}
	// A long window's limiter takes a short one and back (8-byte slots
	// hold any instant), and a rename is free.
	lim, err := engine.New(long, engine.WithSweepInterval(0))
	if err != nil {
		t.Fatal(err)
	}
	defer lim.Close()
	for _, p := range []engine.Policy{{Name: "x", Limit: 3, Window: time.Second}, long} {
		if err := lim.SetPolicy(p); err != nil {
			t.Errorf("%+v: %v", p, err)
		}
	}
	// A cost above a lowered limit is an error, as it is for New's.
	if err := lim.SetPolicy(engine.Policy{Limit: 2, Window: time.Hour}); err != nil {
		t.Fatal(err)
	}
	if _, err := lim.AllowN("k", 3); !errors.Is(err, engine.ErrInvalidCost) {
		t.Errorf("cost 3 at limit 2: %v", err)
	}
}

// varLog is the log with the policy changing between decisions, as
// SetPolicy documents it: a decision counts the logged entries live under
// the window in force; an accept drops the entries that expired under it
// and appends; a sweep drops the keys whose entries all expired under it.
type varLog struct {
	keys map[string][]int64
}

func (m *varLog) decide(key string, n int, t int64, p engine.Policy) reference.Result {
	w := int64(p.Window)
	q := m.keys[key]
	j := 0
	for j < len(q) && q[j] <= t-w {
		j++
	}
	live := q[j:]
	var r reference.Result
	if len(live)+n <= p.Limit {
		r.Allowed = true
		live = append(live[:len(live):len(live)], make([]int64, n)...)
		for i := range n {
			live[len(live)-n+i] = t
		}
		m.keys[key] = live
		r.Remaining = p.Limit - len(live)
	} else {
		r.RetryAfter = live[len(live)+n-p.Limit-1] + w - t
		r.Remaining = max(p.Limit-len(live), 0)
	}
	if len(live) > 0 {
		r.Reset = live[0] + w - t
	}
	return r
}

func (m *varLog) sweep(t int64, p engine.Policy) {
	for k, q := range m.keys {
		if len(q) == 0 || q[len(q)-1] <= t-int64(p.Window) {
			delete(m.keys, k)
		}
	}
}

// Random traces with the policy changed now and then (the log: its limit
// and its window, shorter and longer; the counter: its limit) and sweeps
// in between replay exactly through the models.
func TestSetPolicyMatchesReference(t *testing.T) {
	for _, alg := range []engine.Algorithm{engine.SlidingLog, engine.SlidingCounter} {
		for seed := range uint64(40) {
			t.Run(fmt.Sprintf("%v/seed=%d", alg, seed), func(t *testing.T) {
				setPolicyTrace(t, alg, seed)
			})
		}
	}
}

func setPolicyTrace(t *testing.T, alg engine.Algorithm, seed uint64) {
	r := rand.New(rand.NewPCG(seed, 28))
	windows := []time.Duration{10, 25, 40, 100}
	policy := func() engine.Policy {
		p := engine.Policy{Limit: 1 + r.IntN(8), Window: windows[r.IntN(len(windows))], Algorithm: alg}
		if alg == engine.SlidingCounter {
			p.Window = windows[0]
		}
		return p
	}
	p := policy()
	clk := engine.NewManualClock()
	lim, err := engine.New(p, engine.WithSweepInterval(0), engine.WithShards(2), engine.WithClock(clk))
	if err != nil {
		t.Fatal(err)
	}
	defer lim.Close()
	logModel := &varLog{keys: map[string][]int64{}}
	counter := reference.NewCounter(p.Limit, int64(p.Window))
	keys := []string{"a", "b", "", "c", string(make([]byte, 2*engine.LongKeyBytes))}
	var now int64
	for i := range 3000 {
		switch x := r.IntN(100); {
		case x < 3:
			// Decisions after SetPolicy are made no earlier than the
			// clock's reading in it: the trace's instant.
			clk.Set(time.Duration(now))
			p = policy()
			if err := lim.SetPolicy(p); err != nil {
				t.Fatalf("step %d: SetPolicy(%+v): %v", i, p, err)
			}
			counter.Limit = p.Limit
			continue
		case x < 6:
			lim.SweepAt(now)
			logModel.sweep(now, p)
			continue
		}
		now += int64(r.IntN(6))
		key := keys[r.IntN(len(keys))]
		n := 1 + r.IntN(p.Limit)
		d, err := lim.AllowNAt(key, n, now)
		if err != nil {
			t.Fatalf("step %d: %v", i, err)
		}
		var want reference.Result
		if alg == engine.SlidingLog {
			want = logModel.decide(key, n, d.At, p)
		} else {
			want = counter.Decide(key, n, d.At)
		}
		got := reference.Result{Allowed: d.Allowed, Remaining: d.Remaining, RetryAfter: int64(d.RetryAfter), Reset: int64(d.Reset)}
		if d.At != now || d.Limit != p.Limit || got != want {
			t.Fatalf("step %d: key %q cost %d at %d under %+v: got %+v (At %d, Limit %d), want %+v",
				i, key, n, now, p, got, d.At, d.Limit, want)
		}
	}
}
