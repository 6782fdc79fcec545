package clientcore

import (
	"testing"
	"time"
)

// run drives w from start as a waiter would, with no reply ever coming:
// each step ends late by what lateness returns for it (its index). It
// returns the wall time at which the wait was over.
func run(w *RunWait, start time.Time, lateness func(i int) time.Duration) time.Duration {
	now := start
	for i := 0; ; i++ {
		d, ok := w.Step(now)
		if !ok {
			return now.Sub(start)
		}
		if d <= 0 || d > RunStep {
			panic("step out of range")
		}
		end := now.Add(d + lateness(i))
		w.Woke(now, end, d)
		now = end
	}
}

// TestRunWaitCountsRunningTime: a waiter that wakes on time waits its
// grace; one whose wakes were late (a starved host) waits the grace plus
// its lag, so that a stall does not use the grace up; the wall-time limit
// ends the wait however starved the host.
func TestRunWaitCountsRunningTime(t *testing.T) {
	start := time.Unix(1000, 0)
	const grace = 250 * time.Millisecond
	for _, c := range []struct {
		name     string
		limit    time.Duration
		lateness func(i int) time.Duration
		want     time.Duration
	}{
		{"on time", time.Hour, func(int) time.Duration { return 0 }, grace},
		{"one stall", time.Hour, func(i int) time.Duration {
			if i == 3 {
				return 1500 * time.Millisecond
			}
			return 0
		}, grace + 1500*time.Millisecond},
		{"every wake late", time.Hour, func(int) time.Duration { return 5 * time.Millisecond }, grace + 25*5*time.Millisecond},
		{"stalled past the limit", 2 * time.Second, func(i int) time.Duration {
			if i == 1 {
				return 3 * time.Second
			}
			return 0
		}, 3*time.Second + 2*RunStep},
		{"starved up to the limit", time.Second, func(int) time.Duration { return 40 * time.Millisecond }, time.Second},
	} {
		t.Run(c.name, func(t *testing.T) {
			w := NewRunWait(start, grace, c.limit)
			if got := run(&w, start, c.lateness); got != c.want {
				t.Errorf("wait over after %v, want %v (lag %v)", got, c.want, w.Lag())
			}
		})
	}
	var zero RunWait
	if _, ok := zero.Step(start); ok {
		t.Error("the zero RunWait is not over at once")
	}
}
