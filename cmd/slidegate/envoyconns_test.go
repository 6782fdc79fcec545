package main

import (
	"context"
	"io"
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/slidegate/slidegate/internal/server/config"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

// watchedConn is a client's connection that records when it ended: the
// server closed it (a read failed) or the client closed it (after the
// server's GOAWAY).
type watchedConn struct {
	net.Conn
	once  sync.Once
	ended chan struct{}
}

func (c *watchedConn) end() { c.once.Do(func() { close(c.ended) }) }

func (c *watchedConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	if err != nil {
		c.end()
	}
	return n, err
}

func (c *watchedConn) Close() error {
	c.end()
	return c.Conn.Close()
}

func (c *watchedConn) isEnded() bool {
	select {
	case <-c.ended:
		return true
	default:
		return false
	}
}

// watchedClient is a gRPC client of the rate limit service whose
// connections are watched.
type watchedClient struct {
	rlsv3.RateLimitServiceClient
	cc    *grpc.ClientConn
	mu    sync.Mutex
	conns []*watchedConn
}

func newWatchedClient(t *testing.T, addr string) *watchedClient {
	t.Helper()
	w := &watchedClient{}
	cc, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithContextDialer(func(ctx context.Context, a string) (net.Conn, error) {
			c, err := (&net.Dialer{Timeout: 10 * time.Second}).DialContext(ctx, "tcp", a)
			if err != nil {
				return nil, err
			}
			wc := &watchedConn{Conn: c, ended: make(chan struct{})}
			w.mu.Lock()
			w.conns = append(w.conns, wc)
			w.mu.Unlock()
			return wc, nil
		}))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	w.cc, w.RateLimitServiceClient = cc, rlsv3.NewRateLimitServiceClient(cc)
	return w
}

// dialed returns the connections the client has made so far.
func (w *watchedClient) dialed() []*watchedConn {
	w.mu.Lock()
	defer w.mu.Unlock()
	return append([]*watchedConn(nil), w.conns...)
}

// call makes one ShouldRateLimit call with a generous bound.
func (w *watchedClient) call(value string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_, err := w.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "edge",
		Descriptors: []*ratelimitv3.RateLimitDescriptor{{Entries: []*ratelimitv3.RateLimitDescriptor_Entry{{Key: "remote_address", Value: value}}}}})
	return err
}

// pollFor polls cond every 10 ms for up to two minutes.
func pollFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(2 * time.Minute)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

const idleTestRules = "domain: edge\ndescriptors:\n  - key: remote_address\n    rate_limit:\n      unit: second\n      requests_per_unit: 1000000\n"

// checkIdleEviction shows, on the rate limit service at addr (closing
// connections idle for 2s), that a connection with no call in flight is
// closed, and reopened by its client on the next call, while one with
// calls going on all along is kept: two idle connections close, one after
// the other, over the busy one's life.
func checkIdleEviction(t *testing.T, addr string) {
	busy := newWatchedClient(t, addr)
	if err := busy.call("192.0.2.1"); err != nil {
		t.Fatal(err)
	}
	stop := make(chan struct{})
	var calls, failures atomic.Int64
	var wg sync.WaitGroup
	var once sync.Once
	stopBusy := func() { once.Do(func() { close(stop); wg.Wait() }) }
	defer stopBusy() // also when a check below ends the test
	// Two callers, so that a call is nearly always in flight.
	for range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				if err := busy.call("192.0.2.1"); err != nil {
					failures.Add(1)
					t.Errorf("busy connection: %v", err)
				}
				calls.Add(1)
				time.Sleep(10 * time.Millisecond)
			}
		}()
	}
	for round := range 2 {
		idle := newWatchedClient(t, addr)
		if err := idle.call("192.0.2.2"); err != nil {
			t.Fatal(err)
		}
		pollFor(t, "the idle connection to be closed", func() bool { return idle.dialed()[0].isEnded() })
		// Envoy's next call opens another connection, answered as usual.
		if err := idle.call("192.0.2.2"); err != nil {
			t.Fatalf("round %d: a call after the idle connection closed: %v", round, err)
		}
		if n := len(idle.dialed()); n != 2 {
			t.Errorf("round %d: the idle client dialed %d connections, want 2", round, n)
		}
		before := calls.Load()
		pollFor(t, "busy calls after the idle connection closed", func() bool { return calls.Load() > before+2 })
	}
	stopBusy()
	conns := busy.dialed()
	if len(conns) != 1 || conns[0].isEnded() || failures.Load() != 0 {
		t.Errorf("busy client: %d connections (first ended: %v), %d of %d calls failed; want its one connection kept",
			len(conns), len(conns) > 0 && conns[0].isEnded(), failures.Load(), calls.Load())
		return
	}
	t.Logf("busy connection kept over %d calls while two idle ones closed", calls.Load())
}

// slidegate serve --grpc closes idle gRPC connections and keeps busy ones.
func TestServeEnvoyIdleConnections(t *testing.T) {
	rules := filepath.Join(t.TempDir(), "ratelimit.yaml")
	writeFile(t, rules, idleTestRules)
	stderr := &logWatch{started: make(chan *served, 1)}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan int, 1)
	go func() {
		done <- serve(ctx, []string{"--listen", "127.0.0.1:0", "--admin", "off", "--grpc", "127.0.0.1:0", "--envoy-config", rules,
			"--grpc-max-connection-idle", "2s", "--drain-delay", "0s"}, io.Discard, stderr)
	}()
	defer func() {
		cancel()
		if code := <-done; code != 0 {
			t.Errorf("serve exited %d: %s", code, stderr.String())
		}
	}()
	select {
	case <-stderr.started:
	case code := <-done:
		done <- code
		t.Fatalf("serve exited %d: %s", code, stderr.String())
	}
	m := grpcAddrRE.FindStringSubmatch(stderr.String())
	if m == nil {
		t.Fatalf("no gRPC address in the log: %s", stderr.String())
	}
	checkIdleEviction(t, m[1])
}

// slidegate envoy serve closes idle gRPC connections and keeps busy ones.
func TestEnvoyServeIdleConnections(t *testing.T) {
	dir := t.TempDir()
	writeFile(t, filepath.Join(dir, "ratelimit.yaml"), idleTestRules)
	env := map[string]string{"GRPC_HOST": "127.0.0.1", "GRPC_PORT": "0", "PORT": "off"}
	addr, _, stop := startEnvoyServe(t, env, "--config", dir, "--grpc-max-connection-idle", "2s")
	defer stop()
	checkIdleEviction(t, addr)
}

// startEnvoyServe runs slidegate envoy serve with env and args until stop,
// which checks that it exited 0, and returns its gRPC and HTTP addresses.
func startEnvoyServe(t *testing.T, env map[string]string, args ...string) (addr, httpAddr string, stop func()) {
	t.Helper()
	addrs := make(chan [2]string, 1)
	ctx, cancel := context.WithCancel(context.Background())
	var stderr syncBuf
	done := make(chan int, 1)
	go func() {
		done <- envoyMain(ctx, append([]string{"serve"}, args...), func(k string) string { return env[k] }, io.Discard, &stderr,
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

// slidegate envoy serve caps the keys each rule tracks on the memory store
// by default (config.DefaultMaxKeys, as the HTTP server's policies), and a
// new key beyond the cap is a decision, OVER_LIMIT, never an error (Envoy
// would let the request pass); keys already tracked keep their limits, and
// /metrics counts the overflows.
func TestEnvoyServeMaxKeys(t *testing.T) {
	fs, s, finish := envoyCmdFlags("serve", func(string) string { return "" }, io.Discard)
	if err := fs.Parse(nil); err != nil {
		t.Fatal(err)
	}
	if err := finish(); err != nil || s.maxKeys != config.DefaultMaxKeys || s.maxKeysSet {
		t.Errorf("default: max keys %d (set %v), %v; want %d", s.maxKeys, s.maxKeysSet, err, config.DefaultMaxKeys)
	}
	for _, bad := range []string{"0", "-1"} {
		fs, _, finish := envoyCmdFlags("serve", func(string) string { return "" }, io.Discard)
		if err := fs.Parse([]string{"--max-keys", bad}); err != nil {
			t.Fatal(err)
		}
		if err := finish(); err == nil || !strings.Contains(err.Error(), "--max-keys") {
			t.Errorf("--max-keys %s: %v; want an error naming it", bad, err)
		}
	}

	dir := t.TempDir()
	writeFile(t, filepath.Join(dir, "ratelimit.yaml"), "domain: edge\ndescriptors:\n  - key: remote_address\n    rate_limit:\n      unit: minute\n      requests_per_unit: 2\n")
	addr, httpAddr, stop := startEnvoyServe(t, map[string]string{"GRPC_HOST": "127.0.0.1", "GRPC_PORT": "0", "HOST": "127.0.0.1", "PORT": "0"},
		"--config", dir, "--max-keys", "1")
	defer stop()
	c := newWatchedClient(t, addr)
	ask := func(value string) rlsv3.RateLimitResponse_Code {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		resp, err := c.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "edge",
			Descriptors: []*ratelimitv3.RateLimitDescriptor{{Entries: []*ratelimitv3.RateLimitDescriptor_Entry{{Key: "remote_address", Value: value}}}}})
		if err != nil {
			t.Fatalf("%s: %v (an error lets Envoy pass the request)", value, err)
		}
		return resp.OverallCode
	}
	ok, over := rlsv3.RateLimitResponse_OK, rlsv3.RateLimitResponse_OVER_LIMIT
	for i, step := range []struct {
		value string
		want  rlsv3.RateLimitResponse_Code
	}{{"192.0.2.1", ok}, {"192.0.2.2", over}, {"192.0.2.1", ok}, {"192.0.2.3", over}, {"192.0.2.1", over}} {
		if got := ask(step.value); got != step.want {
			t.Errorf("step %d, %s: %v, want %v", i, step.value, got, step.want)
		}
	}
	resp, err := http.Get("http://" + httpAddr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if !strings.Contains(string(body), "\nslidegate_key_overflows_total{policy=\"\",surface=\"rls\"} 2\n") {
		t.Errorf("/metrics: no slidegate_key_overflows_total{surface=\"rls\"} 2:\n%s", body)
	}
}
