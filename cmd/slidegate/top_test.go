package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/slidegate/slidegate/internal/redact"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

// TestTop: refusals sent to a real slidegate serve show in slidegate top's
// view, most refused first, keys as the logs show them; bad arguments exit
// 2 and an admin listener that does not answer exits 1.
func TestTop(t *testing.T) {
	cfg := filepath.Join(t.TempDir(), "slidegate.yaml")
	if err := os.WriteFile(cfg, []byte("policies:\n  - {name: free, limit: 1, window: 60s}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	srv, stop := startServe(t, "--config", cfg, "--listen", "127.0.0.1:0", "--admin", "127.0.0.1:0")
	if srv == nil {
		code, log := stop()
		t.Fatalf("serve exited %d: %s", code, log)
	}
	defer stop()
	for key, times := range map[string]int{"mallory": 9, "eve": 4} {
		for range times {
			resp, err := http.Post("http://"+srv.addr+"/v1/allow", "application/json", strings.NewReader(fmt.Sprintf(`{"key":%q}`, key)))
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
		}
	}
	var out, errb bytes.Buffer
	if code := runTop(context.Background(), []string{"--admin", "http://" + srv.admin, "--policy", "free", "--once"}, &out, &errb, false); code != 0 {
		t.Fatalf("exit %d: %s", code, errb.String())
	}
	view := out.String()
	mallory, eve := strings.Index(view, logKeyOf("mallory")), strings.Index(view, logKeyOf("eve"))
	if mallory < 0 || eve < 0 || mallory > eve || !strings.Contains(view, "  8  ") || !strings.Contains(view, "  3  ") {
		t.Fatalf("view:\n%s\nwant mallory (8 refused) above eve (3)", view)
	}
	if strings.Contains(view, "mallory") {
		t.Errorf("the raw key is shown:\n%s", view)
	}
	for _, args := range [][]string{{"-n", "0"}, {"--admin", "ftp://x"}, {"--interval", "0s"}, {"extra"}} {
		if code := runTop(context.Background(), append(args, "--once"), &out, &errb, false); code != 2 {
			t.Errorf("%q: exit %d, want 2", args, code)
		}
	}
	errb.Reset()
	if code := runTop(context.Background(), []string{"--admin", "http://" + srv.admin, "--policy", "nope", "--once"}, &out, &errb, false); code != 1 || !strings.Contains(errb.String(), "404") {
		t.Errorf("unknown policy: exit %d, %q", code, errb.String())
	}
}

// logKeyOf is a key as the logs and the top view show it.
func logKeyOf(k string) string { return redact.Key(k) }

// TestEnvoyTop: OVER_LIMIT answers of slidegate envoy serve show in
// /admin/top on its HTTP port and in slidegate top --rule, by rule
// (domain/descriptor), the rule's key shown as the logs show keys.
func TestEnvoyTop(t *testing.T) {
	root := t.TempDir()
	writeFile(t, filepath.Join(root, "ratelimit", "config", "a.yaml"), "domain: top\ndescriptors:\n  - key: k\n    rate_limit: {unit: minute, requests_per_unit: 1}\n")
	env := map[string]string{"RUNTIME_ROOT": root, "RUNTIME_SUBDIRECTORY": "ratelimit", "GRPC_HOST": "127.0.0.1", "GRPC_PORT": "0",
		"HOST": "127.0.0.1", "PORT": "0", "USE_STATSD": "false"}
	addrs := make(chan [2]string, 1)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var stderr syncBuf
	done := make(chan int, 1)
	go func() {
		done <- envoyMain(ctx, []string{"serve"}, func(k string) string { return env[k] }, io.Discard, &stderr,
			func(g, h string) { addrs <- [2]string{g, h} })
	}()
	var a [2]string
	select {
	case a = <-addrs:
	case code := <-done:
		t.Fatalf("exited %d: %s", code, stderr.String())
	}
	conn, err := grpc.NewClient(a[0], grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	c := rlsv3.NewRateLimitServiceClient(conn)
	for value, times := range map[string]int{"mallory": 7, "eve": 3} {
		for range times {
			_, err := c.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{Domain: "top",
				Descriptors: []*ratelimitv3.RateLimitDescriptor{{Entries: []*ratelimitv3.RateLimitDescriptor_Entry{{Key: "k", Value: value}}}}})
			if err != nil {
				t.Fatal(err)
			}
		}
	}
	var out, errb bytes.Buffer
	if code := runTop(context.Background(), []string{"--admin", "http://" + a[1], "--rule", "top/k", "--once"}, &out, &errb, false); code != 0 {
		t.Fatalf("exit %d: %s", code, errb.String())
	}
	view := out.String()
	// The rule's key for entry k=v is "1:k" then the value's length and
	// the value (rls's storeKey).
	mallory, eve := strings.Index(view, logKeyOf("1:k7:mallory")), strings.Index(view, logKeyOf("1:k3:eve"))
	if mallory < 0 || eve < 0 || mallory > eve || !strings.Contains(view, "top/k") || !strings.Contains(view, "  6  ") || !strings.Contains(view, "  2  ") {
		t.Fatalf("view:\n%s\nwant mallory (6 refused) above eve (2) under top/k", view)
	}
	cancel()
	if code := <-done; code != 0 {
		t.Fatalf("exit %d: %s", code, stderr.String())
	}
}
