package engine_test

// Tests of the sliding window counter (engine.SlidingCounter): the
// textbook worked examples (L = 100, W = 60 s) as step tables, every Decision field against the exact
// rational reference model on random traces, its invariants (at most 2L − 1
// in any trailing window, no refusal with an empty previous window), a
// parallel replay under the race detector, and sweeps that change nothing.
// Identifiers are prefixed ctr so that they never collide with the log's
// tests in this package.

import (
	"fmt"
	"math/rand/v2"
	"runtime"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/slidegate/slidegate/engine"
	"github.com/slidegate/slidegate/internal/reference"
)

// ctrStep is one request of a counter step table: at instant at, key asks
// for cost n (0 means 1) and gets want (Limit and At are filled in).
type ctrStep struct {
	at   time.Duration
	key  string
	n    int
	want engine.Decision
	note string
}

func ctrAllow(rem int, reset time.Duration) engine.Decision {
	return engine.Decision{Allowed: true, Remaining: rem, Reset: reset}
}

func ctrRefuse(rem int, retry, reset time.Duration) engine.Decision {
	return engine.Decision{Remaining: rem, RetryAfter: retry, Reset: reset}
}

// ctrRun drives a counter limiter of limit and window with a manual clock
// through steps, checking every field of every decision.
func ctrRun(t *testing.T, limit int, window time.Duration, steps []ctrStep) {
	t.Helper()
	clk := engine.NewManualClock()
	lim, err := engine.New(engine.Policy{Limit: limit, Window: window, Algorithm: engine.SlidingCounter},
		engine.WithClock(clk), engine.WithSweepInterval(0))
	if err != nil {
		t.Fatal(err)
	}
	defer lim.Close()
	for i, st := range steps {
		clk.Set(st.at)
		n := max(st.n, 1)
		key := st.key
		if key == "" {
			key = "client"
		}
		got, err := lim.AllowN(key, n)
		if err != nil {
			t.Fatalf("step %d (%s): %v", i, st.note, err)
		}
		want := st.want
		want.Limit, want.At = limit, int64(st.at)
		if got != want {
			t.Errorf("step %d at %v, %q n=%d (%s):\n got  %+v\n want %+v", i, st.at, key, n, st.note, got, want)
		}
	}
}

const (
	ctrSecond      = time.Second
	ctrMillisecond = time.Millisecond
	ctrNanosecond  = time.Nanosecond
)

// The classic worked example: L = 100, W = 60 s, 80 requests in the previous
// window and 30 in this one. Windows are aligned to the clock's epoch, so
// the window [60 s, 120 s) is "this minute".
func TestCounterEightyThirty(t *testing.T) {
	ctrRun(t, 100, time.Minute, []ctrStep{
		{at: 30 * ctrSecond, n: 80, want: ctrAllow(20, 90*ctrSecond),
			note: "80 in window 0; Reset = 2W − e: the estimate reaches 0 at the end of the next window"},
		{at: 75 * ctrSecond, n: 30, want: ctrAllow(10, 105*ctrSecond),
			note: "15 s into window 1: 80·45/60 = 60, 60 + 30 = 90 ≤ 100"},
		{at: 75 * ctrSecond, want: ctrAllow(9, 105*ctrSecond),
			note: "the worked example: 80·45/60 + 30 = 90, under budget, allow; 91 after, Remaining 9"},
		{at: 75 * ctrSecond, n: 10, want: ctrRefuse(9, 750*ctrMillisecond, 105*ctrSecond),
			note: "91 + 10 > 100; 80·(45 s − d)/60 s ≤ 59 first at d = 750 ms"},
		{at: 75*ctrSecond + 750*ctrMillisecond, n: 10, want: ctrAllow(0, 104*ctrSecond+250*ctrMillisecond),
			note: "exactly RetryAfter later: 80·44.25/60 = 59, 59 + 31 + 10 = 100 ≤ 100 (exact arithmetic)"},
		{at: 75*ctrSecond + 750*ctrMillisecond, want: ctrRefuse(0, 750*ctrMillisecond, 104*ctrSecond+250*ctrMillisecond),
			note: "full: 80·(44.25 s − d)/60 s ≤ 100 − 41 − 1 = 58 at d = 750 ms"},
	})
}

// The same example's 45-second case: the same state, 45 s into the window:
// 80·15/60 + 30 = 50.
func TestCounterFortyFiveSeconds(t *testing.T) {
	ctrRun(t, 100, time.Minute, []ctrStep{
		{at: 30 * ctrSecond, n: 80, want: ctrAllow(20, 90*ctrSecond), note: "80 in window 0"},
		{at: 75 * ctrSecond, n: 30, want: ctrAllow(10, 105*ctrSecond), note: "30 in window 1, 15 s in"},
		{at: 105 * ctrSecond, want: ctrAllow(49, 75*ctrSecond),
			note: "45 s in: 80·15/60 + 30 = 50, allow; 51 after"},
		{at: 105 * ctrSecond, n: 49, want: ctrAllow(0, 75*ctrSecond), note: "51 + 49 = 100 ≤ 100"},
		{at: 105 * ctrSecond, want: ctrRefuse(0, 750*ctrMillisecond, 75*ctrSecond),
			note: "estimate 100: 80·(15 s − d)/60 s ≤ 100 − 80 − 1 = 19 at d = 750 ms"},
	})
}

// A second worked example: 88 previous, 12 current, 15 s in:
// 88·45/60 + 12 = 66 + 12 = 78 < 100, accept.
func TestCounterEightyEightTwelve(t *testing.T) {
	ctrRun(t, 100, time.Minute, []ctrStep{
		{at: 10 * ctrSecond, n: 88, want: ctrAllow(12, 110*ctrSecond), note: "88 in window 0"},
		{at: 75 * ctrSecond, n: 12, want: ctrAllow(22, 105*ctrSecond), note: "15 s in: 66 + 12 = 78"},
		{at: 75 * ctrSecond, want: ctrAllow(21, 105*ctrSecond), note: "the worked example: estimate 78 < 100, accepted; 79 after"},
		{at: 75 * ctrSecond, n: 22, want: ctrRefuse(21, 681818182*ctrNanosecond, 105*ctrSecond),
			note: "79 + 22 = 101: 88·(45 s − d)/60 s ≤ 100 − 13 − 22 = 65 at d = 45 s − ⌊65·60/88 s⌋ = 0.681818182 s"},
		{at: 75*ctrSecond + 681818181*ctrNanosecond, n: 22, want: ctrRefuse(21, 1*ctrNanosecond, 105*ctrSecond-681818181*ctrNanosecond),
			note: "one nanosecond before RetryAfter: still one nanosecond short"},
		{at: 75*ctrSecond + 681818182*ctrNanosecond, n: 22, want: ctrAllow(0, 105*ctrSecond-681818182*ctrNanosecond),
			note: "at RetryAfter it fits; Remaining ⌊100 − 35 − 64.99…⌋ = 0"},
	})
}

// A full current window refuses until the next window, where the count
// decays as the previous one; the window boundary is exact.
func TestCounterFullWindowAndBoundary(t *testing.T) {
	ctrRun(t, 100, time.Minute, []ctrStep{
		{at: 0, n: 100, want: ctrAllow(0, 120*ctrSecond), note: "100 at instant 0"},
		{at: 30 * ctrSecond, want: ctrRefuse(0, 30*ctrSecond+600*ctrMillisecond, 90*ctrSecond),
			note: "cur = L: wait for window 1 (30 s), then 100·(60 s − e′)/60 s ≤ 99 at e′ = 600 ms"},
		{at: 60*ctrSecond - ctrNanosecond, want: ctrRefuse(0, 600*ctrMillisecond+ctrNanosecond, 60*ctrSecond+ctrNanosecond), note: "last instant of window 0"},
		{at: 60 * ctrSecond, want: ctrRefuse(0, 600*ctrMillisecond, 60*ctrSecond),
			note: "exact boundary: e = 0, the previous window weighs 100%; Reset W − e (only prev > 0)"},
		{at: 60*ctrSecond + 600*ctrMillisecond, want: ctrAllow(0, 119*ctrSecond+400*ctrMillisecond), note: "100·59.4/60 = 99, 99 + 1 = 100"},
		{at: 60*ctrSecond + 600*ctrMillisecond, want: ctrRefuse(0, 600*ctrMillisecond, 119*ctrSecond+400*ctrMillisecond), note: "99 + 1 + 1 > 100: 0.6 s more"},
		{at: 120*ctrSecond - ctrNanosecond, n: 97, want: ctrAllow(1, 60*ctrSecond+ctrNanosecond),
			note: "1 ns before window 2: estimate 100·1ns/60s + 1, 98.000…002 after, Remaining rounds down to 1"},
	})
}

// Window 2 starts with window 1's count as the previous one and window 0
// forgotten; a gap of two windows forgets everything.
func TestCounterForgetsOldWindows(t *testing.T) {
	ctrRun(t, 10, 10*ctrSecond, []ctrStep{
		{at: 9 * ctrSecond, n: 10, want: ctrAllow(0, 11*ctrSecond), note: "10 in window 0"},
		{at: 19 * ctrSecond, want: ctrAllow(8, 11*ctrSecond), note: "window 1, 9 s in: 10·1/10 + 0 = 1; 2 after"},
		{at: 29 * ctrSecond, n: 10, want: ctrRefuse(9, 1*ctrSecond, 1*ctrSecond),
			note: "window 2: window 0 is forgotten, prev = 1: 0.1 + 10 > 10 until prev has fully decayed; Reset W − e"},
		{at: 30 * ctrSecond, n: 10, want: ctrAllow(0, 20*ctrSecond), note: "window 3: prev = 0 (window 2 is empty), exact boundary"},
		{at: 50 * ctrSecond, n: 10, want: ctrAllow(0, 20*ctrSecond), note: "window 5 after an empty window 4: everything forgotten"},
		{at: 60 * ctrSecond, want: ctrRefuse(0, 1*ctrSecond, 10*ctrSecond), note: "window 6, e = 0: prev = 10 weighs fully; 10·(10 s − d)/10 s ≤ 9 at d = 1 s"},
	})
}

func TestCounterCostsAboveOneAndKeys(t *testing.T) {
	ctrRun(t, 10, 10*ctrSecond, []ctrStep{
		{at: 0, key: "a", n: 7, want: ctrAllow(3, 20*ctrSecond)},
		{at: 0, key: "b", n: 10, want: ctrAllow(0, 20*ctrSecond), note: "keys are independent"},
		{at: 5 * ctrSecond, key: "a", n: 4, want: ctrRefuse(3, 6428571429*ctrNanosecond, 15*ctrSecond),
			note: "cur 7 + 4 > 10: wait 5 s for window 1, then 7·(10 s − e′)/10 s ≤ 6 at e′ = 10 s − ⌊60/7 s⌋ = 1.428571429 s"},
		{at: 5 * ctrSecond, key: "a", n: 3, want: ctrAllow(0, 15*ctrSecond), note: "7 + 3 = 10 fits"},
		{at: 5 * ctrSecond, key: "b", want: ctrRefuse(0, 6*ctrSecond, 15*ctrSecond), note: "cur = L: 5 s to window 1, then 10·(10 s − e′)/10 s ≤ 9 at e′ = 1 s"},
		{at: 16 * ctrSecond, key: "a", n: 4, want: ctrAllow(2, 14*ctrSecond), note: "window 1, 6 s in: 10·4/10 = 4, 4 + 4 = 8"},
		{at: 16 * ctrSecond, key: "b", n: 6, want: ctrAllow(0, 14*ctrSecond), note: "4 + 6 = 10 fits exactly"},
	})
}

// ctrOp is one request of a random trace, at an absolute instant.
type ctrOp struct {
	key string
	n   int
	at  int64
}

// ctrTrace draws a globally nondecreasing trace that hits what breaks a
// counter: equal instants, exact window boundaries and one nanosecond
// either side, jumps of a whole window and of two, costs above 1, and
// several keys.
func ctrTrace(r *rand.Rand, limit int, window int64, steps, keys int) []ctrOp {
	ops := make([]ctrOp, steps)
	at := int64(0)
	for i := range ops {
		switch r.IntN(10) {
		case 0, 1: // same instant
		case 2: // the next boundary exactly
			at = (at/window + 1) * window
		case 3: // one nanosecond before the next boundary
			at = max(at, (at/window+1)*window-1)
		case 4:
			at++
		case 5:
			at += window
		case 6:
			at += 2*window + r.Int64N(window)
		default:
			at += r.Int64N(window/max(int64(limit), 4) + 1)
		}
		n := 1
		if r.IntN(3) == 0 {
			n = 1 + r.IntN(limit)
		}
		ops[i] = ctrOp{key: fmt.Sprintf("k%d", r.IntN(keys)), n: n, at: at}
	}
	return ops
}

// Every field of every decision equals the exact rational reference
// model's, including huge limits and windows where prev·(W − e) needs more
// than 64 bits.
func TestCounterMatchesReference(t *testing.T) {
	for _, tc := range []struct {
		limit  int
		window time.Duration
		steps  int
	}{
		{1, 7, 2000},
		{2, time.Second, 2000},
		{3, 60, 2000},
		{10, time.Minute, 3000},
		{100, time.Minute, 3000},
		{1000, 999_983, 2000}, // a prime window: the divisions are never exact
		{engine.MaxCounterLimit, engine.MaxWindow, 400}, // about 140 windows of 366 days: instants stay below 2^63
	} {
		t.Run(fmt.Sprintf("L=%d/W=%v", tc.limit, tc.window), func(t *testing.T) {
			r := rand.New(rand.NewPCG(uint64(tc.limit), uint64(tc.window)))
			lim, err := engine.New(engine.Policy{Limit: tc.limit, Window: tc.window, Algorithm: engine.SlidingCounter},
				engine.WithSweepInterval(0), engine.WithShards(4))
			if err != nil {
				t.Fatal(err)
			}
			defer lim.Close()
			model := reference.NewCounter(tc.limit, int64(tc.window))
			allowed, refused := 0, 0
			for i, o := range ctrTrace(r, tc.limit, int64(tc.window), tc.steps, 5) {
				got, err := lim.AllowNAt(o.key, o.n, o.at)
				if err != nil {
					t.Fatal(err)
				}
				m := model.Decide(o.key, o.n, o.at)
				want := engine.Decision{Allowed: m.Allowed, Limit: tc.limit, Remaining: m.Remaining,
					RetryAfter: time.Duration(m.RetryAfter), Reset: time.Duration(m.Reset), At: o.at}
				if got != want {
					t.Fatalf("op %d %q n=%d at %d:\n got   %+v\n model %+v", i, o.key, o.n, o.at, got, want)
				}
				if got.Allowed {
					allowed++
				} else {
					refused++
				}
			}
			if allowed == 0 || refused == 0 {
				t.Errorf("trace exercised allowed=%d refused=%d; want both", allowed, refused)
			}
		})
	}
}

// ctrMaxInWindow returns the most units accepted for one key in one
// trailing window (t − W, t]; decisions are in trace order.
func ctrMaxInWindow(ops []ctrOp, ds []engine.Decision, window int64) int {
	type entry struct {
		at int64
		n  int
	}
	live := map[string][]entry{}
	sum := map[string]int{}
	best := 0
	for i, o := range ops {
		if !ds[i].Allowed {
			continue
		}
		q := live[o.key]
		for len(q) > 0 && q[0].at <= ds[i].At-window {
			sum[o.key] -= q[0].n
			q = q[1:]
		}
		live[o.key] = append(q, entry{ds[i].At, o.n})
		sum[o.key] += o.n
		best = max(best, sum[o.key])
	}
	return best
}

// The counter never admits more than 2L in a window of length W; in fact
// never more than 2L − 1: a trailing window spans the tail of fixed window
// k and the head of k+1; k holds at most L, and k+1 at most
// L − prev·(W − e)/W, which is below L whenever k holds anything.
// docs/algorithms.md has the construction that reaches 2L − 1.
func TestCounterNeverAdmitsTwiceTheLimit(t *testing.T) {
	for seed := range uint64(40) {
		r := rand.New(rand.NewPCG(seed, 11))
		limit := 1 + r.IntN(20)
		window := int64(5 + r.IntN(500))
		lim, err := engine.New(engine.Policy{Limit: limit, Window: time.Duration(window), Algorithm: engine.SlidingCounter},
			engine.WithSweepInterval(0))
		if err != nil {
			t.Fatal(err)
		}
		ops := ctrTrace(r, limit, window, 3000, 3)
		ds := make([]engine.Decision, len(ops))
		for i, o := range ops {
			if ds[i], err = lim.AllowNAt(o.key, o.n, o.at); err != nil {
				t.Fatal(err)
			}
		}
		lim.Close()
		if got := ctrMaxInWindow(ops, ds, window); got > 2*limit-1 {
			t.Fatalf("seed %d (L=%d, W=%dns): %d units accepted in one trailing window, bound 2L−1 = %d", seed, limit, window, got, 2*limit-1)
		}
	}
	// The construction reaches the bound: L at the last instant of window 0,
	// then L at the last-but-one instant of window 1.
	const limit = 50
	window := int64(time.Minute)
	lim, err := engine.New(engine.Policy{Limit: limit, Window: time.Minute, Algorithm: engine.SlidingCounter}, engine.WithSweepInterval(0))
	if err != nil {
		t.Fatal(err)
	}
	defer lim.Close()
	var ops []ctrOp
	var ds []engine.Decision
	for _, at := range []int64{window - 1, 2*window - 2} {
		for range limit {
			d, err := lim.AllowNAt("attacker", 1, at)
			if err != nil {
				t.Fatal(err)
			}
			ops, ds = append(ops, ctrOp{key: "attacker", n: 1, at: at}), append(ds, d)
		}
	}
	if got := ctrMaxInWindow(ops, ds, window); got != 2*limit-1 {
		t.Errorf("worst case: %d accepted in (W − 2ns, 2W − 2ns], want 2L − 1 = %d", got, 2*limit-1)
	}
}

// With an empty previous window the estimate is the current count, so the
// counter is exact there: it never refuses a request with cur + n ≤ L.
// The fixed-window counts are rebuilt from the decisions alone.
func TestCounterNeverRefusesWithEmptyPreviousWindow(t *testing.T) {
	checked := 0
	for seed := range uint64(40) {
		r := rand.New(rand.NewPCG(seed, 13))
		limit := 1 + r.IntN(30)
		window := int64(10 + r.IntN(1000))
		lim, err := engine.New(engine.Policy{Limit: limit, Window: time.Duration(window), Algorithm: engine.SlidingCounter},
			engine.WithSweepInterval(0))
		if err != nil {
			t.Fatal(err)
		}
		counts := map[string]map[int64]int{} // key → window index → accepted units
		for i, o := range ctrTrace(r, limit, window, 3000, 4) {
			d, err := lim.AllowNAt(o.key, o.n, o.at)
			if err != nil {
				t.Fatal(err)
			}
			c := counts[o.key]
			if c == nil {
				c = map[int64]int{}
				counts[o.key] = c
			}
			idx := d.At / window
			if c[idx-1] == 0 && c[idx]+o.n <= limit {
				checked++
				if !d.Allowed {
					t.Fatalf("seed %d op %d: refused %q n=%d at %d with prev = 0, cur = %d, L = %d: %+v", seed, i, o.key, o.n, d.At, c[idx], limit, d)
				}
			}
			if d.Allowed {
				c[idx] += o.n
			}
		}
		lim.Close()
	}
	if checked < 1000 {
		t.Fatalf("only %d decisions had an empty previous window; the trace does not exercise the property", checked)
	}
}

// Sweeping idle keys between decisions, at the trace's current instant,
// changes no decision, and the sweeps do drop keys.
func TestCounterSweepChangesNoDecision(t *testing.T) {
	for seed := range uint64(10) {
		r := rand.New(rand.NewPCG(seed, 17))
		limit, window := 1+r.IntN(10), int64(50+r.IntN(100))
		p := engine.Policy{Limit: limit, Window: time.Duration(window), Algorithm: engine.SlidingCounter}
		plain, err := engine.New(p, engine.WithSweepInterval(0))
		if err != nil {
			t.Fatal(err)
		}
		swept, err := engine.New(p, engine.WithSweepInterval(0), engine.WithShards(2))
		if err != nil {
			t.Fatal(err)
		}
		dropped := 0
		for i, o := range ctrTrace(r, limit, window, 3000, 20) {
			if r.IntN(5) == 0 {
				dropped += swept.SweepAt(o.at)
			}
			a, err := plain.AllowNAt(o.key, o.n, o.at)
			if err != nil {
				t.Fatal(err)
			}
			b, err := swept.AllowNAt(o.key, o.n, o.at)
			if err != nil {
				t.Fatal(err)
			}
			if a != b {
				t.Fatalf("seed %d op %d %q n=%d at %d: without sweeps %+v, with %+v", seed, i, o.key, o.n, o.at, a, b)
			}
		}
		if dropped == 0 || swept.Stats().Swept != int64(dropped) {
			t.Fatalf("seed %d: sweeps dropped %d keys (Stats.Swept %d); the test needs idle keys", seed, dropped, swept.Stats().Swept)
		}
		plain.Close()
		swept.Close()
	}
}

// Parallel replay: many goroutines on few keys share one manual clock that
// they advance themselves, so that decisions collide at equal instants and
// cross window boundaries constantly. Replaying every recorded decision in
// At order through the reference counter reproduces every field.
func TestCounterParallelReplay(t *testing.T) {
	for _, procs := range []int{1, 2, 8} {
		t.Run(fmt.Sprintf("GOMAXPROCS=%d", procs), func(t *testing.T) {
			defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(procs))
			const (
				goroutines = 16
				keys       = 3
				limit      = 20
				window     = 100 * time.Microsecond
			)
			perG := 800 // 12,800 decisions per run; the replay's exact arithmetic dominates the time
			if testing.Short() {
				perG = 200
			}
			clk := engine.NewManualClock()
			lim, err := engine.New(engine.Policy{Limit: limit, Window: window, Algorithm: engine.SlidingCounter},
				engine.WithClock(clk), engine.WithShards(2), engine.WithSweepInterval(time.Millisecond))
			if err != nil {
				t.Fatal(err)
			}
			defer lim.Close()
			recs := make([][]reference.Record, goroutines)
			var wg sync.WaitGroup
			for g := range goroutines {
				wg.Add(1)
				go func() {
					defer wg.Done()
					r := rand.New(rand.NewPCG(uint64(g), uint64(procs)))
					out := make([]reference.Record, 0, perG)
					for range perG {
						if r.IntN(3) == 0 {
							clk.Advance(time.Duration(r.IntN(2000)))
						}
						key := fmt.Sprintf("key-%d", r.IntN(keys))
						n := 1 + r.IntN(3)
						if r.IntN(20) == 0 {
							n = limit
						}
						d, err := lim.AllowN(key, n)
						if err != nil {
							t.Errorf("AllowN: %v", err)
							return
						}
						out = append(out, reference.Record{Key: key, Cost: n, At: d.At, Allowed: d.Allowed,
							Remaining: d.Remaining, RetryAfter: int64(d.RetryAfter), Reset: int64(d.Reset)})
					}
					recs[g] = out
				}()
			}
			wg.Wait()
			all := slices.Concat(recs...)
			rep := reference.VerifyCounter(limit, int64(window), all)
			if rep.Mismatches != 0 || rep.Decisions != goroutines*perG {
				t.Fatalf("replay: %d decisions, %d mismatches: %v", rep.Decisions, rep.Mismatches, rep.Examples)
			}
			if rep.Allowed == 0 || rep.Refused == 0 {
				t.Fatalf("replay saw allowed=%d refused=%d; want both", rep.Allowed, rep.Refused)
			}
		})
	}
}
