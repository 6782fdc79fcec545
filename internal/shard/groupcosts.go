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
		if s != nil && uint(ns[i]-1) >= uint(s.Limit()) {
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
	return decideGroup(stores, keys, 0, ns, now, rs)
}
