package telemetry_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace/noop"

	"github.com/slidegate/slidegate/engine"
	"github.com/slidegate/slidegate/httplimit"
	"github.com/slidegate/slidegate/telemetry"
)

// stubBackend decides in constant time without the engine, so that the
// benchmarks measure the middleware and the tracing around it.
type stubBackend struct{ p engine.Policy }

func (s stubBackend) Policy() engine.Policy     { return s.p }
func (stubBackend) WallTime(at int64) time.Time { return time.Unix(0, at) }
func (stubBackend) Close() error                { return nil }

func (s stubBackend) Decide(context.Context, string, int) (engine.Decision, error) {
	return engine.Decision{Allowed: true, Limit: s.p.Limit, Remaining: s.p.Limit - 1, Reset: s.p.Window}, nil
}

// discard is an exporter that drops what it is sent.
type discard struct{}

func (discard) ExportSpans(context.Context, []sdktrace.ReadOnlySpan) error { return nil }
func (discard) Shutdown(context.Context) error                             { return nil }

// BenchmarkHTTPDecision is one request through httplimit's middleware
// (a stub backend, no engine) with tracing off (no hook: the middleware
// as it is without this package), with the hooks on a no-op provider,
// with the SDK sampling no trace (sample_rate 0), and with the SDK
// sampling every trace into a batcher that discards. Compare allocs/op
// and ns/op within one run.
func BenchmarkHTTPDecision(b *testing.B) {
	pol := engine.Policy{Name: "bench", Limit: 1 << 30, Window: time.Minute}
	never := sdktrace.NewTracerProvider(sdktrace.WithSampler(sdktrace.NeverSample()))
	always := sdktrace.NewTracerProvider(sdktrace.WithSampler(sdktrace.AlwaysSample()), sdktrace.WithBatcher(discard{}))
	defer never.Shutdown(context.Background())
	defer always.Shutdown(context.Background())
	for _, c := range []struct {
		name string
		tr   *telemetry.Tracing
	}{
		{"off", nil},
		{"noop-provider", telemetry.NewWithProvider(noop.NewTracerProvider())},
		{"sdk-unsampled", telemetry.NewWithProvider(never)},
		{"sdk-sampled", telemetry.NewWithProvider(always)},
	} {
		b.Run(c.name, func(b *testing.B) {
			mw, err := httplimit.New(httplimit.WithBackend(stubBackend{pol}), httplimit.WithKeyFunc(httplimit.HeaderKey("X-API-Key")),
				httplimit.WithObserver(c.tr.HTTPObserver("middleware")))
			if err != nil {
				b.Fatal(err)
			}
			h := c.tr.Handler("middleware", mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
				w.WriteHeader(http.StatusNoContent)
			})))
			req := httptest.NewRequest(http.MethodGet, "/", nil)
			req.Header.Set("X-API-Key", "k")
			w := &nopWriter{h: http.Header{}}
			b.ReportAllocs()
			for b.Loop() {
				clear(w.h)
				h.ServeHTTP(w, req)
			}
			if w.status != http.StatusNoContent {
				b.Fatalf("status %d", w.status)
			}
		})
	}
}

// nopWriter is a ResponseWriter that keeps the status only, so that the
// benchmark allocates nothing of its own per request.
type nopWriter struct {
	h      http.Header
	status int
}

func (w *nopWriter) Header() http.Header         { return w.h }
func (w *nopWriter) Write(p []byte) (int, error) { return len(p), nil }
func (w *nopWriter) WriteHeader(s int)           { w.status = s }
