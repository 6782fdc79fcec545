package httplimit

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/slidegate/slidegate/engine"
	"github.com/slidegate/slidegate/internal/httpkit"
)

// maxLimits bounds the limits of one multi-limit tier (WithLimits): each
// costs a key derivation and a log to lock per request.
const maxLimits = httpkit.MaxLimits

// GroupLimit is one limit of a multi-limit tier: the name of one of the
// group's policies, and how a request's key for it is derived (nil: the
// middleware's key function, WithKeyFunc).
type GroupLimit struct {
	Policy string
	Key    KeyFunc
}

// LimitEvent is one limit's part of a multi-limit decision (Event.Limits).
type LimitEvent struct {
	Policy   string
	Key      string
	Decision engine.Decision
}

// WithLimits adds a tier named name whose requests count against every
// one of limits at once, decided all or nothing by g: a request is
// allowed only if every limit has room for it, and a refusal by any of
// them leaves all of them untouched. It is what stacking one middleware
// per limit cannot do: the outer middleware would count the requests the
// inner one refuses. For example 10 per second and 1,000 per hour on one
// API key:
//
//	g, _ := engine.NewGroup([]engine.Policy{perSecond, perHour})
//	key := httplimit.HeaderKey("X-API-Key")
//	mw, _ := httplimit.New(httplimit.WithLimits("api", g,
//		httplimit.GroupLimit{Policy: "per_second", Key: key},
//		httplimit.GroupLimit{Policy: "per_hour", Key: key}))
//
// The response's RateLimit-Policy lists every policy of the tier;
// RateLimit, X-RateLimit-* and Retry-After report the binding limit
// (engine.GroupDecision.Binding): on a refusal the one that makes the
// client wait longest, else the one with the least remaining. The refusal
// body names the binding policy. name must be a valid tier name, not the
// name of another tier; limits holds 1 to 16 limits, no two alike
// (same policy, both with the default key function). The group is the
// caller's to Close.
func WithLimits(name string, g engine.GroupBackend, limits ...GroupLimit) Option {
	return func(c *config) error {
		if g == nil {
			return fmt.Errorf("%w: tier %q: nil group", ErrInvalidOption, name)
		}
		if err := httpkit.CheckPolicyName(name); err != nil {
			return fmt.Errorf("%w: tier %q: %w", ErrInvalidOption, name, err)
		}
		if len(limits) == 0 || len(limits) > maxLimits {
			return fmt.Errorf("%w: tier %q: %d limits (want 1 to %d)", ErrInvalidOption, name, len(limits), maxLimits)
		}
		c.groups = append(c.groups, groupSpec{name: name, g: g, limits: append([]GroupLimit(nil), limits...)})
		c.order = append(c.order, name)
		return nil
	}
}

// WithTag names how a request's tag is derived for the multi-limit tiers
// of a group whose store keeps keys in partitions (an engine.GroupBackend
// whose NeedsTag is true, such as a Redis Cluster group): every key of a
// request is then placed by the tag, so that one atomic call can decide
// them. Typical: the API key, when the limits are per API key and per IP
// (the per-IP limit then counts per API key and IP). The tag obeys
// MaxKeyLen. Stores that need no tag ignore it; without it, such a store
// decides only requests whose limits share one key.
func WithTag(f KeyFunc) Option {
	return func(c *config) error { return setKeyFunc(&c.tagFn, f, "tag") }
}

type groupSpec struct {
	name   string
	g      engine.GroupBackend
	limits []GroupLimit
}

// groupTier is a multi-limit tier, ready to serve.
type groupTier struct {
	name     string
	g        engine.GroupBackend
	needsTag bool // g.NeedsTag, asked once
	limits   []groupLimit
	minLimit int
	// policyValue is the RateLimit-Policy value listing every policy of
	// the tier, each once.
	policyValue []string
	// scratch holds *groupScratch: the refs and decisions of one request,
	// reused so that a decision through the GroupBackend interface (whose
	// arguments escape) allocates nothing in a steady state.
	scratch sync.Pool
}

type groupScratch struct {
	refs [maxLimits]engine.Ref
	ds   [maxLimits]engine.Decision
}

type groupLimit struct {
	policy int
	key    KeyFunc
	hw     *tierWriter
}

// refBackend is one policy of a group seen as a Backend, so that a
// header writer can render its decisions; its Decide decides that policy
// alone.
type refBackend struct {
	g engine.GroupBackend
	i int
	p engine.Policy
}

func (b refBackend) Policy() engine.Policy { return b.p }
func (b refBackend) Decide(ctx context.Context, key string, n int) (engine.Decision, error) {
	gd, err := b.g.DecideGroup(ctx, nil, engine.GroupRequest{Refs: []engine.Ref{{Policy: b.i, Key: key}}, N: n})
	if err != nil {
		return engine.Decision{}, err
	}
	return gd.Decision(), nil
}
func (b refBackend) WallTime(at int64) time.Time { return b.g.WallTime(at) }
func (b refBackend) Close() error                { return nil } // the group is the caller's

func newGroupTier(gs groupSpec, defKey KeyFunc, which Headers) (*groupTier, error) {
	ps := gs.g.Policies()
	idx := make(map[string]int, len(ps))
	for i, p := range ps {
		idx[p.Name] = i
	}
	gt := &groupTier{name: gs.name, g: gs.g, needsTag: gs.g.NeedsTag()}
	hws := map[int]*tierWriter{}
	var listed []string
	for j, l := range gs.limits {
		i, ok := idx[l.Policy]
		if !ok {
			return nil, fmt.Errorf("%w: tier %q: limit %d names policy %q, which the group does not have", ErrInvalidOption, gs.name, j, l.Policy)
		}
		if l.Key == nil {
			for _, o := range gs.limits[:j] {
				if o.Policy == l.Policy && o.Key == nil {
					return nil, fmt.Errorf("%w: tier %q: policy %q is listed twice with the same key", ErrInvalidOption, gs.name, l.Policy)
				}
			}
		}
		hw := hws[i]
		if hw == nil {
			var err error
			if hw, err = newTierWriter(refBackend{g: gs.g, i: i, p: ps[i]}, which); err != nil {
				return nil, fmt.Errorf("%w: tier %q: %w", ErrInvalidOption, gs.name, err)
			}
			hws[i] = hw
			listed = append(listed, hw.DraftPolicy())
		}
		kf := l.Key
		if kf == nil {
			kf = defKey
		}
		gt.limits = append(gt.limits, groupLimit{policy: i, key: kf, hw: hw})
		if j == 0 || ps[i].Limit < gt.minLimit {
			gt.minLimit = ps[i].Limit
		}
	}
	gt.policyValue = []string{strings.Join(listed, ", ")}
	return gt, nil
}

// serveGroup decides r against every limit of gt, all or nothing; it
// reports whether the request should go on to the next handler.
func (m *Middleware) serveGroup(w http.ResponseWriter, r *http.Request, gt *groupTier) bool {
	c := &m.cfg
	sc, _ := gt.scratch.Get().(*groupScratch)
	if sc == nil {
		sc = new(groupScratch)
	}
	defer gt.scratch.Put(sc)
	refs := sc.refs[:0]
	for _, l := range gt.limits {
		key, err := l.key(r)
		if err != nil {
			c.onError(w, r, http.StatusBadRequest, err)
			return false
		}
		if len(key) > MaxKeyLen {
			c.onError(w, r, http.StatusBadRequest, fmt.Errorf("%w: the request's key for policy %q is longer than %d bytes", ErrNoKey, l.hw.policy.Name, MaxKeyLen))
			return false
		}
		refs = append(refs, engine.Ref{Policy: l.policy, Key: key})
	}
	cost := 1
	if c.costFn != nil {
		var err error
		if cost, err = c.costFn(r); err != nil {
			c.onError(w, r, http.StatusBadRequest, err)
			return false
		}
	}
	if cost < 1 || cost > gt.minLimit {
		c.onError(w, r, http.StatusBadRequest, fmt.Errorf("%w: %d is outside 1..%d (the smallest limit of tier %q)", engine.ErrInvalidCost, cost, gt.minLimit, gt.name))
		return false
	}
	var start time.Time
	if c.observe != nil {
		start = time.Now()
	}
	var tag string
	if c.tagFn != nil && gt.needsTag {
		var err error
		if tag, err = c.tagFn(r); err == nil && len(tag) > MaxKeyLen {
			err = fmt.Errorf("%w: the request's tag is longer than %d bytes", ErrNoKey, MaxKeyLen)
		}
		if err != nil {
			c.onError(w, r, http.StatusBadRequest, err)
			return false
		}
	}
	gd, err := gt.g.DecideGroup(r.Context(), sc.ds[:0], engine.GroupRequest{Refs: refs, N: cost, Tag: tag})
	if c.observe != nil {
		ev := Event{Request: r, Cost: cost, Latency: time.Since(start), Err: err}
		if err == nil {
			b := gd.Binding
			ev.Policy, ev.Key, ev.Decision = gt.limits[b].hw.policy.Name, refs[b].Key, gd.Limits[b]
			ev.Limits = make([]LimitEvent, len(refs))
			for i := range refs {
				ev.Limits[i] = LimitEvent{Policy: gt.limits[i].hw.policy.Name, Key: refs[i].Key, Decision: gd.Limits[i]}
			}
		} else {
			ev.Policy = gt.limits[0].hw.policy.Name
		}
		c.observe(ev)
	}
	if err != nil {
		c.onError(w, r, httpkit.StatusOf(err), err)
		return false
	}
	b := gd.Binding
	hw, d := gt.limits[b].hw, gd.Limits[b]
	refuse := !gd.Allowed && !c.shadow
	hw.write(w.Header(), d, refuse)
	if c.headers&HeaderDraft != 0 {
		w.Header()[httpkit.HeaderRateLimitPolicy] = gt.policyValue
	}
	if !refuse {
		return true
	}
	if m.fastRefusal {
		hw.writeProblem(w, r, d)
	} else {
		c.onRefusal(w, r, Refusal{Policy: applied(hw.policy, d), Key: refs[b].Key, Cost: cost, Decision: d,
			Limits: append([]engine.Decision(nil), gd.Limits...)})
	}
	return false
}
