package redisstore

import (
	"sync"
	"sync/atomic"
	"time"
)

// Breaker states, as exported by the breaker-state metric.
const (
	stateClosed   int32 = 0 // requests go to Redis
	stateOpen     int32 = 1 // requests go to the failure policy
	stateHalfOpen int32 = 2 // one probe goes to Redis; the rest as open
)

func stateName(s int32) string {
	switch s {
	case stateClosed:
		return "closed"
	case stateOpen:
		return "open"
	}
	return "half-open"
}

// breakerBucket is the length of one bucket of the failure-rate window;
// the window is the current bucket and the previous one (1 to 2 s).
const breakerBucket = time.Second

// breaker is the circuit breaker of one Redis node (a standalone server,
// or the master owning a set of cluster slots): a failing node sends only
// its own keys to the failure policy.
//
// It opens on threshold consecutive failures, or when, over the last one
// to two seconds, at least threshold calls failed and they were at least
// half of the calls: a node that fails most of its calls opens even while
// some succeed (a success does not reset the count). After cooldown one
// probe goes to Redis; its success closes the breaker, its failure
// reopens it.
//
// Cost in the closed state: one atomic load and one clock read per call
// while the node has had no failure for two buckets; calls are counted
// (under the mutex) only from a node's first recent failure on, which is
// when the rate matters. It times everything on the monotonic clock,
// whatever clock decisions use: it is about a real server's health.
type breaker struct {
	threshold int // 0: never opens
	cooldown  time.Duration
	onChange  func(from, to int32, failures int, err error)
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

func newBreaker(threshold int, cooldown time.Duration) *breaker {
	b := &breaker{threshold: threshold, cooldown: cooldown, epoch: time.Now()}
	b.lastFail.Store(-1)
	return b
}

// allow reports whether a request may go to Redis.
func (b *breaker) allow() bool {
	if b.state.Load() == stateClosed {
		return true
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	switch b.state.Load() {
	case stateClosed:
		return true
	case stateOpen:
		if time.Since(b.openedAt) < b.cooldown {
			return false
		}
		b.set(stateHalfOpen, 0, nil)
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
func (b *breaker) rotate(now time.Duration) {
	k := int64(now / breakerBucket)
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

// success records a request Redis answered.
func (b *breaker) success() {
	if b.state.Load() == stateClosed {
		lf := b.lastFail.Load()
		if lf < 0 {
			return
		}
		now := time.Since(b.epoch)
		if now-time.Duration(lf) > 2*breakerBucket {
			return
		}
		b.mu.Lock()
		if b.state.Load() == stateClosed {
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
	if b.state.Load() != stateClosed {
		b.probing = false
		b.consec = 0
		b.calls, b.fails = [2]int{}, [2]int{}
		b.set(stateClosed, 0, nil)
	}
}

// failure records a request Redis failed.
func (b *breaker) failure(err error) {
	if b.threshold == 0 {
		return
	}
	now := time.Since(b.epoch)
	b.lastFail.Store(int64(now))
	b.mu.Lock()
	defer b.mu.Unlock()
	b.rotate(now)
	b.calls[0]++
	b.fails[0]++
	b.consec++
	switch b.state.Load() {
	case stateClosed:
		fails, calls := b.fails[0]+b.fails[1], b.calls[0]+b.calls[1]
		if b.consec >= b.threshold || fails >= b.threshold && 2*fails >= calls {
			b.openedAt = time.Now()
			b.set(stateOpen, fails, err)
		}
	case stateHalfOpen:
		b.probing = false
		b.openedAt = time.Now()
		b.set(stateOpen, b.fails[0]+b.fails[1], err)
	}
}

// trip opens the breaker at once: the node answered neither a call nor
// a liveness probe in time (a hang). It does nothing when the breaker is
// disabled or already open.
func (b *breaker) trip(err error) {
	if b.threshold == 0 {
		return
	}
	now := time.Since(b.epoch)
	b.lastFail.Store(int64(now))
	b.mu.Lock()
	defer b.mu.Unlock()
	b.rotate(now)
	b.fails[0]++
	b.probing = false
	if b.state.Load() != stateOpen {
		b.openedAt = time.Now()
		b.set(stateOpen, b.fails[0]+b.fails[1], err)
	}
}

// revive records that the node answered a liveness probe: a breaker
// that is not closed closes, as after a successful call.
func (b *breaker) revive() {
	if b.state.Load() == stateClosed {
		return
	}
	b.success()
}

// abandon records a request that ended without telling anything about
// Redis (the caller gave up), so that a half-open probe slot is freed.
func (b *breaker) abandon() {
	if b.state.Load() == stateClosed {
		return
	}
	b.mu.Lock()
	b.probing = false
	b.mu.Unlock()
}

// set changes state; b.mu is held.
func (b *breaker) set(to int32, failures int, err error) {
	from := b.state.Swap(to)
	if from != to && b.onChange != nil {
		b.onChange(from, to, failures, err)
	}
}
