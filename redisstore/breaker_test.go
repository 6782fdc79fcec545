package redisstore

import (
	"errors"
	"testing"
	"time"
)

// TestBreakerFailureRate: a node that fails most of its calls opens its
// breaker even though successes keep interrupting the failures (each
// success used to reset the count); one that fails a minority does not.
func TestBreakerFailureRate(t *testing.T) {
	errDown := errors.New("down")
	for _, c := range []struct {
		name      string
		pattern   string // s: success, f: failure, repeated
		wantOpen  bool
		threshold int
	}{
		{"two failures per success", "ffs", true, 5},
		{"alternating", "fs", true, 5},
		{"one failure in four", "fsss", false, 5},
		{"consecutive", "f", true, 5},
		{"all succeed", "s", false, 5},
		{"disabled", "f", false, 0},
	} {
		t.Run(c.name, func(t *testing.T) {
			b := newBreaker(c.threshold, time.Minute)
			for i := range 40 {
				if !b.allow() {
					break
				}
				if c.pattern[i%len(c.pattern)] == 'f' {
					b.failure(errDown)
				} else {
					b.success()
				}
			}
			if open := b.state.Load() == stateOpen; open != c.wantOpen {
				t.Errorf("after 40 calls of %q: open %v, want %v", c.pattern, open, c.wantOpen)
			}
		})
	}
}
