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

// breaker is a consecutive-failure circuit breaker. The closed state, the
// common one, costs one atomic load per request and one more per success
// only while failures are being counted; transitions take the mutex.
// It times the cooldown on the monotonic clock, whatever clock decisions
// use: it is about a real server's health.
type breaker struct {
	threshold int // 0: never opens
	cooldown  time.Duration
	onChange  func(from, to int32, failures int, err error)

	state atomic.Int32
	fails atomic.Int64

	mu       sync.Mutex
	openedAt time.Time
	probing  bool
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

// success records a request Redis answered.
func (b *breaker) success() {
	if b.state.Load() == stateClosed {
		if b.fails.Load() != 0 {
			b.fails.Store(0)
		}
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.state.Load() != stateClosed {
		b.probing = false
		b.fails.Store(0)
		b.set(stateClosed, 0, nil)
	}
}

// failure records a request Redis failed.
func (b *breaker) failure(err error) {
	if b.threshold == 0 {
		return
	}
	n := b.fails.Add(1)
	st := b.state.Load()
	if st == stateClosed && n < int64(b.threshold) {
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	switch b.state.Load() {
	case stateClosed:
		if b.fails.Load() >= int64(b.threshold) {
			b.openedAt = time.Now()
			b.set(stateOpen, int(b.fails.Load()), err)
		}
	case stateHalfOpen:
		b.probing = false
		b.openedAt = time.Now()
		b.set(stateOpen, int(b.fails.Load()), err)
	}
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
