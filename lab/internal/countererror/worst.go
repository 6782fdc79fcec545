package countererror

import (
	"fmt"
	"time"
)

// Construction is the counter's worst case for one policy, as built and
// measured by WorstCase.
type Construction struct {
	Limit  int
	Window time.Duration
	Trace  []Request
	// From and To bound the trailing window (From, To] = (To−W, To] the
	// figures are about.
	From, To int64
	// CounterAdmitted and LogAdmitted are the units each algorithm
	// accepted in (From, To] when fed Trace.
	CounterAdmitted, LogAdmitted int
	// Bound is the most the counter can ever admit in one trailing window:
	// 2L − 1 (see docs/algorithms.md for the proof).
	Bound int
}

// WorstCase builds the trace that makes the counter admit the most in one
// trailing window, feeds it to both algorithms and counts.
//
// Window 0 is empty. L unit requests at W − 1 ns, the last instant of
// window 0, all fit (the previous window is empty). L more at 2W − 2 ns,
// the last-but-one instant of window 1, see an estimate of
// L·2ns/W + cur: the previous window has all but vanished from the
// estimate although all of it is still inside (t−W, t], so the counter
// admits cur up to ⌊L − 2L·ns/W⌋, which is L − 1 whenever W > 2L ns. The
// trailing window (W − 2 ns, 2W − 2 ns] then holds 2L − 1 accepted
// requests; the log holds L.
func WorstCase(limit int, window time.Duration) (Construction, error) {
	c := Construction{Limit: limit, Window: window, Bound: 2*limit - 1}
	if limit < 1 || window < 3 {
		return c, fmt.Errorf("%w: worst case needs limit ≥ 1 and window ≥ 3ns (got %d, %v)", ErrInvalidConfig, limit, window)
	}
	w := int64(window)
	c.Trace = worstPair("attacker", limit, w, 0)
	c.To = 2*w - 2
	c.From = c.To - w
	res, err := Compare("worst-case", limit, window, c.Trace)
	if err != nil {
		return c, err
	}
	// Every request of the trace is inside (From, To]: W − 1 > W − 2.
	c.CounterAdmitted, c.LogAdmitted = res.CounterAllowed, res.LogAllowed
	return c, nil
}
