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

// verifyLogBoth replays the goroutines' records through the reference log
// of limit and window: all want decisions must match, and the run must
// have both allowed and refused some.
func verifyLogBoth(t *testing.T, limit int, window int64, recs [][]reference.Record, want int) {
	t.Helper()
	rep := reference.VerifyLog(limit, window, slices.Concat(recs...))
	if rep.Decisions != want || !rep.OK() {
		t.Fatalf("limit %d window %d: %d decisions, %d mismatches, %d over-admissions, %d under-admissions; e.g.\n%s",
			limit, window, rep.Decisions, rep.Mismatches, rep.OverAdmissions, rep.UnderAdmissions, strings.Join(rep.Examples, "\n"))
	}
	if rep.Allowed == 0 || rep.Refused == 0 {
		t.Fatalf("limit %d window %d: the run did not exercise both outcomes: %+v", limit, window, rep)
	}
}
