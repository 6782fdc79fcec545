package config

import (
	"fmt"
	"net/url"

	"go.yaml.in/yaml/v3"
)

// TracingConfig is the tracing section: OpenTelemetry spans sent to an
// OTLP endpoint. slidegate serve builds the exporter from it and sets the
// hooks (server.WithTracing); the configuration only validates it. It
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
			return Errorf("tracing", "endpoint is required with protocol, sample_rate or service_name")
		}
		return nil
	}
	u, err := url.Parse(t.Endpoint)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return Errorf("tracing.endpoint", "want an http:// or https:// URL")
	}
	if u.User != nil {
		// The exporter would drop them, and --print-config would show them.
		return Errorf("tracing.endpoint", "credentials in the URL are not sent: set OTEL_EXPORTER_OTLP_HEADERS")
	}
	if p := t.Protocol; p != "" && p != "http" && p != "grpc" {
		return Errorf("tracing.protocol", "%q is neither http nor grpc", p)
	}
	if r := t.SampleRate; r != nil && !(*r >= 0 && *r <= 1) {
		return Errorf("tracing.sample_rate", "%v is outside [0, 1]", *r)
	}
	return nil
}

// Same reports whether t and o configure the same tracing.
func (t TracingConfig) Same(o TracingConfig) bool {
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
