package engine

import (
	"sync/atomic"
	"time"
)

// Clock is the limiter's time source: monotonic nanoseconds since an epoch
// of the clock's choosing. Decisions only ever compare instants of one
// clock, so the epoch does not matter; what matters is that Now never jumps
// with wall-clock adjustments (NTP steps, leap smearing, a user's date -s).
type Clock interface {
	Now() int64
}

// monoClock reads Go's monotonic clock as an offset from its creation.
// time.Since on an instant taken by time.Now uses the monotonic reading
// only, so a wall-clock step changes nothing.
type monoClock struct{ epoch time.Time }

// NewMonotonicClock returns the default clock: monotonic nanoseconds since
// the call.
func NewMonotonicClock() Clock { return monoClock{epoch: time.Now()} }

func (c monoClock) Now() int64 { return int64(time.Since(c.epoch)) }

// ManualClock is a clock that moves only when told to: for tests,
// simulations and deterministic replays. It starts at 0. It is safe for
// concurrent use.
type ManualClock struct{ ns atomic.Int64 }

// NewManualClock returns a ManualClock at instant 0.
func NewManualClock() *ManualClock { return &ManualClock{} }

// Now returns the current instant in nanoseconds.
func (c *ManualClock) Now() int64 { return c.ns.Load() }

// Set moves the clock to d after its epoch. Moving it backwards is allowed
// (to test that limiters do not go back with it).
func (c *ManualClock) Set(d time.Duration) { c.ns.Store(int64(d)) }

// Advance moves the clock by d and returns the new instant.
func (c *ManualClock) Advance(d time.Duration) int64 { return c.ns.Add(int64(d)) }
