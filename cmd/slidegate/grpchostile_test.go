package main

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/slidegate/slidegate/internal/rls"
	"github.com/slidegate/slidegate/internal/server/config"
)

const hostileRules = "domain: edge\ndescriptors:\n  - key: remote_address\n    rate_limit:\n      unit: minute\n      requests_per_unit: 5\n"

// checkGRPCListenerBounds checks the bounds every gRPC listener has, on
// the listener at addr whose metrics metricsURL serves and whose log is
// logs: a call's header list is capped (grpc-go's client refuses to send
// one past the server's setting), connections that are not HTTP/2 are
// counted and not logged one line each nor quoted, and an Envoy call is
// still answered.
func checkGRPCListenerBounds(t *testing.T, addr, metricsURL string, logs func() string) {
	t.Helper()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	client := rlsv3.NewRateLimitServiceClient(conn)
	req := &rlsv3.RateLimitRequest{Domain: "edge", Descriptors: []*ratelimitv3.RateLimitDescriptor{
		{Entries: []*ratelimitv3.RateLimitDescriptor_Entry{{Key: "remote_address", Value: "10.0.0.1"}}}}}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second) // a hang bound
	defer cancel()
	if _, err := client.ShouldRateLimit(ctx, req); err != nil {
		t.Fatalf("first call: %v", err)
	}
	// The server's SETTINGS are known now: 100 KiB of metadata is past them.
	big := metadata.AppendToOutgoingContext(ctx, "x-big", strings.Repeat("b", 100<<10))
	if _, err := client.ShouldRateLimit(big, req); err == nil {
		t.Error("a call with 100 KiB of metadata was served")
	}
	const n = 10
	for range n {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		_ = c.SetDeadline(time.Now().Add(30 * time.Second))
		_, _ = io.WriteString(c, "GET /MARKER-4711 HTTP/1.1\r\nHost: x\r\n\r\n")
		_, _ = io.Copy(io.Discard, c)
		_ = c.Close()
	}
	pollFor(t, "refused connections counted", func() bool {
		return scrape(t, metricsURL, rls.MetricRefusedConns+`{reason="preface"}`) == fmt.Sprint(n)
	})
	out := logs()
	if strings.Contains(out, "MARKER") {
		t.Errorf("the log quotes what a client sent:\n%s", out)
	}
	if lines := strings.Count(out, "refused before their first call"); lines > 1 {
		t.Errorf("%d log lines for %d refused connections (within %v)", lines, n, rls.RefusedLogInterval)
	}
	if _, err := client.ShouldRateLimit(ctx, req); err != nil {
		t.Fatalf("a call after them: %v", err)
	}
}

// scrape returns the value of the series named line on url's metrics, or
// "".
func scrape(t *testing.T, url, series string) string {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), series+" "); ok {
			return v
		}
	}
	return ""
}

// slidegate serve --grpc: the bounds of every gRPC listener.
func TestServeGRPCListenerBounds(t *testing.T) {
	dir := t.TempDir()
	rules := filepath.Join(dir, "ratelimit.yaml")
	if err := os.WriteFile(rules, []byte(hostileRules), 0o600); err != nil {
		t.Fatal(err)
	}
	stderr := &logWatch{started: make(chan *served, 1)}
	sctx, stop := context.WithCancel(context.Background())
	done := make(chan int, 1)
	go func() {
		done <- serve(sctx, []string{"--listen", "127.0.0.1:0", "--admin", "127.0.0.1:0", "--grpc", "127.0.0.1:0",
			"--envoy-config", rules, "--drain-delay", "0s"}, io.Discard, stderr)
	}()
	defer func() {
		stop()
		if code := <-done; code != 0 {
			t.Errorf("serve exited %d: %s", code, stderr.String())
		}
	}()
	var s *served
	select {
	case s = <-stderr.started:
	case code := <-done:
		done <- code
		t.Fatalf("serve exited %d: %s", code, stderr.String())
	}
	m := grpcAddrRE.FindStringSubmatch(stderr.String())
	if m == nil {
		t.Fatalf("no gRPC address in the log: %s", stderr.String())
	}
	checkGRPCListenerBounds(t, m[1], "http://"+s.admin+"/metrics", stderr.String)
}

// slidegate envoy serve: the bounds of every gRPC listener, and calls in
// flight per address (--grpc-max-calls-per-address).
func TestEnvoyServeGRPCListenerBounds(t *testing.T) {
	dir := t.TempDir()
	writeFile(t, filepath.Join(dir, "ratelimit.yaml"), hostileRules)
	var stderr syncBuf
	addr, httpAddr, stop := startEnvoyServeLog(t, map[string]string{"GRPC_HOST": "127.0.0.1", "GRPC_PORT": "0", "HOST": "127.0.0.1", "PORT": "0"},
		&stderr, "--config", dir, "--grpc-max-calls-per-address", "6")
	defer stop()
	checkGRPCListenerBounds(t, addr, "http://"+httpAddr+"/metrics", stderr.String)

	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second) // a hang bound
	defer cancel()
	hc := healthpb.NewHealthClient(conn)
	for i := range 6 {
		// The server frees a call's slot when the call's context ends,
		// in a goroutine of its own, after the client has its answer: a
		// slot of the calls above may still be held for a moment.
		pollFor(t, fmt.Sprintf("watch %d", i), func() bool {
			w, err := hc.Watch(ctx, &healthpb.HealthCheckRequest{})
			if err == nil {
				_, err = w.Recv()
			}
			if status.Code(err) == codes.ResourceExhausted {
				return false
			}
			if err != nil {
				t.Fatalf("watch %d: %v", i, err)
			}
			return true
		})
	}
	w, err := hc.Watch(ctx, &healthpb.HealthCheckRequest{})
	if err == nil {
		_, err = w.Recv()
	}
	if status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("watch 7: %v, want ResourceExhausted", err)
	}
}

// startEnvoyServeLog is startEnvoyServe with its log in stderr.
func startEnvoyServeLog(t *testing.T, env map[string]string, stderr *syncBuf, args ...string) (addr, httpAddr string, stop func()) {
	t.Helper()
	addrs := make(chan [2]string, 1)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan int, 1)
	go func() {
		done <- envoyMain(ctx, append([]string{"serve"}, args...), func(k string) string { return env[k] }, io.Discard, stderr,
			func(g, h string) { addrs <- [2]string{g, h} })
	}()
	select {
	case a := <-addrs:
		addr, httpAddr = a[0], a[1]
	case code := <-done:
		cancel()
		t.Fatalf("envoy serve exited %d: %s", code, stderr.String())
	}
	return addr, httpAddr, func() {
		cancel()
		if code := <-done; code != 0 {
			t.Errorf("envoy serve exited %d: %s", code, stderr.String())
		}
	}
}

// unfinished opens a connection from src to addr and sends a /json
// request whose body never comes.
func unfinished(t *testing.T, src, addr string) net.Conn {
	t.Helper()
	c, err := dialFrom(context.Background(), src, addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	if _, err := io.WriteString(c, "POST /json HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n{"); err != nil {
		t.Fatal(err)
	}
	return c
}

// closedByServer reads c until the server closes it (30 s is a hang
// bound), and returns what it read.
func closedByServer(t *testing.T, c net.Conn) string {
	t.Helper()
	_ = c.SetReadDeadline(time.Now().Add(30 * time.Second))
	b, err := io.ReadAll(c)
	var ne net.Error
	if err != nil && (!isNetError(err, &ne) || ne.Timeout()) {
		t.Fatalf("the server did not close the connection: %v", err)
	}
	return string(b)
}

func isNetError(err error, ne *net.Error) bool {
	e, ok := err.(net.Error)
	if ok {
		*ne = e
	}
	return ok
}

// slidegate envoy serve's HTTP port has serve's bounds: one address holds
// at most max_conns_per_ip connections with unfinished bodies (as many
// more wait; one more is closed at once), another address is served, and
// an unfinished request is closed at the read timeout.
func TestEnvoyServeHTTPPortBounded(t *testing.T) {
	dir := t.TempDir()
	writeFile(t, filepath.Join(dir, "ratelimit.yaml"), hostileRules)
	env := map[string]string{"GRPC_HOST": "127.0.0.1", "GRPC_PORT": "0", "HOST": "127.0.0.1", "PORT": "0"}
	_, httpAddr, stop := startEnvoyServe(t, env, "--config", dir)
	defer stop()
	per := config.DefaultMaxConnsPerIP
	var held []net.Conn
	defer func() { // before stop, which waits for requests in flight
		for _, c := range held {
			_ = c.Close()
		}
	}()
	for range 2 * per { // per served, per waiting
		held = append(held, unfinished(t, "127.0.0.1", httpAddr))
	}
	// One more from the address is closed before any answer.
	if got := closedByServer(t, unfinished(t, "127.0.0.1", httpAddr)); got != "" {
		t.Errorf("connection %d from one address was answered: %q", 2*per+1, got)
	}
	// Another address is served.
	c, err := dialFrom(context.Background(), "127.0.0.2", httpAddr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_, _ = io.WriteString(c, "GET /healthcheck HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
	if got := closedByServer(t, c); !strings.HasPrefix(got, "HTTP/1.1 200") {
		t.Errorf("another address: %q", got)
	}

	// With a short read timeout, unfinished requests are closed.
	_, httpAddr2, stop2 := startEnvoyServe(t, env, "--config", dir, "--http-read-timeout", "1s")
	defer stop2()
	var conns []net.Conn
	for range 5 {
		conns = append(conns, unfinished(t, "127.0.0.3", httpAddr2))
	}
	for _, c := range conns {
		closedByServer(t, c)
	}
}
