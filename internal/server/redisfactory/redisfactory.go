// Package redisfactory is the Redis store's server.StoreFactory, the one
// that slidegate serve registers for redisstore's URL schemes and the load
// test runs its server on. It lives apart from redisstore so that the
// store does not depend on the HTTP server.
package redisfactory

import (
	"context"
	"errors"
	"fmt"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/slidegate/slidegate/engine"
	"github.com/slidegate/slidegate/internal/server"
	"github.com/slidegate/slidegate/redisstore"
)

// New returns the factory: one connection to spec.URL with spec.Options
// read as store_options (redisstore.OptionsFromMap), spec's clock and
// logger, then opts (which win); one limiter per policy and a group over
// them; the store's metrics on spec.Registerer. The store is the one
// closer of all it made.
func New(opts ...redisstore.Option) server.StoreFactory {
	return func(_ context.Context, spec server.StoreSpec) (server.Store, error) {
		o, err := redisstore.OptionsFromMap(spec.Options)
		if err != nil {
			return server.Store{}, err
		}
		if spec.Clock != nil {
			o = append(o, redisstore.WithClock(spec.Clock))
		}
		if spec.Logger != nil {
			o = append(o, redisstore.WithLogger(spec.Logger))
		}
		st, err := redisstore.Open(spec.URL, append(o, opts...)...)
		if err != nil {
			return server.Store{}, err
		}
		if spec.Registerer != nil {
			if err := spec.Registerer.Register(st.Collector()); err != nil {
				var are prometheus.AlreadyRegisteredError
				if !errors.As(err, &are) {
					st.Close()
					return server.Store{}, fmt.Errorf("registering redis metrics: %w", err)
				}
			}
		}
		ls, err := st.Limiters(spec.Policies)
		if err != nil {
			st.Close()
			return server.Store{}, err
		}
		out := make([]engine.Backend, len(ls))
		for i, l := range ls {
			out[i] = l
		}
		// On a cluster the group needs the keys of one request in one
		// slot: the server refuses at start-up a route whose limits use
		// different keys and name no cluster_tag.
		g, err := redisstore.NewGroup(ls...)
		if err != nil {
			st.Close()
			return server.Store{}, err
		}
		return server.Store{Backends: out, Group: g, Close: st.Close}, nil
	}
}
