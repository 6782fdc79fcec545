package remote

import (
	"errors"
	"sync"
	"sync/atomic"
	"time"
)

// ErrBreakerOpen is the cause given to the failure policy while the
// circuit breaker is open: the server failed threshold calls in a row, and
// decisions skip it until a probe succeeds.
var ErrBreakerOpen = errors.New("remote: circuit breaker open")

// breaker is the client's circuit breaker: threshold consecutive failures
// open it; while open, calls go straight to the failure policy instead of
// each waiting out the timeout; after cooldown one probe goes to the
// server, and its success closes the breaker (its failure reopens it).
// Cost while closed and healthy: one atomic load per call.
type breaker struct {
	threshold int // 0: never opens
	cooldown  time.Duration

	fails atomic.Int32 // consecutive failures
	open  atomic.Bool

	mu       sync.Mutex
	openedAt time.Time
	probing  bool
}

// allow reports whether a call may go to the server.
func (b *breaker) allow() bool {
	if !b.open.Load() {
		return true
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if !b.open.Load() {
		return true
	}
	if b.probing || time.Since(b.openedAt) < b.cooldown {
		return false
	}
	b.probing = true
	return true
}

// success records an answer from the server.
func (b *breaker) success() {
	if b.fails.Load() == 0 && !b.open.Load() {
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	b.fails.Store(0)
	b.probing = false
	b.open.Store(false)
}

// failure records a call the server did not answer.
func (b *breaker) failure() {
	b.mu.Lock()
	defer b.mu.Unlock()
	n := b.fails.Add(1)
	if b.probing || (b.threshold > 0 && int(n) >= b.threshold) {
		b.probing = false
		b.openedAt = time.Now()
		b.open.Store(true)
	}
}

// abandon records a call the caller gave up on: it says nothing about the
// server, but frees the probe.
func (b *breaker) abandon() {
	b.mu.Lock()
	b.probing = false
	b.mu.Unlock()
}
