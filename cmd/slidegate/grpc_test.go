package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/slidegate/slidegate/internal/rls"
)

// lockedBuffer is a bytes.Buffer safe to read while serve logs into it.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

var grpcAddrRE = regexp.MustCompile(`grpc=(127\.0\.0\.1:\d+)`)

// slidegate serve --grpc serves the Envoy rate limit service beside the
// decision API, with its metrics on the admin listener, turns its health
// NOT_SERVING when the drain begins, and stops with the server.
func TestServeEnvoy(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	cfgPath := filepath.Join(t.TempDir(), "ratelimit.yaml")
	if err := os.WriteFile(cfgPath, []byte("domain: edge\ndescriptors:\n  - key: remote_address\n    rate_limit:\n      unit: minute\n      requests_per_unit: 1\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	stderr := &logWatch{started: make(chan *served, 1)}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan int, 1)
	go func() {
		done <- serve(ctx, []string{"--listen", "127.0.0.1:0", "--admin", "127.0.0.1:0", "--grpc", "127.0.0.1:0",
			"--envoy-config", cfgPath, "--envoy-headers", "--drain-delay", "3s", "--envoy-max-keys", "1"}, io.Discard, stderr)
	}()
	var srv *served
	select {
	case srv = <-stderr.started:
	case code := <-done:
		cancel()
		t.Fatalf("serve exited %d: %s", code, stderr.String())
	}
	// The service logs its address before the HTTP listeners start.
	m := grpcAddrRE.FindStringSubmatch(stderr.String())
	if m == nil {
		cancel()
		<-done
		t.Fatalf("no gRPC address in the log: %s", stderr.String())
	}
	conn, err := grpc.NewClient(m[1], grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	client := rlsv3.NewRateLimitServiceClient(conn)
	req := &rlsv3.RateLimitRequest{Domain: "edge", Descriptors: []*ratelimitv3.RateLimitDescriptor{{
		Entries: []*ratelimitv3.RateLimitDescriptor_Entry{{Key: "remote_address", Value: "192.0.2.1"}}}}}
	for i, want := range []rlsv3.RateLimitResponse_Code{rlsv3.RateLimitResponse_OK, rlsv3.RateLimitResponse_OVER_LIMIT} {
		resp, err := client.ShouldRateLimit(context.Background(), req)
		if err != nil || resp.OverallCode != want || len(resp.ResponseHeadersToAdd) == 0 {
			t.Fatalf("call %d: %v %v", i, resp, err)
		}
	}
	// --envoy-max-keys 1: a second client finds the rule's one key slot
	// taken.
	other := &rlsv3.RateLimitRequest{Domain: "edge", Descriptors: []*ratelimitv3.RateLimitDescriptor{{
		Entries: []*ratelimitv3.RateLimitDescriptor_Entry{{Key: "remote_address", Value: "192.0.2.2"}}}}}
	if resp, err := client.ShouldRateLimit(context.Background(), other); err != nil || resp.OverallCode != rlsv3.RateLimitResponse_OVER_LIMIT {
		t.Fatalf("a new key beyond --envoy-max-keys: %v %v", resp, err)
	}
	h, err := healthpb.NewHealthClient(conn).Check(context.Background(), &healthpb.HealthCheckRequest{Service: rls.ServiceName})
	if err != nil || h.Status != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("health: %v %v", h, err)
	}
	tr := &http.Transport{}
	resp, err := (&http.Client{Transport: tr}).Get("http://" + srv.AdminAddr() + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	tr.CloseIdleConnections()
	for _, want := range []string{
		`slidegate_rls_requests_total{descriptor="remote_address",domain="edge"} 3`,
		`slidegate_rls_over_limit_total{descriptor="remote_address",domain="edge"} 2`,
		`slidegate_decision_duration_seconds_count{domain="edge",policy="",surface="rls"} 3`,
		`slidegate_keys{policy="",surface="rls"} 1`,
	} {
		if !strings.Contains(string(body), want) {
			t.Errorf("/metrics lacks %s", want)
		}
	}
	// The drain: health turns NOT_SERVING at once, while decisions are
	// still answered until the listeners close.
	cancel()
	hc := healthpb.NewHealthClient(conn)
	for deadline := time.Now().Add(10 * time.Second); ; {
		h, err := hc.Check(context.Background(), &healthpb.HealthCheckRequest{Service: rls.ServiceName})
		if err == nil && h.Status == healthpb.HealthCheckResponse_NOT_SERVING {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("health during the drain: %v %v", h, err)
		}
		time.Sleep(10 * time.Millisecond)
	}
	if _, err := client.ShouldRateLimit(context.Background(), req); err != nil {
		t.Fatalf("a decision during the drain: %v", err)
	}
	_ = conn.Close()
	select {
	case code := <-done:
		if code != 0 || !strings.Contains(stderr.String(), "envoy rate limit service stopped") {
			t.Fatalf("exit %d: %s", code, stderr.String())
		}
	case <-time.After(30 * time.Second):
		t.Fatal("serve did not stop")
	}
}

func TestServeEnvoyFlagErrors(t *testing.T) {
	dir := t.TempDir()
	bad := filepath.Join(dir, "bad.yaml")
	if err := os.WriteFile(bad, []byte("domain: d\ndescriptors:\n  - key: a\n    rate_limit:\n      unit: fortnight\n      requests_per_unit: 1\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		args []string
		code int
		msg  string
	}{
		{[]string{"--grpc", "127.0.0.1:0"}, 2, "--grpc needs --envoy-config"},
		{[]string{"--envoy-config", bad}, 2, "--envoy-config needs --grpc"},
		{[]string{"--grpc", "127.0.0.1:0", "--envoy-config", bad, "--store", "redis://127.0.0.1:1/0", "--envoy-max-keys", "5"}, 2, "the Redis store has no key cap"},
		{[]string{"--grpc", "127.0.0.1:0", "--envoy-config", bad}, 1, "bad.yaml:5: unknown unit"},
		{[]string{"--grpc", "127.0.0.1:0", "--envoy-config", bad, "--envoy-max-keys", "-1"}, 2, "--envoy-max-keys -1"},
	} {
		var stderr lockedBuffer
		args := append([]string{"--listen", "127.0.0.1:0", "--admin", "off"}, c.args...)
		code := serve(context.Background(), args, io.Discard, &stderr)
		if code != c.code || !strings.Contains(stderr.String(), c.msg) {
			t.Errorf("%q: exit %d, %s; want %d and %q", c.args, code, stderr.String(), c.code, c.msg)
		}
	}
}

// serveEnvoy runs slidegate serve with args until the returned stop, and
// a client of the Envoy rate limit service it started (the address from
// its log). stop closes the client, ends serve and checks it exited 0.
func serveEnvoy(t *testing.T, args ...string) (rlsv3.RateLimitServiceClient, func()) {
	t.Helper()
	stderr := &logWatch{started: make(chan *served, 1)}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan int, 1)
	go func() { done <- serve(ctx, args, io.Discard, stderr) }()
	select {
	case <-stderr.started:
	case code := <-done:
		cancel()
		t.Fatalf("serve exited %d: %s", code, stderr.String())
	}
	m := grpcAddrRE.FindStringSubmatch(stderr.String())
	if m == nil {
		cancel()
		<-done
		t.Fatalf("no Envoy rate limit service started (no gRPC address in the log): %s", stderr.String())
	}
	conn, err := grpc.NewClient(m[1], grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		cancel()
		<-done
		t.Fatal(err)
	}
	return rlsv3.NewRateLimitServiceClient(conn), func() {
		conn.Close()
		cancel()
		if code := <-done; code != 0 {
			t.Errorf("serve exited %d: %s", code, stderr.String())
		}
	}
}

// The Envoy rate limit service on the server's Redis, standalone and
// cluster: two descriptors of one request are decided all or nothing in
// one script call (a refusal by the per-user limit charges nothing to the
// per-address one). On the cluster, descriptors on different keys are
// decided without --envoy-cluster-tag too (across their slots, all or
// nothing), and with it in one call. A descriptor's limit
// override is decided with them, on every store.
func TestServeEnvoyRedis(t *testing.T) {
	addr, cluster := os.Getenv("SLIDEGATE_REDIS_ADDR"), os.Getenv("SLIDEGATE_REDIS_CLUSTER_ADDRS")
	if addr == "" || cluster == "" {
		t.Skip("SLIDEGATE_REDIS_ADDR / SLIDEGATE_REDIS_CLUSTER_ADDRS not set: run make test (scripts/redis-env.sh starts Redis)")
	}
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent(), goleak.IgnoreAnyFunction("github.com/redis/rueidis.(*clusterClient)._refresh.func2"))
	dir := t.TempDir()
	envoyCfg := filepath.Join(dir, "ratelimit.yaml")
	if err := os.WriteFile(envoyCfg, []byte(`domain: edge
descriptors:
  - key: remote_address
    rate_limit: {unit: minute, requests_per_unit: 3}
  - key: user_id
    rate_limit: {unit: minute, requests_per_unit: 2}
`), 0o600); err != nil {
		t.Fatal(err)
	}
	desc := func(k, v string) *ratelimitv3.RateLimitDescriptor {
		return &ratelimitv3.RateLimitDescriptor{Entries: []*ratelimitv3.RateLimitDescriptor_Entry{{Key: k, Value: v}}}
	}
	run := func(t *testing.T, store string, extra ...string) (rlsv3.RateLimitServiceClient, func()) {
		t.Helper()
		cfg := filepath.Join(t.TempDir(), "slidegate.yaml")
		conf := "policies:\n  - {name: free, limit: 5, window: 60s}\n"
		if store != "memory" {
			// A call slower than the default timeout on a loaded machine
			// would be decided by a fresh local limiter (failure_policy
			// local) and admit what Redis refuses; the test checks Redis's
			// decisions, so it waits for them and fails on an error.
			conf += fmt.Sprintf("store_options:\n  key_prefix: \"envoy-%d:\"\n  timeout: 30s\n  failure_policy: closed\n", time.Now().UnixNano())
		}
		os.WriteFile(cfg, []byte(conf), 0o600)
		return serveEnvoy(t, append([]string{"--config", cfg, "--store", store, "--listen", "127.0.0.1:0", "--admin", "off",
			"--grpc", "127.0.0.1:0", "--envoy-config", envoyCfg, "--drain-delay", "0s"}, extra...)...)
	}
	// allOrNothing: two requests over both limits, a third that the user's
	// limit refuses, then requests over the address's limit alone (with a
	// descriptor that matches no rule but carries the cluster tag, so that
	// the address's key is the one the first requests used): the refused
	// request charged nothing to the address.
	allOrNothing := func(t *testing.T, client rlsv3.RateLimitServiceClient) {
		t.Helper()
		both := &rlsv3.RateLimitRequest{Domain: "edge", Descriptors: []*ratelimitv3.RateLimitDescriptor{
			desc("remote_address", "192.0.2.7"), desc("user_id", "erin")}}
		tagOnly := &ratelimitv3.RateLimitDescriptor{Entries: []*ratelimitv3.RateLimitDescriptor_Entry{{Key: "user_id", Value: "erin"}, {Key: "no_rule", Value: "x"}}}
		ipOnly := &rlsv3.RateLimitRequest{Domain: "edge", Descriptors: []*ratelimitv3.RateLimitDescriptor{desc("remote_address", "192.0.2.7"), tagOnly}}
		for i, c := range []struct {
			req  *rlsv3.RateLimitRequest
			want rlsv3.RateLimitResponse_Code
		}{
			{both, rlsv3.RateLimitResponse_OK},
			{both, rlsv3.RateLimitResponse_OK},
			{both, rlsv3.RateLimitResponse_OVER_LIMIT}, // the user's limit (2) refuses; the address is not charged
			{ipOnly, rlsv3.RateLimitResponse_OK},       // the address's third
			{ipOnly, rlsv3.RateLimitResponse_OVER_LIMIT},
		} {
			resp, err := client.ShouldRateLimit(context.Background(), c.req)
			if err != nil || resp.OverallCode != c.want {
				t.Fatalf("call %d: %v %v, want %v", i, resp, err, c.want)
			}
		}
	}
	// override: a descriptor's limit override (2 per hour) decides the
	// user's descriptor beside the address's, all or nothing: its refusal
	// charges nothing to the address.
	override := func(t *testing.T, client rlsv3.RateLimitServiceClient) {
		t.Helper()
		user := desc("user_id", "olga")
		user.Limit = &ratelimitv3.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 2, Unit: 3} // HOUR
		both := &rlsv3.RateLimitRequest{Domain: "edge", Descriptors: []*ratelimitv3.RateLimitDescriptor{user, desc("remote_address", "192.0.2.9")}}
		tagOnly := &ratelimitv3.RateLimitDescriptor{Entries: []*ratelimitv3.RateLimitDescriptor_Entry{{Key: "user_id", Value: "olga"}, {Key: "no_rule", Value: "x"}}}
		ipOnly := &rlsv3.RateLimitRequest{Domain: "edge", Descriptors: []*ratelimitv3.RateLimitDescriptor{desc("remote_address", "192.0.2.9"), tagOnly}}
		for i, c := range []struct {
			req  *rlsv3.RateLimitRequest
			want rlsv3.RateLimitResponse_Code
		}{
			{both, rlsv3.RateLimitResponse_OK},
			{both, rlsv3.RateLimitResponse_OK},
			{both, rlsv3.RateLimitResponse_OVER_LIMIT}, // the override refuses; the address is not charged
			{ipOnly, rlsv3.RateLimitResponse_OK},       // the address's third
			{ipOnly, rlsv3.RateLimitResponse_OVER_LIMIT},
		} {
			resp, err := client.ShouldRateLimit(context.Background(), c.req)
			if err != nil || resp.OverallCode != c.want {
				t.Fatalf("override call %d: %v %v, want %v", i, resp, err, c.want)
			}
			if c.req == both && (resp.Statuses[0].CurrentLimit.GetRequestsPerUnit() != 2 || resp.Statuses[0].CurrentLimit.GetUnit() != rlsv3.RateLimitResponse_RateLimit_HOUR) {
				t.Fatalf("override call %d: %v, want the override's limit", i, resp)
			}
		}
	}
	t.Run("memory", func(t *testing.T) {
		client, stop := run(t, "memory")
		defer stop()
		allOrNothing(t, client)
		override(t, client)
	})
	t.Run("standalone", func(t *testing.T) {
		client, stop := run(t, "redis://"+addr+"/0")
		defer stop()
		allOrNothing(t, client)
		override(t, client)
	})
	t.Run("cluster", func(t *testing.T) {
		client, stop := run(t, "redis-cluster://"+cluster)
		both := &rlsv3.RateLimitRequest{Domain: "edge", Descriptors: []*ratelimitv3.RateLimitDescriptor{
			desc("remote_address", "192.0.2.8"), desc("user_id", "frank")}}
		r, err := client.ShouldRateLimit(context.Background(), both)
		if err != nil || r.OverallCode != rlsv3.RateLimitResponse_OK || r.Statuses[0].Code != rlsv3.RateLimitResponse_OK || r.Statuses[1].Code != rlsv3.RateLimitResponse_OK {
			t.Errorf("untagged descriptors on different keys: %v %v, want OK (decided across slots)", r, err)
		}
		stop()
		client, stop = run(t, "redis-cluster://"+cluster, "--envoy-cluster-tag", "user_id")
		defer stop()
		allOrNothing(t, client)
		override(t, client)
	})
}

// The grpc section of slidegate's own configuration starts the service as
// the flags do; a flag given explicitly wins; --print-config shows what is
// in force; a section missing half of itself is an error naming the field.
func TestServeEnvoyConfigSection(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	dir := t.TempDir()
	envoyCfg := filepath.Join(dir, "ratelimit.yaml")
	os.WriteFile(envoyCfg, []byte("domain: edge\ndescriptors:\n  - key: remote_address\n    rate_limit: {unit: minute, requests_per_unit: 1}\n"), 0o600)
	cfg := filepath.Join(dir, "slidegate.yaml")
	os.WriteFile(cfg, []byte("policies:\n  - {name: free, limit: 5, window: 60s}\ngrpc:\n  listen: 127.0.0.1:0\n  envoy_config: "+envoyCfg+"\n  max_connections: 7\n"), 0o600)

	var out, errOut lockedBuffer
	if code := serve(context.Background(), []string{"--config", cfg, "--print-config", "--envoy-headers"}, &out, &errOut); code != 0 {
		t.Fatalf("--print-config: exit %d: %s", code, errOut.String())
	}
	for _, want := range []string{"grpc:", "listen: 127.0.0.1:0", "envoy_config: " + envoyCfg, "envoy_headers: true", "max_connections: 7"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("--print-config lacks %q:\n%s", want, out.String())
		}
	}

	client, stop := serveEnvoy(t, "--config", cfg, "--listen", "127.0.0.1:0", "--admin", "off", "--drain-delay", "0s")
	req := &rlsv3.RateLimitRequest{Domain: "edge", Descriptors: []*ratelimitv3.RateLimitDescriptor{{
		Entries: []*ratelimitv3.RateLimitDescriptor_Entry{{Key: "remote_address", Value: "192.0.2.1"}}}}}
	for i, want := range []rlsv3.RateLimitResponse_Code{rlsv3.RateLimitResponse_OK, rlsv3.RateLimitResponse_OVER_LIMIT} {
		if resp, err := client.ShouldRateLimit(context.Background(), req); err != nil || resp.OverallCode != want {
			t.Errorf("call %d: %v %v, want %v", i, resp, err, want)
		}
	}
	stop()

	os.WriteFile(cfg, []byte("policies:\n  - {name: free, limit: 5, window: 60s}\ngrpc:\n  listen: 127.0.0.1:0\n"), 0o600)
	errOut = lockedBuffer{}
	if code := serve(context.Background(), []string{"--config", cfg, "--print-config"}, io.Discard, &errOut); code == 0 ||
		!strings.Contains(errOut.String(), "grpc.envoy_config: missing") {
		t.Errorf("grpc.listen without envoy_config: exit %d: %s", code, errOut.String())
	}
}
