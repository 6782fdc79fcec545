package rls

import (
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/slidegate/slidegate/engine"
)

// A descriptor's limit override (RateLimitDescriptor.limit) is decided
// with its own requests_per_unit and unit, together with the request's
// other descriptors, all or nothing, in one call of a backend that can
// take on more policies than the configuration's: MemoryBackends' groups,
// and a store's group that can extend itself (redisstore's Group, alone
// or through WithPeek). Each distinct override (limit and unit) becomes
// one more policy of the service's backend, after the configuration's,
// up to DefaultMaxOverrides; a descriptor with a new one beyond them, or
// on another backend, is decided by its configured rule.

// extender is a store's group that can return a copy of itself with one
// more policy on its store (redisstore's Group).
type extender interface {
	Extend(p engine.Policy) (engine.GroupBackend, engine.Backend, error)
}

// overrides are the limit overrides of one service: their policy indexes
// by limit and window, and the backend over the configuration's policies
// followed by theirs.
type overrides struct {
	base int // the configuration's policies
	// add returns the backend with one more policy, p (for limit per
	// window); it is called with mu held.
	add func(limit int64, p engine.Policy) (engine.GroupBackend, error)

	mu  sync.Mutex
	ids map[overrideID]int
	ps  []engine.Policy
	cur atomic.Pointer[overrideBackend]
}

// overrideBackend is the backend with the overrides, and its peeker
// (nil when it cannot read state), asked once when it is made.
type overrideBackend struct {
	engine.GroupBackend
	peek refPeeker
}

// errOverrideBound: the bound of distinct overrides is reached.
var errOverrideBound = fmt.Errorf("rls: %d distinct limit overrides already", DefaultMaxOverrides)

// overridesOf returns b's overrides, or nil when b cannot take on
// policies.
func overridesOf(b engine.GroupBackend) *overrides {
	o := &overrides{base: len(b.Policies()), ids: map[overrideID]int{}}
	switch g := b.(type) {
	case memGroup:
		ls := slices.Clip(g.ls)
		o.add = func(limit int64, p engine.Policy) (engine.GroupBackend, error) {
			l := g.m.override(limit, p)
			if l == nil {
				return nil, errOverrideBound
			}
			ng, err := engine.NewGroupOf(append(ls, l)...)
			if err != nil {
				return nil, err
			}
			ls = append(ls, l)
			return ng, nil
		}
	case peekingGroup:
		ext, ok := g.GroupBackend.(extender)
		if !ok {
			return nil
		}
		admins, limits := slices.Clip(g.admins), slices.Clip(g.limits)
		o.add = func(_ int64, p engine.Policy) (engine.GroupBackend, error) {
			ng, nb, err := ext.Extend(p)
			if err != nil {
				return nil, err
			}
			ka, ok := nb.(engine.KeyAdmin)
			next, ok2 := ng.(extender)
			if !ok || !ok2 {
				return nil, errors.New("rls: an extended group cannot show or extend its new policy")
			}
			ext, admins, limits = next, append(admins, ka), append(limits, p.Limit)
			return peekingGroup{GroupBackend: ng, admins: admins, limits: limits}, nil
		}
	case extender:
		o.add = func(_ int64, p engine.Policy) (engine.GroupBackend, error) {
			ng, _, err := g.Extend(p)
			if err != nil {
				return nil, err
			}
			next, ok := ng.(extender)
			if !ok {
				return nil, errors.New("rls: an extended group cannot extend further")
			}
			g = next
			return ng, nil
		}
	default:
		return nil
	}
	o.cur.Store(&overrideBackend{b, peekerOf(b)})
	return o
}

// overridePolicy is the policy of an override of limit (≥ 1) per window:
// above the log's cap, the counter's. Its name keys its state on a store
// apart from every configured rule's.
func overridePolicy(limit int64, window time.Duration) engine.Policy {
	p := engine.Policy{Name: fmt.Sprintf("override %d/%v", limit, window), Limit: int(min(limit, int64(engine.MaxCounterLimit))), Window: window}
	if limit > engine.MaxLogLimit {
		p.Algorithm = engine.SlidingCounter
	}
	return p
}

// policy returns the index of the override of limit per window among
// the backend's policies, and its policy, made on first use; false beyond
// DefaultMaxOverrides distinct ones or when the backend cannot make it.
func (o *overrides) policy(limit int64, window time.Duration) (int, engine.Policy, bool) {
	id := overrideID{limit, window}
	o.mu.Lock()
	defer o.mu.Unlock()
	if i, ok := o.ids[id]; ok {
		return i, o.ps[i-o.base], true
	}
	if len(o.ps) >= DefaultMaxOverrides {
		return 0, engine.Policy{}, false
	}
	p := overridePolicy(limit, window)
	b, err := o.add(limit, p)
	if err != nil {
		return 0, engine.Policy{}, false
	}
	// The backend holding the new policy is in force before its index is
	// handed out.
	o.cur.Store(&overrideBackend{b, peekerOf(b)})
	i := o.base + len(o.ps)
	o.ps = append(o.ps, p)
	o.ids[id] = i
	return i, p, true
}

// backend returns the backend over the configuration's policies and every
// override made so far.
func (o *overrides) backend() *overrideBackend { return o.cur.Load() }
