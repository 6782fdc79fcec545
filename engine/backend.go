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
