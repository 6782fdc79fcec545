package server

import (
	"context"
	"fmt"
	"net/http"
	"net/url"

	"go.yaml.in/yaml/v3"

	"github.com/slidegate/slidegate/httplimit"
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

// surface names what the main listener serves, for Tracing.Handler.
func (cfg Config) surface() string {
	if cfg.Upstream != "" {
		return "gateway"
	}
	return "api"
}

// TracingConfig is the tracing section: OpenTelemetry spans sent to an
// OTLP endpoint. slidegate serve builds the exporter from it and sets the
// hooks (WithTracing); the server only validates and carries it. It
// takes effect at start-up only.
type TracingConfig struct {
	// Endpoint is the collector's URL: http://host:4318 for OTLP/HTTP,
	// http://host:4317 for OTLP/gRPC, https for TLS. Empty: tracing is
	// off.
	Endpoint string `yaml:"endpoint,omitempty"`
	// Protocol is "http" (OTLP/HTTP with protobuf, the default) or
	// "grpc".
	Protocol string `yaml:"protocol,omitempty"`
	// SampleRate is the share of new traces sampled, in [0, 1] (default
	// 1). A request whose caller sampled its trace is always traced.
	SampleRate *float64 `yaml:"sample_rate,omitempty"`
	// ServiceName is the spans' service.name (default "slidegate").
	ServiceName string `yaml:"service_name,omitempty"`
}

// validateTracing checks the tracing section.
func (c Config) validateTracing() error {
	t := c.Tracing
	if t.Endpoint == "" {
		if t.Protocol != "" || t.SampleRate != nil || t.ServiceName != "" {
			return fieldErr("tracing", "endpoint is required with protocol, sample_rate or service_name")
		}
		return nil
	}
	u, err := url.Parse(t.Endpoint)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return fieldErr("tracing.endpoint", "want an http:// or https:// URL")
	}
	if u.User != nil {
		// The exporter would drop them, and --print-config would show them.
		return fieldErr("tracing.endpoint", "credentials in the URL are not sent: set OTEL_EXPORTER_OTLP_HEADERS")
	}
	if p := t.Protocol; p != "" && p != "http" && p != "grpc" {
		return fieldErr("tracing.protocol", "%q is neither http nor grpc", p)
	}
	if r := t.SampleRate; r != nil && !(*r >= 0 && *r <= 1) {
		return fieldErr("tracing.sample_rate", "%v is outside [0, 1]", *r)
	}
	return nil
}

// same reports whether t and o configure the same tracing.
func (t TracingConfig) same(o TracingConfig) bool {
	rate := func(r *float64) float64 {
		if r == nil {
			return 1
		}
		return *r
	}
	return t.Endpoint == o.Endpoint && t.Protocol == o.Protocol && t.ServiceName == o.ServiceName && rate(t.SampleRate) == rate(o.SampleRate)
}

var tracingMapping = mapping{"tracing", fmt.Sprintf("%T", TracingConfig{}), "endpoint, protocol, sample_rate, service_name"}

type plainTracing TracingConfig

// UnmarshalYAML reads the tracing mapping.
func (t *TracingConfig) UnmarshalYAML(n *yaml.Node) error {
	return decodeMapping(n, (*plainTracing)(t), &tracingMapping)
}
