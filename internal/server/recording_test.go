package server_test

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"sync"
	"testing"

	"github.com/slidegate/slidegate/engine"
	"github.com/slidegate/slidegate/internal/server"
	"github.com/slidegate/slidegate/internal/server/config"
)

// These tests record decisions from their own side, at the backends and
// the group of a store factory, as the load-test harness does: every
// decision the server makes goes through one of them.

// record is one decision a recorded store made.
type record struct {
	Policy   string
	Key      string
	Cost     int
	Decision engine.Decision
	// Limits is set for a decision over several limits at once (the
	// group's): each limit's policy, key and decision, in the request's
	// order; Policy, Key and Decision are then the binding limit's.
	Limits []recordLimit
}

// recordLimit is one limit's part of a multi-limit record.
type recordLimit struct {
	Policy   string
	Key      string
	Decision engine.Decision
}

// recorder keeps records behind a mutex.
type recorder struct {
	mu   sync.Mutex
	recs []record
}

func (r *recorder) add(rec record) {
	r.mu.Lock()
	r.recs = append(r.recs, rec)
	r.mu.Unlock()
}

// Len returns the number of records.
func (r *recorder) Len() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.recs)
}

// Records returns a copy of the records, in arrival order.
func (r *recorder) Records() []record {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]record(nil), r.recs...)
}

// recordingBackend records every decision of its backend.
type recordingBackend struct {
	engine.Backend
	rec *recorder
}

func (b recordingBackend) Decide(ctx context.Context, key string, n int) (engine.Decision, error) {
	d, err := b.Backend.Decide(ctx, key, n)
	if err == nil {
		b.rec.add(record{Policy: b.Policy().Name, Key: key, Cost: n, Decision: d})
	}
	return d, err
}

// recordingGroup records every decision of its group.
type recordingGroup struct {
	engine.GroupBackend
	rec *recorder
}

func (g recordingGroup) DecideGroup(ctx context.Context, dst []engine.Decision, req engine.GroupRequest) (engine.GroupDecision, error) {
	gd, err := g.GroupBackend.DecideGroup(ctx, dst, req)
	if err != nil {
		return gd, err
	}
	// The server decides every limit of a request at one cost.
	refs, n := req.Refs, req.N
	ps := g.Policies()
	r := record{Cost: n, Limits: make([]recordLimit, len(refs))}
	for i, ref := range refs {
		r.Limits[i] = recordLimit{Policy: ps[ref.Policy].Name, Key: ref.Key, Decision: gd.Limits[i]}
	}
	b := r.Limits[gd.Binding]
	r.Policy, r.Key, r.Decision = b.Policy, b.Key, b.Decision
	g.rec.add(r)
	return gd, nil
}

// recordingStore points cfg at a store of in-memory engines on one clock,
// as the built-in memory store makes them, whose backends and group record
// every decision to rec, and returns the option that registers it.
func recordingStore(cfg *config.Config, rec *recorder) server.Option {
	cfg.Store = "recorded://memory"
	return server.WithStore("recorded", func(_ context.Context, spec server.StoreSpec) (server.Store, error) {
		clock := spec.Clock
		if clock == nil {
			clock = engine.NewMonotonicClock()
		}
		var ls []*engine.Limiter
		closeAll := func() error {
			var errs []error
			for _, l := range ls {
				errs = append(errs, l.Close())
			}
			return errors.Join(errs...)
		}
		out := make([]engine.Backend, len(spec.Policies))
		for i, p := range spec.Policies {
			l, err := engine.New(p, engine.WithClock(clock))
			if err != nil {
				return server.Store{}, errors.Join(err, closeAll())
			}
			ls = append(ls, l)
			out[i] = recordingBackend{l, rec}
		}
		g, err := engine.NewGroupOf(ls...)
		if err != nil {
			return server.Store{}, errors.Join(err, closeAll())
		}
		return server.Store{Backends: out, Group: recordingGroup{g, rec}, Close: closeAll}, nil
	})
}

// noopServer serves a handler that reads the body and answers 204, on
// loopback, the way Server.Start serves the API: the baseline of
// BenchmarkHTTP. It returns the base URL.
func noopServer(tb testing.TB) string {
	tb.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	hs := &http.Server{
		Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			_, _ = io.Copy(io.Discard, http.MaxBytesReader(w, r.Body, config.DefaultMaxBodyBytes))
			w.WriteHeader(http.StatusNoContent)
		}),
		ReadHeaderTimeout: config.DefaultReadTimeout,
		ReadTimeout:       config.DefaultReadTimeout,
		IdleTimeout:       config.DefaultIdleTimeout,
	}
	go func() { _ = hs.Serve(lis) }()
	tb.Cleanup(func() { _ = hs.Close() })
	return "http://" + lis.Addr().String()
}
