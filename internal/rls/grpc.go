package rls

import (
	"context"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/encoding"
	protoenc "google.golang.org/grpc/encoding/proto"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/reflection"
	"google.golang.org/grpc/stats"
	"google.golang.org/grpc/status"
)

// ServiceName is the full name of the rate limit service, as health checks
// ask for it.
const ServiceName = "envoy.service.ratelimit.v3.RateLimitService"

// PeerHealthName is the service name envoyproxy/ratelimit's health
// service answers for; health checks written for it ask for this name.
const PeerHealthName = "ratelimit"

// Defaults of the gRPC server NewGRPCServer builds. Envoy's request
// headers are 60 KiB by default, so a request it builds from them is far
// below DefaultMaxRecvMsgSize; a larger message is ResourceExhausted.
const (
	DefaultMaxRecvMsgSize       = 2 << 20
	DefaultMaxConcurrentStreams = 1024
	// DefaultStreamWorkers is how many long-lived goroutines take the
	// calls (grpc.NumStreamWorkers; a call that finds them all busy gets
	// one of its own): their stacks stay grown, where a goroutine per call
	// grows and copies its stack on every call.
	DefaultStreamWorkers = 64
)

// Connection lifetimes of the gRPC server NewGRPCServer builds. A
// connection with no call in flight for DefaultMaxConnectionIdle is sent a
// GOAWAY and closed, so that idle connections cannot hold a listener's
// slots; one that is busy is kept (Envoy reconnects when it next needs
// one). Every connection is asked to go away after DefaultMaxConnectionAge
// (as envoyproxy/ratelimit does), so that proxies spread over replicas
// added since, and closed DefaultMaxConnectionAgeGrace later if calls are
// still in flight.
const (
	DefaultMaxConnectionIdle     = 5 * time.Minute
	DefaultMaxConnectionAge      = 24 * time.Hour
	DefaultMaxConnectionAgeGrace = time.Hour
	// MinPingInterval is the shortest interval between a client's
	// keepalive pings, with or without a call in flight, that the server
	// tolerates; a client pinging more often is sent a GOAWAY. Pings do
	// not make a connection busy.
	MinPingInterval = 10 * time.Second
)

// KeepaliveParams are DefaultMaxConnectionIdle, DefaultMaxConnectionAge
// and DefaultMaxConnectionAgeGrace as gRPC's server parameters.
func KeepaliveParams() keepalive.ServerParameters {
	return keepalive.ServerParameters{MaxConnectionIdle: DefaultMaxConnectionIdle, MaxConnectionAge: DefaultMaxConnectionAge,
		MaxConnectionAgeGrace: DefaultMaxConnectionAgeGrace}
}

// NewGRPCServer returns a gRPC server that serves svc (a *Service, or a
// *Reloader, whose calls are decided by the configuration in force), the
// gRPC health service (grpc.health.v1, SERVING for "", ServiceName and
// PeerHealthName) and server reflection. opts come after the defaults
// (DefaultMaxRecvMsgSize, DefaultMaxConcurrentStreams,
// DefaultMaxHeaderListSize, DefaultHandshakeTimeout, DefaultStreamWorkers,
// KeepaliveParams, MinPingInterval), so they may override them
// (grpc.KeepaliveParams replaces all of KeepaliveParams).
// MaxCallsPerAddr, CallTimeout and CallsIPv6Prefix replace
// DefaultMaxCallsPerAddr, DefaultCallTimeout and the /64 networks; the
// server has its own tap (grpc.InTapHandle may not be given).
//
// To stop it, call hs.Shutdown (health checks then answer NOT_SERVING, so
// that Envoy's health checking moves away) and then GracefulStop, which
// lets in-flight calls finish.
func NewGRPCServer(svc servable, opts ...grpc.ServerOption) (gs *grpc.Server, hs *health.Server) {
	count := svc.countError
	calls := newCallLimiter(count)
	for _, o := range opts {
		if co, ok := o.(callOption); ok {
			co.f(calls)
		}
	}
	all := append([]grpc.ServerOption{
		grpc.MaxRecvMsgSize(DefaultMaxRecvMsgSize),
		grpc.MaxConcurrentStreams(DefaultMaxConcurrentStreams),
		grpc.MaxHeaderListSize(DefaultMaxHeaderListSize),
		grpc.ConnectionTimeout(DefaultHandshakeTimeout),
		grpc.NumStreamWorkers(DefaultStreamWorkers),
		grpc.KeepaliveParams(KeepaliveParams()),
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: MinPingInterval, PermitWithoutStream: true}),
		grpc.ForceServerCodecV2(lenientCodec{encoding.GetCodecV2(protoenc.Name), func() { count(CodeMalformed) }}),
		grpc.StatsHandler(oversized{count}),
		grpc.InTapHandle(calls.tap),
	}, opts...)
	gs = grpc.NewServer(all...)
	defer calls.learn(gs)
	rlsv3.RegisterRateLimitServiceServer(gs, svc)
	hs = health.NewServer()
	hs.SetServingStatus("", healthpb.HealthCheckResponse_SERVING)
	hs.SetServingStatus(ServiceName, healthpb.HealthCheckResponse_SERVING)
	hs.SetServingStatus(PeerHealthName, healthpb.HealthCheckResponse_SERVING)
	healthpb.RegisterHealthServer(gs, hs)
	reflection.Register(gs)
	return gs, hs
}

// servable is what NewGRPCServer serves: a *Service or a *Reloader.
type servable interface {
	rlsv3.RateLimitServiceServer
	// countError counts a call answered with an error before it reached
	// the service (a malformed or oversized message).
	countError(code string)
}

func (s *Service) countError(code string) { s.m.errors.WithLabelValues(code).Inc() }

// CodeMalformed labels, in MetricErrors, messages that are not protobuf
// (gRPC answers them Internal before the service sees them).
const CodeMalformed = "malformed"

// oversized counts calls that gRPC ended ResourceExhausted before the
// service saw them (a message over the receive limit); the service counts
// its own errors.
type oversized struct{ count func(code string) }

func (oversized) TagRPC(ctx context.Context, _ *stats.RPCTagInfo) context.Context   { return ctx }
func (oversized) TagConn(ctx context.Context, _ *stats.ConnTagInfo) context.Context { return ctx }
func (oversized) HandleConn(context.Context, stats.ConnStats)                       {}

func (o oversized) HandleRPC(_ context.Context, s stats.RPCStats) {
	if e, ok := s.(*stats.End); ok && e.Error != nil && status.Code(e.Error) == codes.ResourceExhausted {
		o.count(codes.ResourceExhausted.String())
	}
}
