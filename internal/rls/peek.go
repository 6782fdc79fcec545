package rls

import (
	"context"
	"time"

	"github.com/slidegate/slidegate/engine"
)

// PeekTimeout bounds reading the state of a request's checked or
// uncharged descriptors on a remote store.
const PeekTimeout = 2 * time.Second

// peekingGroup is a store's group that can also read its keys' state
// (the service reports a check, and the uncharged descriptors of a refused
// request, with it) through its limiters' InspectKey.
type peekingGroup struct {
	engine.GroupBackend
	admins []engine.KeyAdmin
	limits []int
}

// WithPeek returns g, able to show the state of keys it did not decide
// when every one of backends (g's limiters, one per policy, in order) is
// an engine.KeyAdmin and g places keys without a tag; otherwise g itself.
// A group that can read state already (*engine.Group) needs none of it.
func WithPeek(g engine.GroupBackend, backends []engine.Backend) engine.GroupBackend {
	if _, ok := g.(refPeeker); ok || g == nil || g.NeedsTag() || len(backends) != len(g.Policies()) {
		return g
	}
	pg := peekingGroup{GroupBackend: g}
	for i, b := range backends {
		ka, ok := b.(engine.KeyAdmin)
		if !ok {
			return g
		}
		pg.admins = append(pg.admins, ka)
		pg.limits = append(pg.limits, g.Policies()[i].Limit)
	}
	return pg
}

// PeekRefs reads each ref's state, one call per ref, within PeekTimeout.
func (p peekingGroup) PeekRefs(ctx context.Context, dst []engine.Decision, refs []engine.Ref) ([]engine.Decision, error) {
	ctx, cancel := context.WithTimeout(ctx, PeekTimeout)
	defer cancel()
	dst = dst[:0]
	for _, r := range refs {
		lim := p.limits[r.Policy]
		st, ok, err := p.admins[r.Policy].InspectKey(ctx, r.Key)
		if err != nil {
			return nil, err
		}
		if !ok {
			dst = append(dst, engine.Decision{Allowed: true, Limit: lim, Remaining: lim})
			continue
		}
		dst = append(dst, engine.Decision{Allowed: st.Remaining > 0, Limit: lim, Remaining: st.Remaining, Reset: st.Reset, At: st.At})
	}
	return dst, nil
}
