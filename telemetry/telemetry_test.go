package telemetry_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/slidegate/slidegate/engine"
	"github.com/slidegate/slidegate/grpclimit"
	"github.com/slidegate/slidegate/httplimit"
	"github.com/slidegate/slidegate/telemetry"
	"github.com/slidegate/slidegate/telemetry/otlptest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// secretKey is the client key of the tests' requests: no span may carry
// it.
const secretKey = "sk-live-7f3a9c1e5b"

func rate(v float64) *float64 { return &v }

func newTracing(t *testing.T, cfg telemetry.Config) *telemetry.Tracing {
	t.Helper()
	tr, err := telemetry.New(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	return tr
}

// shutdown flushes tr's spans to the receiver (Shutdown exports what is
// buffered before it returns).
func shutdown(t *testing.T, tr *telemetry.Tracing) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := tr.Shutdown(ctx); err != nil {
		t.Fatalf("shutdown: %v", err)
	}
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

func noSecret(t *testing.T, rcv *otlptest.Receiver) {
	t.Helper()
	if where := rcv.Containing(secretKey); len(where) > 0 {
		t.Errorf("the client key reached the exporter: %v", where)
	}
}

// The middleware's decisions over a real listener, exported over
// OTLP/HTTP: each request's server span is the child of the caller's
// traceparent, each decision span the child of its request's span, with
// the policy and the outcome and without the key.
func TestHTTPSpansOverOTLPHTTP(t *testing.T) {
	rcv := otlptest.Start(t)
	tr := newTracing(t, telemetry.Config{Endpoint: rcv.HTTPURL, Protocol: "http", ServiceName: "edge", ServiceNamespace: "team-a", ServiceInstanceID: "i-1"})
	lim, err := engine.New(engine.Policy{Name: "free", Limit: 1, Window: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	defer lim.Close()
	mw, err := httplimit.New(httplimit.WithBackend(lim), httplimit.WithKeyFunc(httplimit.HeaderKey("X-API-Key")),
		httplimit.WithObserver(tr.HTTPObserver("middleware")))
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(tr.Handler("middleware", mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.WriteHeader(http.StatusNoContent)
	}))))
	defer srv.Close()

	traceID := randomHex(16)
	var parents []string
	for range 2 {
		parent := randomHex(8)
		parents = append(parents, parent)
		req, _ := http.NewRequest(http.MethodGet, srv.URL+"/users/"+secretKey, nil)
		req.Header.Set("X-API-Key", secretKey)
		req.Header.Set("Traceparent", "00-"+traceID+"-"+parent+"-01")
		res, err := srv.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		res.Body.Close()
	}
	shutdown(t, tr)

	servers := rcv.Named("GET")
	if len(servers) != 2 {
		t.Fatalf("got %d server spans named GET, want 2 (all spans: %+v)", len(servers), rcv.Spans())
	}
	decisions := rcv.Named("slidegate.decide")
	if len(decisions) != 2 {
		t.Fatalf("got %d decision spans, want 2", len(decisions))
	}
	wantStatus := []string{"204", "429"}
	wantAllowed := []string{"true", "false"}
	for i, s := range servers {
		if s.Via != "http" {
			t.Errorf("server span %d came over %s, want http", i, s.Via)
		}
		if s.TraceID != traceID || s.ParentID != parents[i] {
			t.Errorf("server span %d: trace %s parent %s, want the caller's %s and %s", i, s.TraceID, s.ParentID, traceID, parents[i])
		}
		if got := s.Attrs["http.response.status_code"]; got != wantStatus[i] {
			t.Errorf("server span %d: status %s, want %s", i, got, wantStatus[i])
		}
		if s.Resource["service.name"] != "edge" || s.Resource["service.namespace"] != "team-a" || s.Resource["service.instance.id"] != "i-1" {
			t.Errorf("resource %v, want service edge in team-a, instance i-1", s.Resource)
		}
		d := decisions[i]
		if d.ParentID != s.SpanID || d.TraceID != traceID {
			t.Errorf("decision span %d: parent %s in trace %s, want its request's span %s in %s", i, d.ParentID, d.TraceID, s.SpanID, traceID)
		}
		if d.Attrs["slidegate.policy"] != "free" || d.Attrs["slidegate.allowed"] != wantAllowed[i] || d.Attrs["slidegate.surface"] != "middleware" {
			t.Errorf("decision span %d: attributes %v, want policy free, allowed %s, surface middleware", i, d.Attrs, wantAllowed[i])
		}
	}
	noSecret(t, rcv)
}

// A gRPC call through telemetry's client and server interceptors and
// grpclimit, exported over OTLP/gRPC: the client span's trace and span
// ids, sent in the call's metadata, are the server span's parent; the
// decision span is the server span's child.
func TestGRPCSpansOverOTLPGRPC(t *testing.T) {
	rcv := otlptest.Start(t)
	server := newTracing(t, telemetry.Config{Endpoint: "http://" + rcv.GRPCAddr, Protocol: "grpc", ServiceName: "limiter"})
	client := newTracing(t, telemetry.Config{Endpoint: "http://" + rcv.GRPCAddr, Protocol: "grpc", ServiceName: "caller"})
	lim, err := engine.New(engine.Policy{Name: "calls", Limit: 1, Window: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	defer lim.Close()
	gl, err := grpclimit.New(grpclimit.WithBackend(lim), grpclimit.WithKeyFunc(grpclimit.MetadataKey("x-api-key")),
		grpclimit.WithObserver(server.GRPCLimitObserver()))
	if err != nil {
		t.Fatal(err)
	}
	gs := grpc.NewServer(grpc.ChainUnaryInterceptor(server.UnaryServerInterceptor(), gl.UnaryServerInterceptor()))
	healthpb.RegisterHealthServer(gs, health.NewServer())
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	served := make(chan struct{})
	go func() { defer close(served); _ = gs.Serve(lis) }()
	defer func() { gs.Stop(); <-served }()
	cc, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithChainUnaryInterceptor(client.UnaryClientInterceptor()))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	ctx := metadata.AppendToOutgoingContext(context.Background(), "x-api-key", secretKey)
	hc := healthpb.NewHealthClient(cc)
	if _, err := hc.Check(ctx, &healthpb.HealthCheckRequest{}); err != nil {
		t.Fatalf("first call: %v", err)
	}
	if _, err := hc.Check(ctx, &healthpb.HealthCheckRequest{}); status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("second call: %v, want ResourceExhausted", err)
	}
	shutdown(t, client)
	shutdown(t, server)

	const name = "grpc.health.v1.Health/Check"
	var clients, servers []otlptest.Span
	for _, s := range rcv.Named(name) {
		if s.Via != "grpc" {
			t.Errorf("span %s came over %s, want grpc", s.Name, s.Via)
		}
		switch s.Resource["service.name"] {
		case "caller":
			clients = append(clients, s)
		case "limiter":
			servers = append(servers, s)
		}
	}
	decisions := rcv.Named("slidegate.decide")
	if len(clients) != 2 || len(servers) != 2 || len(decisions) != 2 {
		t.Fatalf("got %d client, %d server and %d decision spans, want 2 of each (all: %+v)", len(clients), len(servers), len(decisions), rcv.Spans())
	}
	wantCode := []string{"0", "8"} // OK, ResourceExhausted
	wantAllowed := []string{"true", "false"}
	for i := range 2 {
		c, s, d := clients[i], servers[i], decisions[i]
		if s.TraceID != c.TraceID || s.ParentID != c.SpanID {
			t.Errorf("call %d: server span in trace %s with parent %s, want the client span's %s and %s", i, s.TraceID, s.ParentID, c.TraceID, c.SpanID)
		}
		if s.Attrs["rpc.grpc.status_code"] != wantCode[i] || s.Attrs["rpc.service"] != "grpc.health.v1.Health" {
			t.Errorf("call %d: server attributes %v, want status %s", i, s.Attrs, wantCode[i])
		}
		if d.ParentID != s.SpanID || d.Attrs["slidegate.policy"] != "calls" || d.Attrs["slidegate.allowed"] != wantAllowed[i] {
			t.Errorf("call %d: decision span parent %s attributes %v, want parent %s, policy calls, allowed %s", i, d.ParentID, d.Attrs, s.SpanID, wantAllowed[i])
		}
	}
	noSecret(t, rcv)
}

// A server stream's span is the child of the traceparent in its
// metadata, and grpclimit's decision when the stream opens is the
// stream span's child.
func TestGRPCStreamSpans(t *testing.T) {
	rcv := otlptest.Start(t)
	tr := newTracing(t, telemetry.Config{Endpoint: rcv.HTTPURL})
	lim, err := engine.New(engine.Policy{Name: "streams", Limit: 5, Window: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	defer lim.Close()
	gl, err := grpclimit.New(grpclimit.WithBackend(lim), grpclimit.WithKeyFunc(grpclimit.MetadataKey("x-api-key")),
		grpclimit.WithObserver(tr.GRPCLimitObserver()))
	if err != nil {
		t.Fatal(err)
	}
	gs := grpc.NewServer(grpc.ChainStreamInterceptor(tr.StreamServerInterceptor(), gl.StreamServerInterceptor()))
	healthpb.RegisterHealthServer(gs, health.NewServer())
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	served := make(chan struct{})
	go func() { defer close(served); _ = gs.Serve(lis) }()
	cc, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	traceID, parent := randomHex(16), randomHex(8)
	ctx, cancel := context.WithCancel(metadata.AppendToOutgoingContext(context.Background(),
		"x-api-key", secretKey, "traceparent", "00-"+traceID+"-"+parent+"-01"))
	stream, err := healthpb.NewHealthClient(cc).Watch(ctx, &healthpb.HealthCheckRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := stream.Recv(); err != nil {
		t.Fatalf("first status: %v", err)
	}
	cancel()
	cc.Close()
	gs.GracefulStop() // waits for the stream's handler, whose span then ends
	<-served
	shutdown(t, tr)

	streams, decisions := rcv.Named("grpc.health.v1.Health/Watch"), rcv.Named("slidegate.decide")
	if len(streams) != 1 || len(decisions) != 1 {
		t.Fatalf("got %d stream and %d decision spans, want 1 and 1: %+v", len(streams), len(decisions), rcv.Spans())
	}
	s, d := streams[0], decisions[0]
	if s.TraceID != traceID || s.ParentID != parent || s.Attrs["rpc.method"] != "Watch" {
		t.Errorf("stream span %+v: want the child of %s in %s", s, parent, traceID)
	}
	if d.ParentID != s.SpanID || d.Attrs["slidegate.policy"] != "streams" || d.Attrs["slidegate.allowed"] != "true" {
		t.Errorf("decision span %+v: want the child of the stream span %s, policy streams, allowed", d, s.SpanID)
	}
	noSecret(t, rcv)
}

// The store hook's span is the child of the context it is handed and
// carries the store kind, the node and the outcome, or the error.
func TestStoreHook(t *testing.T) {
	rcv := otlptest.Start(t)
	tr := newTracing(t, telemetry.Config{Endpoint: rcv.HTTPURL})
	ctx, parent := tr.Tracer().Start(context.Background(), "request")
	hook := tr.StoreHook()
	cctx, done := hook(ctx, "redis-cluster", "127.0.0.1:7001", "free")
	done(true, nil)
	_, done = hook(cctx, "redis", "127.0.0.1:6379", "free")
	done(false, errors.New("i/o timeout"))
	parent.End()
	shutdown(t, tr)
	stores := rcv.Named("slidegate.store")
	req := rcv.Named("request")
	if len(stores) != 2 || len(req) != 1 {
		t.Fatalf("got %d store and %d request spans, want 2 and 1", len(stores), len(req))
	}
	s := stores[0]
	if s.ParentID != req[0].SpanID || s.Attrs["slidegate.store"] != "redis-cluster" || s.Attrs["server.address"] != "127.0.0.1:7001" || s.Attrs["slidegate.allowed"] != "true" {
		t.Errorf("store span %+v: want child of the request, redis-cluster at 127.0.0.1:7001, allowed", s)
	}
	if f := stores[1]; f.Status.String() != "STATUS_CODE_ERROR" || f.Attrs["slidegate.allowed"] != "" || len(f.Events) != 1 {
		t.Errorf("failed store span %+v: want status error, no outcome, one error event", f)
	}
}

// Bad configurations are errors, not panics.
func TestConfigErrors(t *testing.T) {
	for _, cfg := range []telemetry.Config{
		{Protocol: "udp"},
		{SampleRate: rate(1.5)},
		{SampleRate: rate(-0.1)},
		{Endpoint: "127.0.0.1:4318"},
		{Endpoint: "ftp://collector:21", Protocol: "grpc"},
		{Endpoint: "https://user:s3cret@collector:4318"},
	} {
		tr, err := telemetry.New(context.Background(), cfg)
		if !errors.Is(err, telemetry.ErrConfig) {
			t.Errorf("%+v: got %v, want ErrConfig", cfg, err)
			_ = tr.Shutdown(context.Background())
		} else if strings.Contains(err.Error(), "s3cret") {
			t.Errorf("the error shows the password: %v", err)
		}
	}
}

// A nil Tracing is tracing off: every hook is nil, so the instrumented
// code calls none.
func TestNilTracingIsOff(t *testing.T) {
	var tr *telemetry.Tracing
	if tr.HTTPObserver("x") != nil || tr.GRPCLimitObserver() != nil || tr.StoreHook() != nil ||
		tr.UnaryServerInterceptor() != nil || tr.StreamServerInterceptor() != nil || tr.UnaryClientInterceptor() != nil {
		t.Error("a nil Tracing returned a hook")
	}
	h := http.NotFoundHandler()
	if got := tr.Handler("api", h); got == nil {
		t.Error("Handler returned nil")
	}
	tr.Decision(context.Background(), "api", httplimit.Event{Policy: "p", Cost: 1})
	if err := tr.Shutdown(context.Background()); err != nil {
		t.Error(err)
	}
}

// A collector that is down loses spans: the exporter's failure reaches
// OnError (slidegate logs it) rather than the standard logger.
func TestCollectorDown(t *testing.T) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead := "http://" + lis.Addr().String()
	lis.Close()
	errs := make(chan error, 16)
	tr := newTracing(t, telemetry.Config{Endpoint: dead, OnError: func(err error) {
		select {
		case errs <- err:
		default:
		}
	}})
	_, span := tr.Tracer().Start(context.Background(), "lost")
	span.End()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_ = tr.Shutdown(ctx) // its error, if any, is the same failure
	select {
	case err := <-errs:
		if !strings.Contains(err.Error(), lis.Addr().String()) {
			t.Errorf("OnError got %v, want the failed export to %s", err, dead)
		}
	default:
		t.Fatal("OnError was not handed the failed export")
	}
}
