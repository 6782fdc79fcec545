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

// The Redis backend: slidegate serve --store redis://host:port/db or
// --store redis-cluster://host:port,host:port, with store_options in the
// YAML configuration (redisstore.OptionKeys).
func init() {
	storeOptions = append(storeOptions,
		server.WithStore("redis", openRedis),
		server.WithStore("redis-cluster", openRedis))
}

// openRedis is the server.StoreFactory for Redis: one connection, one
// limiter per policy, the store's metrics on the server's registry. It
// makes no group yet: a route of several limits is refused at start-up.
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
		return server.Store{}, err
	}
	out := make([]engine.Backend, len(ls))
	for i, l := range ls {
		out[i] = l
	}
	// The limiters jointly own the connection: it closes with the last.
	return server.Store{Backends: out, Close: func() error {
		var errs []error
		for _, l := range ls {
			errs = append(errs, l.Close())
		}
		return errors.Join(errs...)
	}}, nil
}
