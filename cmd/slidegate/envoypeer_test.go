package main

import (
	"context"
	"crypto/tls"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/slidegate/slidegate/internal/rls"
	"github.com/slidegate/slidegate/internal/tlsfiles/tlstest"
)

// envoyProc is slidegate envoy serve running on real listeners.
type envoyProc struct {
	grpc, http string
	stderr     *syncBuf
	cancel     func()
	done       chan int
}

// startPeerEnvoy runs envoy serve with env alone (and the test's loopback
// listeners), watching every 50 ms.
func startPeerEnvoy(t *testing.T, env map[string]string) *envoyProc {
	t.Helper()
	all := map[string]string{"GRPC_HOST": "127.0.0.1", "GRPC_PORT": "0", "HOST": "127.0.0.1", "PORT": "0", "LOG_LEVEL": "info"}
	for k, v := range env {
		all[k] = v
	}
	ctx, cancel := context.WithCancel(context.Background())
	p := &envoyProc{stderr: &syncBuf{}, cancel: cancel, done: make(chan int, 1)}
	addrs := make(chan [2]string, 1)
	go func() {
		p.done <- envoyMain(ctx, []string{"serve", "--watch-interval", "50ms"}, func(k string) string { return all[k] }, io.Discard, p.stderr,
			func(g, h string) { addrs <- [2]string{g, h} })
	}()
	select {
	case a := <-addrs:
		p.grpc, p.http = a[0], a[1]
	case code := <-p.done:
		cancel()
		t.Fatalf("envoy serve exited %d: %s", code, p.stderr.String())
	}
	t.Cleanup(func() {
		p.cancel()
		if code := <-p.done; code != 0 {
			t.Errorf("exit %d: %s", code, p.stderr.String())
		}
	})
	return p
}

func (p *envoyProc) client(t *testing.T, creds credentials.TransportCredentials) *grpc.ClientConn {
	t.Helper()
	if creds == nil {
		creds = insecure.NewCredentials()
	}
	conn, err := grpc.NewClient(p.grpc, grpc.WithTransportCredentials(creds))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

func askKV(ctx context.Context, conn *grpc.ClientConn, domain string) (*rlsv3.RateLimitResponse, error) {
	return rlsv3.NewRateLimitServiceClient(conn).ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: domain,
		Descriptors: []*ratelimitv3.RateLimitDescriptor{{Entries: []*ratelimitv3.RateLimitDescriptor_Entry{{Key: "k", Value: "v"}}}}})
}

func (p *envoyProc) get(t *testing.T, path string) (int, string) {
	t.Helper()
	resp, err := http.Get("http://" + p.http + path)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// eventually polls cond until it holds; the bound only stops a hang.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within 60 s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

const oneRule = "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: minute, requests_per_unit: 1}\n"

// As the peer: an empty runtime directory starts the service, which
// answers OK with no limit; rules written later are enforced, and a
// directory emptied again unloads them.
func TestEnvoyServeEmptyRuntimeDirectory(t *testing.T) {
	root := t.TempDir()
	dir := filepath.Join(root, "config")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	p := startPeerEnvoy(t, map[string]string{"RUNTIME_ROOT": root})
	conn := p.client(t, nil)
	ctx := context.Background()
	for range 3 {
		r, err := askKV(ctx, conn, "d")
		if err != nil || r.OverallCode != rlsv3.RateLimitResponse_OK || r.Statuses[0].CurrentLimit != nil {
			t.Fatalf("no rules: %v %v", r, err)
		}
	}
	if code, body := p.get(t, "/healthcheck"); code != 200 || body != "OK" {
		t.Fatalf("/healthcheck: %d %q", code, body)
	}
	writeFile(t, filepath.Join(dir, "a.yaml"), oneRule)
	eventually(t, "a.yaml in force", func() bool {
		r, err := askKV(ctx, conn, "d")
		return err == nil && r.OverallCode == rlsv3.RateLimitResponse_OVER_LIMIT
	})
	if err := os.Remove(filepath.Join(dir, "a.yaml")); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the rules unloaded", func() bool {
		r, err := askKV(ctx, conn, "d")
		return err == nil && r.Statuses[0].CurrentLimit == nil
	})
	for range 3 {
		if r, err := askKV(ctx, conn, "d"); err != nil || r.OverallCode != rlsv3.RateLimitResponse_OK {
			t.Fatalf("after the unload: %v %v", r, err)
		}
	}
}

func healthOf(t *testing.T, conn *grpc.ClientConn, name string) healthpb.HealthCheckResponse_ServingStatus {
	t.Helper()
	r, err := healthpb.NewHealthClient(conn).Check(context.Background(), &healthpb.HealthCheckRequest{Service: name})
	if err != nil {
		t.Fatalf("health %q: %v", name, err)
	}
	return r.Status
}

// The peer's health service name answers; with
// HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED the service is unhealthy until
// a domain is configured, and again when none is.
func TestEnvoyServeHealth(t *testing.T) {
	root := t.TempDir()
	dir := filepath.Join(root, "config")
	writeFile(t, filepath.Join(dir, "a.yaml"), oneRule)
	p := startPeerEnvoy(t, map[string]string{"RUNTIME_ROOT": root})
	if st := healthOf(t, p.client(t, nil), "ratelimit"); st != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("ratelimit: %v", st)
	}

	root2 := t.TempDir()
	dir2 := filepath.Join(root2, "config")
	if err := os.MkdirAll(dir2, 0o755); err != nil {
		t.Fatal(err)
	}
	p2 := startPeerEnvoy(t, map[string]string{"RUNTIME_ROOT": root2, "HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED": "true"})
	conn := p2.client(t, nil)
	for _, name := range []string{"ratelimit", rls.ServiceName} {
		if st := healthOf(t, conn, name); st != healthpb.HealthCheckResponse_NOT_SERVING {
			t.Fatalf("%s with no configuration: %v", name, st)
		}
	}
	if code, _ := p2.get(t, "/healthcheck"); code != 500 {
		t.Fatalf("/healthcheck with no configuration: %d", code)
	}
	writeFile(t, filepath.Join(dir2, "a.yaml"), oneRule)
	eventually(t, "healthy once configured", func() bool {
		return healthOf(t, conn, "ratelimit") == healthpb.HealthCheckResponse_SERVING
	})
	if code, body := p2.get(t, "/healthcheck"); code != 200 || body != "OK" {
		t.Fatalf("/healthcheck configured: %d %q", code, body)
	}
	if err := os.Remove(filepath.Join(dir2, "a.yaml")); err != nil {
		t.Fatal(err)
	}
	eventually(t, "unhealthy once emptied", func() bool {
		return healthOf(t, conn, "ratelimit") == healthpb.HealthCheckResponse_NOT_SERVING
	})
}

// SHADOW_MODE decides and counts but answers OK; QUOTA_MODE reports
// every refusal as a quota violation, OK.
func TestEnvoyServeShadowAndQuotaMode(t *testing.T) {
	for _, mode := range []string{"SHADOW_MODE", "QUOTA_MODE"} {
		t.Run(mode, func(t *testing.T) {
			root := t.TempDir()
			writeFile(t, filepath.Join(root, "config", "a.yaml"), oneRule)
			p := startPeerEnvoy(t, map[string]string{"RUNTIME_ROOT": root, mode: "true", "RESPONSE_DYNAMIC_METADATA": "true"})
			conn := p.client(t, nil)
			for i := range 3 {
				r, err := askKV(context.Background(), conn, "d")
				if err != nil || r.OverallCode != rlsv3.RateLimitResponse_OK {
					t.Fatalf("call %d: %v %v", i, r, err)
				}
				want := rlsv3.RateLimitResponse_OK
				if i > 0 && mode == "SHADOW_MODE" {
					want = rlsv3.RateLimitResponse_OVER_LIMIT // the peer keeps the descriptor's code
				}
				if r.Statuses[0].Code != want {
					t.Fatalf("call %d: descriptor %v, want %v", i, r.Statuses[0].Code, want)
				}
				v := r.DynamicMetadata.GetFields()["quotaModeViolations"]
				if mode == "QUOTA_MODE" && (i > 0) != (v != nil && len(v.GetListValue().GetValues()) == 1) {
					t.Fatalf("call %d: quotaModeViolations %v", i, v)
				}
			}
			_, metrics := p.get(t, "/metrics")
			if mode == "SHADOW_MODE" {
				for _, want := range []string{rls.MetricGlobalShadow + " 2", rls.MetricOverLimit + `{descriptor="k",domain="d"} 2`} {
					if !strings.Contains(metrics, want) {
						t.Fatalf("/metrics lacks %q:\n%s", want, metrics)
					}
				}
			}
		})
	}
}

// GRPC_SERVER_USE_TLS with a client CA and a SAN: a client with a
// certificate of the CA naming the SAN is served; one without a
// certificate, one naming another SAN, and a plaintext one are refused.
func TestEnvoyServeGRPCMutualTLS(t *testing.T) {
	dir := t.TempDir()
	ca := tlstest.NewCA(t, "envoy test CA")
	cert, key := ca.WriteServer(t, dir, "server", "rls")
	caFile := ca.WriteCA(t, dir, "ca")
	root := t.TempDir()
	writeFile(t, filepath.Join(root, "config", "a.yaml"), oneRule)
	p := startPeerEnvoy(t, map[string]string{"RUNTIME_ROOT": root, "GRPC_SERVER_USE_TLS": "true", "GRPC_SERVER_TLS_CERT": cert,
		"GRPC_SERVER_TLS_KEY": key, "GRPC_CLIENT_TLS_CACERT": caFile, "GRPC_CLIENT_TLS_SAN": "envoy.internal"})
	creds := func(certs ...tls.Certificate) credentials.TransportCredentials {
		return credentials.NewTLS(&tls.Config{RootCAs: ca.Pool(), Certificates: certs, ServerName: "127.0.0.1"})
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	good := p.client(t, creds(ca.ClientFor(t, "envoy", "envoy.internal")))
	if r, err := askKV(ctx, good, "d"); err != nil || r.OverallCode != rlsv3.RateLimitResponse_OK {
		t.Fatalf("a client of the CA naming the SAN: %v %v", r, err)
	}
	if st := healthOf(t, good, "ratelimit"); st != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("health over mTLS: %v", st)
	}
	other := tlstest.NewCA(t, "another CA")
	for name, c := range map[string]credentials.TransportCredentials{
		"no certificate":   creds(),
		"another SAN":      creds(ca.ClientFor(t, "envoy", "someone.else")),
		"another CA":       creds(other.ClientFor(t, "envoy", "envoy.internal")),
		"plaintext client": insecure.NewCredentials(),
	} {
		c2, cancel2 := context.WithTimeout(context.Background(), 30*time.Second)
		r, err := askKV(c2, p.client(t, c), "d")
		cancel2()
		if err == nil {
			t.Fatalf("%s: served %v", name, r)
		}
	}
}

// The peer's variables slidegate does not honour stop the start with a
// message naming them; their neutral values are accepted.
func TestEnvoyServeRefusesPeerVariables(t *testing.T) {
	root := t.TempDir()
	writeFile(t, filepath.Join(root, "config", "a.yaml"), oneRule)
	for _, env := range []map[string]string{
		{"USE_STATSD": "true"}, {"STATSD_HOST": "statsd"}, {"USE_PROMETHEUS": "true"}, {"GRPC_UDS": "/tmp/rls.sock"},
		{"BACKEND_TYPE": "memcache"}, {"CONFIG_TYPE": "GRPC_XDS_SOTW"}, {"LOCAL_CACHE_SIZE_IN_BYTES": "1000"},
		{"REDIS_PERSECOND": "true"}, {"TRACING_ENABLED": "maybe"}, {"DEBUG_PORT": "6070"},
		{"SHADOW_MODE": "maybe"}, {"GRPC_CLIENT_TLS_CACERT": "/ca.pem"}, {"GRPC_SERVER_USE_TLS": "true"},
		{"REDIS_HEALTH_CHECK_ACTIVE_CONNECTION": "true"}, {"REDIS_TLS_SKIP_HOSTNAME_VERIFICATION": "true"},
	} {
		var name string
		for k := range env {
			name = k
		}
		all := map[string]string{"RUNTIME_ROOT": root, "GRPC_HOST": "127.0.0.1", "GRPC_PORT": "0", "PORT": "off"}
		for k, v := range env {
			all[k] = v
		}
		var stderr syncBuf
		code := envoyMain(context.Background(), []string{"serve"}, func(k string) string { return all[k] }, io.Discard, &stderr, nil)
		if code != 2 || !strings.Contains(stderr.String(), name) {
			t.Fatalf("%v: exit %d: %s", env, code, stderr.String())
		}
	}
	neutral := map[string]string{"RUNTIME_ROOT": root, "GRPC_HOST": "127.0.0.1", "GRPC_PORT": "0", "PORT": "off",
		"USE_STATSD": "false", "STATSD_HOST": "statsd", "DISABLE_STATS": "true", "CONFIG_TYPE": "FILE", "BACKEND_TYPE": "redis",
		"LOCAL_CACHE_SIZE_IN_BYTES": "0", "REDIS_PERSECOND_URL": "x", "TRACING_SERVICE_NAME": "rl", "RUNTIME_WATCH_ROOT": "false",
		"STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT": "true", "CONFIG_GRPC_XDS_SERVER_URL": "xds:18000"}
	var out, stderr syncBuf
	if code := envoyMain(context.Background(), []string{"check"}, func(k string) string { return neutral[k] }, &out, &stderr, nil); code != 0 {
		t.Fatalf("neutral values refused: %d %s", code, stderr.String())
	}
}

// peerSettingsNames are the variables of the pinned peer's settings.go.
var peerSettingsNames = strings.Fields(`HOST PORT DEBUG_HOST DEBUG_PORT GRPC_UDS GRPC_HOST GRPC_PORT
GRPC_MAX_CONNECTION_AGE GRPC_MAX_CONNECTION_AGE_GRACE GRPC_SERVER_USE_TLS GRPC_SERVER_TLS_CERT
GRPC_SERVER_TLS_KEY GRPC_CLIENT_TLS_CACERT GRPC_CLIENT_TLS_SAN LOG_LEVEL LOG_FORMAT CONFIG_TYPE
FORCE_START_WITHOUT_INITIAL_CONFIG CONFIG_GRPC_XDS_NODE_ID CONFIG_GRPC_XDS_NODE_METADATA
CONFIG_GRPC_XDS_SERVER_URL CONFIG_GRPC_XDS_SERVER_CONNECT_RETRY_INTERVAL
CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS CONFIG_GRPC_XDS_SERVER_USE_TLS CONFIG_GRPC_XDS_CLIENT_TLS_CERT
CONFIG_GRPC_XDS_CLIENT_TLS_KEY CONFIG_GRPC_XDS_SERVER_TLS_CACERT CONFIG_GRPC_XDS_SERVER_TLS_SAN
XDS_CLIENT_BACKOFF_INITIAL_INTERVAL XDS_CLIENT_BACKOFF_MAX_INTERVAL XDS_CLIENT_BACKOFF_RANDOM_FACTOR
XDS_CLIENT_BACKOFF_JITTER XDS_CLIENT_MAX_MSG_SIZE_IN_BYTES USE_DOG_STATSD USE_DOG_STATSD_MOGRIFIERS
USE_STATSD STATSD_HOST STATSD_PORT EXTRA_TAGS STATS_FLUSH_INTERVAL DISABLE_STATS USE_PROMETHEUS
PROMETHEUS_ADDR PROMETHEUS_PATH PROMETHEUS_MAPPER_YAML RUNTIME_ROOT RUNTIME_SUBDIRECTORY
RUNTIME_APPDIRECTORY RUNTIME_IGNOREDOTFILES RUNTIME_WATCH_ROOT EXPIRATION_JITTER_MAX_SECONDS
LOCAL_CACHE_SIZE_IN_BYTES NEAR_LIMIT_RATIO CACHE_KEY_PREFIX BACKEND_TYPE
STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT LIMIT_RESPONSE_HEADERS_ENABLED LIMIT_LIMIT_HEADER
LIMIT_REMAINING_HEADER LIMIT_RESET_HEADER HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED REDIS_SOCKET_TYPE
REDIS_TYPE REDIS_URL REDIS_POOL_SIZE REDIS_AUTH REDIS_TLS REDIS_TLS_CLIENT_CERT REDIS_TLS_CLIENT_KEY
REDIS_TLS_CACERT REDIS_TLS_SKIP_HOSTNAME_VERIFICATION REDIS_PIPELINE_WINDOW REDIS_PIPELINE_LIMIT
REDIS_PERSECOND REDIS_PERSECOND_SOCKET_TYPE REDIS_PERSECOND_TYPE REDIS_PERSECOND_URL
REDIS_PERSECOND_POOL_SIZE REDIS_PERSECOND_AUTH REDIS_PERSECOND_TLS REDIS_SENTINEL_AUTH
REDIS_PERSECOND_SENTINEL_AUTH REDIS_PERSECOND_PIPELINE_WINDOW REDIS_PERSECOND_PIPELINE_LIMIT
REDIS_HEALTH_CHECK_ACTIVE_CONNECTION REDIS_TIMEOUT REDIS_PERSECOND_TIMEOUT REDIS_POOL_ON_EMPTY_BEHAVIOR
REDIS_PERSECOND_POOL_ON_EMPTY_BEHAVIOR MEMCACHE_HOST_PORT MEMCACHE_MAX_IDLE_CONNS MEMCACHE_SRV
MEMCACHE_SRV_REFRESH MEMCACHE_TLS MEMCACHE_TLS_CLIENT_CERT MEMCACHE_TLS_CLIENT_KEY MEMCACHE_TLS_CACERT
MEMCACHE_TLS_SKIP_HOSTNAME_VERIFICATION SHADOW_MODE QUOTA_MODE RESPONSE_DYNAMIC_METADATA
MERGE_DOMAIN_CONFIG TRACING_ENABLED TRACING_SERVICE_NAME TRACING_SERVICE_NAMESPACE
TRACING_SERVICE_INSTANCE_ID TRACING_EXPORTER_PROTOCOL TRACING_SAMPLING_RATE`)

// envoyHonoured are the peer's variables envoy serve reads.
var envoyHonoured = strings.Fields(`HOST PORT GRPC_HOST GRPC_PORT GRPC_MAX_CONNECTION_AGE
GRPC_MAX_CONNECTION_AGE_GRACE GRPC_SERVER_USE_TLS GRPC_SERVER_TLS_CERT GRPC_SERVER_TLS_KEY
GRPC_CLIENT_TLS_CACERT GRPC_CLIENT_TLS_SAN LOG_LEVEL LOG_FORMAT RUNTIME_ROOT RUNTIME_SUBDIRECTORY
RUNTIME_APPDIRECTORY RUNTIME_IGNOREDOTFILES NEAR_LIMIT_RATIO CACHE_KEY_PREFIX
LIMIT_RESPONSE_HEADERS_ENABLED LIMIT_LIMIT_HEADER LIMIT_REMAINING_HEADER LIMIT_RESET_HEADER
HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED REDIS_SOCKET_TYPE REDIS_TYPE REDIS_URL REDIS_AUTH REDIS_TLS
REDIS_TLS_CLIENT_CERT REDIS_TLS_CLIENT_KEY REDIS_TLS_CACERT REDIS_SENTINEL_AUTH REDIS_TIMEOUT
REDIS_HEALTH_CHECK_ACTIVE_CONNECTION SHADOW_MODE QUOTA_MODE RESPONSE_DYNAMIC_METADATA MERGE_DOMAIN_CONFIG TRACING_ENABLED
TRACING_SERVICE_NAME TRACING_SERVICE_NAMESPACE TRACING_SERVICE_INSTANCE_ID TRACING_EXPORTER_PROTOCOL
TRACING_SAMPLING_RATE`)

// Every variable of the peer's settings.go is either read by envoy serve
// or in peerVars; with the peer's source at hand (make test-envoy's
// environment), the list is checked against it too.
func TestEnvoyEveryPeerVariableAccounted(t *testing.T) {
	names := peerSettingsNames
	if src := os.Getenv("SLIDEGATE_ENVOY_PEER_SRC"); src != "" {
		b, err := os.ReadFile(filepath.Join(src, "src", "settings", "settings.go"))
		if err != nil {
			t.Fatal(err)
		}
		var fromSrc []string
		for _, m := range regexp.MustCompile(`envconfig:"([A-Z0-9_]+)"`).FindAllStringSubmatch(string(b), -1) {
			fromSrc = append(fromSrc, m[1])
		}
		slices.Sort(fromSrc)
		sorted := slices.Sorted(slices.Values(names))
		if !slices.Equal(fromSrc, sorted) {
			t.Fatalf("the peer's settings.go has %v,\nthe test lists %v", fromSrc, sorted)
		}
	}
	for _, n := range names {
		inVars := slices.ContainsFunc(peerVars, func(v peerVar) bool { return slices.Contains(strings.Fields(v.names), n) })
		if inVars == slices.Contains(envoyHonoured, n) {
			t.Errorf("%s: honoured %t and in peerVars %t: want exactly one", n, !inVars, inVars)
		}
	}
	for _, n := range envoyHonoured {
		if !strings.Contains(envoyUsage+envoyDocVars(t), n) {
			t.Errorf("%s is honoured but not documented", n)
		}
	}
}

// envoyDocVars is docs/envoy.md's text.
func envoyDocVars(t *testing.T) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("..", "..", "docs", "envoy.md"))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// A configuration file of nested YAML aliases (10^9 descriptors in a few
// kilobytes) is refused at once by each command that reads one, run as a
// real process: envoy check, envoy serve and serve --envoy-config.
func TestAliasBombRefusedByEveryCommand(t *testing.T) {
	if testing.Short() {
		t.Skip("starts processes")
	}
	var b strings.Builder
	b.WriteString("domain: d\ndescriptors:\n  - key: l0\n    descriptors: &a0 [")
	for i := range 10 {
		b.WriteString("{key: k" + string(rune('0'+i)) + "}, ")
	}
	b.WriteString("]\n")
	for l := 1; l <= 9; l++ {
		b.WriteString("  - key: l" + string(rune('0'+l)) + "\n    descriptors: &a" + string(rune('0'+l)) + " [")
		for i := range 10 {
			b.WriteString("{key: k" + string(rune('0'+i)) + ", descriptors: *a" + string(rune('0'+l-1)) + "}, ")
		}
		b.WriteString("]\n")
	}
	dir := t.TempDir()
	writeFile(t, filepath.Join(dir, "bomb.yaml"), b.String())
	for _, args := range [][]string{
		{"envoy", "check", dir},
		{"envoy", "serve", "--config", dir},
		{"serve", "--listen", "127.0.0.1:0", "--admin", "off", "--grpc", "127.0.0.1:0", "--envoy-config", filepath.Join(dir, "bomb.yaml")},
	} {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute) // a hang bound
		cmd := exec.CommandContext(ctx, os.Args[0], append([]string{"-test.run=^TestHelperProcess$", "--"}, args...)...)
		cmd.Env = append(os.Environ(), "SLIDEGATE_HELPER=1", "GRPC_HOST=127.0.0.1", "GRPC_PORT=0", "PORT=off")
		out, err := cmd.CombinedOutput()
		timedOut := ctx.Err() != nil
		cancel()
		if timedOut {
			t.Fatalf("%q did not finish within a minute", args)
		}
		if err == nil || !strings.Contains(string(out), "aliases expand") {
			t.Fatalf("%q: %v: %s", args, err, out)
		}
	}
}
