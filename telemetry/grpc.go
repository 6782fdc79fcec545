package telemetry

import (
	"context"
	"strings"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"

	"github.com/slidegate/slidegate/grpclimit"
	"github.com/slidegate/slidegate/httplimit"
)

// rlsOverallOK is RateLimitResponse.Code OK in Envoy's RLS v3 API.
const rlsOverallOK = 1

// UnaryServerInterceptor returns an interceptor that makes a server span
// per call, whose parent is the caller's span when the call's metadata
// carries a W3C traceparent. The span is named by the full method and
// carries rpc.system, rpc.service, rpc.method and the status code. For a
// call of Envoy's rate limit service (a request with a domain, a response
// with an overall code) it also carries the domain and the outcome, never
// a descriptor's value. For a nil Tracing it returns nil, which
// grpc.ChainUnaryInterceptor cannot take: check first.
func (t *Tracing) UnaryServerInterceptor() grpc.UnaryServerInterceptor {
	if t == nil {
		return nil
	}
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		md, _ := metadata.FromIncomingContext(ctx)
		ctx = t.prop.Extract(ctx, mdCarrier(md))
		ctx, span := t.tracer.Start(ctx, strings.TrimPrefix(info.FullMethod, "/"), trace.WithSpanKind(trace.SpanKindServer),
			trace.WithAttributes(rpcAttrs(info.FullMethod)...))
		defer span.End()
		if r, ok := req.(interface{ GetDomain() string }); ok {
			span.SetAttributes(attrDomain.String(r.GetDomain()), attrSurface.String("rls"))
		}
		resp, err := handler(ctx, req)
		st, _ := status.FromError(err)
		span.SetAttributes(attribute.Int("rpc.grpc.status_code", int(st.Code())))
		if err != nil {
			span.SetStatus(codes.Error, st.Code().String())
			return resp, err
		}
		if code, ok := overallCode(resp); ok {
			span.SetAttributes(attrAllowed.Bool(code == rlsOverallOK))
		}
		return resp, err
	}
}

// StreamServerInterceptor is UnaryServerInterceptor for streams: a span
// from the stream's opening to its end, whose context the handler's
// stream carries (grpclimit decides a stream once, when it opens, under
// it). For a nil Tracing it returns nil.
func (t *Tracing) StreamServerInterceptor() grpc.StreamServerInterceptor {
	if t == nil {
		return nil
	}
	return func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
		ctx := ss.Context()
		md, _ := metadata.FromIncomingContext(ctx)
		ctx = t.prop.Extract(ctx, mdCarrier(md))
		ctx, span := t.tracer.Start(ctx, strings.TrimPrefix(info.FullMethod, "/"), trace.WithSpanKind(trace.SpanKindServer),
			trace.WithAttributes(rpcAttrs(info.FullMethod)...))
		defer span.End()
		err := handler(srv, &tracedStream{ServerStream: ss, ctx: ctx})
		st, _ := status.FromError(err)
		span.SetAttributes(attribute.Int("rpc.grpc.status_code", int(st.Code())))
		if err != nil {
			span.SetStatus(codes.Error, st.Code().String())
		}
		return err
	}
}

// tracedStream is a server stream whose context carries its span.
type tracedStream struct {
	grpc.ServerStream
	ctx context.Context
}

func (s *tracedStream) Context() context.Context { return s.ctx }

// UnaryClientInterceptor returns an interceptor that makes a client span
// per call and sends its context in the call's metadata (traceparent),
// so that the server's span is its child. For a nil Tracing it returns
// nil.
func (t *Tracing) UnaryClientInterceptor() grpc.UnaryClientInterceptor {
	if t == nil {
		return nil
	}
	return func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		ctx, span := t.tracer.Start(ctx, strings.TrimPrefix(method, "/"), trace.WithSpanKind(trace.SpanKindClient),
			trace.WithAttributes(rpcAttrs(method)...))
		defer span.End()
		md, _ := metadata.FromOutgoingContext(ctx)
		md = md.Copy()
		t.prop.Inject(ctx, mdCarrier(md))
		err := invoker(metadata.NewOutgoingContext(ctx, md), method, req, reply, cc, opts...)
		if err != nil {
			st, _ := status.FromError(err)
			span.SetAttributes(attribute.Int("rpc.grpc.status_code", int(st.Code())))
			span.SetStatus(codes.Error, st.Code().String())
		}
		return err
	}
}

// GRPCLimitObserver returns a grpclimit observer (grpclimit.WithObserver)
// that records each decision of the interceptors with Decision, as a
// child of the call's span. For a nil Tracing it returns nil, which
// grpclimit takes as no observer.
func (t *Tracing) GRPCLimitObserver() func(grpclimit.Event) {
	if t == nil {
		return nil
	}
	return func(ev grpclimit.Event) {
		t.Decision(ev.Ctx, "grpc", httplimit.Event{Policy: ev.Policy, Cost: ev.Cost, Decision: ev.Decision, Latency: ev.Latency, Err: ev.Err})
	}
}

// rpcAttrs are the semantic-convention attributes of a gRPC method
// (/package.Service/Method).
func rpcAttrs(full string) []attribute.KeyValue {
	svc, m, _ := strings.Cut(strings.TrimPrefix(full, "/"), "/")
	return []attribute.KeyValue{
		attribute.String("rpc.system", "grpc"),
		attribute.String("rpc.service", svc),
		attribute.String("rpc.method", m),
	}
}

// overallCode reads the enum field overall_code of a response message
// (Envoy's RateLimitResponse) without importing its package.
func overallCode(resp any) (int32, bool) {
	m, ok := resp.(proto.Message)
	if !ok || m == nil {
		return 0, false
	}
	r := m.ProtoReflect()
	if !r.IsValid() {
		return 0, false
	}
	fd := r.Descriptor().Fields().ByName("overall_code")
	if fd == nil || fd.Kind() != protoreflect.EnumKind {
		return 0, false
	}
	return int32(r.Get(fd).Enum()), true
}

// mdCarrier adapts gRPC metadata to the propagator's carrier.
type mdCarrier metadata.MD

var _ propagation.TextMapCarrier = mdCarrier(nil)

func (c mdCarrier) Get(key string) string {
	if v := metadata.MD(c).Get(key); len(v) > 0 {
		return v[0]
	}
	return ""
}

func (c mdCarrier) Set(key, value string) { metadata.MD(c).Set(key, value) }

func (c mdCarrier) Keys() []string {
	keys := make([]string, 0, len(c))
	for k := range c {
		keys = append(keys, k)
	}
	return keys
}
