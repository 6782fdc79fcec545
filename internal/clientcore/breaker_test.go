package clientcore

import (
	"errors"
	"testing"
	"time"
)

// TestBreakerFailureRate: a backend that fails most of its calls opens
// its breaker even though successes keep interrupting the failures (each
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
			b := NewBreaker(c.threshold, time.Minute, nil)
			for i := range 40 {
				if !b.Allow() {
					break
				}
				if c.pattern[i%len(c.pattern)] == 'f' {
					b.Failure(errDown)
				} else {
					b.Success()
				}
			}
			if open := b.State() == StateOpen; open != c.wantOpen {
				t.Errorf("after 40 calls of %q: open %v, want %v", c.pattern, open, c.wantOpen)
			}
		})
	}
}

type change struct {
	from, to State
	err      error
}

// TestBreakerCycle walks the states: threshold consecutive failures
// open, the cooldown holds calls back, one probe passes in half-open,
// its failure reopens, a probe's success closes; a trip opens at once, a
// revive closes, and an abandoned probe frees the probe slot. onChange
// sees each change once, with its cause.
func TestBreakerCycle(t *testing.T) {
	errDown, errHung := errors.New("down"), errors.New("hung")
	var changes []change
	b := NewBreaker(2, time.Millisecond, func(from, to State, _ int, err error) {
		changes = append(changes, change{from, to, err})
	})
	b.Failure(errDown)
	if b.State() != StateClosed {
		t.Fatalf("one failure of two: %v", b.State())
	}
	b.Failure(errDown)
	if b.State() != StateOpen || len(changes) != 1 || changes[0] != (change{StateClosed, StateOpen, errDown}) {
		t.Fatalf("two failures: %v, changes %v", b.State(), changes)
	}
	// The cooldown is a millisecond: wait it out.
	for !b.Allow() {
		time.Sleep(time.Millisecond)
	}
	if b.State() != StateHalfOpen || b.Allow() {
		t.Fatalf("after the cooldown: %v, or a second call let through", b.State())
	}
	b.Abandon()
	if !b.Allow() {
		t.Fatal("an abandoned probe did not free the probe slot")
	}
	b.Failure(errDown)
	if b.State() != StateOpen {
		t.Fatalf("a failed probe: %v, want open", b.State())
	}
	for !b.Allow() {
		time.Sleep(time.Millisecond)
	}
	b.Success()
	if b.State() != StateClosed || !b.Allow() {
		t.Fatalf("a probe's success: %v, want closed", b.State())
	}
	n := len(changes)
	b.Trip(errHung)
	if b.State() != StateOpen || changes[len(changes)-1] != (change{StateClosed, StateOpen, errHung}) {
		t.Fatalf("trip: %v, changes %v", b.State(), changes[n:])
	}
	b.Trip(errHung)
	if len(changes) != n+1 {
		t.Fatalf("a trip of an open breaker changed it: %v", changes[n:])
	}
	b.Revive()
	if b.State() != StateClosed || changes[len(changes)-1] != (change{StateOpen, StateClosed, nil}) {
		t.Fatalf("revive: %v, changes %v", b.State(), changes[n:])
	}
	off := NewBreaker(0, 0, nil)
	off.Trip(errHung)
	for range 10 {
		off.Failure(errDown)
	}
	if off.State() != StateClosed || !off.Allow() {
		t.Fatalf("a disabled breaker: %v", off.State())
	}
}

func TestStateString(t *testing.T) {
	for s, want := range map[State]string{StateClosed: "closed", StateOpen: "open", StateHalfOpen: "half-open"} {
		if s.String() != want {
			t.Errorf("%d: %q, want %q", s, s.String(), want)
		}
	}
}
