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

// These tests record single-limit decisions from their own side, at the
// backends of a store factory, as the load-test harness does (WithRecorder
// remains for multi-limit decisions, which no single backend sees whole).

// record is one decision a recorded backend made.
type record struct {
	Policy   string
	Key      string
	Cost     int
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

// recordingStore points cfg at a store of in-memory engines (as the
// built-in memory store makes them) whose decisions go to rec, and returns
// the option that registers it.
func recordingStore(cfg *server.Config, rec *recorder) server.Option {
	cfg.Store = "recorded://memory"
	return server.WithStore("recorded", func(_ context.Context, spec server.StoreSpec) (server.Store, error) {
		var out []engine.Backend
		closeAll := func() error {
			var errs []error
			for _, b := range out {
				errs = append(errs, b.Close())
			}
			return errors.Join(errs...)
		}
		for _, p := range spec.Policies {
			var opts []engine.Option
			if spec.Clock != nil {
				opts = append(opts, engine.WithClock(spec.Clock))
			}
			l, err := engine.New(p, opts...)
			if err != nil {
				_ = closeAll()
				return server.Store{}, err
			}
			out = append(out, recordingBackend{l, rec})
		}
		return server.Store{Backends: out, Close: closeAll}, nil
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
