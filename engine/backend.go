package engine

import (
	"context"
	"time"

	"github.com/slidegate/slidegate/internal/shard"
)

// Backend is what the HTTP layer and the load-test harness need from a
// limiter of one policy. *Limiter implements it in memory; the redisstore
// package implements it on Redis and Redis Cluster.
type Backend interface {
	// Policy returns the policy the backend enforces.
	Policy() Policy
	// Decide decides a request of cost n for key. Errors are for bad input
	// (ErrInvalidCost) and, for remote backends, for a failed store whose
	// failure policy says to fail.
	Decide(ctx context.Context, key string, n int) (Decision, error)
	// WallTime maps a Decision.At to wall time, for display only.
	WallTime(at int64) time.Time
	// Close releases background work.
	Close() error
}

var _ Backend = (*Limiter)(nil)

// Decide is AllowN for the Backend interface; the in-memory engine never
// blocks, so ctx is not consulted.
func (l *Limiter) Decide(_ context.Context, key string, n int) (Decision, error) {
	return l.AllowN(key, n)
}

// GroupBackend is what a server needs to decide requests over several
// limits at once, all or nothing (see Group): the HTTP routes, the Envoy
// rate limit service. *Group implements it in memory; a remote backend
// implements it with one atomic call per request.
type GroupBackend interface {
	// Policies returns the policies a request's refs index into.
	Policies() []Policy
	// NeedsTag reports whether the backend keeps keys in partitions (Redis
	// Cluster's hash slots) and decides a request whose refs have
	// different keys in one atomic call only when it names a Tag. A limit
	// whose key is not the tag then counts per tag value as well (per user
	// and IP, not per IP): the price of one atomic call on a partitioned
	// store.
	NeedsTag() bool
	// DecideGroup decides req, all or nothing, and writes each ref's
	// decision in dst's storage when it is large enough (nil is fine):
	// the result's Limits follow req.Refs and alias dst. A ref repeated
	// exactly (same policy, same key) is decided once. Errors are for bad
	// input (ErrInvalidKeys, ErrInvalidCost), changing nothing, and, for
	// remote backends, for a failed store whose failure policy says to
	// fail.
	DecideGroup(ctx context.Context, dst []Decision, req GroupRequest) (GroupDecision, error)
	// WallTime maps a Decision.At to wall time, for display only.
	WallTime(at int64) time.Time
	// Close releases background work.
	Close() error
}

// GroupRequest is one request to a GroupBackend: the limits it counts
// against and what it costs each.
type GroupRequest struct {
	// Refs names the limits, at least one.
	Refs []Ref
	// N is the cost of every ref, 1..the smallest referenced limit; it is
	// unused when Costs is not nil.
	N int
	// Costs, when not nil, holds each ref's own cost (Costs[i] for
	// Refs[i], 1..its limit): the request is allowed iff every limit has
	// room for its own cost at one instant. A ref repeated exactly is
	// decided at the largest of its costs.
	Costs []int
	// Tag, when not empty, places every key of the request on a backend
	// that needs one (NeedsTag); other backends ignore it. A (policy, key)
	// must always be decided with the same tag.
	Tag string
}

var _ GroupBackend = (*Group)(nil)

// DecideGroup decides req at the clock's current instant (see
// GroupBackend). The in-memory engine never blocks and keeps no
// partitions: it consults neither ctx nor req.Tag.
func (g *Group) DecideGroup(_ context.Context, dst []Decision, req GroupRequest) (GroupDecision, error) {
	if req.Costs != nil {
		return g.allowRefsCosts(dst, req.Refs, req.Costs)
	}
	return g.allowRefs(dst, req.Refs, req.N, g.Now(), g.mono)
}

// NeedsTag reports false: memory has no partitions.
func (g *Group) NeedsTag() bool { return false }

// KeyState is what a backend holds for one key at an instant, for
// operators (the server's admin listener).
type KeyState struct {
	// Used is how much of the limit the key uses now: for the log, its
	// live entries; for the counter, its estimate rounded up.
	Used      int
	Remaining int
	// Oldest is how long ago the oldest live entry was made (the log; 0
	// for the counter).
	Oldest time.Duration
	// Reset is how long until the key's state is empty again.
	Reset time.Duration
	// At is the instant the state was read at.
	At int64
}

// KeyAdmin is implemented by backends that can show and reset one key's
// state, for support staff. *Limiter implements it.
type KeyAdmin interface {
	// InspectKey returns key's state now, and false when it holds none.
	// It changes nothing.
	InspectKey(ctx context.Context, key string) (KeyState, bool, error)
	// ResetKey drops key's state, as if it had never made a request, and
	// reports whether it had any.
	ResetKey(ctx context.Context, key string) (bool, error)
}

var _ KeyAdmin = (*Limiter)(nil)

// InspectKey returns key's state at the clock's current instant, and false
// when the key holds none. It changes nothing; ctx is not consulted.
func (l *Limiter) InspectKey(_ context.Context, key string) (KeyState, bool, error) {
	var r shard.Result
	oldest, ok, err := l.store.Peek(key, l.Now(), &r)
	if err != nil || !ok {
		return KeyState{}, false, err
	}
	st := KeyState{Used: r.Limit - r.Remaining, Remaining: max(r.Remaining, 0), Reset: time.Duration(r.Reset), At: r.At}
	if l.Policy().Algorithm == SlidingLog && st.Used > 0 {
		st.Oldest = time.Duration(r.At - oldest)
	}
	return st, true, nil
}

// ResetKey drops key's state and reports whether it had any: its next
// request is decided as a new key's (at no earlier an instant than its
// last one). ctx is not consulted.
func (l *Limiter) ResetKey(_ context.Context, key string) (bool, error) {
	return l.store.Drop(key, l.Now())
}
