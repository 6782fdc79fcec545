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
	"github.com/slidegate/slidegate/server"
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

func (g recordingGroup) DecideRefs(ctx context.Context, dst []engine.Decision, refs []engine.Ref, n int) (engine.GroupDecision, error) {
	gd, err := g.GroupBackend.DecideRefs(ctx, dst, refs, n)
	if err != nil {
		return gd, err
	}
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

// recordingStore points cfg at a store of in-memory engines whose
// decisions go to rec, and returns the option that registers it. Like the
// built-in memory store, it keeps the limiter of a policy whose settings
// are unchanged across reloads (each Store counts its references to a
// limiter, and the last Close closes it), puts every limiter on one clock
// and makes a group over the spec's limiters.
func recordingStore(cfg *server.Config, rec *recorder) server.Option {
	cfg.Store = "recorded://memory"
	var (
		mu    sync.Mutex
		clock engine.Clock
		live  = map[engine.Policy]*sharedLimiter{}
	)
	release := func(ls []*sharedLimiter) error {
		mu.Lock()
		defer mu.Unlock()
		var errs []error
		for _, sl := range ls {
			if sl.refs--; sl.refs == 0 {
				delete(live, sl.p)
				errs = append(errs, sl.l.Close())
			}
		}
		return errors.Join(errs...)
	}
	return server.WithStore("recorded", func(_ context.Context, spec server.StoreSpec) (server.Store, error) {
		mu.Lock()
		if clock == nil {
			clock = spec.Clock
			if clock == nil {
				clock = engine.NewMonotonicClock()
			}
		}
		var (
			held []*sharedLimiter
			err  error
		)
		for _, p := range spec.Policies {
			sl, ok := live[p]
			if !ok {
				var l *engine.Limiter
				if l, err = engine.New(p, engine.WithClock(clock)); err != nil {
					break
				}
				sl = &sharedLimiter{p: p, l: l}
				live[p] = sl
			}
			sl.refs++
			held = append(held, sl)
		}
		mu.Unlock()
		if err != nil {
			return server.Store{}, errors.Join(err, release(held))
		}
		ls := make([]*engine.Limiter, len(held))
		out := make([]engine.Backend, len(held))
		for i, sl := range held {
			ls[i], out[i] = sl.l, recordingBackend{sl.l, rec}
		}
		g, err := engine.NewGroupOf(ls...)
		if err != nil {
			return server.Store{}, errors.Join(err, release(held))
		}
		return server.Store{
			Backends: out,
			Group:    recordingGroup{g, rec},
			Close:    func() error { return release(held) },
		}, nil
	})
}

// sharedLimiter is a limiter of recordingStore and the number of Stores
// that hold it.
type sharedLimiter struct {
	p    engine.Policy
	l    *engine.Limiter
	refs int
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
			_, _ = io.Copy(io.Discard, http.MaxBytesReader(w, r.Body, server.DefaultMaxBodyBytes))
			w.WriteHeader(http.StatusNoContent)
		}),
		ReadHeaderTimeout: server.DefaultReadTimeout,
		ReadTimeout:       server.DefaultReadTimeout,
		IdleTimeout:       server.DefaultIdleTimeout,
	}
	go func() { _ = hs.Serve(lis) }()
	tb.Cleanup(func() { _ = hs.Close() })
	return "http://" + lis.Addr().String()
}
