package redisstore

import (
	"slices"

	"github.com/slidegate/slidegate/engine"
)

// Extend returns a group over g's limiters followed by a new limiter of
// policy p on g's store, and that limiter; g is unchanged. It decides an
// ad-hoc limit (an Envoy descriptor's limit override) together with g's
// limits, all or nothing, in one script call, with p's own limit and
// window. The new limiter's keys are its own, as any limiter's (p.Name
// names them); the store owns it, as every limiter it made. It returns an
// error as Store.Limiter does, and when p's keys would be those of one of
// g's limiters.
func (g *Group) Extend(p engine.Policy) (engine.GroupBackend, engine.Backend, error) {
	l, err := g.st.Limiter(p)
	if err != nil {
		return nil, nil, err
	}
	ng, err := NewGroup(append(slices.Clip(g.lims), l)...)
	if err != nil {
		return nil, nil, err
	}
	return ng, l, nil
}
