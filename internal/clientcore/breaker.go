package clientcore

import (
	"sync"
	"sync/atomic"
	"time"
)

// State is a breaker's state; its value is what the breaker-state metric
// exports.
type State int32

// The states.
const (
	StateClosed   State = 0 // calls go to the backend
	StateOpen     State = 1 // calls go to the failure policy
	StateHalfOpen State = 2 // one probe goes to the backend; the rest as open
)

// String returns "closed", "open" or "half-open".
func (s State) String() string {
	switch s {
	case StateClosed:
		return "closed"
	case StateOpen:
		return "open"
	}
	return "half-open"
}

// bucket is the length of one bucket of the failure-rate window; the
// window is the current bucket and the previous one (1 to 2 s).
const bucket = time.Second

// Breaker is the circuit breaker of one backend: a Redis node (a
// standalone server, or the master owning a set of cluster slots) or a
// slidegate server. A failing backend sends only its own calls to the
// failure policy.
//
// It opens on threshold consecutive failures, or when, over the last one
// to two seconds, at least threshold calls failed and they were at least
// half of the calls: a backend that fails most of its calls opens even
// while some succeed (a success does not reset the count). After cooldown
// one probe goes to the backend; its success closes the breaker, its
// failure reopens it. What counts as a failure is the caller's choice.
//
// Cost in the closed state: one atomic load and one clock read per call
// while the backend has had no failure for two buckets; calls are counted
// (under the mutex) only from its first recent failure on, which is when
// the rate matters. It times everything on the monotonic clock, whatever
// clock decisions use: it is about a real server's health.
type Breaker struct {
	threshold int // 0: never opens
	cooldown  time.Duration
	onChange  func(from, to State, failures int, err error)
	epoch     time.Time

	state    atomic.Int32
	lastFail atomic.Int64 // ns since epoch of the latest failure; -1: none

	mu       sync.Mutex
	bucket   int64  // index of the current bucket
	calls    [2]int // [0] current bucket, [1] previous
	fails    [2]int
	consec   int
	openedAt time.Time
	probing  bool
}

// NewBreaker returns a closed breaker; threshold 0 never opens. onChange,
// if not nil, is called on every change of state, with the failures in
// the window and the failure that caused it (nil for a closing), under the
// breaker's lock: it must not call the breaker.
func NewBreaker(threshold int, cooldown time.Duration, onChange func(from, to State, failures int, err error)) *Breaker {
	b := &Breaker{threshold: threshold, cooldown: cooldown, onChange: onChange, epoch: time.Now()}
	b.lastFail.Store(-1)
	return b
}

// State returns the current state.
func (b *Breaker) State() State { return State(b.state.Load()) }

// Allow reports whether a call may go to the backend.
func (b *Breaker) Allow() bool {
	if b.State() == StateClosed {
		return true
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	switch b.State() {
	case StateClosed:
		return true
	case StateOpen:
		if time.Since(b.openedAt) < b.cooldown {
			return false
		}
		b.set(StateHalfOpen, 0, nil)
		b.probing = true
		return true
	default: // half-open
		if b.probing {
			return false
		}
		b.probing = true
		return true
	}
}

// rotate moves the window to the bucket of now; b.mu is held.
func (b *Breaker) rotate(now time.Duration) {
	k := int64(now / bucket)
	switch k - b.bucket {
	case 0:
		return
	case 1:
		b.calls[1], b.fails[1] = b.calls[0], b.fails[0]
	default:
		b.calls[1], b.fails[1] = 0, 0
	}
	b.calls[0], b.fails[0] = 0, 0
	b.bucket = k
}

// Success records a call the backend answered.
func (b *Breaker) Success() {
	if b.State() == StateClosed {
		lf := b.lastFail.Load()
		if lf < 0 {
			return
		}
		now := time.Since(b.epoch)
		if now-time.Duration(lf) > 2*bucket {
			return
		}
		b.mu.Lock()
		if b.State() == StateClosed {
			b.rotate(now)
			b.calls[0]++
			b.consec = 0
			b.mu.Unlock()
			return
		}
		b.mu.Unlock()
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.State() != StateClosed {
		b.probing = false
		b.consec = 0
		b.calls, b.fails = [2]int{}, [2]int{}
		b.set(StateClosed, 0, nil)
	}
}

// Failure records a call the backend failed, err saying how.
func (b *Breaker) Failure(err error) { b.fail(err, false) }

// Trip opens the breaker at once: the backend answered neither a call
// nor a liveness probe in time (a hang). It does nothing when the breaker
// is disabled or already open.
func (b *Breaker) Trip(err error) { b.fail(err, true) }

// fail is Failure, or Trip when trip is set.
func (b *Breaker) fail(err error, trip bool) {
	if b.threshold == 0 {
		return
	}
	now := time.Since(b.epoch)
	b.lastFail.Store(int64(now))
	b.mu.Lock()
	defer b.mu.Unlock()
	b.rotate(now)
	b.fails[0]++
	if trip {
		b.probing = false
		if b.State() != StateOpen {
			b.open(err)
		}
		return
	}
	b.calls[0]++
	b.consec++
	switch b.State() {
	case StateClosed:
		fails, calls := b.fails[0]+b.fails[1], b.calls[0]+b.calls[1]
		if b.consec >= b.threshold || fails >= b.threshold && 2*fails >= calls {
			b.open(err)
		}
	case StateHalfOpen:
		b.probing = false
		b.open(err)
	}
}

// open opens the breaker for err; b.mu is held.
func (b *Breaker) open(err error) {
	b.openedAt = time.Now()
	b.set(StateOpen, b.fails[0]+b.fails[1], err)
}

// Revive records that the backend answered a liveness probe: a breaker
// that is not closed closes, as after a successful call.
func (b *Breaker) Revive() {
	if b.State() == StateClosed {
		return
	}
	b.Success()
}

// Abandon records a call that ended without telling anything about the
// backend (the caller gave up), so that a half-open probe slot is freed.
func (b *Breaker) Abandon() {
	if b.State() == StateClosed {
		return
	}
	b.mu.Lock()
	b.probing = false
	b.mu.Unlock()
}

// set changes state; b.mu is held.
func (b *Breaker) set(to State, failures int, err error) {
	from := State(b.state.Swap(int32(to)))
	if from != to && b.onChange != nil {
		b.onChange(from, to, failures, err)
	}
}
