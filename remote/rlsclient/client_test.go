package rlsclient_test

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/status"

	"github.com/slidegate/slidegate/internal/rls"
	"github.com/slidegate/slidegate/internal/tlsfiles/tlstest"
	"github.com/slidegate/slidegate/remote"
	"github.com/slidegate/slidegate/remote/rlsclient"
)

const rlsConfig = `domain: edge
descriptors:
  - key: remote_address
    rate_limit:
      name: per_address
      unit: minute
      requests_per_unit: 3
  - key: path
    value: /free
`

// serveRLS starts the rate limit service as slidegate serve --grpc builds
// it (a configuration file loaded from a directory, rls.NewGRPCServer) on
// a loopback listener, stopped at the end of the test.
func serveRLS(t *testing.T, opts ...grpc.ServerOption) string {
	t.Helper()
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "ratelimit.yaml"), []byte(rlsConfig), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg, err := rls.LoadConfig(dir)
	if err != nil {
		t.Fatal(err)
	}
	g, err := cfg.NewGroup()
	if err != nil {
		t.Fatal(err)
	}
	svc, err := rls.New(cfg, g)
	if err != nil {
		t.Fatal(err)
	}
	gs, _ := rls.NewGRPCServer(svc, opts...)
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { defer close(done); _ = gs.Serve(lis) }()
	t.Cleanup(func() {
		gs.Stop()
		<-done
		_ = g.Close()
	})
	return lis.Addr().String()
}

func dialRLS(t *testing.T, target string, opts ...rlsclient.Option) *rlsclient.Client {
	t.Helper()
	c, err := rlsclient.Dial(target, append([]rlsclient.Option{rlsclient.WithTimeout(time.Minute)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

func addr(ip string) []rlsclient.Descriptor {
	return []rlsclient.Descriptor{
		{Entries: []rlsclient.Entry{{Key: "remote_address", Value: ip}}},
		{Entries: []rlsclient.Entry{{Key: "path", Value: "/free"}}},
	}
}

// Three requests pass at the rule's limit of three, the fourth is over
// the limit, with each descriptor's own status; another address and a
// call that charges two hits are counted apart.
func TestRLSOverLimit(t *testing.T) {
	c := dialRLS(t, serveRLS(t))
	ctx := context.Background()
	for i := range 4 {
		d, err := c.ShouldRateLimit(ctx, "edge", addr("192.0.2.1"), 1)
		if err != nil {
			t.Fatal(err)
		}
		if d.Fallback || len(d.Statuses) != 2 {
			t.Fatalf("call %d: %+v", i+1, d)
		}
		s, free := d.Statuses[0], d.Statuses[1]
		if s.Name != "per_address" || s.Limit != 3 || s.Window != time.Minute {
			t.Fatalf("call %d: rule %+v, want per_address 3 per minute", i+1, s)
		}
		if s.Reset <= 0 || s.Reset > time.Minute {
			t.Fatalf("call %d: reset %v outside (0, 1m]", i+1, s.Reset)
		}
		if free.OverLimit || free.Limit != 0 {
			t.Fatalf("call %d: the unlimited descriptor: %+v", i+1, free)
		}
		if i < 3 {
			if !d.Allowed || s.OverLimit || s.Remaining != uint32(2-i) {
				t.Fatalf("call %d: %+v, want allowed with %d remaining", i+1, s, 2-i)
			}
		} else if d.Allowed || !s.OverLimit || s.Remaining != 0 {
			t.Fatalf("call 4: %+v allowed=%v, want over the limit", s, d.Allowed)
		}
	}
	d, err := c.ShouldRateLimit(ctx, "edge", addr("192.0.2.2"), 2)
	if err != nil || !d.Allowed || d.Statuses[0].Remaining != 1 {
		t.Fatalf("two hits from another address: %+v, %v", d, err)
	}
	d, err = c.ShouldRateLimit(ctx, "edge", addr("192.0.2.2"), 2)
	if err != nil || d.Allowed || !d.Statuses[0].OverLimit {
		t.Fatalf("two more hits: %+v, %v", d, err)
	}
}

// A request the server refuses as bad input is ErrRejected, not a
// failure-policy decision; calls after Close are ErrClosed.
func TestRLSRejectedAndClosed(t *testing.T) {
	target := serveRLS(t)
	c := dialRLS(t, target, rlsclient.WithFailurePolicy(remote.FailOpen))
	d, err := c.ShouldRateLimit(context.Background(), "", addr("192.0.2.1"), 1)
	if !errors.Is(err, remote.ErrRejected) || d.Allowed || d.Fallback {
		t.Fatalf("no domain: %+v, %v, want ErrRejected", d, err)
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := c.ShouldRateLimit(context.Background(), "edge", addr("192.0.2.1"), 1); !errors.Is(err, remote.ErrClosed) {
		t.Fatalf("after Close: %v, want ErrClosed", err)
	}
	if err := c.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
}

// closedPort is a loopback address nothing listens on.
func closedPort(t *testing.T) string {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	a := lis.Addr().String()
	_ = lis.Close()
	return a
}

// An unreachable server: FailOpen allows, FailClosed refuses with an
// error that wraps ErrUnavailable and says the policy.
func TestRLSFailurePolicies(t *testing.T) {
	target := closedPort(t)
	open := dialRLS(t, target)
	d, err := open.ShouldRateLimit(context.Background(), "edge", addr("192.0.2.1"), 1)
	if err != nil || !d.Allowed || !d.Fallback {
		t.Fatalf("open: %+v, %v, want a fallback allow", d, err)
	}
	closed := dialRLS(t, target, rlsclient.WithFailurePolicy(remote.FailClosed))
	d, err = closed.ShouldRateLimit(context.Background(), "edge", addr("192.0.2.1"), 1)
	if !errors.Is(err, remote.ErrUnavailable) || d.Allowed || !d.Fallback {
		t.Fatalf("closed: %+v, %v, want a fallback refusal with ErrUnavailable", d, err)
	}
	if !strings.Contains(err.Error(), "failure policy closed") || !strings.Contains(err.Error(), target) {
		t.Fatalf("closed: %q does not say the policy and the server", err)
	}
	if _, err := rlsclient.Dial(target, rlsclient.WithFailurePolicy(remote.FailLocal)); !errors.Is(err, remote.ErrInvalidOption) {
		t.Fatalf("FailLocal: %v, want ErrInvalidOption", err)
	}
}

// A server that accepts connections and never answers: the call ends at
// the client's timeout and the failure policy decides.
func TestRLSTimeout(t *testing.T) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var conns []net.Conn
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			conn, err := lis.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, conn)
			mu.Unlock()
		}
	}()
	defer func() {
		_ = lis.Close()
		<-done
		mu.Lock()
		for _, c := range conns {
			_ = c.Close()
		}
		mu.Unlock()
	}()
	c, err := rlsclient.Dial(lis.Addr().String(), rlsclient.WithTimeout(200*time.Millisecond), rlsclient.WithFailurePolicy(remote.FailClosed))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	d, err := c.ShouldRateLimit(context.Background(), "edge", addr("192.0.2.1"), 1)
	if !errors.Is(err, remote.ErrUnavailable) || status.Code(err) != codes.DeadlineExceeded || d.Allowed {
		t.Fatalf("hung server: %+v, %v, want a refusal at the deadline", d, err)
	}
	// A caller's own cancelled context is its error, not a decision.
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := c.ShouldRateLimit(ctx, "edge", addr("192.0.2.1"), 1); !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled: %v, want context.Canceled", err)
	}
}

// Mutual TLS: with the CA and a client certificate the call is decided;
// without a client certificate the server cannot be reached.
func TestRLSMutualTLS(t *testing.T) {
	dir := t.TempDir()
	ca := tlstest.NewCA(t, "test CA")
	certFile, keyFile := ca.WriteServer(t, dir, "server", "slidegate")
	cert, err := tls.LoadX509KeyPair(certFile, keyFile)
	if err != nil {
		t.Fatal(err)
	}
	target := serveRLS(t, grpc.Creds(credentials.NewTLS(&tls.Config{Certificates: []tls.Certificate{cert},
		ClientCAs: ca.Pool(), ClientAuth: tls.RequireAndVerifyClientCert, MinVersion: tls.VersionTLS12})))
	c := dialRLS(t, target, rlsclient.WithTLS(&tls.Config{RootCAs: ca.Pool(), Certificates: []tls.Certificate{ca.Client(t, "svc")}}))
	d, err := c.ShouldRateLimit(context.Background(), "edge", addr("192.0.2.1"), 1)
	if err != nil || !d.Allowed || d.Fallback || d.Statuses[0].Remaining != 2 {
		t.Fatalf("over mutual TLS: %+v, %v", d, err)
	}
	bare := dialRLS(t, target, rlsclient.WithTLS(&tls.Config{RootCAs: ca.Pool()}), rlsclient.WithFailurePolicy(remote.FailClosed))
	if _, err := bare.ShouldRateLimit(context.Background(), "edge", addr("192.0.2.1"), 1); !errors.Is(err, remote.ErrUnavailable) {
		t.Fatalf("without a client certificate: %v, want ErrUnavailable", err)
	}
	other := dialRLS(t, target, rlsclient.WithTLS(&tls.Config{RootCAs: x509.NewCertPool()}), rlsclient.WithFailurePolicy(remote.FailClosed))
	if _, err := other.ShouldRateLimit(context.Background(), "edge", addr("192.0.2.1"), 1); !errors.Is(err, remote.ErrUnavailable) {
		t.Fatalf("untrusted server: %v, want ErrUnavailable", err)
	}
}
