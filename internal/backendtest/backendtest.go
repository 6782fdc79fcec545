// Package backendtest is the conformance suite every slidegate backend
// runs: the same step tables, random traces against the plain reference
// model, parallel replay and bad input, for the in-memory engine (log and
// counter), the multi-limit group and the Redis backend (standalone and
// cluster). A new backend is checked by calling Run (and RunGroup, if it
// decides several limits at once) from its tests.
package backendtest

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/slidegate/slidegate/engine"
	"github.com/slidegate/slidegate/internal/reference"
)

// Factory returns a fresh backend for policy p that reads clk, with no
// state from earlier calls (a fresh key prefix, a flushed database). The
// test closes it.
type Factory func(t *testing.T, p engine.Policy, clk engine.Clock) engine.Backend

// Sizes bounds the suite's work, so that a remote backend (a network round
// trip per decision) can run it in a few seconds. The zero value picks
// sizes for the in-memory engine.
type Sizes struct {
	Traces     int // random traces per algorithm
	TraceSteps int // decisions per trace
	Goroutines int // parallel replay
	PerG       int // decisions per goroutine in the parallel replay
	// Resolution is the backend's instant resolution (0: 1 ns, the
	// engine's). A remote backend that keeps instants on a coarser grid
	// (Redis: 1 µs) is stepped at that resolution where the step tables
	// step "one nanosecond before" a boundary, and its counter's
	// RetryAfter is compared with the model's rounded up to the grid (the
	// least wait in nanoseconds may fall between two grid instants).
	Resolution time.Duration
	// SharedCost: the backend decides a GroupRequest with Costs at the
	// largest of them for every ref (a server that takes one cost per
	// request), not at each ref's own.
	SharedCost bool
}

func (s Sizes) withDefaults() Sizes {
	if s.Traces == 0 {
		s.Traces = 12
	}
	if s.TraceSteps == 0 {
		s.TraceSteps = 2000
	}
	if s.Goroutines == 0 {
		s.Goroutines = 8
	}
	if s.PerG == 0 {
		s.PerG = 1000
	}
	if s.Resolution <= 0 {
		s.Resolution = time.Nanosecond
	}
	return s
}

// Run runs the single-limit suite against backends from f, for the
// algorithms given (engine.SlidingLog, engine.SlidingCounter).
func Run(t *testing.T, f Factory, sizes Sizes, algs ...engine.Algorithm) {
	sizes = sizes.withDefaults()
	for _, alg := range algs {
		t.Run(alg.String(), func(t *testing.T) {
			if alg == engine.SlidingLog {
				t.Run("Steps", func(t *testing.T) { steps(t, f, sizes.Resolution) })
			}
			t.Run("Traces", func(t *testing.T) { traces(t, f, alg, sizes) })
			t.Run("ParallelReplay", func(t *testing.T) { parallelReplay(t, f, alg, sizes) })
			t.Run("BadInput", func(t *testing.T) { badInput(t, f, alg) })
		})
	}
}

// step is one row of a step table.
type step struct {
	at      time.Duration
	key     string
	n       int
	allowed bool
	rem     int
	retry   time.Duration
	reset   time.Duration
	why     string
}

func (s step) instant() time.Duration { return s.at }

// stepThrough runs a step table: it makes a backend on a manual clock
// (mk), and calls do for each row with the clock at the row's instant.
func stepThrough[S interface{ instant() time.Duration }, B interface{ Close() error }](mk func(engine.Clock) B, rows []S, do func(b B, i int, s S)) {
	clk := engine.NewManualClock()
	b := mk(clk)
	defer b.Close()
	for i, s := range rows {
		clk.Set(s.instant())
		do(b, i, s)
	}
}

func runSteps(t *testing.T, f Factory, p engine.Policy, rows []step) {
	t.Helper()
	stepThrough(func(clk engine.Clock) engine.Backend { return f(t, p, clk) }, rows, func(b engine.Backend, i int, s step) {
		key := s.key
		if key == "" {
			key = "k"
		}
		d, err := b.Decide(context.Background(), key, s.n)
		if err != nil {
			t.Fatalf("step %d (%s): %v", i, s.why, err)
		}
		want := engine.Decision{Allowed: s.allowed, Limit: p.Limit, Remaining: s.rem, RetryAfter: s.retry, Reset: s.reset, At: int64(s.at)}
		if d != want {
			t.Errorf("step %d at %v (%s):\n got  %+v\n want %+v", i, s.at, s.why, d, want)
		}
	})
}

func allow(at time.Duration, n, rem int, reset time.Duration, why string) step {
	return step{at: at, n: n, allowed: true, rem: rem, reset: reset, why: why}
}

func refuse(at time.Duration, n, rem int, retry, reset time.Duration, why string) step {
	return step{at: at, n: n, rem: rem, retry: retry, reset: reset, why: why}
}

// steps: the boundary traces every log backend must get right
// (docs/semantics.md): the two-per-minute trace, five per minute at the
// exact boundary and one nanosecond before it, and the worked traces.
func steps(t *testing.T, f Factory, ns time.Duration) {
	const s = time.Second
	t.Run("TwoPerMinute", func(t *testing.T) {
		runSteps(t, f, engine.Policy{Limit: 2, Window: time.Minute}, []step{
			allow(0, 1, 1, 60*s, "empty log"),
			allow(1*s, 1, 0, 59*s, "second slot"),
			refuse(2*s, 1, 0, 58*s, 58*s, "full: the entry at 0 frees the slot at 60"),
			allow(60*s, 1, 0, 1*s, "the entry at 0 expired exactly W later: (0, 60]"),
			refuse(60*s, 1, 0, 1*s, 1*s, "the refusal at 2 was not logged; 1 and 60 are live"),
			allow(61*s, 1, 0, 59*s, "the entry at 1 expired"),
		})
	})
	t.Run("FivePerMinuteBoundary", func(t *testing.T) {
		runSteps(t, f, engine.Policy{Limit: 5, Window: time.Minute}, []step{
			allow(0, 1, 4, 60*s, "first"),
			allow(10*s, 1, 3, 50*s, ""),
			allow(20*s, 1, 2, 40*s, ""),
			allow(30*s, 1, 1, 30*s, ""),
			allow(40*s, 1, 0, 20*s, "fifth: full"),
			refuse(50*s, 1, 0, 10*s, 10*s, "refused, not logged"),
			refuse(60*s-ns, 1, 0, ns, ns, "one nanosecond before the entry at 0 expires"),
			allow(60*s, 1, 0, 10*s, "exactly W after the oldest: it has expired"),
			refuse(60*s, 1, 0, 10*s, 10*s, "same instant again: full"),
			refuse(70*s-ns, 1, 0, ns, ns, ""),
			allow(70*s, 1, 0, 10*s, "the entry at 10 s expired; refusals at 50 s and 60 s did not prolong anything"),
		})
	})
	t.Run("WorkedTraceOne", func(t *testing.T) {
		runSteps(t, f, engine.Policy{Limit: 3, Window: 10 * s}, []step{
			allow(0, 1, 2, 10*s, ""),
			allow(4*s, 1, 1, 6*s, ""),
			allow(4*s, 1, 0, 6*s, ""),
			refuse(10*s-ns, 1, 0, ns, ns, "one nanosecond before the entry at 0 expires"),
			allow(10*s, 1, 0, 4*s, "the entry at 0 expired exactly W later"),
			refuse(13*s, 1, 0, 1*s, 1*s, ""),
			allow(14*s, 1, 1, 6*s, "both entries at 4 s expired; the refusals left nothing"),
		})
	})
	t.Run("WorkedTraceTwoCostsAboveOne", func(t *testing.T) {
		runSteps(t, f, engine.Policy{Limit: 10, Window: 10 * s}, []step{
			allow(0, 4, 6, 10*s, "4 entries at 0"),
			allow(2*s, 5, 1, 8*s, "9 live"),
			refuse(3*s, 3, 1, 7*s, 7*s, "needs 2 to expire: the 2nd oldest live (at 0) frees at 10 s"),
			allow(3*s, 1, 0, 7*s, "1 fits"),
			refuse(10*s, 10, 4, 3*s, 2*s, "6 live (2 s ×5, 3 s), needs all: the last (3 s) frees at 13 s"),
			allow(10*s, 4, 0, 2*s, "4 fit"),
			refuse(13*s, 10, 6, 7*s, 7*s, "4 live at 10 s"),
			allow(20*s, 10, 0, 10*s, "everything expired exactly at 20 s"),
			{at: 20 * s, key: "other", n: 10, allowed: true, reset: 10 * s, why: "keys are independent"},
		})
	})
}

// TraceOp is one decision of a random trace: N for Key at instant At.
type TraceOp struct {
	Key string
	N   int
	At  int64
}

// RandomTrace draws steps decisions over keys keys ("k0", "k1", …), from
// the instant 1 s on, that hit what breaks limiters: equal instants, jumps
// of exactly W and one nanosecond either side, costs above 1 up to the
// limit, and, with stepBack, now and then the clock stepping back (the
// backend must decide at the key's latest instant instead).
func RandomTrace(r *rand.Rand, limit int, window int64, steps, keys int, stepBack bool) []TraceOp {
	ops := make([]TraceOp, steps)
	kinds := 8
	if stepBack {
		kinds = 9
	}
	var now int64 = 1_000_000_000
	for i := range ops {
		switch k := r.IntN(kinds); {
		case k <= 1: // same instant
		case k == 2:
			now += window
		case k == 3:
			now += window - 1
		case k == 4:
			now++
		case k == 5 && stepBack:
			now -= min(now, r.Int64N(window)) // the clock steps back
		default:
			now += r.Int64N(window/int64(limit) + 1)
		}
		n := 1
		if r.IntN(4) == 0 {
			n = 1 + r.IntN(limit)
		}
		ops[i] = TraceOp{Key: fmt.Sprintf("k%d", r.IntN(keys)), N: n, At: now}
	}
	return ops
}

func traces(t *testing.T, f Factory, alg engine.Algorithm, sizes Sizes) {
	r := rand.New(rand.NewPCG(uint64(alg), 17))
	for trial := range sizes.Traces {
		limit := 1 + r.IntN(6)
		// Windows from 1 ms to a minute: remote backends keep instants at a
		// coarser resolution than 1 ns, so windows and steps are whole
		// milliseconds there; see Factory.
		window := time.Duration(1+r.IntN(60_000)) * time.Millisecond
		p := engine.Policy{Limit: limit, Window: window, Algorithm: alg}
		ops := RandomTrace(r, limit, int64(window), sizes.TraceSteps, 8, true)
		for i := range ops {
			ops[i].At -= ops[i].At % int64(time.Millisecond)
		}
		t.Run(fmt.Sprintf("%d_L%d_W%v", trial, limit, window), func(t *testing.T) {
			clk := engine.NewManualClock()
			b := f(t, p, clk)
			defer b.Close()
			var recs []reference.Record
			last := map[string]int64{}
			for i, o := range ops {
				clk.Set(time.Duration(o.At))
				d, err := b.Decide(context.Background(), o.Key, o.N)
				if err != nil {
					t.Fatalf("op %d: %v", i, err)
				}
				if want := max(o.At, last[o.Key]); d.At != want {
					t.Fatalf("op %d key %s: At %d, want %d (the clock read %d; the key's last instant %d)", i, o.Key, d.At, want, o.At, last[o.Key])
				}
				last[o.Key] = d.At
				recs = append(recs, Record(o.Key, o.N, d))
			}
			verify(t, p, recs, sizes.Resolution)
		})
	}
}

// Record turns a decision into a reference record.
func Record(key string, n int, d engine.Decision) reference.Record {
	return reference.Record{Key: key, Cost: n, At: d.At, Allowed: d.Allowed, Remaining: d.Remaining,
		RetryAfter: int64(d.RetryAfter), Reset: int64(d.Reset)}
}

func verify(t *testing.T, p engine.Policy, recs []reference.Record, res time.Duration) {
	t.Helper()
	var rep reference.Report
	switch {
	case p.Algorithm == engine.SlidingCounter && res > time.Nanosecond:
		// The model's RetryAfter rounded up to the backend's grid: replay
		// as a group of one limit through the rounding model.
		grecs := make([]reference.GroupRecord, len(recs))
		for i, r := range recs {
			grecs[i] = reference.GroupRecord{Keys: []string{r.Key}, Cost: r.Cost, At: r.At, Allowed: r.Allowed,
				Limits: []reference.Result{{Allowed: r.Allowed, Remaining: r.Remaining, RetryAfter: r.RetryAfter, Reset: r.Reset}}}
		}
		rep = reference.VerifyGroup([]reference.Model{model(p, res)}, []int{p.Limit}, []int64{int64(p.Window)}, []bool{false}, grecs)
	case p.Algorithm == engine.SlidingLog:
		rep = reference.VerifyLog(p.Limit, int64(p.Window), recs)
	default:
		rep = reference.VerifyCounter(p.Limit, int64(p.Window), recs)
	}
	if rep.Decisions != len(recs) {
		t.Fatalf("verified %d decisions of %d", rep.Decisions, len(recs))
	}
	if !rep.OK() {
		t.Fatalf("%+v: %d mismatches, %d over-admissions, %d under-admissions; e.g.\n%s",
			p, rep.Mismatches, rep.OverAdmissions, rep.UnderAdmissions, strings.Join(rep.Examples, "\n"))
	}
	if rep.Allowed == 0 || rep.Refused == 0 {
		t.Fatalf("%+v: the run did not exercise both outcomes: %d allowed, %d refused", p, rep.Allowed, rep.Refused)
	}
}

// Loop calls f over and over on a goroutine of its own (background work
// such as sweeps or a moving clock, in a tight loop) until the returned
// stop is called; stop waits for the goroutine to end.
func Loop(f func()) (stop func()) {
	quit, done := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		for {
			select {
			case <-quit:
				return
			default:
				f()
			}
		}
	}()
	return func() { close(quit); <-done }
}

// parallelReplay: goroutines decide on three keys while another goroutine
// moves the clock; every decision replays exactly through the reference.
func parallelReplay(t *testing.T, f Factory, alg engine.Algorithm, sizes Sizes) {
	p := engine.Policy{Limit: 5, Window: 20 * time.Millisecond, Algorithm: alg}
	clk := engine.NewManualClock()
	clk.Set(time.Second)
	b := f(t, p, clk)
	defer b.Close()
	stopClock := Loop(func() {
		clk.Advance(time.Millisecond)
		time.Sleep(50 * time.Microsecond)
	})
	recs := make([][]reference.Record, sizes.Goroutines)
	var wg sync.WaitGroup
	for g := range recs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := rand.New(rand.NewPCG(uint64(g), 5))
			for range sizes.PerG {
				key := fmt.Sprintf("key-%d", r.IntN(3))
				n := 1 + r.IntN(3)
				d, err := b.Decide(context.Background(), key, n)
				if err != nil {
					t.Errorf("Decide: %v", err)
					return
				}
				recs[g] = append(recs[g], Record(key, n, d))
			}
		}()
	}
	wg.Wait()
	stopClock()
	var all []reference.Record
	for _, rs := range recs {
		all = append(all, rs...)
	}
	verify(t, p, all, sizes.Resolution)
}

// badInput: costs outside 1..L are errors that change nothing.
func badInput(t *testing.T, f Factory, alg engine.Algorithm) {
	p := engine.Policy{Limit: 3, Window: time.Minute, Algorithm: alg}
	clk := engine.NewManualClock()
	b := f(t, p, clk)
	defer b.Close()
	ctx := context.Background()
	for _, n := range []int{0, -1, 4, math.MaxInt} {
		if _, err := b.Decide(ctx, "k", n); !errors.Is(err, engine.ErrInvalidCost) {
			t.Errorf("cost %d: %v, want ErrInvalidCost", n, err)
		}
	}
	d, err := b.Decide(ctx, "k", 3)
	if err != nil || !d.Allowed || d.Remaining != 0 {
		t.Fatalf("the full limit after bad costs: %+v, %v (a bad cost was charged)", d, err)
	}
}

// model returns the reference model of p for a backend of resolution res:
// the plain log or counter, the counter's RetryAfter rounded up to res.
func model(p engine.Policy, res time.Duration) reference.Model {
	if p.Algorithm == engine.SlidingLog {
		return reference.NewLog(p.Limit, int64(p.Window))
	}
	m := reference.NewCounter(p.Limit, int64(p.Window))
	if res <= time.Nanosecond {
		return m
	}
	return roundedRetry{m, int64(res)}
}

// roundedRetry is a model whose RetryAfter is rounded up to a multiple of
// res.
type roundedRetry struct {
	reference.Model
	res int64
}

func (m roundedRetry) round(r reference.Result) reference.Result {
	if rem := r.RetryAfter % m.res; rem != 0 {
		r.RetryAfter += m.res - rem
	}
	return r
}

func (m roundedRetry) Decide(key string, n int, t int64) reference.Result {
	return m.round(m.Model.Decide(key, n, t))
}

func (m roundedRetry) Peek(key string, n int, t int64) reference.Result {
	return m.round(m.Model.Peek(key, n, t))
}
