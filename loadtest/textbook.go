package loadtest

import (
	"sync"
	"time"
)

// Textbook is the baseline the memory phase measures the engine against:
// the sliding window log as textbooks and the seeds write it, one mutex
// over a map from key to a deque of accepted instants. The deque is a ring
// over a slice that doubles when full (Go's append growth), starting from
// one slot, so that a client with one request pays for one instant.
//
// It is exact (it is the reference model's algorithm) but serializes every
// decision and pays a map entry, a deque header and a slice per key.
type Textbook struct {
	limit  int
	window int64
	epoch  time.Time

	mu   sync.Mutex
	keys map[string]*deque
}

// deque is a ring of instants, oldest first: buf[head], ..., n entries.
type deque struct {
	buf  []int64
	head int
	n    int
}

func (d *deque) front() int64 { return d.buf[d.head] }

func (d *deque) popFront() {
	d.head = (d.head + 1) % len(d.buf)
	d.n--
}

func (d *deque) pushBack(t int64) {
	if d.n == len(d.buf) {
		grown := make([]int64, max(1, 2*len(d.buf)))
		for i := range d.n {
			grown[i] = d.buf[(d.head+i)%len(d.buf)]
		}
		d.buf, d.head = grown, 0
	}
	d.buf[(d.head+d.n)%len(d.buf)] = t
	d.n++
}

// NewTextbook returns an empty textbook limiter of limit per window,
// reading the monotonic clock.
func NewTextbook(limit int, window time.Duration) *Textbook {
	return &Textbook{limit: limit, window: int64(window), epoch: time.Now(), keys: map[string]*deque{}}
}

// Allow decides a request of cost n for key now and returns whether it was
// allowed.
func (tb *Textbook) Allow(key string, n int) bool {
	return tb.allowAt(key, n, int64(time.Since(tb.epoch)))
}

// allowAt is Allow at instant t (nanoseconds since the epoch); per key, t
// must not decrease.
func (tb *Textbook) allowAt(key string, n int, t int64) bool {
	tb.mu.Lock()
	defer tb.mu.Unlock()
	d := tb.keys[key]
	if d == nil {
		d = &deque{}
		tb.keys[key] = d
	}
	for d.n > 0 && d.front() <= t-tb.window {
		d.popFront()
	}
	if d.n+n > tb.limit {
		return false
	}
	for range n {
		d.pushBack(t)
	}
	return true
}

// StoredInstants returns the number of instants held.
func (tb *Textbook) StoredInstants() int64 {
	tb.mu.Lock()
	defer tb.mu.Unlock()
	var n int64
	for _, d := range tb.keys {
		n += int64(d.n)
	}
	return n
}
