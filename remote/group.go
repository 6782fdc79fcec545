package remote

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/slidegate/slidegate/engine"
	"github.com/slidegate/slidegate/internal/clientcore"
	"github.com/slidegate/slidegate/internal/httpkit"
)

// Group decides requests over several of the server's policies at once,
// all or nothing, with one POST /v1/allow per request: an
// engine.GroupBackend. Make it with Client.Group.
type Group struct {
	c        *Client
	policies []engine.Policy
	local    *engine.Group // FailLocal's; nil otherwise
}

var _ engine.GroupBackend = (*Group)(nil)

// Group returns a GroupBackend over the server's policies ps (Ref.Policy
// indexes ps). Every policy needs its server name when there is more than
// one; limits, windows and algorithms must be the server's, as for
// Limiter.
func (c *Client) Group(ps ...engine.Policy) (*Group, error) {
	if len(ps) == 0 {
		return nil, fmt.Errorf("%w: a group needs at least one policy", ErrInvalidOption)
	}
	for i, p := range ps {
		if err := p.Validate(); err != nil {
			return nil, fmt.Errorf("%w: policy %d: %w", ErrInvalidOption, i, err)
		}
		if len(ps) > 1 && p.Name == "" {
			return nil, fmt.Errorf("%w: policy %d has no name: the server's policies of a group are named", ErrInvalidOption, i)
		}
	}
	ps = append([]engine.Policy(nil), ps...)
	local, err := fallback(c, func(o engine.Option) (*engine.Group, error) { return engine.NewGroup(ps, o) })
	if err != nil {
		return nil, err
	}
	return &Group{c: c, policies: ps, local: local}, nil
}

// Policies returns the policies refs index into.
func (g *Group) Policies() []engine.Policy { return append([]engine.Policy(nil), g.policies...) }

// WallTime maps a Decision.At to wall time, as Limiter.WallTime does.
func (g *Group) WallTime(at int64) time.Time { return g.c.wallTime(at) }

// Close stops the local fallback group.
func (g *Group) Close() error {
	if g.local != nil {
		return g.local.Close()
	}
	return nil
}

// NeedsTag reports false: the server places keys itself.
func (g *Group) NeedsTag() bool { return false }

// DecideGroup decides req, all or nothing, as engine.Group does: a ref
// repeated exactly counts once, and Limits follow req.Refs. dst is reused
// when it has room. The server takes one cost per request: a request with
// Costs is decided at the largest of them for every ref, so it is never
// admitted beyond any of its limits. req.Tag is unused. Empty refs, a
// policy index out of range or more than httpkit.MaxLimits distinct refs
// return an error wrapping engine.ErrInvalidKeys, a cost outside 1..the
// smallest referenced limit one wrapping engine.ErrInvalidCost, without a
// request. When the server cannot decide, the failure policy does.
func (g *Group) DecideGroup(ctx context.Context, dst []engine.Decision, req engine.GroupRequest) (engine.GroupDecision, error) {
	refs, n := req.Refs, req.N
	if req.Costs != nil {
		if len(req.Costs) != len(refs) {
			return engine.GroupDecision{}, fmt.Errorf("%w: %d refs, %d costs", engine.ErrInvalidKeys, len(refs), len(req.Costs))
		}
		for i, c := range req.Costs {
			if i == 0 || c > n {
				n = c
			}
			if c < 1 {
				return engine.GroupDecision{}, fmt.Errorf("%w: ref %d's cost %d is below 1", engine.ErrInvalidCost, i, c)
			}
		}
	}
	if len(refs) == 0 {
		return engine.GroupDecision{}, fmt.Errorf("%w: no refs", engine.ErrInvalidKeys)
	}
	least := 0
	for i, r := range refs {
		if r.Policy < 0 || r.Policy >= len(g.policies) {
			return engine.GroupDecision{}, fmt.Errorf("%w: ref %d names policy %d of %d", engine.ErrInvalidKeys, i, r.Policy, len(g.policies))
		}
		if l := g.policies[r.Policy].Limit; i == 0 || l < least {
			least = l
		}
	}
	if n < 1 || n > least {
		return engine.GroupDecision{}, fmt.Errorf("%w: %d is outside 1..%d (the smallest limit of the request)", engine.ErrInvalidCost, n, least)
	}
	c := g.c
	if c.isClosed() {
		return engine.GroupDecision{}, ErrClosed
	}
	// The server refuses a repeated limit; the engine decides it once.
	// first[i] is the index in uniq of refs[i].
	var firstBuf [8]int
	first := firstBuf[:0]
	var uniqBuf [8]engine.Ref
	uniq := uniqBuf[:0]
	for _, r := range refs {
		j := 0
		for j < len(uniq) && uniq[j] != r {
			j++
		}
		if j == len(uniq) {
			uniq = append(uniq, r)
		}
		first = append(first, j)
	}
	if len(uniq) > httpkit.MaxLimits {
		return engine.GroupDecision{}, fmt.Errorf("%w: %d distinct limits; the server decides at most %d at once", engine.ErrInvalidKeys, len(uniq), httpkit.MaxLimits)
	}
	if cap(dst) < len(refs) {
		dst = make([]engine.Decision, len(refs))
	}
	gd := engine.GroupDecision{Limits: dst[:len(refs)]}
	var ds []engine.Decision
	var at int64 // the server's instant, for the anchor
	var err error
	if len(uniq) == 1 {
		var out decisionResp
		p := g.policies[uniq[0].Policy]
		err = c.post(ctx, &allowReq{Key: c.cfg.prefix + uniq[0].Key, Policy: p.Name, Cost: n}, &out)
		if err == nil {
			gd.Allowed, at = out.Allowed, out.At
			ds = []engine.Decision{out.decision(c, p)}
		}
	} else {
		req := allowReq{Cost: n, Limits: make([]limitReq, len(uniq))}
		for i, r := range uniq {
			req.Limits[i] = limitReq{Policy: g.policies[r.Policy].Name, Key: c.cfg.prefix + r.Key}
		}
		var out groupResp
		err = c.post(ctx, &req, &out)
		if err == nil && len(out.Limits) != len(uniq) {
			err = c.unavailable(fmt.Errorf("malformed answer: %d limits for a request of %d", len(out.Limits), len(uniq)))
		}
		if err == nil {
			out.consistent()
			gd.Allowed, at = out.Allowed, out.Limits[0].At
			ds = make([]engine.Decision, len(uniq))
			for i, d := range out.Limits {
				ds[i] = d.decision(c, g.policies[uniq[i].Policy])
			}
		}
	}
	if err == nil {
		for i, d := range ds {
			if want := g.policies[uniq[i].Policy]; d.Limit != want.Limit {
				err = fmt.Errorf("%w: policy %q has limit %d on %s, this Group was made with %d", ErrPolicyMismatch, want.Name, d.Limit, c.name, want.Limit)
				break
			}
		}
	}
	var ue *clientcore.Unavailable
	switch {
	case err == nil:
		for i, j := range first {
			gd.Limits[i] = ds[j]
		}
		gd.Binding = engine.BindingLimit(gd.Limits, gd.Allowed)
		c.anchor(at)
		return gd, nil
	case errors.As(err, &ue):
		return g.fail(dst, refs, n, ue)
	}
	return engine.GroupDecision{}, err
}

// fail decides by the failure policy; cause is why the server did not.
func (g *Group) fail(dst []engine.Decision, refs []engine.Ref, n int, cause error) (engine.GroupDecision, error) {
	c := g.c
	clientcore.EachKey(refs, c.cfg.onFallback, cause)
	if c.cfg.failure == FailLocal {
		return g.local.DecideGroup(context.Background(), dst, engine.GroupRequest{Refs: refs, N: n})
	}
	open := c.cfg.failure == FailOpen
	gd := clientcore.Static(dst, refs, n, func(p int) int { return g.policies[p].Limit }, clientcore.Verdict{Open: open, RetryAfter: c.cfg.retryAfter, Now: localClock{c}.Now()})
	if !open {
		return gd, fmt.Errorf("%w (failure policy closed): %w", ErrUnavailable, cause)
	}
	return gd, nil
}
