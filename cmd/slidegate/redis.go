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
// limiter per policy, the store's metrics on the server's registry.
func openRedis(_ context.Context, spec server.StoreSpec) ([]engine.Backend, error) {
	opts, err := redisstore.OptionsFromMap(spec.Options)
	if err != nil {
		return nil, err
	}
	if spec.Clock != nil {
		opts = append(opts, redisstore.WithClock(spec.Clock))
	}
	if spec.Logger != nil {
		opts = append(opts, redisstore.WithLogger(spec.Logger))
	}
	st, err := redisstore.Open(spec.URL, opts...)
	if err != nil {
		return nil, err
	}
	if spec.Registerer != nil {
		if err := spec.Registerer.Register(st.Collector()); err != nil {
			var are prometheus.AlreadyRegisteredError
			if !errors.As(err, &are) {
				st.Close()
				return nil, fmt.Errorf("registering redis metrics: %w", err)
			}
		}
	}
	ls, err := st.Limiters(spec.Policies)
	if err != nil {
		st.Close()
		return nil, err
	}
	out := make([]engine.Backend, len(ls))
	for i, l := range ls {
		out[i] = l
	}
	// The store owns its limiters; the server closes backends one by one,
	// all at once, so the first one's Close closes the store.
	if len(out) > 0 {
		out[0] = storeCloser{ls[0], st}
	} else {
		st.Close()
	}
	return out, nil
}

// storeCloser is a limiter whose Close closes its store.
type storeCloser struct {
	*redisstore.Limiter
	st *redisstore.Store
}

func (c storeCloser) Close() error { return c.st.Close() }
