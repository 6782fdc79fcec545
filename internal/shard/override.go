package shard

import (
	"fmt"
	"maps"
)

// Overrides give some keys a limit of their own in the store's window.
// They belong to the policy in force: SetOverrides replaces the policy
// whole, with the same protocol as SetPolicy, so that everything
// SetPolicy promises about a change holds for a key whose override is
// added, changed or removed. A key keeps its one log throughout: its
// accepted instants count under whichever limit a decision applies.
//
// A decision loads the policy once and picks the key's own with of. For a
// store without overrides that is one nil check. With overrides, it is
// one map lookup of the key's bytes.

// of returns the policy a decision on key applies: p, or the one of
// key's override. Precondition: p is a store's policy (its over is set
// by newPolicy).
func (p *policy) of(key string) *policy {
	if p.over == nil {
		return p
	}
	return p.keyed(key)
}

// keyed is of for a policy with overrides. It is kept out of line so that
// Decide carries only of's nil check for stores without overrides.
//
//go:noinline
func (p *policy) keyed(key string) *policy {
	if q, ok := p.over[key]; ok {
		return q
	}
	return p
}

// newPolicy returns the store's policy of limit per window, in force from
// from, sealed or not, with the keys of limits limited each by its own.
// The keys share one policy per distinct limit; a key whose limit is the
// store's own gets p itself. limits is kept as it is: callers hand over
// a map nobody writes afterwards.
func newPolicy(limit int, window, from int64, sealed bool, limits map[string]int) *policy {
	p := &policy{limit: limit, window: window, from: from, sealed: sealed}
	p.base = p
	if len(limits) == 0 {
		return p
	}
	p.limits = limits
	p.over = make(map[string]*policy, len(limits))
	byLimit := map[int]*policy{limit: p}
	for k, l := range limits {
		q, ok := byLimit[l]
		if !ok {
			q = &policy{limit: l, window: window, from: from, sealed: sealed, base: p}
			byLimit[l] = q
		}
		p.over[k] = q
	}
	return p
}

// SetOverrides replaces the keys that have a limit of their own: each key
// of limits is limited to its value in the store's window, and every
// other key to the store's limit. It keeps every key's state, as
// SetPolicy does: a key whose limit drops below what it holds is refused
// until enough of its instants leave the window, and one whose limit
// rises gets exactly the difference. A nil or empty map removes every
// override. It returns an error wrapping ErrInvalid, and changes nothing,
// for a limit outside Config's range for the store's algorithm. The store
// keeps a copy of limits. now and the rules on concurrent calls are as
// for SetPolicy; SetPolicy keeps the overrides.
func (s *Store) SetOverrides(limits map[string]int, now func() int64) error {
	for _, l := range limits {
		cfg := Config{Algorithm: s.alg, Limit: l, Window: 1}
		if err := cfg.check(); err != nil {
			return fmt.Errorf("%w (an override)", err)
		}
	}
	limits = maps.Clone(limits)
	old := s.pol.Load()
	s.pol.Store(newPolicy(old.limit, old.window, old.from, true, old.limits))
	s.pol.Store(newPolicy(old.limit, old.window, max(now(), old.from), false, limits))
	return nil
}

// KeyLimit returns the limit in force for key: its override's, or the
// store's.
func (s *Store) KeyLimit(key string) int { return s.pol.Load().of(key).limit }

// Overrides returns a copy of the keys that have a limit of their own
// (SetOverrides), or nil for none.
func (s *Store) Overrides() map[string]int { return maps.Clone(s.pol.Load().limits) }
