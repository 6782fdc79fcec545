package reference

import "slices"

// ReserveLog is the sliding window log extended with reservations: entries
// may lie after the instant a decision is made at. Per key it keeps the
// entries (sorted) and the latest decision instant; every operation is
// decided at the latest of its instant and that one, so instants never go
// back.
//
//   - Reserve places n entries at the earliest instant x, no earlier than
//     the decision instant and every entry, at which the window (x−W, x]
//     holds at most Limit−n entries.
//   - Allow is the plain log's decision, except that while an entry lies
//     after the decision instant the request is refused, RetryAfter saying
//     when a reservation would be placed.
//   - Cancel removes a reservation's n entries at instant at, if at is
//     after the decision instant; the later entries stay where they are.
//
// Every placement is at or after the newest entry, so a key's reservations
// lie in the order they were made.
type ReserveLog struct {
	Limit  int
	Window int64
	// MaxAhead, when > 0, refuses a reservation placed more than MaxAhead
	// after its decision instant.
	MaxAhead int64
	keys     map[string]*reserveKey
}

type reserveKey struct {
	q    []int64
	last int64
}

// NewReserveLog returns an empty model.
func NewReserveLog(limit int, window int64) *ReserveLog {
	return &ReserveLog{Limit: limit, Window: window, keys: map[string]*reserveKey{}}
}

func (m *ReserveLog) key(k string, now int64) (*reserveKey, int64) {
	s := m.keys[k]
	if s == nil {
		s = &reserveKey{}
		m.keys[k] = s
	}
	s.last = max(s.last, now)
	return s, s.last
}

// count returns how many entries of q lie in (x−W, x].
func (m *ReserveLog) count(q []int64, x int64) int {
	c := 0
	for _, e := range q {
		if e > x-m.Window && e <= x {
			c++
		}
	}
	return c
}

// earliest returns the earliest instant ≥ t and ≥ every entry at which n
// more entries fit, trying the candidates in increasing order.
func (m *ReserveLog) earliest(q []int64, n int, t int64) int64 {
	lo := t
	if len(q) > 0 {
		lo = max(lo, q[len(q)-1])
	}
	cands := []int64{lo}
	for _, e := range q {
		if e+m.Window > lo {
			cands = append(cands, e+m.Window)
		}
	}
	slices.Sort(cands)
	for _, x := range cands {
		if m.count(q, x)+n <= m.Limit {
			return x
		}
	}
	panic("reference: no instant fits") // the last candidate is after every entry's window
}

func (m *ReserveLog) state(s *reserveKey, t int64) (live int, oldest int64) {
	for _, e := range s.q {
		if e > t-m.Window {
			if live == 0 {
				oldest = e
			}
			live++
		}
	}
	return live, oldest
}

// Allow decides a request of cost n at now; it returns the result and the
// instant it was decided at.
func (m *ReserveLog) Allow(key string, n int, now int64) (Result, int64) {
	s, t := m.key(key, now)
	live, oldest := m.state(s, t)
	var r Result
	r.Remaining = max(0, m.Limit-live)
	if live > 0 {
		r.Reset = oldest + m.Window - t
	}
	x := m.earliest(s.q, n, t)
	if x > t {
		r.RetryAfter = x - t
		return r, t
	}
	r.Allowed = true
	for range n {
		s.q = append(s.q, t)
	}
	r.Remaining -= n
	if live == 0 {
		r.Reset = m.Window
	}
	return r, t
}

// Reserve reserves n at the earliest fitting instant, if it is ≤ maxAt;
// it returns that instant, whether it reserved, and the decision instant.
func (m *ReserveLog) Reserve(key string, n int, now, maxAt int64) (at int64, ok bool, t int64) {
	s, t := m.key(key, now)
	x := m.earliest(s.q, n, t)
	if x > maxAt || (m.MaxAhead > 0 && x-t > m.MaxAhead) {
		return x, false, t
	}
	for range n {
		s.q = append(s.q, x)
	}
	return x, true, t
}

// Cancel gives back n entries at instant at if at is after the decision
// instant, and reports whether it did. A cancel at or after at is no
// decision at all.
func (m *ReserveLog) Cancel(key string, n int, at, now int64) bool {
	if at <= now {
		return false
	}
	s, t := m.key(key, now)
	if at <= t {
		return false
	}
	left := n
	for i := len(s.q) - 1; i >= 0 && left > 0; i-- {
		if s.q[i] == at {
			s.q = slices.Delete(s.q, i, i+1)
			left--
		}
	}
	return true
}

// Entries returns key's entries, oldest first.
func (m *ReserveLog) Entries(key string) []int64 {
	if s := m.keys[key]; s != nil {
		return slices.Clone(s.q)
	}
	return nil
}
