package countererror

import (
	"bytes"
	"errors"
	"math/rand/v2"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/slidegate/slidegate/engine"
	"github.com/slidegate/slidegate/internal/reference"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// The constructed worst case reaches the bound 2L − 1 exactly, for every
// policy with W > 2L ns, while the log admits L.
func TestWorstCaseReachesBound(t *testing.T) {
	for _, tc := range []struct {
		limit  int
		window time.Duration
	}{
		{1, time.Second},
		{2, time.Second},
		{100, time.Minute},
		{1000, time.Hour},
		{7, time.Microsecond},
	} {
		wc, err := WorstCase(tc.limit, tc.window)
		if err != nil {
			t.Fatal(err)
		}
		if wc.CounterAdmitted != 2*tc.limit-1 || wc.Bound != 2*tc.limit-1 {
			t.Errorf("L=%d W=%v: counter admitted %d in (%d, %d], want 2L−1 = %d", tc.limit, tc.window, wc.CounterAdmitted, wc.From, wc.To, 2*tc.limit-1)
		}
		if wc.LogAdmitted != tc.limit {
			t.Errorf("L=%d W=%v: log admitted %d, want L", tc.limit, tc.window, wc.LogAdmitted)
		}
		for _, q := range wc.Trace {
			if q.At <= wc.From || q.At > wc.To {
				t.Fatalf("L=%d: request at %d outside (%d, %d]", tc.limit, q.At, wc.From, wc.To)
			}
		}
	}
	// A window so short that 2 ns of it weigh more than 1/L: the previous
	// window still counts, and the counter admits less than 2L − 1.
	wc, err := WorstCase(7, 10)
	if err != nil {
		t.Fatal(err)
	}
	// cur ≤ 7 − 7·2/10 = 5.6 in the second window.
	if want := 7 + 5; wc.CounterAdmitted != want {
		t.Errorf("L=7 W=10ns: counter admitted %d, want %d", wc.CounterAdmitted, want)
	}
	if _, err := WorstCase(0, time.Second); !errors.Is(err, ErrInvalidConfig) {
		t.Errorf("WorstCase(0, 1s) = %v, want ErrInvalidConfig", err)
	}
}

// No trace, however adversarial, makes the counter admit more than 2L − 1
// units in one trailing window, and the log never more than L. Windows are
// a few hundred nanoseconds so that random instants hit exact boundaries
// and equal instants often.
func TestCounterNeverExceedsBound(t *testing.T) {
	r := rand.New(rand.NewPCG(7, 7))
	for iter := range 300 {
		limit := 1 + r.IntN(12)
		w := int64(3 + r.IntN(200))
		var trace []Request
		at := int64(0)
		for range 200 + r.IntN(300) {
			switch r.IntN(4) {
			case 0: // same instant
			case 1: // the next window boundary, or just before it
				at = max(at, (at/w+1)*w-int64(r.IntN(3)))
			default:
				at += int64(r.IntN(int(w)/2 + 1))
			}
			trace = append(trace, Request{Key: "k" + string(rune('a'+r.IntN(3))), At: at, Cost: 1 + r.IntN(limit)})
		}
		res, err := Compare("random", limit, time.Duration(w), trace)
		if err != nil {
			t.Fatalf("iteration %d: %v", iter, err)
		}
		if res.CounterMaxInWindow > 2*limit-1 {
			t.Fatalf("iteration %d (L=%d, W=%dns): counter admitted %d units in one window, bound 2L−1 = %d", iter, limit, w, res.CounterMaxInWindow, 2*limit-1)
		}
		if res.LogMaxInWindow > limit {
			t.Fatalf("iteration %d: log admitted %d units in one window, limit %d", iter, res.LogMaxInWindow, limit)
		}
		if res.CounterAllowed-res.LogAllowed != res.FalseAllows-res.FalseRefusals {
			t.Fatalf("iteration %d: inconsistent counts %+v", iter, res)
		}
	}
}

func smallConfig() Config {
	return Config{Limit: 20, Window: time.Minute, Keys: 4, Windows: 12, Seed: 3}
}

func TestScenarios(t *testing.T) {
	c := smallConfig()
	results, err := Run(c)
	if err != nil {
		t.Fatal(err)
	}
	again, err := Run(c)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(results, again) {
		t.Fatal("two runs of the same config differ")
	}
	by := map[string]Result{}
	for i, sc := range Scenarios() {
		r := results[i]
		if r.Scenario != sc.Name || r.Requests == 0 || r.Keys != c.Keys {
			t.Errorf("%s: result %+v", sc.Name, r)
		}
		if r.LogMaxInWindow > c.Limit || r.CounterMaxInWindow > 2*c.Limit-1 {
			t.Errorf("%s: max in window log %d counter %d", sc.Name, r.LogMaxInWindow, r.CounterMaxInWindow)
		}
		if r.CounterAllowed-r.LogAllowed != r.FalseAllows-r.FalseRefusals {
			t.Errorf("%s: inconsistent counts %+v", sc.Name, r)
		}
		if r.CounterMaxInWindow <= c.Limit && r.OverAdmissions != 0 {
			t.Errorf("%s: over-admissions %d although no window held more than L", sc.Name, r.OverAdmissions)
		}
		trace := sc.Trace(c)
		if !slices.IsSortedFunc(trace, func(a, b Request) int { return int(a.At - b.At) }) {
			t.Errorf("%s: trace not sorted", sc.Name)
		}
		if end := int64(c.Window) * int64(c.Windows); trace[0].At < 0 || trace[len(trace)-1].At >= end {
			t.Errorf("%s: trace spans [%d, %d], want within [0, %d)", sc.Name, trace[0].At, trace[len(trace)-1].At, end)
		}
		by[sc.Name] = r
	}
	if r := by["poisson-0.5L"]; r.FalseAllows+r.FalseRefusals+r.OverAdmissions+r.UnderAdmissions != 0 || r.LogAllowed != r.Requests {
		t.Errorf("traffic at half the limit: every request should pass both: %+v", r)
	}
	if r := by["burst-start"]; r.FalseRefusals <= r.FalseAllows || r.OverAdmissions != 0 {
		t.Errorf("bursts at window starts should make the counter refuse what the log allows: %+v", r)
	}
	if r := by["burst-end"]; r.FalseAllows <= r.FalseRefusals || r.OverAdmissions == 0 {
		t.Errorf("bursts at window ends should make the counter allow what the log refuses: %+v", r)
	}
	if r := by["worst-case"]; r.CounterMaxInWindow != 2*c.Limit-1 {
		t.Errorf("worst case: counter max in window %d, want %d", r.CounterMaxInWindow, 2*c.Limit-1)
	}
	var buf bytes.Buffer
	if err := WriteTable(&buf, results); err != nil {
		t.Fatal(err)
	}
	if lines := strings.Count(buf.String(), "\n"); lines != 2+len(results) {
		t.Errorf("table has %d lines, want %d:\n%s", lines, 2+len(results), buf.String())
	}
}

// The counter decisions the tool measures are the engine's, and they replay
// exactly through the reference counter.
func TestScenarioDecisionsReplayThroughReference(t *testing.T) {
	c := Config{Limit: 10, Window: time.Second, Keys: 3, Windows: 8, Seed: 5}
	for _, sc := range Scenarios() {
		lim, err := engine.New(engine.Policy{Limit: c.Limit, Window: c.Window, Algorithm: engine.SlidingCounter}, engine.WithSweepInterval(0))
		if err != nil {
			t.Fatal(err)
		}
		var recs []reference.Record
		for _, q := range sc.Trace(c) {
			d, err := lim.AllowNAt(q.Key, q.Cost, q.At)
			if err != nil {
				t.Fatal(err)
			}
			recs = append(recs, record(q, d))
		}
		lim.Close()
		if rep := reference.VerifyCounter(c.Limit, int64(c.Window), recs); rep.Mismatches != 0 {
			t.Errorf("%s: %d mismatches: %v", sc.Name, rep.Mismatches, rep.Examples)
		}
	}
}

func TestMaxInWindow(t *testing.T) {
	recs := []reference.Record{
		{Key: "a", At: 0, Cost: 2, Allowed: true},
		{Key: "a", At: 5, Cost: 1, Allowed: false},
		{Key: "a", At: 9, Cost: 3, Allowed: true},  // (−1, 9]: 5
		{Key: "a", At: 10, Cost: 1, Allowed: true}, // (0, 10]: 4, the entry at 0 expired
		{Key: "b", At: 10, Cost: 4, Allowed: true}, // another key starts afresh
	}
	if got := MaxInWindow(recs, 10); got != 5 {
		t.Errorf("MaxInWindow = %d, want 5", got)
	}
	if got := MaxInWindow(nil, 10); got != 0 {
		t.Errorf("MaxInWindow(nil) = %d", got)
	}
}

func TestCompareRejectsBadInput(t *testing.T) {
	for name, trace := range map[string][]Request{
		"unsorted":   {{Key: "a", At: 5, Cost: 1}, {Key: "a", At: 4, Cost: 1}},
		"cost 0":     {{Key: "a", At: 0, Cost: 0}},
		"cost > L":   {{Key: "a", At: 0, Cost: 11}},
		"before now": {{Key: "a", At: -1, Cost: 1}},
	} {
		if _, err := Compare(name, 10, time.Second, trace); err == nil {
			t.Errorf("%s: no error", name)
		}
	}
	if _, err := Compare("bad policy", 0, time.Second, nil); !errors.Is(err, engine.ErrInvalidPolicy) {
		t.Errorf("limit 0: %v, want ErrInvalidPolicy", err)
	}
}

func TestConfigValidate(t *testing.T) {
	if err := DefaultConfig().Validate(); err != nil {
		t.Fatal(err)
	}
	for name, mut := range map[string]func(*Config){
		"limit":   func(c *Config) { c.Limit = 0 },
		"window":  func(c *Config) { c.Window = 99 },
		"keys":    func(c *Config) { c.Keys = 0 },
		"windows": func(c *Config) { c.Windows = 1 },
		"size":    func(c *Config) { c.Keys = 1 << 20 },
	} {
		c := DefaultConfig()
		mut(&c)
		err := c.Validate()
		if !errors.Is(err, ErrInvalidConfig) || !strings.Contains(err.Error(), name) {
			t.Errorf("%s: %v", name, err)
		}
		if _, err := Run(c); !errors.Is(err, ErrInvalidConfig) {
			t.Errorf("Run with bad %s: %v", name, err)
		}
	}
}

func TestMainCommand(t *testing.T) {
	for _, tc := range []struct {
		args []string
		code int
		out  string // in stdout
		err  string // in stderr
	}{
		{args: []string{"-h"}, code: 0, err: "usage: countererror"},
		{args: []string{"-nope"}, code: 2, err: "flag provided but not defined"},
		{args: []string{"extra"}, code: 2, err: "unexpected arguments"},
		{args: []string{"-limit", "0"}, code: 2, err: "limit 0"},
		{args: []string{"-mem-keys", "-1"}, code: 2, err: "must be ≥ 0"},
		{
			args: []string{"-limit", "10", "-keys", "2", "-windows", "4", "-mem-keys", "2000", "-mem-full-keys", "0"},
			code: 0,
			out:  "the counter admits 19 of them",
		},
	} {
		var out, errb bytes.Buffer
		code := Main(tc.args, &out, &errb)
		if code != tc.code || !strings.Contains(out.String(), tc.out) || !strings.Contains(errb.String(), tc.err) {
			t.Errorf("Main(%q) = %d, want %d\nstdout: %s\nstderr: %s", tc.args, code, tc.code, out.String(), errb.String())
		}
	}
}

// The counter's per-key state beyond the map entry is one block: 32 bytes
// of state plus the block's copy of the key's bytes (rounded up to 8),
// which the map's key string points into. At L requests per key it costs a
// small fraction of the log.
func TestMeasureHeap(t *testing.T) {
	if testing.Short() {
		t.Skip("allocates and collects a few hundred thousand keys")
	}
	keys := 200_000
	if raceEnabled {
		keys = 20_000
	}
	one, err := MeasureHeap(keys, 1, 100, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("1 request per key: log %.1f B, counter %.1f B, map %.1f B per key", one.LogPerKey, one.CounterPerKey, one.MapPerKey)
	// The counter's whole state: its block (4 words of state, the index's
	// chain link and the key's bytes, for the names MeasureHeap uses), as
	// the allocator rounds it up to its size class, and its share of the
	// index's chain heads (a word per head, at most two heads per key).
	block := 0.0
	for i := range keys {
		words := 5 + (len("key-"+strconv.Itoa(i))+7)/8
		block += float64(8 * cap(append([]uint64(nil), make([]uint64, words)...)))
	}
	block /= float64(keys)
	if s := one.CounterPerKey; s < block || s > block+16 {
		t.Errorf("counter state: %.1f B per key, want %.1f to %.1f (the block, size-class rounded, and the index's heads)", s, block, block+16)
	}
	full, err := MeasureHeap(keys/10, 100, 100, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("100 requests per key: log %.1f B, counter %.1f B, map %.1f B per key", full.LogPerKey, full.CounterPerKey, full.MapPerKey)
	if full.Ratio() > 0.4 {
		t.Errorf("at L requests per key the counter retains %.0f%% of the log's heap, want ≤ 40%%", 100*full.Ratio())
	}
	if _, err := MeasureHeap(10, 2, 1, time.Minute); !errors.Is(err, ErrInvalidConfig) {
		t.Errorf("requests per key above the limit: %v", err)
	}
}

// BenchmarkHeapPerKey reports the retained heap per key of both algorithms
// at 1M keys × 1 request (the memory target) as custom metrics:
//
//	go test -run '^$' -bench HeapPerKey -benchtime 1x ./internal/countererror
func BenchmarkHeapPerKey(b *testing.B) {
	for range b.N {
		h, err := MeasureHeap(DefaultMemKeys, 1, DefaultLimit, DefaultWindow)
		if err != nil {
			b.Fatal(err)
		}
		b.ReportMetric(h.LogPerKey, "log-B/key")
		b.ReportMetric(h.CounterPerKey, "counter-B/key")
		b.ReportMetric(h.CounterStatePerKey(), "counter-state-B/key")
		b.ReportMetric(100*h.Ratio(), "counter/log-%")
	}
}
