// Package reference holds the plain models every slidegate backend is
// checked against, and the offline verifier that replays recorded decisions
// through them.
//
// The models are written to be obviously right, not fast: a deque of
// instants per key for the log (the textbook design), and exact
// rational arithmetic for the counter. They share no code with the engine.
package reference

import (
	"math/big"
)

// Result is a model decision. Durations are nanoseconds.
type Result struct {
	Allowed    bool
	Remaining  int
	RetryAfter int64
	Reset      int64
}

// Model decides requests for many keys at caller-given instants.
type Model interface {
	Decide(key string, n int, t int64) Result
	// Peek is Decide without logging anything: Allowed says whether the
	// request fits, and the other fields describe the state as it is.
	Peek(key string, n int, t int64) Result
}

// Log is the sliding window log: per key, the instants of accepted
// requests, oldest first.
type Log struct {
	Limit  int
	Window int64
	keys   map[string][]int64
}

// NewLog returns an empty log model.
func NewLog(limit int, window int64) *Log {
	return &Log{Limit: limit, Window: window, keys: map[string][]int64{}}
}

// Decide evicts entries ≤ t−W, allows iff live+n ≤ Limit, and appends n
// entries of t when it allows.
func (m *Log) Decide(key string, n int, t int64) Result { return m.decide(key, n, t, true) }

// Peek is Decide without appending.
func (m *Log) Peek(key string, n int, t int64) Result { return m.decide(key, n, t, false) }

func (m *Log) decide(key string, n int, t int64, commit bool) Result {
	q := m.keys[key]
	for len(q) > 0 && q[0] <= t-m.Window {
		q = q[1:]
	}
	var r Result
	if len(q)+n <= m.Limit {
		r.Allowed = true
		for range n {
			if commit {
				q = append(q, t)
			}
		}
	} else {
		// The entry whose expiry makes room for n.
		k := len(q) + n - m.Limit
		r.RetryAfter = q[k-1] + m.Window - t
	}
	r.Remaining = m.Limit - len(q)
	if len(q) > 0 {
		r.Reset = q[0] + m.Window - t
	}
	if len(q) == 0 {
		delete(m.keys, key)
	} else {
		m.keys[key] = q
	}
	return r
}

// Entries returns a copy of key's logged instants, oldest first (some
// may have expired: they go at the key's next decision).
func (m *Log) Entries(key string) []int64 { return append([]int64(nil), m.keys[key]...) }

// Restore sets key's logged instants to a copy of es, as Entries returned
// them: a replay that tries an order and backs out of it.
func (m *Log) Restore(key string, es []int64) {
	if len(es) == 0 {
		delete(m.keys, key)
		return
	}
	m.keys[key] = append([]int64(nil), es...)
}

// Counter is the sliding window counter: per key the counts of the
// previous and current fixed windows (aligned to instant 0).
type Counter struct {
	Limit  int
	Window int64
	keys   map[string]*counterKey
}

type counterKey struct {
	idx       int64
	prev, cur int64
}

// NewCounter returns an empty counter model.
func NewCounter(limit int, window int64) *Counter {
	return &Counter{Limit: limit, Window: window, keys: map[string]*counterKey{}}
}

func (m *Counter) state(key string, t int64) (idx, prev, cur int64) {
	idx = t / m.Window
	k := m.keys[key]
	if k == nil {
		return idx, 0, 0
	}
	switch idx - k.idx {
	case 0:
		return idx, k.prev, k.cur
	case 1:
		return idx, k.cur, 0
	}
	return idx, 0, 0
}

// estimate returns prev·(W−e)/W + cur at t as an exact rational.
func (m *Counter) estimate(prev, cur int64, t int64) *big.Rat {
	idx := t / m.Window
	e := t - idx*m.Window
	est := new(big.Rat).SetFrac(big.NewInt(prev*1), big.NewInt(1))
	est.Mul(est, big.NewRat(m.Window-e, m.Window))
	return est.Add(est, big.NewRat(cur, 1))
}

// estimateAfter is the estimate at t+d given the state at t and no new
// requests.
func (m *Counter) estimateAfter(idx, prev, cur, t, d int64) *big.Rat {
	t2 := t + d
	switch t2/m.Window - idx {
	case 0:
		return m.estimate(prev, cur, t2)
	case 1:
		return m.estimate(cur, 0, t2)
	}
	return new(big.Rat)
}

// Decide allows iff estimate + n ≤ Limit.
func (m *Counter) Decide(key string, n int, t int64) Result { return m.decide(key, n, t, true) }

// Peek is Decide without counting.
func (m *Counter) Peek(key string, n int, t int64) Result { return m.decide(key, n, t, false) }

func (m *Counter) decide(key string, n int, t int64, commit bool) Result {
	idx, prev, cur := m.state(key, t)
	limit := big.NewRat(int64(m.Limit), 1)
	fits := func(est *big.Rat) bool {
		return new(big.Rat).Add(est, big.NewRat(int64(n), 1)).Cmp(limit) <= 0
	}
	var r Result
	if fits(m.estimate(prev, cur, t)) {
		r.Allowed = true
		if commit {
			cur += int64(n)
			m.keys[key] = &counterKey{idx: idx, prev: prev, cur: cur}
		}
	} else {
		// The least d with a fitting estimate: the estimate never rises
		// without requests, so bisect.
		lo, hi := int64(0), 2*m.Window
		for lo < hi {
			mid := lo + (hi-lo)/2
			if fits(m.estimateAfter(idx, prev, cur, t, mid)) {
				hi = mid
			} else {
				lo = mid + 1
			}
		}
		r.RetryAfter = lo
	}
	// Remaining = floor(Limit − estimate), at least 0.
	rem := new(big.Rat).Sub(limit, m.estimate(prev, cur, t))
	if rem.Sign() > 0 {
		q := new(big.Int).Quo(rem.Num(), rem.Denom())
		r.Remaining = int(q.Int64())
	}
	e := t - idx*m.Window
	switch {
	case cur > 0:
		r.Reset = 2*m.Window - e
	case prev > 0:
		r.Reset = m.Window - e
	}
	return r
}

// Group is the all-or-nothing model over several limits: a request carries
// one key per limit, and is logged by every limit iff every limit has room
// for it at its instant.
type Group struct {
	Limits []Model
}

// Decide decides keys[i] against Limits[i] at t and returns whether the
// request was allowed and each limit's result: for an allowed request each
// limit's Decide, otherwise each limit's Peek.
func (g *Group) Decide(keys []string, n int, t int64) (bool, []Result) {
	rs := make([]Result, len(g.Limits))
	allowed := true
	for i, m := range g.Limits {
		rs[i] = m.Peek(keys[i], n, t)
		allowed = allowed && rs[i].Allowed
	}
	if allowed {
		for i, m := range g.Limits {
			rs[i] = m.Decide(keys[i], n, t)
		}
	}
	return allowed, rs
}
