package remote

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/slidegate/slidegate/engine"
	"github.com/slidegate/slidegate/internal/clientcore"
)

// Limiter decides requests against one of the server's policies: an
// engine.Backend. Make it with Client.Limiter.
type Limiter struct {
	c      *Client
	policy engine.Policy
	local  *engine.Limiter // FailLocal's; nil otherwise
}

var _ engine.Backend = (*Limiter)(nil)

// Limiter returns a Backend for the server's policy p. p.Name names it on
// the server ("" means the server's default policy); p's limit, window and
// algorithm must be the server's: they size the local fallback, and the
// limit is checked against every answer.
func (c *Client) Limiter(p engine.Policy) (*Limiter, error) {
	if err := p.Validate(); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalidOption, err)
	}
	local, err := fallback(c, func(o engine.Option) (*engine.Limiter, error) { return engine.New(p, o) })
	if err != nil {
		return nil, err
	}
	return &Limiter{c: c, policy: p, local: local}, nil
}

// Policy returns the policy the Limiter was made with.
func (l *Limiter) Policy() engine.Policy { return l.policy }

// WallTime maps a Decision.At to wall time, as estimated from the first
// answer; for display only.
func (l *Limiter) WallTime(at int64) time.Time { return l.c.wallTime(at) }

// Close stops the local fallback limiter. The Client stays open; closing
// it closes every Limiter too.
func (l *Limiter) Close() error {
	if l.local != nil {
		return l.local.Close()
	}
	return nil
}

// Decide decides a request of cost n for key: one POST /v1/allow. When
// the server cannot decide, the failure policy does (see the package
// documentation). n outside 1..Limit returns an error wrapping
// engine.ErrInvalidCost, without a request; a caller's cancelled context
// returns its error.
func (l *Limiter) Decide(ctx context.Context, key string, n int) (engine.Decision, error) {
	if n < 1 || n > l.policy.Limit {
		return engine.Decision{}, fmt.Errorf("%w: %d is outside 1..%d", engine.ErrInvalidCost, n, l.policy.Limit)
	}
	c := l.c
	if c.isClosed() {
		return engine.Decision{}, ErrClosed
	}
	var out decisionResp
	err := c.post(ctx, &allowReq{Key: c.cfg.prefix + key, Policy: l.policy.Name, Cost: n}, &out)
	if err == nil && out.Limit != l.policy.Limit {
		err = fmt.Errorf("%w: policy %q has limit %d on %s, this Limiter was made with %d", ErrPolicyMismatch, out.Policy, out.Limit, c.name, l.policy.Limit)
	}
	var ue *clientcore.Unavailable
	switch {
	case err == nil:
		c.anchor(out.At)
		return out.decision(c, l.policy), nil
	case errors.As(err, &ue):
		return l.fail(key, n, ue)
	}
	return engine.Decision{}, err
}

// fail decides by the failure policy; cause is why the server did not.
func (l *Limiter) fail(key string, n int, cause error) (engine.Decision, error) {
	c := l.c
	if c.cfg.onFallback != nil {
		c.cfg.onFallback(key, cause)
	}
	now := localClock{c}.Now()
	switch c.cfg.failure {
	case FailOpen:
		return engine.Decision{Allowed: true, Limit: l.policy.Limit, Remaining: l.policy.Limit - n, At: now}, nil
	case FailClosed:
		return engine.Decision{Limit: l.policy.Limit, RetryAfter: c.cfg.retryAfter, At: now},
			fmt.Errorf("%w (failure policy closed): %w", ErrUnavailable, cause)
	}
	return l.local.AllowN(key, n)
}
