package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

// edgeRules is a configuration of domain edge: limit requests a minute
// per remote_address.
func edgeRules(limit int) string {
	return fmt.Sprintf("domain: edge\ndescriptors:\n  - key: remote_address\n    rate_limit:\n      unit: minute\n      requests_per_unit: %d\n", limit)
}

// rlsClient calls the Envoy rate limit service at addr; allowed counts
// how many of n calls for one remote_address are OK.
type rlsClient struct {
	t    *testing.T
	conn *grpc.ClientConn
	c    rlsv3.RateLimitServiceClient
}

func dialRLS(t *testing.T, addr string) *rlsClient {
	t.Helper()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	return &rlsClient{t: t, conn: conn, c: rlsv3.NewRateLimitServiceClient(conn)}
}

func (c *rlsClient) allowed(addr string, n int) int {
	c.t.Helper()
	req := &rlsv3.RateLimitRequest{Domain: "edge", Descriptors: []*ratelimitv3.RateLimitDescriptor{{
		Entries: []*ratelimitv3.RateLimitDescriptor_Entry{{Key: "remote_address", Value: addr}}}}}
	ok := 0
	for range n {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		resp, err := c.c.ShouldRateLimit(ctx, req)
		cancel()
		if err != nil {
			c.t.Fatalf("ShouldRateLimit: %v", err)
		}
		if resp.OverallCode == rlsv3.RateLimitResponse_OK {
			ok++
		}
	}
	return ok
}

// adminMetrics returns the admin listener's /metrics.
func adminMetrics(t *testing.T, admin string) string {
	t.Helper()
	tr := &http.Transport{}
	defer tr.CloseIdleConnections()
	resp, err := (&http.Client{Transport: tr, Timeout: 30 * time.Second}).Get("http://" + admin + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

const (
	rlsReloadOK   = `slidegate_config_reloads_total{result="success",surface="rls"} `
	rlsReloadFail = `slidegate_config_reloads_total{result="failure",surface="rls"} `
)

// TestServeEnvoySIGHUP runs slidegate serve --grpc as a real process.
// SIGHUP rereads --envoy-config: a file rewritten with the same bytes is
// no reload (its hash is unchanged, so it is not parsed) and keeps the
// keys' state; new bytes put new rules in force; a broken file keeps the
// rules in force and counts one failed reload.
func TestServeEnvoySIGHUP(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a process")
	}
	path := filepath.Join(t.TempDir(), "ratelimit.yaml")
	write := func(s string) {
		t.Helper()
		if err := os.WriteFile(path, []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write(edgeRules(1))
	h := startHelper(t, nil, "--listen", "127.0.0.1:0", "--admin", "127.0.0.1:0", "--grpc", "127.0.0.1:0",
		"--envoy-config", path, "--drain-delay", "0")
	m := grpcAddrRE.FindStringSubmatch(h.logs())
	if m == nil {
		t.Fatalf("no gRPC address in the log:\n%s", h.logs())
	}
	c := dialRLS(t, m[1])
	defer c.conn.Close()
	hup := func() {
		t.Helper()
		if err := h.cmd.Process.Signal(syscall.SIGHUP); err != nil {
			t.Fatal(err)
		}
	}
	if got := c.allowed("192.0.2.1", 3); got != 1 {
		t.Fatalf("limit 1: %d of 3 allowed", got)
	}

	write(edgeRules(1)) // the same bytes, a new modification time
	hup()
	waitFor(t, "SIGHUP to be read", func() bool {
		return strings.Contains(h.logs(), `msg="SIGHUP: envoy configuration read"`)
	})
	if mt := adminMetrics(t, h.admn); !strings.Contains(mt, rlsReloadOK+"0") {
		t.Errorf("the same bytes counted as a reload:\n%s", grepLines(mt, "slidegate_config_reloads_total"))
	}
	if got := c.allowed("192.0.2.1", 1); got != 0 {
		t.Errorf("after the same bytes: 192.0.2.1 allowed again; its state should be kept")
	}

	write(edgeRules(3))
	hup()
	waitFor(t, "the new rules", func() bool { return strings.Contains(adminMetrics(t, h.admn), rlsReloadOK+"1") })
	if got := c.allowed("192.0.2.2", 5); got != 3 {
		t.Errorf("limit 3 after SIGHUP: %d of 5 allowed", got)
	}

	write("domain: edge\ndescriptors: [\n") // broken YAML
	hup()
	waitFor(t, "the failed reload to be counted", func() bool { return strings.Contains(adminMetrics(t, h.admn), rlsReloadFail+"1") })
	if got := c.allowed("192.0.2.3", 5); got != 3 {
		t.Errorf("after a broken file: %d of 5 allowed, want the rules in force (3)", got)
	}
	if !strings.Contains(h.logs(), "envoy configuration not reloaded; the previous one stays in force") {
		t.Errorf("the failed reload was not logged:\n%s", h.logs())
	}
	if err := h.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-h.exited:
		if err != nil {
			t.Fatalf("exit: %v\n%s", err, h.logs())
		}
	case <-time.After(30 * time.Second):
		t.Fatalf("serve did not stop:\n%s", h.logs())
	}
	if !strings.Contains(h.logs(), "envoy rate limit service stopped") {
		t.Errorf("no stop in the log:\n%s", h.logs())
	}
}

// TestServeEnvoyWatchesItsRules: slidegate serve --grpc puts a changed
// --envoy-config in force without a signal (the watch), and every
// goroutine it started, the watch and the SIGHUP loop included, is gone
// once it returns.
func TestServeEnvoyWatchesItsRules(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	dir := t.TempDir()
	path := filepath.Join(dir, "ratelimit.yaml")
	if err := os.WriteFile(path, []byte(edgeRules(1)), 0o644); err != nil {
		t.Fatal(err)
	}
	stderr := &logWatch{started: make(chan *served, 1)}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan int, 1)
	go func() {
		done <- serve(ctx, []string{"--listen", "127.0.0.1:0", "--admin", "127.0.0.1:0", "--grpc", "127.0.0.1:0",
			"--envoy-config", dir, "--drain-delay", "0"}, io.Discard, stderr)
	}()
	var srv *served
	select {
	case srv = <-stderr.started:
	case code := <-done:
		t.Fatalf("serve exited %d: %s", code, stderr.String())
	}
	stopped := false
	stop := func() {
		stopped = true
		cancel()
		select {
		case code := <-done:
			if code != 0 || !strings.Contains(stderr.String(), "envoy rate limit service stopped") {
				t.Errorf("exit %d:\n%s", code, stderr.String())
			}
		case <-time.After(30 * time.Second):
			t.Fatal("serve did not stop")
		}
	}
	defer func() {
		if !stopped {
			stop()
		}
	}()
	// The service logs its address before the HTTP listeners start.
	m := grpcAddrRE.FindStringSubmatch(stderr.String())
	if m == nil {
		t.Fatalf("no gRPC address in the log: %s", stderr.String())
	}
	if mt := adminMetrics(t, srv.AdminAddr()); !strings.Contains(mt, rlsReloadOK+"0") {
		t.Fatalf("no reload counter on /metrics:\n%s", grepLines(mt, "slidegate_config_reloads_total"))
	}
	c := dialRLS(t, m[1])
	if got := c.allowed("192.0.2.1", 3); got != 1 {
		c.conn.Close()
		t.Fatalf("limit 1: %d of 3 allowed", got)
	}
	if err := os.WriteFile(path, []byte(edgeRules(2)), 0o644); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the watch to reload", func() bool { return strings.Contains(adminMetrics(t, srv.AdminAddr()), rlsReloadOK+"1") })
	if got := c.allowed("192.0.2.2", 4); got != 2 {
		t.Errorf("limit 2 after the file changed: %d of 4 allowed", got)
	}
	c.conn.Close()
	stop()
}

// grepLines keeps the lines of s that contain sub.
func grepLines(s, sub string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, sub) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

// TestEnvoyServeSIGHUPAndStop: slidegate envoy serve reloads on SIGHUP
// through the same runner (the watch is too slow to be what reloads
// here), and every goroutine it started is gone once it returns.
func TestEnvoyServeSIGHUPAndStop(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	dir := t.TempDir()
	writeFile(t, filepath.Join(dir, "a.yaml"), edgeRules(1))
	env := map[string]string{"GRPC_HOST": "127.0.0.1", "GRPC_PORT": "0", "HOST": "127.0.0.1", "PORT": "0", "LOG_LEVEL": "info"}
	addrs := make(chan [2]string, 1)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var stderr syncBuf
	done := make(chan int, 1)
	go func() {
		done <- envoyMain(ctx, []string{"serve", "--config", dir, "--watch-interval", "1h"}, func(k string) string { return env[k] }, io.Discard, &stderr,
			func(g, h string) { addrs <- [2]string{g, h} })
	}()
	var a [2]string
	select {
	case a = <-addrs:
	case code := <-done:
		t.Fatalf("envoy serve exited %d: %s", code, stderr.String())
	}
	tr := &http.Transport{}
	rlconfig := func() string {
		resp, err := (&http.Client{Transport: tr, Timeout: 30 * time.Second}).Get("http://" + a[1] + "/rlconfig")
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return string(b)
	}
	if got := rlconfig(); !strings.Contains(got, "requests_per_unit=1,") {
		t.Fatalf("/rlconfig at start: %q", got)
	}
	writeFile(t, filepath.Join(dir, "a.yaml"), edgeRules(3))
	if err := syscall.Kill(os.Getpid(), syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "SIGHUP to reload", func() bool { return strings.Contains(rlconfig(), "requests_per_unit=3,") })
	c := dialRLS(t, a[0])
	if got := c.allowed("192.0.2.1", 4); got != 3 {
		t.Errorf("limit 3 after SIGHUP: %d of 4 allowed", got)
	}
	c.conn.Close()
	tr.CloseIdleConnections()
	cancel()
	select {
	case code := <-done:
		if code != 0 {
			t.Fatalf("exit %d: %s", code, stderr.String())
		}
	case <-time.After(30 * time.Second):
		t.Fatal("envoy serve did not stop")
	}
}
