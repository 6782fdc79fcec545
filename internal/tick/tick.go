// Package tick runs a function at a fixed interval until it is told to
// stop: the loop of the background goroutines that sweep, redraw or
// poll.
package tick

import "time"

// Every calls f every d until stop is closed, and returns then. The first
// call is d after Every starts. A call that takes longer than d delays
// the next; ticks missed meanwhile are dropped (time.Ticker's rule).
// d must be positive.
func Every(stop <-chan struct{}, d time.Duration, f func()) {
	t := time.NewTicker(d)
	defer t.Stop()
	for {
		select {
		case <-stop:
			return
		case <-t.C:
			f()
		}
	}
}
