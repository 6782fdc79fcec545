package main

import (
	"context"
	"errors"
	"fmt"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/slidegate/slidegate/engine"
	"github.com/slidegate/slidegate/redisstore"
	"github.com/slidegate/slidegate/server"
)

// The Redis backend: slidegate serve --store redis://host:port/db,
// rediss://, unix://, redis-cluster://host:port,host:port,
// rediss-cluster://, redis-sentinel://host:port?master_set=NAME or
// rediss-sentinel:// (redisstore.URLSchemes), with store_options in the
// YAML configuration (redisstore.OptionKeys).
func init() {
	for _, scheme := range redisstore.URLSchemes {
		storeOptions = append(storeOptions, server.WithStore(scheme, openRedis))
	}
}

// openRedis is the server.StoreFactory for Redis: one connection, one
// limiter per policy, a group over them on a standalone server, the
// store's metrics on the server's registry; the store is the one closer.
func openRedis(_ context.Context, spec server.StoreSpec) (server.Store, error) {
	opts, err := redisstore.OptionsFromMap(spec.Options)
	if err != nil {
		return server.Store{}, err
	}
	if spec.Clock != nil {
		opts = append(opts, redisstore.WithClock(spec.Clock))
	}
	if spec.Logger != nil {
		opts = append(opts, redisstore.WithLogger(spec.Logger))
	}
	st, err := redisstore.Open(spec.URL, opts...)
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
	// The store owns its limiters and the group: one closer for all. On a
	// cluster the group needs the keys of one request in one slot: the
	// server refuses at start-up a route whose limits use different keys
	// and name no cluster_tag, and places a route's keys by its tag.
	g, err := redisstore.NewGroup(ls...)
	if err != nil {
		st.Close()
		return server.Store{}, err
	}
	return server.Store{Backends: out, Group: g, Close: st.Close}, nil
}
