package engine

import (
	"context"
	"time"
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
