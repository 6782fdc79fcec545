package telemetry

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"math"
	"strings"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
)

// ErrConfig is wrapped by the errors New returns for a bad Config.
var ErrConfig = errors.New("telemetry: invalid configuration")

// Protocols of the OTLP exporter.
const (
	ProtocolHTTP = "http" // OTLP/HTTP with protobuf bodies (port 4318)
	ProtocolGRPC = "grpc" // OTLP/gRPC (port 4317)
)

// Defaults of a Config's zero fields.
const (
	defaultProtocol    = ProtocolHTTP
	defaultServiceName = "slidegate"
)

// instrumentationName names the tracer of every span this package makes.
const instrumentationName = "github.com/slidegate/slidegate/telemetry"

// Config configures the OTLP exporter and the spans' resource.
type Config struct {
	// Endpoint is where spans go: a URL (http://host:4318 for OTLP/HTTP,
	// http://host:4317 for OTLP/gRPC; https for TLS). A URL with no path
	// sends OTLP/HTTP to /v1/traces. Empty: the standard
	// OTEL_EXPORTER_OTLP_ENDPOINT and OTEL_EXPORTER_OTLP_TRACES_ENDPOINT
	// variables, else localhost on the protocol's port.
	Endpoint string
	// Protocol is ProtocolHTTP (the default) or ProtocolGRPC.
	Protocol string
	// SampleRate is the share of new traces sampled, in [0, 1]. A request
	// whose caller sampled its trace is always sampled (parent-based).
	// Nil means 1.
	SampleRate *float64
	// ServiceName is the resource's service.name (default "slidegate").
	ServiceName string
	// ServiceNamespace is service.namespace (omitted when empty).
	ServiceNamespace string
	// ServiceInstanceID is service.instance.id (random when empty).
	ServiceInstanceID string
	// OnError, when set, is handed the exporter's errors (a collector
	// that is down, a refused batch) instead of OpenTelemetry's default,
	// the standard logger. It is process-wide (otel.SetErrorHandler):
	// the last New with one wins.
	OnError func(error)
}

// Tracing makes slidegate's spans with one tracer provider. Build one with
// New (an OTLP exporter) or NewWithProvider (a provider the caller owns).
// A nil *Tracing is valid and makes no spans: its hooks are nil, so the
// instrumented code skips them. A Tracing is safe for concurrent use.
type Tracing struct {
	tracer trace.Tracer
	prop   propagation.TextMapPropagator
	sdk    *sdktrace.TracerProvider // nil for NewWithProvider
}

// New starts an OTLP exporter for cfg and returns a Tracing that sends to
// it in batches. Shutdown flushes and stops it. New does not dial: an
// endpoint that is down loses spans, never requests.
func New(ctx context.Context, cfg Config) (*Tracing, error) {
	rate := 1.0
	if cfg.SampleRate != nil {
		rate = *cfg.SampleRate
	}
	if math.IsNaN(rate) || rate < 0 || rate > 1 {
		return nil, fmt.Errorf("%w: sample rate %v is outside [0, 1]", ErrConfig, rate)
	}
	client, err := newClient(cfg)
	if err != nil {
		return nil, err
	}
	exp, err := otlptrace.New(ctx, client)
	if err != nil {
		return nil, fmt.Errorf("telemetry: OTLP exporter: %w", err)
	}
	res, err := newResource(cfg)
	if err != nil {
		_ = exp.Shutdown(ctx)
		return nil, err
	}
	if cfg.OnError != nil {
		otel.SetErrorHandler(otel.ErrorHandlerFunc(cfg.OnError))
	}
	tp := sdktrace.NewTracerProvider(
		sdktrace.WithSampler(sdktrace.ParentBased(sdktrace.TraceIDRatioBased(rate))),
		sdktrace.WithBatcher(exp),
		sdktrace.WithResource(res),
	)
	t := NewWithProvider(tp)
	t.sdk = tp
	return t, nil
}

// newClient returns the OTLP client of cfg's protocol and endpoint.
func newClient(cfg Config) (otlptrace.Client, error) {
	proto := strings.ToLower(cmp.Or(cfg.Protocol, defaultProtocol))
	switch proto {
	case ProtocolHTTP, "http/protobuf":
		opts, err := endpointOption(cfg.Endpoint, "/v1/traces", otlptracehttp.WithEndpointURL)
		if err != nil {
			return nil, err
		}
		return otlptracehttp.NewClient(opts...), nil
	case ProtocolGRPC:
		opts, err := endpointOption(cfg.Endpoint, "", otlptracegrpc.WithEndpointURL)
		if err != nil {
			return nil, err
		}
		return otlptracegrpc.NewClient(opts...), nil
	}
	return nil, fmt.Errorf("%w: protocol %q is neither %q nor %q", ErrConfig, cfg.Protocol, ProtocolHTTP, ProtocolGRPC)
}

// endpointOption is the exporter's option (with) for endpoint's URL, the
// path added where it has none; none for an empty endpoint, which leaves
// the exporter to its environment and defaults.
func endpointOption[O any](endpoint, path string, with func(string) O) ([]O, error) {
	if endpoint == "" {
		return nil, nil
	}
	u, err := endpointURL(endpoint, path)
	if err != nil {
		return nil, err
	}
	return []O{with(u)}, nil
}

// endpointURL checks an endpoint URL and gives a URL with no path the
// default path.
func endpointURL(s, path string) (string, error) {
	scheme, rest, ok := strings.Cut(s, "://")
	if !ok || (scheme != "http" && scheme != "https") || rest == "" || rest[0] == '/' {
		return "", fmt.Errorf("%w: the endpoint is not an http:// or https:// URL", ErrConfig)
	}
	if host, _, _ := strings.Cut(rest, "/"); strings.Contains(host, "@") {
		// The exporter drops them: say so rather than send unauthenticated.
		return "", fmt.Errorf("%w: credentials in the endpoint URL are not sent; set OTEL_EXPORTER_OTLP_HEADERS", ErrConfig)
	}
	if path != "" && !strings.Contains(rest, "/") {
		s += path
	}
	return s, nil
}

// newResource describes this process: service name, namespace and
// instance.
func newResource(cfg Config) (*resource.Resource, error) {
	id := cfg.ServiceInstanceID
	if id == "" {
		var b [16]byte
		_, _ = rand.Read(b[:])
		id = hex.EncodeToString(b[:])
	}
	attrs := []attribute.KeyValue{
		attribute.String("service.name", cmp.Or(cfg.ServiceName, defaultServiceName)),
		attribute.String("service.instance.id", id),
	}
	if cfg.ServiceNamespace != "" {
		attrs = append(attrs, attribute.String("service.namespace", cfg.ServiceNamespace))
	}
	return resource.NewSchemaless(attrs...), nil
}

// NewWithProvider returns a Tracing that makes its spans with tp (for a
// program that has its own provider, and for tests). Trace context
// crosses HTTP and gRPC as W3C traceparent and baggage.
func NewWithProvider(tp trace.TracerProvider) *Tracing {
	return &Tracing{
		tracer: tp.Tracer(instrumentationName),
		prop:   propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{}),
	}
}

// Tracer returns the tracer the spans are made with.
func (t *Tracing) Tracer() trace.Tracer { return t.tracer }

// Shutdown sends the spans still buffered and stops the exporter New
// started. It does nothing for NewWithProvider's Tracing (the provider is
// its owner's) and for nil.
func (t *Tracing) Shutdown(ctx context.Context) error {
	if t == nil || t.sdk == nil {
		return nil
	}
	return t.sdk.Shutdown(ctx)
}
