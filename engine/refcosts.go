package engine

import (
	"cmp"
	"context"
	"fmt"
	"slices"

	"github.com/slidegate/slidegate/internal/shard"
)

// allowRefsCosts is allowRefs with a cost per ref: the request is allowed
// iff every ref's limit has room for its own cost costs[i] at one instant,
// and then each logs its cost; if any refuses, none changes. A ref
// repeated exactly is decided once, at the largest of its costs. It
// returns an error, and changes nothing, when refs is empty, a policy
// index is out of range, or a cost is outside 1..its ref's limit.
func (g *Group) allowRefsCosts(dst []Decision, refs []Ref, costs []int) (GroupDecision, error) {
	if len(refs) == 0 || len(costs) != len(refs) {
		return GroupDecision{}, fmt.Errorf("%w: %d refs, %d costs", ErrInvalidKeys, len(refs), len(costs))
	}
	for i, r := range refs {
		if r.Policy < 0 || r.Policy >= len(g.policies) {
			return GroupDecision{}, fmt.Errorf("%w: ref %d names policy %d of %d", ErrInvalidKeys, i, r.Policy, len(g.policies))
		}
		if l := g.policies[r.Policy].Limit; costs[i] < 1 || costs[i] > l {
			return GroupDecision{}, fmt.Errorf("%w: ref %d's cost %d is outside 1..%d", ErrInvalidCost, i, costs[i], l)
		}
	}
	order := make([]int, len(refs))
	for i := range order {
		order[i] = i
	}
	slices.SortFunc(order, func(a, b int) int {
		if c := cmp.Compare(g.stores[refs[a].Policy].ID(), g.stores[refs[b].Policy].ID()); c != 0 {
			return c
		}
		return cmp.Compare(refs[a].Key, refs[b].Key)
	})
	stores := make([]*shard.Store, 0, len(refs))
	keys := make([]string, 0, len(refs))
	ns := make([]int, 0, len(refs))
	for j, i := range order {
		if j > 0 && refs[i] == refs[order[j-1]] {
			ns[len(ns)-1] = max(ns[len(ns)-1], costs[i])
			continue
		}
		stores = append(stores, g.stores[refs[i].Policy])
		keys = append(keys, refs[i].Key)
		ns = append(ns, costs[i])
	}
	rs := make([]shard.Result, len(keys))
	allowed, err := shard.DecideGroupCosts(stores, keys, ns, g.Now(), g.mono, rs)
	if err != nil {
		return GroupDecision{}, err
	}
	return spread(dst, refs, order, rs, allowed), nil
}

// PeekRefs writes to dst[i] what refs[i]'s limit holds now, changing
// nothing: Allowed says whether one more request would fit, Remaining and
// Reset the state; a key without state has its whole limit. It returns an
// error for a policy index out of range. Memory never blocks: ctx is not
// consulted.
func (g *Group) PeekRefs(_ context.Context, dst []Decision, refs []Ref) ([]Decision, error) {
	if cap(dst) < len(refs) {
		dst = make([]Decision, len(refs))
	}
	dst = dst[:len(refs)]
	now := g.Now()
	for i, r := range refs {
		if r.Policy < 0 || r.Policy >= len(g.policies) {
			return nil, fmt.Errorf("%w: ref %d names policy %d of %d", ErrInvalidKeys, i, r.Policy, len(g.policies))
		}
		lim := g.stores[r.Policy].Limit()
		var res shard.Result
		_, ok, err := g.stores[r.Policy].Peek(r.Key, now, &res)
		if err != nil {
			return nil, err
		}
		if !ok {
			dst[i] = Decision{Allowed: true, Limit: lim, Remaining: lim, At: now}
			continue
		}
		dst[i].set(&res)
	}
	return dst, nil
}
