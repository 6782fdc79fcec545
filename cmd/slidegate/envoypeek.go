package main

import (
	"context"
	"time"

	"github.com/slidegate/slidegate/engine"
	"github.com/slidegate/slidegate/server"
)

// peekTimeout bounds reading the state of a request's checked or uncharged
// descriptors on a remote store.
const peekTimeout = 2 * time.Second

// peekingGroup is a store's group that can also read its keys' state
// (rls reports a check, and the uncharged descriptors of a refused
// request, with it) through its limiters' InspectKey.
type peekingGroup struct {
	engine.GroupBackend
	admins []engine.KeyAdmin
	limits []int
}

// withPeek returns st's group, able to read state when every limiter of
// the store can and the store places keys without a tag.
func withPeek(st server.Store) engine.GroupBackend {
	if st.Group == nil || engine.NeedsTag(st.Group) {
		return st.Group
	}
	pg := peekingGroup{GroupBackend: st.Group}
	for i, b := range st.Backends {
		ka, ok := b.(engine.KeyAdmin)
		if !ok {
			return st.Group
		}
		pg.admins = append(pg.admins, ka)
		pg.limits = append(pg.limits, st.Group.Policies()[i].Limit)
	}
	return pg
}

// PeekRefs reads each ref's state, one call per ref.
func (p peekingGroup) PeekRefs(dst []engine.Decision, refs []engine.Ref) ([]engine.Decision, error) {
	ctx, cancel := context.WithTimeout(context.Background(), peekTimeout)
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
