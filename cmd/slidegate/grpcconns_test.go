package main

import (
	"context"
	"io"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

// dialFrom connects to addr from the loopback address from (127.0.0.0/8
// is all loopback on Linux, so each is another client).
func dialFrom(ctx context.Context, from, addr string) (net.Conn, error) {
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(from)}, Timeout: 10 * time.Second}
	return d.DialContext(ctx, "tcp", addr)
}

// TestGRPCOneAddressCannotHoldTheListener: with
// --grpc-max-connections 4 and max_conns_per_ip 2, an address that opens
// connections and sends nothing holds two of them (two more wait, the
// rest are closed), and Envoy on another address is answered.
func TestGRPCOneAddressCannotHoldTheListener(t *testing.T) {
	dir := t.TempDir()
	rules := filepath.Join(dir, "ratelimit.yaml")
	conf := filepath.Join(dir, "slidegate.yaml")
	if err := os.WriteFile(rules, []byte("domain: edge\ndescriptors:\n  - key: remote_address\n    rate_limit:\n      unit: minute\n      requests_per_unit: 5\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(conf, []byte("max_conns_per_ip: 2\npolicies:\n  - {name: free, limit: 5, window: 60s}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	stderr := &logWatch{started: make(chan *served, 1)}
	sctx, stop := context.WithCancel(context.Background())
	done := make(chan int, 1)
	go func() {
		done <- serve(sctx, []string{"--config", conf, "--listen", "127.0.0.1:0", "--admin", "127.0.0.1:0", "--grpc", "127.0.0.1:0",
			"--envoy-config", rules, "--grpc-max-connections", "4", "--drain-delay", "0s"}, io.Discard, stderr)
	}()
	defer func() {
		stop()
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
	addr := m[1]
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	for range 8 {
		c, err := dialFrom(ctx, "127.0.0.2", addr)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
	}
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithContextDialer(func(ctx context.Context, a string) (net.Conn, error) { return dialFrom(ctx, "127.0.0.3", a) }))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	start := time.Now()
	cctx, ccancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer ccancel()
	resp, err := rlsv3.NewRateLimitServiceClient(conn).ShouldRateLimit(cctx, &rlsv3.RateLimitRequest{Domain: "edge",
		Descriptors: []*ratelimitv3.RateLimitDescriptor{{Entries: []*ratelimitv3.RateLimitDescriptor_Entry{{Key: "remote_address", Value: "192.0.2.1"}}}}})
	if err != nil || resp.OverallCode != rlsv3.RateLimitResponse_OK {
		t.Fatalf("Envoy on another address while one holds its slots: %v %v", resp, err)
	}
	t.Logf("answered in %v", time.Since(start).Round(time.Millisecond))
}
