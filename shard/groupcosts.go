package shard

import "fmt"

// DecideGroupCosts is DecideGroup with a cost per key: the request is
// allowed iff every store has room for its own cost ns[i] at one instant
// t; then each store logs ns[i] entries of t; otherwise no store changes.
// The arguments are as for DecideGroup, with 1 ≤ ns[i] ≤ stores[i]'s limit.
func DecideGroupCosts(stores []*Store, keys []string, ns []int, now int64, monotonic bool, rs []Result) (bool, error) {
	if len(ns) != len(stores) {
		return false, fmt.Errorf("%w: %d costs for %d stores", ErrInvalid, len(ns), len(stores))
	}
	for i, s := range stores {
		if s != nil && uint(ns[i]-1) >= uint(s.limit) {
			return false, errCost
		}
	}
	if err := checkGroup(stores, keys, 1, now, rs); err != nil {
		return false, err
	}
	if len(stores) == 1 {
		err := stores[0].Decide(keys[0], ns[0], now, monotonic, &rs[0])
		return rs[0].Allowed, err
	}
	var buf [groupMax]held
	hs := buf[:0]
	if len(stores) > groupMax {
		hs = make([]held, 0, len(stores))
	}
	t := now
	for i, s := range stores {
		h := s.acquire(keys[i], ns[i])
		if h.over {
			t = max(t, h.sh.horizon.Load())
		}
		hs = append(hs, h)
	}
	for _, h := range hs {
		if !h.over {
			t = max(t, h.b.wm.Load())
		}
	}
	allowed := true
	for i, s := range stores {
		h := &hs[i]
		if h.over {
			s.overflow(h.sh, ns[i], t, &rs[i])
		} else {
			h.j = s.decide(h.b, h.b.words(len(h.k.s)), ns[i], t, h.b.wm.Load(), &rs[i])
		}
		allowed = allowed && rs[i].Allowed
	}
	for i, s := range stores {
		h := &hs[i]
		if !allowed && rs[i].Allowed {
			s.unlogged(h, ns[i], t, &rs[i])
		}
		if h.over {
			continue
		}
		d := h.b.words(len(h.k.s))
		if !allowed {
			if s.alg == Log {
				s.logDropExpired(h.sh, h.b, d, h.j)
			}
			raise(&h.b.wm, t)
			h.b.ctl.Store(h.v + ctlVersion)
			continue
		}
		raise(&h.b.wm, t)
		if s.alg == Log {
			s.logAppend(h.sh, h.k, h.b, d, h.v, ns[i], t, h.j)
		} else {
			s.counterAppend(h.b, d, ns[i], t)
			h.b.ctl.Store(h.v + ctlVersion)
		}
	}
	return allowed, nil
}
