package bench

import (
	"fmt"
	"sync"
	"time"

	"github.com/cespare/xxhash/v2"
	"github.com/slidegate/slidegate/engine"
)

// Textbook is the sliding window log as textbooks describe it, written
// carefully: one mutex around a map from key to a ring-buffer deque of the
// instants of accepted requests, read from a monotonic clock. Each
// decision evicts the expired prefix, then allows iff live + n ≤ Limit.
// Rings start at one slot and double up to Limit. Keys are never dropped
// (the textbook design has no sweeper).
//
// It is a benchmark baseline, not a product: it exists so that slidegate's
// figures can be quoted as ratios to it, measured in the same run. It is
// safe for concurrent use.
type Textbook struct {
	tbShard
	limit  int
	window int64
	epoch  time.Time
}

// deque is a ring of instants, oldest first.
type deque struct {
	buf   []int64
	head  int
	count int
}

// NewTextbook returns an empty textbook log for limit requests per window.
func NewTextbook(limit int, window time.Duration) (*Textbook, error) {
	if err := checkPolicy(limit, window); err != nil {
		return nil, err
	}
	return &Textbook{tbShard: tbShard{keys: make(map[string]*deque)}, limit: limit, window: int64(window), epoch: time.Now()}, nil
}

func checkPolicy(limit int, window time.Duration) error {
	if limit < 1 || limit > engine.MaxLogLimit {
		return fmt.Errorf("bench: limit %d outside 1..%d", limit, engine.MaxLogLimit)
	}
	if window <= 0 {
		return fmt.Errorf("bench: window %v must be positive", window)
	}
	return nil
}

// Now returns the current instant: monotonic nanoseconds since New.
func (tb *Textbook) Now() int64 { return int64(time.Since(tb.epoch)) }

// Allow decides a request of cost 1 now.
func (tb *Textbook) Allow(key string) engine.Decision {
	return tb.AllowNAt(key, 1, tb.Now())
}

// AllowNAt decides a request of cost n (1 ≤ n ≤ Limit, unchecked) at
// instant now. Instants must not decrease per key.
func (tb *Textbook) AllowNAt(key string, n int, now int64) engine.Decision {
	return tb.decide(key, n, now, tb.limit, tb.window)
}

// Keys returns the number of keys holding state.
func (tb *Textbook) Keys() int {
	tb.mu.Lock()
	defer tb.mu.Unlock()
	return len(tb.keys)
}

// StoredInstants returns the instants held in all deques.
func (tb *Textbook) StoredInstants() int64 {
	tb.mu.Lock()
	defer tb.mu.Unlock()
	var n int64
	for _, q := range tb.keys {
		n += int64(q.count)
	}
	return n
}

// decide is the log decision on q. Precondition: the caller holds q's lock.
func (q *deque) decide(n int, now int64, limit int, window int64) engine.Decision {
	// Goroutines read the clock before taking the lock, so they may arrive
	// out of order; the key's time never goes backwards.
	if q.count > 0 {
		now = max(now, q.at(q.count-1))
	}
	cutoff := now - window
	for q.count > 0 && q.buf[q.head] <= cutoff {
		q.head++
		if q.head == len(q.buf) {
			q.head = 0
		}
		q.count--
	}
	d := engine.Decision{Limit: limit, At: now}
	if q.count+n <= limit {
		d.Allowed = true
		for range n {
			q.push(now, limit)
		}
	} else {
		// The entry whose expiry makes room for n.
		d.RetryAfter = time.Duration(q.at(q.count+n-limit-1) + window - now)
	}
	d.Remaining = limit - q.count
	if q.count > 0 {
		d.Reset = time.Duration(q.at(0) + window - now)
	}
	return d
}

// at returns the i-th oldest instant.
func (q *deque) at(i int) int64 {
	j := q.head + i
	if j >= len(q.buf) {
		j -= len(q.buf)
	}
	return q.buf[j]
}

// push appends t, growing the ring (doubling, at most to limit) when full.
func (q *deque) push(t int64, limit int) {
	if q.count == len(q.buf) {
		nb := make([]int64, min(max(2*len(q.buf), 1), limit))
		for i := range q.count {
			nb[i] = q.at(i)
		}
		q.buf, q.head = nb, 0
	}
	j := q.head + q.count
	if j >= len(q.buf) {
		j -= len(q.buf)
	}
	q.buf[j] = t
	q.count++
}

// TextbookShards is the shard count of ShardedTextbook.
const TextbookShards = 64

// ShardedTextbook is Textbook split into TextbookShards independent maps,
// each behind its own mutex and padded to a cache line, keys hashed with
// xxhash: the obvious next step for a textbook log on many cores.
type ShardedTextbook struct {
	shards [TextbookShards]tbShard
	limit  int
	window int64
	epoch  time.Time
}

// tbShard is a map of deques behind a mutex: all of Textbook, and one of
// ShardedTextbook's shards (padded to a cache line there).
type tbShard struct {
	mu   sync.Mutex
	keys map[string]*deque
	_    [64 - 16]byte
}

// decide decides key's request of cost n at now under the shard's lock.
func (sh *tbShard) decide(key string, n int, now int64, limit int, window int64) engine.Decision {
	sh.mu.Lock()
	q := sh.keys[key]
	if q == nil {
		q = &deque{}
		sh.keys[key] = q
	}
	d := q.decide(n, now, limit, window)
	sh.mu.Unlock()
	return d
}

// NewShardedTextbook returns an empty 64-shard textbook log.
func NewShardedTextbook(limit int, window time.Duration) (*ShardedTextbook, error) {
	if err := checkPolicy(limit, window); err != nil {
		return nil, err
	}
	s := &ShardedTextbook{limit: limit, window: int64(window), epoch: time.Now()}
	for i := range s.shards {
		s.shards[i].keys = make(map[string]*deque)
	}
	return s, nil
}

// Now returns the current instant: monotonic nanoseconds since New.
func (s *ShardedTextbook) Now() int64 { return int64(time.Since(s.epoch)) }

// Allow decides a request of cost 1 now.
func (s *ShardedTextbook) Allow(key string) engine.Decision {
	return s.AllowNAt(key, 1, s.Now())
}

// AllowNAt decides a request of cost n (1 ≤ n ≤ Limit, unchecked) at
// instant now. Instants must not decrease per key.
func (s *ShardedTextbook) AllowNAt(key string, n int, now int64) engine.Decision {
	return s.shards[xxhash.Sum64String(key)&(TextbookShards-1)].decide(key, n, now, s.limit, s.window)
}
