package countererror

import (
	"fmt"
	"io"
	"time"

	"github.com/slidegate/slidegate/engine"
	"github.com/slidegate/slidegate/internal/reference"
)

// Result is what Compare measured on one trace. Counts are of requests
// (each trace request has cost 1 in the built-in scenarios).
type Result struct {
	Scenario string
	Limit    int
	Window   time.Duration
	Keys     int

	Requests       int // decisions each limiter made
	LogAllowed     int
	CounterAllowed int

	// Side by side, each limiter keeping its own state.
	FalseAllows   int // the counter allowed, the log refused
	FalseRefusals int // the counter refused, the log allowed

	// Counterfactual, from the counter's own accepted set.
	OverAdmissions  int // accepts after which (t−W, t] held more than L
	UnderAdmissions int // refusals although (t−W, t] had room

	// The most units either limiter accepted in one trailing window
	// (t−W, t] of one key.
	LogMaxInWindow     int
	CounterMaxInWindow int
}

// Share returns n as a percentage of the requests.
func (r Result) Share(n int) float64 {
	if r.Requests == 0 {
		return 0
	}
	return 100 * float64(n) / float64(r.Requests)
}

// Net is how many more requests the counter allowed than the log, as a
// percentage of the log's (negative when it allowed fewer).
func (r Result) Net() float64 {
	if r.LogAllowed == 0 {
		return 0
	}
	return 100 * (float64(r.CounterAllowed) - float64(r.LogAllowed)) / float64(r.LogAllowed)
}

// Compare decides every request of trace with a fresh exact log and a fresh
// counter of the same limit and window, each keeping its own state (see
// the package comment for the two comparisons). Requests must be sorted by
// At; their costs must be in 1..limit. It returns an error for bad input and
// when the exact log breaks its own guarantee, which would make every other
// figure meaningless.
func Compare(name string, limit int, window time.Duration, trace []Request) (Result, error) {
	res := Result{Scenario: name, Limit: limit, Window: window}
	logLim, err := engine.New(engine.Policy{Limit: limit, Window: window}, engine.WithSweepInterval(0))
	if err != nil {
		return res, fmt.Errorf("countererror: %w", err)
	}
	defer logLim.Close()
	ctrLim, err := engine.New(engine.Policy{Limit: limit, Window: window, Algorithm: engine.SlidingCounter}, engine.WithSweepInterval(0))
	if err != nil {
		return res, fmt.Errorf("countererror: %w", err)
	}
	defer ctrLim.Close()

	logRecs := make([]reference.Record, 0, len(trace))
	ctrRecs := make([]reference.Record, 0, len(trace))
	keys := map[string]struct{}{}
	for i, q := range trace {
		if i > 0 && q.At < trace[i-1].At {
			return res, fmt.Errorf("countererror: trace not sorted: request %d at %d follows one at %d", i, q.At, trace[i-1].At)
		}
		dl, err := logLim.AllowNAt(q.Key, q.Cost, q.At)
		if err != nil {
			return res, fmt.Errorf("countererror: request %d: %w", i, err)
		}
		dc, err := ctrLim.AllowNAt(q.Key, q.Cost, q.At)
		if err != nil {
			return res, fmt.Errorf("countererror: request %d: %w", i, err)
		}
		keys[q.Key] = struct{}{}
		res.Requests++
		switch {
		case dl.Allowed && dc.Allowed:
			res.LogAllowed++
			res.CounterAllowed++
		case dl.Allowed:
			res.LogAllowed++
			res.FalseRefusals++
		case dc.Allowed:
			res.CounterAllowed++
			res.FalseAllows++
		}
		logRecs = append(logRecs, record(q, dl))
		ctrRecs = append(ctrRecs, record(q, dc))
	}
	res.Keys = len(keys)

	// The log's decisions must replay exactly and keep the guarantee.
	if rep := reference.VerifyLog(limit, int64(window), logRecs); !rep.OK() {
		return res, fmt.Errorf("countererror: the exact log failed its own check on %s: %+v", name, rep)
	}
	// The counter's accepted set, checked against the exact guarantee. The
	// replay's Mismatches are meaningless here (the log model has its own
	// state); only the window counts, made from the records alone, are used.
	rep := reference.VerifyLog(limit, int64(window), ctrRecs)
	res.OverAdmissions, res.UnderAdmissions = rep.OverAdmissions, rep.UnderAdmissions
	res.LogMaxInWindow = MaxInWindow(logRecs, int64(window))
	res.CounterMaxInWindow = MaxInWindow(ctrRecs, int64(window))
	return res, nil
}

func record(q Request, d engine.Decision) reference.Record {
	return reference.Record{
		Key: q.Key, Cost: q.Cost, At: d.At, Allowed: d.Allowed,
		Remaining: d.Remaining, RetryAfter: int64(d.RetryAfter), Reset: int64(d.Reset),
	}
}

// MaxInWindow returns the most units accepted for one key in one trailing
// window (t−W, t], over all keys and all accept instants t. recs must be
// in replay order (reference.Order; VerifyLog leaves them so) or at least
// grouped by key and sorted by At within a key.
func MaxInWindow(recs []reference.Record, window int64) int {
	best := 0
	var live []reference.Record
	sum := 0
	for i, r := range recs {
		if i > 0 && r.Key != recs[i-1].Key {
			live, sum = live[:0], 0
		}
		if !r.Allowed {
			continue
		}
		for len(live) > 0 && live[0].At <= r.At-window {
			sum -= live[0].Cost
			live = live[1:]
		}
		live = append(live, r)
		sum += r.Cost
		best = max(best, sum)
	}
	return best
}

// Run builds every scenario's trace for c and compares the two algorithms
// on it.
func Run(c Config) ([]Result, error) {
	if err := c.Validate(); err != nil {
		return nil, err
	}
	var out []Result
	for _, sc := range Scenarios() {
		r, err := Compare(sc.Name, c.Limit, c.Window, sc.Trace(c))
		if err != nil {
			return out, err
		}
		out = append(out, r)
	}
	return out, nil
}

// WriteTable prints results as a markdown table.
func WriteTable(w io.Writer, results []Result) error {
	_, err := fmt.Fprintln(w, "| scenario | requests | log allowed | counter allowed (vs log) | false allows | false refusals | over-admissions (counterfactual) | under-admissions (counterfactual) | max in (t−W, t]: log / counter |")
	if err != nil {
		return err
	}
	if _, err := fmt.Fprintln(w, "|---|---:|---:|---:|---:|---:|---:|---:|---:|"); err != nil {
		return err
	}
	for _, r := range results {
		_, err = fmt.Fprintf(w, "| %s | %d | %d | %d (%+.2f%%) | %d (%.3f%%) | %d (%.3f%%) | %d (%.3f%%) | %d (%.3f%%) | %d / %d |\n",
			r.Scenario, r.Requests, r.LogAllowed, r.CounterAllowed, r.Net(),
			r.FalseAllows, r.Share(r.FalseAllows), r.FalseRefusals, r.Share(r.FalseRefusals),
			r.OverAdmissions, r.Share(r.OverAdmissions), r.UnderAdmissions, r.Share(r.UnderAdmissions),
			r.LogMaxInWindow, r.CounterMaxInWindow)
		if err != nil {
			return err
		}
	}
	return nil
}
