package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"

	"github.com/slidegate/slidegate/telemetry"
	"github.com/slidegate/slidegate/telemetry/otlptest"
)

// tracedKey is the client key of the tracing tests: no span may carry it.
const tracedKey = "203.0.113.77-sk-live-9a8b"

func randHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// slidegate serve with a tracing section sends, over OTLP/HTTP to a
// receiver on loopback, a server span per decision API and check request
// (the child of the caller's traceparent) and a decision span under it,
// with the policy, the surface and the outcome and never the key.
func TestServeTracing(t *testing.T) {
	rcv := otlptest.Start(t)
	dir := t.TempDir()
	cfg := filepath.Join(dir, "tracing.yaml")
	body := "admin: 'off'\nkey: header:X-API-Key\ntrusted_proxies: [127.0.0.1/32]\npolicies:\n  - {name: gold, limit: 1, window: 1h}\n" +
		"tracing:\n  endpoint: " + rcv.HTTPURL + "\n  protocol: http\n  sample_rate: 1\n  service_name: edge-api\n"
	if err := os.WriteFile(cfg, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	srv, stop := startServe(t, "--config", cfg, "--listen", "127.0.0.1:0")
	if srv == nil {
		code, stderr := stop()
		t.Fatalf("serve exited %d: %s", code, stderr)
	}
	traceID := randHex(16)
	var parents []string
	tr := &http.Transport{}
	for range 2 {
		parent := randHex(8)
		parents = append(parents, parent)
		req, _ := http.NewRequest(http.MethodPost, "http://"+srv.Addr()+"/v1/allow", strings.NewReader(`{"key":"`+tracedKey+`"}`))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("traceparent", "00-"+traceID+"-"+parent+"-01")
		resp, err := (&http.Client{Transport: tr}).Do(req)
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}
	// The check endpoint, asked as nginx asks it, about a request whose
	// path and key are the client's.
	checkParent := randHex(8)
	req, _ := http.NewRequest(http.MethodGet, "http://"+srv.Addr()+"/v1/check", nil)
	req.Header.Set("X-Original-URI", "/users/"+tracedKey)
	req.Header.Set("X-Original-Method", "GET")
	req.Header.Set("X-API-Key", tracedKey+"-2")
	req.Header.Set("traceparent", "00-"+traceID+"-"+checkParent+"-01")
	resp, err := (&http.Client{Transport: tr}).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("check: %d", resp.StatusCode)
	}
	tr.CloseIdleConnections()
	// Exiting flushes the exporter: every span is at the receiver after.
	if code, stderr := stop(); code != 0 {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	servers, checks, decisions := rcv.Named("POST /v1/allow"), rcv.Named("/v1/check"), rcv.Named("slidegate.decide")
	if len(servers) != 2 || len(checks) != 1 || len(decisions) != 3 {
		t.Fatalf("got %d API, %d check and %d decision spans, want 2, 1 and 3: %+v", len(servers), len(checks), len(decisions), rcv.Spans())
	}
	c, d := checks[0], decisions[2]
	if c.TraceID != traceID || c.ParentID != checkParent || d.ParentID != c.SpanID || d.Attrs["slidegate.surface"] != "check" || d.Attrs["slidegate.allowed"] != "true" {
		t.Errorf("check: server span %+v, decision span %+v; want the caller's child, and its child on surface check, allowed", c, d)
	}
	wantAllowed := []string{"true", "false"}
	for i, s := range servers {
		d := decisions[i]
		if s.TraceID != traceID || s.ParentID != parents[i] || s.Via != "http" || s.Resource["service.name"] != "edge-api" {
			t.Errorf("request %d: server span %+v, want trace %s, parent %s, service edge-api, over http", i, s, traceID, parents[i])
		}
		if d.ParentID != s.SpanID || d.Attrs["slidegate.policy"] != "gold" || d.Attrs["slidegate.allowed"] != wantAllowed[i] || d.Attrs["slidegate.surface"] != "api" {
			t.Errorf("request %d: decision span %+v, want the child of %s, policy gold, allowed %s, surface api", i, d, s.SpanID, wantAllowed[i])
		}
	}
	if where := rcv.Containing(tracedKey); len(where) > 0 {
		t.Errorf("the key reached the exporter: %v", where)
	}
}

// In gateway mode the request's span is named by its method alone (the
// path is the client's), its decision span is on the gateway surface,
// and the upstream receives the gateway span's context as its
// traceparent, so that its own span is the gateway span's child.
func TestServeGatewayTracing(t *testing.T) {
	rcv := otlptest.Start(t)
	upstreamSaw := make(chan string, 2)
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		upstreamSaw <- r.Header.Get("traceparent")
		w.WriteHeader(http.StatusNoContent)
	}))
	defer up.Close()
	cfg := filepath.Join(t.TempDir(), "gateway.yaml")
	body := "admin: 'off'\nkey: header:X-API-Key\npolicies:\n  - {name: gold, limit: 1, window: 1h}\n" +
		"tracing: {endpoint: '" + rcv.HTTPURL + "'}\n"
	if err := os.WriteFile(cfg, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	srv, stop := startServe(t, "--config", cfg, "--listen", "127.0.0.1:0", "--upstream", up.URL)
	if srv == nil {
		code, stderr := stop()
		t.Fatalf("serve exited %d: %s", code, stderr)
	}
	traceID := randHex(16)
	var parents []string
	tr := &http.Transport{}
	for i, want := range []int{http.StatusNoContent, http.StatusTooManyRequests} {
		parent := randHex(8)
		parents = append(parents, parent)
		req, _ := http.NewRequest(http.MethodGet, "http://"+srv.Addr()+"/users/"+tracedKey, nil)
		req.Header.Set("X-API-Key", tracedKey)
		req.Header.Set("traceparent", "00-"+traceID+"-"+parent+"-01")
		resp, err := (&http.Client{Transport: tr}).Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != want {
			t.Fatalf("request %d: %d, want %d", i, resp.StatusCode, want)
		}
	}
	tr.CloseIdleConnections()
	if code, stderr := stop(); code != 0 {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	servers, decisions := rcv.Named("GET"), rcv.Named("slidegate.decide")
	if len(servers) != 2 || len(decisions) != 2 || len(upstreamSaw) != 1 {
		t.Fatalf("got %d server spans, %d decision spans, %d upstream requests; want 2, 2, 1: %+v", len(servers), len(decisions), len(upstreamSaw), rcv.Spans())
	}
	wantAllowed := []string{"true", "false"}
	for i, s := range servers {
		d := decisions[i]
		if s.TraceID != traceID || s.ParentID != parents[i] || s.Attrs["slidegate.surface"] != "gateway" {
			t.Errorf("request %d: server span %+v, want the child of %s in %s on surface gateway", i, s, parents[i], traceID)
		}
		if d.ParentID != s.SpanID || d.Attrs["slidegate.surface"] != "gateway" || d.Attrs["slidegate.allowed"] != wantAllowed[i] || d.Attrs["slidegate.policy"] != "gold" {
			t.Errorf("request %d: decision span %+v, want the child of %s, gateway, gold, allowed %s", i, d, s.SpanID, wantAllowed[i])
		}
	}
	if got, want := <-upstreamSaw, "00-"+traceID+"-"+servers[0].SpanID+"-01"; got != want {
		t.Errorf("the upstream saw traceparent %q, want the gateway span's %q", got, want)
	}
	if where := rcv.Containing(tracedKey); len(where) > 0 {
		t.Errorf("the key reached the exporter: %v", where)
	}
}

// A bad tracing section stops serve at start-up with the field named.
func TestServeTracingConfigErrors(t *testing.T) {
	dir := t.TempDir()
	for _, tc := range []struct{ section, want string }{
		{"tracing: {endpoint: 'collector:4318'}", "tracing.endpoint"},
		{"tracing: {endpoint: 'http://127.0.0.1:4318', protocol: udp}", "tracing.protocol"},
		{"tracing: {endpoint: 'http://127.0.0.1:4318', sample_rate: 2}", "tracing.sample_rate"},
		{"tracing: {sample_rate: 0.5}", "endpoint is required"},
		{"tracing: {endpoint: 'https://user:s3cret@collector:4318'}", "OTEL_EXPORTER_OTLP_HEADERS"},
	} {
		cfg := filepath.Join(dir, "bad.yaml")
		if err := os.WriteFile(cfg, []byte("admin: 'off'\npolicies:\n  - {name: gold, limit: 1, window: 1h}\n"+tc.section+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		srv, stop := startServe(t, "--config", cfg, "--listen", "127.0.0.1:0")
		code, stderr := stop()
		if srv != nil || code == 0 || !strings.Contains(stderr, tc.want) || strings.Contains(stderr, "s3cret") {
			t.Errorf("%s: exit %d, %q; want a failure naming %s", tc.section, code, stderr, tc.want)
		}
	}
}

// slidegate envoy serve with envoyproxy/ratelimit's tracing variables
// sends, over OTLP/gRPC to the endpoint of OTEL_EXPORTER_OTLP_ENDPOINT, a
// server span per ShouldRateLimit call whose parent is the traceparent in
// the call's metadata (as Envoy sends it), with the domain, the outcome
// and the peer's resource attributes, and never a descriptor's value. On
// Redis (SLIDEGATE_REDIS_ADDR), each script call is a span under it with
// the store kind and the node's address.
func TestEnvoyServeTracing(t *testing.T) {
	rcv := otlptest.Start(t)
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://"+rcv.GRPCAddr)
	redisAddr := os.Getenv("SLIDEGATE_REDIS_ADDR")
	root := t.TempDir()
	dir := filepath.Join(root, "ratelimit", "config")
	domain := "traced-" + randHex(4)
	writeFile(t, filepath.Join(dir, "a.yaml"), "domain: "+domain+"\ndescriptors:\n  - key: user\n    rate_limit: {unit: hour, requests_per_unit: 1}\n")
	env := map[string]string{"RUNTIME_ROOT": root, "RUNTIME_SUBDIRECTORY": "ratelimit", "GRPC_HOST": "127.0.0.1", "GRPC_PORT": "0",
		"PORT": "off", "USE_STATSD": "false",
		"TRACING_ENABLED": "true", "TRACING_EXPORTER_PROTOCOL": "grpc", "TRACING_SERVICE_NAME": "ratelimit-edge",
		"TRACING_SERVICE_NAMESPACE": "platform", "TRACING_SERVICE_INSTANCE_ID": "rl-0", "TRACING_SAMPLING_RATE": "1"}
	if redisAddr != "" {
		env["REDIS_SOCKET_TYPE"], env["REDIS_URL"] = "tcp", redisAddr
	}
	addrs := make(chan string, 1)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var stderr syncBuf
	done := make(chan int, 1)
	go func() {
		done <- envoyMain(ctx, []string{"serve"}, func(k string) string { return env[k] }, io.Discard, &stderr,
			func(g, _ string) { addrs <- g })
	}()
	var addr string
	select {
	case addr = <-addrs:
	case code := <-done:
		t.Fatalf("exited %d: %s", code, stderr.String())
	}
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	c := rlsv3.NewRateLimitServiceClient(conn)
	traceID := randHex(16)
	var parents []string
	want := []rlsv3.RateLimitResponse_Code{rlsv3.RateLimitResponse_OK, rlsv3.RateLimitResponse_OVER_LIMIT}
	for i := range 2 {
		parent := randHex(8)
		parents = append(parents, parent)
		ctx := metadata.AppendToOutgoingContext(context.Background(), "traceparent", "00-"+traceID+"-"+parent+"-01")
		r, err := c.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: domain,
			Descriptors: []*ratelimitv3.RateLimitDescriptor{{Entries: []*ratelimitv3.RateLimitDescriptor_Entry{{Key: "user", Value: tracedKey}}}}})
		if err != nil || r.OverallCode != want[i] {
			t.Fatalf("call %d: %v %v, want %v", i, r, err, want[i])
		}
	}
	cancel()
	if code := <-done; code != 0 {
		t.Fatalf("exit %d: %s", code, stderr.String())
	}
	servers := rcv.Named("envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit")
	if len(servers) != 2 {
		t.Fatalf("got %d ShouldRateLimit spans, want 2: %+v", len(servers), rcv.Spans())
	}
	wantAllowed := []string{"true", "false"}
	for i, s := range servers {
		if s.TraceID != traceID || s.ParentID != parents[i] || s.Via != "grpc" {
			t.Errorf("call %d: span in trace %s with parent %s over %s, want %s, %s, grpc", i, s.TraceID, s.ParentID, s.Via, traceID, parents[i])
		}
		if s.Attrs["slidegate.domain"] != domain || s.Attrs["slidegate.allowed"] != wantAllowed[i] || s.Attrs["rpc.grpc.status_code"] != "0" {
			t.Errorf("call %d: attributes %v, want domain %s, allowed %s, status 0", i, s.Attrs, domain, wantAllowed[i])
		}
		r := s.Resource
		if r["service.name"] != "ratelimit-edge" || r["service.namespace"] != "platform" || r["service.instance.id"] != "rl-0" {
			t.Errorf("call %d: resource %v, want the TRACING_SERVICE_* values", i, r)
		}
	}
	if redisAddr != "" {
		stores := rcv.Named("slidegate.store")
		if len(stores) != 2 {
			t.Fatalf("got %d store spans on Redis, want 2", len(stores))
		}
		for i, s := range stores {
			host, _, _ := net.SplitHostPort(s.Attrs["server.address"])
			if s.ParentID != servers[i].SpanID || s.Attrs["slidegate.store"] != "redis" || host == "" || s.Attrs["slidegate.allowed"] != wantAllowed[i] {
				t.Errorf("store span %d: %+v, want the child of call %d's span, store redis, a node address, allowed %s", i, s, i, wantAllowed[i])
			}
		}
	}
	if where := rcv.Containing(tracedKey); len(where) > 0 {
		t.Errorf("the descriptor value reached the exporter: %v", where)
	}
}

// The peer's tracing variables are read with its defaults and its
// clamping of the sampling rate; bad values are errors.
func TestPeerTracingVariables(t *testing.T) {
	get := func(env map[string]string) func(string) string { return func(k string) string { return env[k] } }
	// peerTracing reads them as readPeerEnv parses them.
	peerTracing := func(getenv func(string) string) (*telemetry.Config, error) {
		p, errs := readPeerEnv(getenv)
		if err := firstError(errs, nil); err != nil {
			return nil, err
		}
		return peerTracing(p.Tracing)
	}
	if cfg, err := peerTracing(get(nil)); cfg != nil || err != nil {
		t.Errorf("unset: %+v %v, want off", cfg, err)
	}
	if cfg, err := peerTracing(get(map[string]string{"TRACING_ENABLED": "false", "TRACING_EXPORTER_PROTOCOL": "udp"})); cfg != nil || err != nil {
		t.Errorf("disabled: %+v %v, want off", cfg, err)
	}
	cfg, err := peerTracing(get(map[string]string{"TRACING_ENABLED": "1", "TRACING_SAMPLING_RATE": "7"}))
	if err != nil || cfg.Protocol != "http" || cfg.ServiceName != "RateLimit" || cfg.SampleRate == nil || *cfg.SampleRate != 1 {
		t.Errorf("defaults: %+v %v, want http, RateLimit, rate clamped to 1", cfg, err)
	}
	cfg, err = peerTracing(get(map[string]string{"TRACING_ENABLED": "true", "TRACING_SAMPLING_RATE": "-1"}))
	if err != nil || *cfg.SampleRate != 0 {
		t.Errorf("negative rate: %+v %v, want 0", cfg, err)
	}
	for _, env := range []map[string]string{
		{"TRACING_ENABLED": "yes"},
		{"TRACING_ENABLED": "true", "TRACING_EXPORTER_PROTOCOL": "udp"},
		{"TRACING_ENABLED": "true", "TRACING_SAMPLING_RATE": "half"},
	} {
		if _, err := peerTracing(get(env)); err == nil {
			t.Errorf("%v: no error", env)
		}
	}
	// envoy serve refuses them at start-up, naming the variable.
	var stderr syncBuf
	code := envoyMain(context.Background(), []string{"serve"}, get(map[string]string{"TRACING_ENABLED": "true", "TRACING_EXPORTER_PROTOCOL": "udp"}),
		io.Discard, &stderr, nil)
	if code != 2 || !strings.Contains(stderr.String(), "TRACING_EXPORTER_PROTOCOL") {
		t.Errorf("exit %d, %q; want 2 naming TRACING_EXPORTER_PROTOCOL", code, stderr.String())
	}
}

// slidegate serve --grpc with a tracing section traces the rate limit
// service's calls as envoy serve does, over OTLP/gRPC here; on Redis
// (SLIDEGATE_REDIS_ADDR) each script call is a span under the call's.
func TestServeEnvoyTracing(t *testing.T) {
	rcv := otlptest.Start(t)
	dir := t.TempDir()
	domain := "serve-traced-" + randHex(4)
	envoyCfg := filepath.Join(dir, "envoy.yaml")
	writeFile(t, envoyCfg, "domain: "+domain+"\ndescriptors:\n  - key: user\n    rate_limit: {unit: hour, requests_per_unit: 1}\n")
	cfg := filepath.Join(dir, "serve.yaml")
	writeFile(t, cfg, "policies:\n  - {name: free, limit: 5, window: 60s}\n"+
		"tracing: {endpoint: 'http://"+rcv.GRPCAddr+"', protocol: grpc}\n")
	args := []string{"--config", cfg, "--listen", "127.0.0.1:0", "--admin", "off", "--grpc", "127.0.0.1:0", "--envoy-config", envoyCfg, "--drain-delay", "0s"}
	redisAddr := os.Getenv("SLIDEGATE_REDIS_ADDR")
	if redisAddr != "" {
		args = append(args, "--store", "redis://"+redisAddr)
	}
	c, stop := serveEnvoy(t, args...)
	traceID, parent := randHex(16), randHex(8)
	ctx := metadata.AppendToOutgoingContext(context.Background(), "traceparent", "00-"+traceID+"-"+parent+"-01")
	for i, want := range []rlsv3.RateLimitResponse_Code{rlsv3.RateLimitResponse_OK, rlsv3.RateLimitResponse_OVER_LIMIT} {
		r, err := c.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: domain,
			Descriptors: []*ratelimitv3.RateLimitDescriptor{{Entries: []*ratelimitv3.RateLimitDescriptor_Entry{{Key: "user", Value: tracedKey}}}}})
		if err != nil || r.OverallCode != want {
			t.Fatalf("call %d: %v %v, want %v", i, r, err, want)
		}
	}
	stop()
	servers := rcv.Named("envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit")
	if len(servers) != 2 {
		t.Fatalf("got %d ShouldRateLimit spans, want 2: %+v", len(servers), rcv.Spans())
	}
	for i, s := range servers {
		if s.TraceID != traceID || s.ParentID != parent || s.Attrs["slidegate.domain"] != domain || s.Attrs["slidegate.allowed"] != strconv.FormatBool(i == 0) || s.Resource["service.name"] != "slidegate" {
			t.Errorf("call %d: span %+v, want the child of %s in %s, domain %s, allowed %v, service slidegate", i, s, parent, traceID, domain, i == 0)
		}
	}
	if redisAddr != "" {
		stores := rcv.Named("slidegate.store")
		if len(stores) != 2 {
			t.Fatalf("got %d store spans on Redis, want 2", len(stores))
		}
		for i, s := range stores {
			if s.ParentID != servers[i].SpanID || s.Attrs["server.address"] == "" || s.Attrs["slidegate.allowed"] != strconv.FormatBool(i == 0) {
				t.Errorf("store span %d: %+v, want the child of call %d's span with its node and outcome", i, s, i)
			}
		}
	}
	if where := rcv.Containing(tracedKey); len(where) > 0 {
		t.Errorf("the descriptor value reached the exporter: %v", where)
	}
}
