package server

import (
	"context"
	"net/http"

	"github.com/slidegate/slidegate/httplimit"
	"github.com/slidegate/slidegate/internal/server/config"
)

// Tracing holds the hooks a tracer fills (the telemetry module's
// Tracing.Handler and Tracing.Decision). The server imports no tracing
// library; a nil hook is skipped at no cost.
type Tracing struct {
	// Handler wraps the main listener's handler, once, in New: a span per
	// request. surface is "gateway" with an upstream, else "api".
	Handler func(surface string, next http.Handler) http.Handler
	// Decision is called after every decision, on the request's
	// goroutine, with the request's context, the surface ("api",
	// "gateway" or "check") and an event holding the policy (a
	// multi-limit decision's binding policy), the cost, the outcome, the
	// latency and the backend's error. It is never handed the key: the
	// event's Key, Request and Limits are unset.
	Decision func(ctx context.Context, surface string, ev httplimit.Event)
	// Propagate writes the trace context of ctx (the request's span)
	// into the headers the gateway sends upstream, replacing the
	// client's, so that the upstream's span is the child of the
	// gateway's.
	Propagate func(ctx context.Context, h http.Header)
}

// WithTracing sets the tracing hooks (default: none).
func WithTracing(t Tracing) Option { return func(o *options) { o.tracing = t } }

// traceDecision hands a decision to the tracing hook, if there is one.
func (s *Server) traceDecision(ctx context.Context, surface string, ev httplimit.Event) {
	if f := s.opts.tracing.Decision; f != nil {
		f(ctx, surface, ev)
	}
}

// surface names what cfg's main listener serves, for Tracing.Handler.
func surface(cfg config.Config) string {
	if cfg.Upstream != "" {
		return "gateway"
	}
	return "api"
}
