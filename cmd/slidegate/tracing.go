package main

import (
	"cmp"
	"context"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"time"

	"google.golang.org/grpc"

	"github.com/slidegate/slidegate/internal/redisnames"
	"github.com/slidegate/slidegate/internal/server"
	"github.com/slidegate/slidegate/internal/server/config"
	"github.com/slidegate/slidegate/internal/server/redisfactory"
	"github.com/slidegate/slidegate/redisstore"
	"github.com/slidegate/slidegate/telemetry"
)

// tracingShutdownTimeout bounds the flush of the spans still buffered at
// exit: a collector that is down must not hold the process.
const tracingShutdownTimeout = 5 * time.Second

// serveTracing is the telemetry configuration of serve's tracing section;
// nil when it has no endpoint (tracing off).
func serveTracing(tc config.TracingConfig) *telemetry.Config {
	if tc.Endpoint == "" {
		return nil
	}
	return &telemetry.Config{Endpoint: tc.Endpoint, Protocol: tc.Protocol, SampleRate: tc.SampleRate, ServiceName: tc.ServiceName}
}

// peerTracing is envoyproxy/ratelimit's tracing variables as read in t:
// nil when TRACING_ENABLED is not true. The endpoint and the exporter's
// other settings come from the standard OTEL_EXPORTER_OTLP_* variables,
// which the exporter reads itself, as the peer's does.
func peerTracing(t envTracing) (*telemetry.Config, error) {
	if !t.Enabled {
		return nil, nil
	}
	cfg := &telemetry.Config{
		Protocol:          cmp.Or(strings.ToLower(t.ExporterProtocol), telemetry.ProtocolHTTP),
		ServiceName:       t.ServiceName,
		ServiceNamespace:  t.ServiceNamespace,
		ServiceInstanceID: t.ServiceInstanceID,
	}
	if cfg.Protocol != telemetry.ProtocolHTTP && cfg.Protocol != telemetry.ProtocolGRPC {
		return nil, fmt.Errorf("TRACING_EXPORTER_PROTOCOL: %q is neither http nor grpc", cfg.Protocol)
	}
	if v := t.SamplingRate; v != "" {
		r, err := strconv.ParseFloat(v, 64)
		if err != nil || r != r {
			return nil, fmt.Errorf("TRACING_SAMPLING_RATE: %q is not a number", v)
		}
		// The peer samples every trace at 1 or more and none at 0 or
		// less: so does this.
		r = min(max(r, 0), 1)
		cfg.SampleRate = &r
	}
	return cfg, nil
}

// startTracing starts the exporter of cfg; nil cfg gives a nil Tracing
// (tracing off). stop flushes and stops it, logging a failure.
func startTracing(ctx context.Context, cfg *telemetry.Config, logger *slog.Logger) (tr *telemetry.Tracing, stop func(), err error) {
	if cfg == nil {
		return nil, func() {}, nil
	}
	c := *cfg
	c.OnError = func(err error) { logger.Warn("tracing: spans not sent", "error", err) }
	tr, err = telemetry.New(ctx, c)
	if err != nil {
		return nil, nil, err
	}
	logger.Info("tracing", "protocol", cmp.Or(cfg.Protocol, telemetry.ProtocolHTTP), "service", cmp.Or(cfg.ServiceName, "slidegate"))
	return tr, func() {
		ctx, cancel := context.WithTimeout(context.Background(), tracingShutdownTimeout)
		defer cancel()
		if err := tr.Shutdown(ctx); err != nil {
			logger.Warn("tracing: the last spans were not sent", "error", err)
		}
	}, nil
}

// tracingServerOptions are the gRPC server options that trace each call
// of the rate limit service (none when tracing is off).
func tracingServerOptions(tr *telemetry.Tracing) []grpc.ServerOption {
	if tr == nil {
		return nil
	}
	return []grpc.ServerOption{grpc.ChainUnaryInterceptor(tr.UnaryServerInterceptor())}
}

// tracedRedis is openRedis with a span per script call (openRedis itself
// when tracing is off).
func tracedRedis(tr *telemetry.Tracing) server.StoreFactory {
	if tr == nil {
		return openRedis
	}
	return redisfactory.New(redisstore.WithCallHook(tr.StoreHook()))
}

// serveTracingOptions are the server options of tracing: the hooks, and
// the Redis store factory with spans per call (none when tracing is off).
func serveTracingOptions(tr *telemetry.Tracing) []server.Option {
	if tr == nil {
		return nil
	}
	opts := []server.Option{server.WithTracing(server.Tracing{Handler: tr.Handler, Decision: tr.Decision, Propagate: tr.Inject})}
	f := tracedRedis(tr)
	for _, scheme := range redisnames.Schemes {
		opts = append(opts, server.WithStore(scheme, f))
	}
	return opts
}
