package telemetry

import (
	"context"
	"net/http"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/slidegate/slidegate/httplimit"
)

// The attributes of slidegate's spans. None holds a client key: a key
// may be a user's address or API key.
const (
	attrPolicy    = attribute.Key("slidegate.policy")    // the policy (tier) that decided
	attrAllowed   = attribute.Key("slidegate.allowed")   // the decision
	attrCost      = attribute.Key("slidegate.cost")      // the request's cost
	attrRemaining = attribute.Key("slidegate.remaining") // requests left in the window after it
	attrSurface   = attribute.Key("slidegate.surface")   // api, gateway, check, middleware, grpc
	attrDomain    = attribute.Key("slidegate.domain")    // the Envoy domain of an RLS call
	attrStore     = attribute.Key("slidegate.store")     // the store kind (redis, redis-cluster, ...)
)

// The names of the spans for one decision and one store call.
const (
	spanDecision = "slidegate.decide"
	spanStore    = "slidegate.store"
)

// knownPaths are the paths a server span may be named by: slidegate's
// own. Any other path is the client's (a gateway's upstream path may
// carry a key), so its span is named by the method alone.
var knownPaths = map[string]string{
	"/v1/allow":       "POST /v1/allow",
	"/v1/allow/batch": "POST /v1/allow/batch",
	"/v1/check":       "/v1/check",
}

// Handler wraps next in a server span per request: its parent is the
// caller's span when the request carries a W3C traceparent header. The
// span is named by slidegate's own path (/v1/allow, /v1/check) or else by
// the method alone, and carries the method, the status and the surface.
// For a nil Tracing it returns next.
func (t *Tracing) Handler(surface string, next http.Handler) http.Handler {
	if t == nil {
		return next
	}
	sattr := attrSurface.String(surface)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ctx := t.prop.Extract(r.Context(), propagation.HeaderCarrier(r.Header))
		name, ok := knownPaths[r.URL.Path]
		if !ok {
			name = r.Method
		}
		ctx, span := t.tracer.Start(ctx, name, trace.WithSpanKind(trace.SpanKindServer),
			trace.WithAttributes(sattr, attribute.String("http.request.method", r.Method)))
		defer span.End()
		if !span.IsRecording() {
			// Unsampled: the context still carries the trace (children
			// follow the decision), but there is no status to record.
			next.ServeHTTP(w, r.WithContext(ctx))
			return
		}
		rec := &statusRecorder{ResponseWriter: w, status: http.StatusOK}
		next.ServeHTTP(rec, r.WithContext(ctx))
		span.SetAttributes(attribute.Int("http.response.status_code", rec.status))
		if rec.status >= 500 {
			span.SetStatus(codes.Error, http.StatusText(rec.status))
		}
	})
}

// Inject writes the trace context of ctx into h (W3C traceparent and
// baggage), replacing what h carried: for a request sent on. For a nil
// Tracing it does nothing.
func (t *Tracing) Inject(ctx context.Context, h http.Header) {
	if t == nil {
		return
	}
	t.prop.Inject(ctx, propagation.HeaderCarrier(h))
}

// statusRecorder remembers the status a handler wrote.
type statusRecorder struct {
	http.ResponseWriter
	status int
	wrote  bool
}

func (s *statusRecorder) WriteHeader(code int) {
	if !s.wrote {
		s.status, s.wrote = code, true
	}
	s.ResponseWriter.WriteHeader(code)
}

func (s *statusRecorder) Write(b []byte) (int, error) {
	s.wrote = true
	return s.ResponseWriter.Write(b)
}

// Unwrap lets http.ResponseController reach the writer's Flush and
// deadlines (the gateway streams).
func (s *statusRecorder) Unwrap() http.ResponseWriter { return s.ResponseWriter }

func (s *statusRecorder) Flush() {
	if f, ok := s.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}

// Decision records one decision as a span, a child of ctx's span, that
// began ev.Latency ago and ends now: the surface, ev's policy, outcome,
// cost and remaining count, and ev.Err if the backend failed. It reads
// no other field of ev (not ev.Request: ctx is the parent) and never
// records the key. For a nil Tracing it does nothing.
func (t *Tracing) Decision(ctx context.Context, surface string, ev httplimit.Event) {
	if t == nil {
		return
	}
	end := time.Now()
	_, span := t.tracer.Start(ctx, spanDecision, trace.WithTimestamp(end.Add(-ev.Latency)), trace.WithSpanKind(trace.SpanKindInternal))
	if !span.IsRecording() {
		span.End()
		return
	}
	span.SetAttributes(attrSurface.String(surface), attrPolicy.String(ev.Policy), attrCost.Int(ev.Cost))
	if ev.Err != nil {
		span.RecordError(ev.Err)
		span.SetStatus(codes.Error, "the backend did not decide")
	} else {
		span.SetAttributes(attrAllowed.Bool(ev.Decision.Allowed), attrRemaining.Int(ev.Decision.Remaining))
	}
	span.End(trace.WithTimestamp(end))
}

// HTTPObserver returns an httplimit observer (httplimit.WithObserver)
// that records each decision of the middleware with Decision, as a child
// of the request's span (Handler's, or any other instrumentation's). For
// a nil Tracing it returns nil, which httplimit takes as no observer.
func (t *Tracing) HTTPObserver(surface string) func(httplimit.Event) {
	if t == nil {
		return nil
	}
	return func(ev httplimit.Event) {
		t.Decision(ev.Request.Context(), surface, ev)
	}
}
