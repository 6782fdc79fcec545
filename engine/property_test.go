package engine_test

import (
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/slidegate/slidegate/engine"
	"github.com/slidegate/slidegate/internal/backendtest"
	"github.com/slidegate/slidegate/internal/reference"
)

// sweeps draws, for each of steps decisions, whether the limiter sweeps
// before it: one in every (on average).
func sweeps(r *rand.Rand, steps, every int) []bool {
	out := make([]bool, steps)
	for i := range out {
		out[i] = r.IntN(every) == 0
	}
	return out
}

// replayAgainst runs ops through a limiter and a reference model and
// fails on the first field that differs; the limiter sweeps before op i
// when sweep[i] (nil: never).
func replayAgainst(t *testing.T, p engine.Policy, model reference.Model, ops []backendtest.TraceOp, sweep []bool) []engine.Decision {
	t.Helper()
	lim, err := engine.New(p, engine.WithClock(engine.NewManualClock()), engine.WithSweepInterval(0), engine.WithShards(4))
	if err != nil {
		t.Fatal(err)
	}
	defer lim.Close()
	out := make([]engine.Decision, 0, len(ops))
	for i, o := range ops {
		now := o.At
		if sweep != nil && sweep[i] {
			lim.SweepAt(now)
		}
		d, err := lim.AllowNAt(o.Key, o.N, now)
		if err != nil {
			t.Fatalf("op %d: %v", i, err)
		}
		if d.At != now {
			t.Fatalf("op %d: At %d, want %d", i, d.At, now)
		}
		if model != nil {
			want := model.Decide(o.Key, o.N, now)
			got := reference.Result{Allowed: d.Allowed, Remaining: d.Remaining, RetryAfter: int64(d.RetryAfter), Reset: int64(d.Reset)}
			if got != want || d.Limit != p.Limit {
				t.Fatalf("op %d (key %s, n %d, t %d): engine %+v, reference %+v", i, o.Key, o.N, now, d, want)
			}
		}
		out = append(out, d)
	}
	return out
}

func TestLogMatchesReference(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	policies := []engine.Policy{
		{Limit: 1, Window: 10},
		{Limit: 2, Window: time.Minute},
		{Limit: 5, Window: 1000},
		{Limit: 7, Window: 333},
		{Limit: 100, Window: time.Second},
	}
	for _, p := range policies {
		for trial := range 20 {
			ops := backendtest.RandomTrace(r, p.Limit, int64(p.Window), 2000, 1+r.IntN(20), false)
			sweep := sweeps(r, len(ops), 50)
			t.Run(fmt.Sprintf("L%d_W%d_%d", p.Limit, p.Window, trial), func(t *testing.T) {
				replayAgainst(t, p, reference.NewLog(p.Limit, int64(p.Window)), ops, sweep)
			})
		}
	}
}

// Sweeping never changes a decision: the same trace with and without
// sweeps gives identical decisions.
func TestSweepingChangesNoDecision(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	for _, alg := range []engine.Algorithm{engine.SlidingLog, engine.SlidingCounter} {
		p := engine.Policy{Limit: 4, Window: 1000, Algorithm: alg}
		for trial := range 20 {
			ops := backendtest.RandomTrace(r, p.Limit, int64(p.Window), 3000, 30, false)
			sweep := sweeps(r, len(ops), 5) // sweep a lot
			with := replayAgainst(t, p, nil, ops, sweep)
			without := replayAgainst(t, p, nil, ops, nil)
			for i := range with {
				if with[i] != without[i] {
					t.Fatalf("%v trial %d op %d: with sweeps %+v, without %+v", alg, trial, i, with[i], without[i])
				}
			}
		}
	}
}

// The guarantee, checked on the engine's own output: at no instant more
// than L accepted in any window of length W, and no refusal while the
// request would have fitted.
func TestNeverOverNeverUnder(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 6))
	p := engine.Policy{Limit: 3, Window: 100}
	ops := backendtest.RandomTrace(r, p.Limit, int64(p.Window), 20000, 5, false)
	ds := replayAgainst(t, p, nil, ops, sweeps(r, len(ops), 50))
	recs := make([]reference.Record, len(ds))
	for i, d := range ds {
		recs[i] = record(ops[i].Key, ops[i].N, d)
	}
	rep := reference.VerifyLog(p.Limit, int64(p.Window), recs)
	if !rep.OK() || rep.Decisions != len(ops) {
		t.Fatalf("%+v", rep)
	}
}

func record(key string, n int, d engine.Decision) reference.Record {
	return reference.Record{
		Key: key, Cost: n, At: d.At, Allowed: d.Allowed, Remaining: d.Remaining,
		RetryAfter: int64(d.RetryAfter), Reset: int64(d.Reset),
	}
}

// RetryAfter is exact: waiting exactly that long makes the same request
// fit, and one nanosecond less does not (when nothing else happens).
func TestRetryAfterIsExact(t *testing.T) {
	r := rand.New(rand.NewPCG(7, 8))
	for _, alg := range []engine.Algorithm{engine.SlidingLog, engine.SlidingCounter} {
		p := engine.Policy{Limit: 6, Window: 1000, Algorithm: alg}
		checked := 0
		for trial := 0; trial < 300; trial++ {
			lim, err := engine.New(p, engine.WithClock(engine.NewManualClock()), engine.WithSweepInterval(0))
			if err != nil {
				t.Fatal(err)
			}
			var now int64
			for range 20 {
				now += r.Int64N(200)
				lim.AllowNAt("k", 1+r.IntN(3), now)
			}
			n := 1 + r.IntN(p.Limit)
			d, _ := lim.AllowNAt("k", n, now)
			if d.Allowed {
				lim.Close()
				continue
			}
			checked++
			if d.RetryAfter <= 0 {
				t.Fatalf("%v: refusal with RetryAfter %v", alg, d.RetryAfter)
			}
			// Probe without disturbing: a refusal changes nothing, so ask
			// at the instant one nanosecond early first.
			early, _ := lim.AllowNAt("k", n, now+int64(d.RetryAfter)-1)
			if early.Allowed {
				t.Fatalf("%v: allowed 1 ns before RetryAfter %v (%+v)", alg, d.RetryAfter, early)
			}
			on, _ := lim.AllowNAt("k", n, now+int64(d.RetryAfter))
			if !on.Allowed {
				t.Fatalf("%v: refused exactly at RetryAfter %v: %+v", alg, d.RetryAfter, on)
			}
			lim.Close()
		}
		if checked < 50 {
			t.Fatalf("%v: only %d refusals checked", alg, checked)
		}
	}
}
