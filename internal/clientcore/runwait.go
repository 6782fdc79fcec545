package clientcore

import "time"

// A liveness check that waits for a reply says "hung" when none came in
// its grace. On a starved host that verdict can be wrong twice over: the
// reply may wait unread while this process gets no CPU, and the server,
// on the same host, may get none either. Neither is evidence of a hang.
// RunWait is a wait that counts only the time this process was seen
// running: the waiter wakes in short steps, and a step that ends late
// was starved for as long as it was late. That time does not count
// towards the grace.

// RunStep is the longest step of a RunWait: how late a wake-up may be
// before the lag is seen.
const RunStep = 10 * time.Millisecond

// RunWait is one wait of grace in running time, at most limit in wall
// time, from start. Its zero value is over at once. It is used by one
// goroutine.
type RunWait struct {
	start        time.Time
	grace, limit time.Duration
	lag          time.Duration
}

// NewRunWait returns a wait from start of grace in running time, bounded
// by limit in wall time: a host starved for longer than limit still ends
// the wait.
func NewRunWait(start time.Time, grace, limit time.Duration) RunWait {
	return RunWait{start: start, grace: grace, limit: limit}
}

// Step returns how long the waiter may sleep from now before it looks
// again, and false when the wait is over.
func (w *RunWait) Step(now time.Time) (time.Duration, bool) {
	wall := now.Sub(w.start)
	left := w.grace - (wall - w.lag)
	if left <= 0 || wall >= w.limit {
		return 0, false
	}
	return min(left, RunStep, w.limit-wall), true
}

// Woke records a step of length d that began at began and ended at now
// for want of a reply: the time beyond d is lag.
func (w *RunWait) Woke(began, now time.Time, d time.Duration) {
	if late := now.Sub(began) - d; late > 0 {
		w.lag += late
	}
}

// Lag returns the time the wait has not counted so far.
func (w *RunWait) Lag() time.Duration { return w.lag }
