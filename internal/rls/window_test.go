package rls_test

import (
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
)

// fixedWindow is the textbook fixed-window counter envoyproxy/ratelimit
// keeps in Redis: one count per key and window index, reset when the index
// changes.
type fixedWindow struct {
	limit  int
	window time.Duration
	idx    int64
	count  int
}

func (f *fixedWindow) allow(t time.Duration) bool {
	if i := int64(t / f.window); i != f.idx {
		f.idx, f.count = i, 0
	}
	if f.count+1 > f.limit {
		return false
	}
	f.count++
	return true
}

// maxInWindow is the most instants of ts (sorted) inside any half-open
// interval of length w.
func maxInWindow(ts []time.Duration, w time.Duration) int {
	best, lo := 0, 0
	for hi := range ts {
		for ts[hi]-ts[lo] >= w {
			lo++
		}
		best = max(best, hi-lo+1)
	}
	return best
}

// A client that sends as fast as it may, from the middle of one minute to
// the middle of the next: the fixed window lets 2 × the limit through
// within one minute, the service never more than the limit. docs/envoy.md
// quotes this run.
func TestSlidingVersusFixedWindow(t *testing.T) {
	const limit = 10
	e := start(t, "domain: d\ndescriptors:\n  - key: user\n    rate_limit: {unit: minute, requests_per_unit: 10}\n", envOpts{})
	fixed := &fixedWindow{limit: limit, window: time.Minute, idx: -1}
	base := time.Hour // the manual clock's start; a whole number of minutes
	var slid, fix []time.Duration
	step := 100 * time.Millisecond
	for at := 30 * time.Second; at < 150*time.Second; at += step {
		if fixed.allow(base + at) {
			fix = append(fix, at)
		}
		r := e.ask(t, "d", 0, desc("user", "greedy"))
		if r.OverallCode == rlsv3.RateLimitResponse_OK {
			slid = append(slid, at)
		}
		e.clk.Advance(step)
	}
	ms, mf := maxInWindow(slid, time.Minute), maxInWindow(fix, time.Minute)
	t.Logf("120 s of greedy requests every 100 ms, limit %d/min: sliding admitted %d (at most %d in any minute), fixed window admitted %d (at most %d in one minute)",
		limit, len(slid), ms, len(fix), mf)
	if ms != limit {
		t.Errorf("the service let %d through within one minute, limit %d", ms, limit)
	}
	if mf != 2*limit {
		t.Errorf("the fixed-window baseline let %d through within one minute; the comparison expects %d", mf, 2*limit)
	}
}
