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
	// Policies returns the policies refs index into.
	Policies() []Policy
	// DecideRefs decides a request of cost n over refs, all or nothing;
	// dst is as for Group.AllowRefsN. Errors are for bad input
	// (ErrInvalidKeys, ErrInvalidCost) and, for remote backends, for a
	// failed store whose failure policy says to fail.
	DecideRefs(ctx context.Context, dst []Decision, refs []Ref, n int) (GroupDecision, error)
	// WallTime maps a Decision.At to wall time, for display only.
	WallTime(at int64) time.Time
	// Close releases background work.
	Close() error
}

var _ GroupBackend = (*Group)(nil)

// DecideRefs is AllowRefsN for the GroupBackend interface; the in-memory
// engine never blocks, so ctx is not consulted.
func (g *Group) DecideRefs(_ context.Context, dst []Decision, refs []Ref, n int) (GroupDecision, error) {
	return g.AllowRefsN(dst, refs, n)
}

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

// TaggedGroupBackend is a GroupBackend whose keys live in partitions (Redis
// Cluster's hash slots) and which can decide a request atomically only
// when all its keys are in one. When every ref of a request has the same
// key, that key places them; otherwise the caller names a tag, and every
// key of the request is placed by the tag. A limit whose key is not the
// tag then counts per tag value as well (per user and IP, not per IP),
// which is the price of one atomic call on a partitioned store.
type TaggedGroupBackend interface {
	GroupBackend
	// NeedsTag reports whether a request whose refs have different keys
	// needs a tag (false: DecideRefs decides any request).
	NeedsTag() bool
	// DecideRefsTagged is DecideRefs with every key placed by tag.
	DecideRefsTagged(ctx context.Context, dst []Decision, refs []Ref, n int, tag string) (GroupDecision, error)
}

// NeedsTag reports whether g keeps keys in partitions and needs a tag to
// decide a request whose refs have different keys (TaggedGroupBackend).
func NeedsTag(g GroupBackend) bool {
	tg, ok := g.(TaggedGroupBackend)
	return ok && tg.NeedsTag()
}

// DecideTagged decides refs with g: placed by tag when g needs one
// (NeedsTag) and tag is not empty, else with g.DecideRefs. Backends that
// need no tag ignore it.
func DecideTagged(ctx context.Context, g GroupBackend, dst []Decision, refs []Ref, n int, tag string) (GroupDecision, error) {
	if tg, ok := g.(TaggedGroupBackend); ok && tag != "" && tg.NeedsTag() {
		return tg.DecideRefsTagged(ctx, dst, refs, n, tag)
	}
	return g.DecideRefs(ctx, dst, refs, n)
}
