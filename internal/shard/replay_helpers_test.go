package shard_test

import (
	"slices"
	"strings"
	"testing"

	"github.com/slidegate/slidegate/internal/reference"
	"github.com/slidegate/slidegate/internal/shard"
)

// logRecord is the reference model's record of a decision on k at cost n.
func logRecord(k string, n int, res shard.Result) reference.Record {
	return reference.Record{
		Key: k, Cost: n, At: res.At, Allowed: res.Allowed,
		Remaining: res.Remaining, RetryAfter: res.RetryAfter, Reset: res.Reset,
	}
}

// verifyLog replays the goroutines' records through the reference log of
// limit and window: all want decisions must match. It returns the replay's
// report.
func verifyLog(t *testing.T, limit int, window int64, recs [][]reference.Record, want int) reference.Report {
	t.Helper()
	rep := reference.VerifyLog(limit, window, slices.Concat(recs...))
	if rep.Decisions != want || !rep.OK() {
		t.Fatalf("limit %d window %d: %d decisions, %d mismatches, %d over-admissions, %d under-admissions; e.g.\n%s",
			limit, window, rep.Decisions, rep.Mismatches, rep.OverAdmissions, rep.UnderAdmissions, strings.Join(rep.Examples, "\n"))
	}
	return rep
}

// bothOutcomes runs a stress with window and, on a machine too busy to
// fill it (every decision allowed), again with a window ten times longer,
// up to four times. run must fail the test on any replay mismatch; the
// test fails if no run both allowed and refused some.
func bothOutcomes(t *testing.T, window int64, run func(window int64) reference.Report) {
	t.Helper()
	for range 4 {
		rep := run(window)
		if rep.Allowed > 0 && rep.Refused > 0 {
			return
		}
		t.Logf("window %d: the run did not exercise both outcomes (%d allowed, %d refused); again with a longer window", window, rep.Allowed, rep.Refused)
		window *= 10
	}
	t.Fatalf("no window exercised both outcomes")
}
