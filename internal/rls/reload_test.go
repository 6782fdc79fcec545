package rls_test

import (
	"context"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/mem"
	"google.golang.org/grpc/status"

	"github.com/slidegate/slidegate/internal/rls"
)

func write(t *testing.T, path, body string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
}

func askR(t *testing.T, r *rls.Reloader, domain string, kv ...string) *rlsv3.RateLimitResponse {
	t.Helper()
	resp, err := r.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{Domain: domain, Descriptors: []*ratelimitv3.RateLimitDescriptor{desc(kv...)}})
	if err != nil {
		t.Fatal(err)
	}
	return resp
}

// A changed directory is reloaded: unchanged rules keep their state, new
// and changed ones start afresh, a broken file leaves the configuration in
// force (counted once), and Watch picks up a file copied in.
func TestReloaderKeepsState(t *testing.T) {
	dir := t.TempDir()
	write(t, filepath.Join(dir, "a.yaml"), "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: minute, requests_per_unit: 2}\n  - key: j\n    rate_limit: {unit: minute, requests_per_unit: 3}\n")
	mb := rls.NewMemoryBackends()
	defer mb.Close()
	reg := prometheus.NewRegistry()
	r, err := rls.NewReloader(dir, rls.LoadOptions{AllFiles: true}, mb.Factory, reg, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	ok, over := rlsv3.RateLimitResponse_OK, rlsv3.RateLimitResponse_OVER_LIMIT
	askR(t, r, "d", "k", "1")
	askR(t, r, "d", "k", "1")
	askR(t, r, "d", "j", "1")
	if changed, err := r.Reload(); changed || err != nil {
		t.Fatalf("unchanged files reloaded: %v %v", changed, err)
	}
	write(t, filepath.Join(dir, "a.yaml"), "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: minute, requests_per_unit: 2}\n  - key: j\n    rate_limit: {unit: minute, requests_per_unit: 5}\n")
	write(t, filepath.Join(dir, "sub", "b.yaml"), "domain: e\ndescriptors:\n  - key: k\n    rate_limit: {unit: minute, requests_per_unit: 1}\n")
	if changed, err := r.Reload(); !changed || err != nil {
		t.Fatalf("reload: %v %v", changed, err)
	}
	if resp := askR(t, r, "d", "k", "1"); resp.OverallCode != over {
		t.Fatalf("k lost its state: %v", resp)
	}
	if resp := askR(t, r, "d", "j", "1"); resp.OverallCode != ok || resp.Statuses[0].LimitRemaining != 4 {
		t.Fatalf("j changed: %v", resp)
	}
	if resp := askR(t, r, "e", "k", "1"); resp.OverallCode != ok || resp.Statuses[0].CurrentLimit == nil {
		t.Fatalf("new domain: %v", resp)
	}
	write(t, filepath.Join(dir, "c.yaml"), "domain: f\ndescriptors:\n  - key: k\n    rate_limit: {unit: fortnight}\n")
	for range 2 {
		if _, err := r.Reload(); err != nil && !strings.Contains(err.Error(), `c.yaml:4: unknown unit "fortnight"`) {
			t.Fatalf("broken file: %v", err)
		}
	}
	if n := metric(t, reg, rls.MetricReloads, "result", "failure"); n != 1 {
		t.Fatalf("%v reload errors counted, want 1", n)
	}
	if resp := askR(t, r, "d", "k", "1"); resp.OverallCode != over {
		t.Fatalf("after a broken file: %v", resp)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { r.Watch(ctx, 20*time.Millisecond); close(done) }()
	defer func() { cancel(); <-done }()
	write(t, filepath.Join(dir, "c.yaml"), "domain: f\ndescriptors:\n  - key: k\n    rate_limit: {unit: minute, requests_per_unit: 1}\n")
	deadline := time.Now().Add(30 * time.Second)
	for askR(t, r, "f", "k", "1").Statuses[0].CurrentLimit == nil {
		if time.Now().After(deadline) {
			t.Fatal("the copied file was not loaded within 30 s")
		}
		time.Sleep(20 * time.Millisecond)
	}
	if n := metric(t, reg, rls.MetricReloads, "result", "success"); n != 2 {
		t.Fatalf("%v reloads counted, want 2", n)
	}
}

// The peer's HTTP endpoints, and a malformed gRPC message counted.
func TestReloaderHTTPAndGRPC(t *testing.T) {
	dir := t.TempDir()
	write(t, filepath.Join(dir, "a.yaml"), "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: minute, requests_per_unit: 1}\n")
	mb := rls.NewMemoryBackends()
	defer mb.Close()
	r, err := rls.NewReloader(dir, rls.LoadOptions{AllFiles: true}, mb.Factory, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	hs := httptest.NewServer(rls.HTTPHandler(r, nil))
	defer hs.Close()
	send := func(method, body string) (int, string, string) {
		hr, err := http.NewRequest(method, hs.URL+"/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		resp, err := http.DefaultClient.Do(hr)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, resp.Header.Get("Content-Type"), string(b)
	}
	post := func(body string) (int, string) {
		code, _, b := send(http.MethodPost, body)
		return code, b
	}
	req := `{"domain": "d", "descriptors": [{"entries": [{"key": "k", "value": "v"}]}]}`
	if code, body := post(req); code != 200 || !strings.Contains(body, `"overallCode":"OK"`) {
		t.Fatalf("first: %d %s", code, body)
	}
	if code, body := post(req); code != 429 || !strings.Contains(body, `"OVER_LIMIT"`) {
		t.Fatalf("second: %d %s", code, body)
	}
	// As the peer's /json: any method decides the body's request, and
	// what is refused is a text/plain "Bad Request".
	for _, m := range []string{http.MethodGet, http.MethodPut} {
		if code, _, body := send(m, req); code != 429 || !strings.Contains(body, `"OVER_LIMIT"`) {
			t.Fatalf("%s: %d %s", m, code, body)
		}
	}
	for _, bad := range []struct{ method, body string }{{http.MethodPost, `{"domain": 5`}, {http.MethodGet, ""},
		{http.MethodPost, `{"domain": "d"}`}} {
		if code, ct, body := send(bad.method, bad.body); code != 400 || !strings.HasPrefix(ct, "text/plain") || body != "Bad Request\n" {
			t.Fatalf("%s %q: %d %s %q", bad.method, bad.body, code, ct, body)
		}
	}
	for path, want := range map[string]string{"/healthcheck": "OK", "/rlconfig": "d.k: unit=MINUTE requests_per_unit=1, shadow_mode: false, quota_mode: false\n"} {
		resp, err := http.Get(hs.URL + path)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 || string(b) != want {
			t.Fatalf("%s: %d %q", path, resp.StatusCode, b)
		}
	}
	gs, health := rls.NewGRPCServer(r)
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	served := make(chan error, 1)
	go func() { served <- gs.Serve(lis) }()
	defer func() { health.Shutdown(); gs.GracefulStop(); <-served }()
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	// The peer's health service name, as its probes ask for it.
	for _, name := range []string{"", rls.ServiceName, rls.PeerHealthName} {
		hr, err := healthpb.NewHealthClient(conn).Check(context.Background(), &healthpb.HealthCheckRequest{Service: name})
		if err != nil || hr.GetStatus() != healthpb.HealthCheckResponse_SERVING {
			t.Fatalf("health %q: %v %v", name, hr, err)
		}
	}
	err = conn.Invoke(context.Background(), "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit", &rawBytes{0xff, 0xff, 0xff}, new(rawBytes), grpc.ForceCodecV2(rawCodec{}))
	if status.Code(err) != codes.Internal {
		t.Fatalf("malformed message: %v", err)
	}
	mfs, err := r.Gather()
	if err != nil {
		t.Fatal(err)
	}
	found := false
	for _, mf := range mfs {
		for _, m := range mf.Metric {
			if mf.GetName() == rls.MetricErrors && hasLabel(m, "code", rls.CodeMalformed) && m.GetCounter().GetValue() == 1 {
				found = true
			}
		}
	}
	if !found {
		t.Fatal("the malformed message was not counted")
	}
}

// rawBytes and rawCodec send bytes that are not protobuf.
type rawBytes []byte

type rawCodec struct{}

func (rawCodec) Marshal(v any) (mem.BufferSlice, error) {
	return mem.BufferSlice{mem.SliceBuffer(*v.(*rawBytes))}, nil
}

func (rawCodec) Unmarshal(data mem.BufferSlice, v any) error {
	*v.(*rawBytes) = data.Materialize()
	return nil
}

func (rawCodec) Name() string { return "proto" }

// A reload after any file change (here a comment) keeps the service's
// counters: they count every call across reloads, read over a real gRPC
// listener and a real /metrics endpoint.
func TestReloaderCountersMonotonic(t *testing.T) {
	dir := t.TempDir()
	cfg := "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: minute, requests_per_unit: 1000}\n"
	write(t, filepath.Join(dir, "a.yaml"), cfg)
	mb := rls.NewMemoryBackends()
	defer mb.Close()
	r, err := rls.NewReloader(dir, rls.LoadOptions{AllFiles: true}, mb.Factory, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	gs, _ := rls.NewGRPCServer(r)
	go func() { _ = gs.Serve(lis) }()
	defer gs.Stop()
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	c := rlsv3.NewRateLimitServiceClient(conn)
	hs := httptest.NewServer(promhttp.HandlerFor(r, promhttp.HandlerOpts{}))
	defer hs.Close()
	calls := func(n int) {
		t.Helper()
		for range n {
			resp, err := c.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{Domain: "d", Descriptors: []*ratelimitv3.RateLimitDescriptor{desc("k", "v")}})
			if err != nil || resp.OverallCode != rlsv3.RateLimitResponse_OK {
				t.Fatalf("call: %v %v", resp, err)
			}
		}
	}
	calls(10)
	for i := range 2 {
		write(t, filepath.Join(dir, "a.yaml"), cfg+strings.Repeat("# a comment\n", i+1))
		if changed, err := r.Reload(); !changed || err != nil {
			t.Fatalf("reload %d: %v %v", i, changed, err)
		}
		calls(5)
	}
	resp, err := http.Get(hs.URL)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	for _, want := range []string{
		`slidegate_rls_requests_total{descriptor="k",domain="d"} 20`,
		`slidegate_decision_duration_seconds_count{domain="d",policy="",surface="rls"} 20`,
	} {
		if !strings.Contains(string(body), "\n"+want+"\n") {
			t.Errorf("/metrics has no %s:\n%s", want, body)
		}
	}
}
