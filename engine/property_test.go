package engine_test

import (
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/slidegate/slidegate/engine"
	"github.com/slidegate/slidegate/internal/reference"
)

// op is one step of a random trace.
type op struct {
	key   string
	n     int
	dt    int64 // advance the clock by dt before deciding
	sweep bool  // sweep before deciding
}

// randomTrace draws a trace that hits what breaks limiters: equal instants
// (dt = 0), jumps of exactly W and one nanosecond around it, costs above
// 1 and up to the limit, and many keys.
func randomTrace(r *rand.Rand, limit int, window int64, steps, keys int) []op {
	ops := make([]op, steps)
	for i := range ops {
		var dt int64
		switch r.IntN(8) {
		case 0, 1:
			dt = 0 // same instant
		case 2:
			dt = window
		case 3:
			dt = window - 1
		case 4:
			dt = 1
		default:
			dt = r.Int64N(window/int64(limit) + 1)
		}
		n := 1
		if r.IntN(4) == 0 {
			n = 1 + r.IntN(limit)
		}
		ops[i] = op{
			key:   fmt.Sprintf("k%d", r.IntN(keys)),
			n:     n,
			dt:    dt,
			sweep: r.IntN(50) == 0,
		}
	}
	return ops
}

// replayAgainst runs ops through a limiter and a reference model and
// fails on the first field that differs.
func replayAgainst(t *testing.T, p engine.Policy, model reference.Model, ops []op, sweeps bool) []engine.Decision {
	t.Helper()
	lim, err := engine.New(p, engine.WithClock(engine.NewManualClock()), engine.WithSweepInterval(0), engine.WithShards(4))
	if err != nil {
		t.Fatal(err)
	}
	defer lim.Close()
	var now int64
	out := make([]engine.Decision, 0, len(ops))
	for i, o := range ops {
		now += o.dt
		if sweeps && o.sweep {
			lim.SweepAt(now)
		}
		d, err := lim.AllowNAt(o.key, o.n, now)
		if err != nil {
			t.Fatalf("op %d: %v", i, err)
		}
		if d.At != now {
			t.Fatalf("op %d: At %d, want %d", i, d.At, now)
		}
		if model != nil {
			want := model.Decide(o.key, o.n, now)
			got := reference.Result{Allowed: d.Allowed, Remaining: d.Remaining, RetryAfter: int64(d.RetryAfter), Reset: int64(d.Reset)}
			if got != want || d.Limit != p.Limit {
				t.Fatalf("op %d (key %s, n %d, t %d): engine %+v, reference %+v", i, o.key, o.n, now, d, want)
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
			ops := randomTrace(r, p.Limit, int64(p.Window), 2000, 1+r.IntN(20))
			t.Run(fmt.Sprintf("L%d_W%d_%d", p.Limit, p.Window, trial), func(t *testing.T) {
				replayAgainst(t, p, reference.NewLog(p.Limit, int64(p.Window)), ops, true)
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
			ops := randomTrace(r, p.Limit, int64(p.Window), 3000, 30)
			for i := range ops {
				ops[i].sweep = r.IntN(5) == 0 // sweep a lot
			}
			with := replayAgainst(t, p, nil, ops, true)
			without := replayAgainst(t, p, nil, ops, false)
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
	ops := randomTrace(r, p.Limit, int64(p.Window), 20000, 5)
	ds := replayAgainst(t, p, nil, ops, true)
	recs := make([]reference.Record, len(ds))
	for i, d := range ds {
		recs[i] = record(ops[i].key, ops[i].n, d)
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
