package server_test

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/slidegate/slidegate/engine"
	"github.com/slidegate/slidegate/internal/server"
)

// TestStores: a store URL needs a registered factory, which gets the
// policies, options and clock; its backends are used and closed.
func TestStores(t *testing.T) {
	// A store URL without a registered factory is refused at New.
	cfg := mustParse(t, "store: redis://127.0.0.1:1/0\npolicies:\n  - {name: free, limit: 5, window: 60s}\n")
	if _, err := server.New(cfg); err == nil || !strings.Contains(err.Error(), `store: no backend for "redis://"`) {
		t.Errorf("unknown store: %v", err)
	}
	// A registered factory gets the policies, options and clock, and its
	// backends are used and closed.
	clk := engine.NewManualClock()
	var got server.StoreSpec
	var made []*engine.Limiter
	factory := func(_ context.Context, spec server.StoreSpec) (server.Store, error) {
		got = spec
		var out []engine.Backend
		for _, p := range spec.Policies {
			l, err := engine.New(p, engine.WithClock(spec.Clock))
			if err != nil {
				return server.Store{}, err
			}
			made = append(made, l)
			out = append(out, l)
		}
		return server.Store{Backends: out}, nil
	}
	cfg.StoreOptions = map[string]any{"failure": "open"}
	e := start(t, cfg, server.WithClock(clk), server.WithStore("redis", factory))
	if got.URL != "redis://127.0.0.1:1/0" || got.Options["failure"] != "open" || len(got.Policies) != 1 || got.Clock != clk || got.Registerer == nil {
		t.Errorf("factory got %+v", got)
	}
	if _, d := e.allow(`{"key":"a"}`); !d.Allowed || d.Remaining != 4 {
		t.Errorf("decision through the factory's backend: %+v", d)
	}
	// A factory's error stops New.
	failing := func(context.Context, server.StoreSpec) (server.Store, error) {
		return server.Store{}, errors.New("dial tcp 127.0.0.1:1: connection refused")
	}
	if _, err := server.New(cfg, server.WithStore("redis", failing)); err == nil || !strings.Contains(err.Error(), "store: dial tcp") {
		t.Errorf("failing factory: %v", err)
	}
}

func TestStartErrors(t *testing.T) {
	e := start(t, mustParse(t, "policies:\n  - {name: free, limit: 5, window: 60s}\n"))
	cfg := mustParse(t, "policies:\n  - {name: free, limit: 5, window: 60s}\n")
	cfg.Listen = e.srv.Addr() // taken
	s, err := server.New(cfg, server.WithLogger(quiet))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if err := s.Start(); err == nil || !strings.Contains(err.Error(), "listen") {
		t.Errorf("port in use: %v", err)
	}
	if err := e.srv.Start(); err == nil {
		t.Error("second Start accepted")
	}
}

// TestReloadClosesEveryStore: a store factory that hands back the same
// backends on every call (its state is shared, as a connection pool would
// be) still sees the Store of every replaced configuration closed, once,
// and the last one at shutdown: each Store is the server's to close.
func TestReloadClosesEveryStore(t *testing.T) {
	cfg := mustParse(t, "store: shared://x\npolicies:\n  - {name: free, limit: 5, window: 60s}\n")
	lim, err := engine.New(engine.Policy{Name: "free", Limit: 5, Window: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	var made, closed atomic.Int64
	factory := func(context.Context, server.StoreSpec) (server.Store, error) {
		made.Add(1)
		return server.Store{Backends: []engine.Backend{lim}, Close: func() error { closed.Add(1); return nil }}, nil
	}
	s, err := server.New(cfg, server.WithLogger(quiet), server.WithStore("shared", factory))
	if err != nil {
		t.Fatal(err)
	}
	for range 3 {
		if err := s.Reload(cfg); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if err := lim.Close(); err != nil {
		t.Fatal(err)
	}
	if made.Load() != 4 || closed.Load() != 4 {
		t.Errorf("%d stores made, %d closed; want 4 and 4", made.Load(), closed.Load())
	}
}
