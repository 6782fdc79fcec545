package main

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"

	"github.com/slidegate/slidegate/internal/server/config"
	"go.uber.org/goleak"
)

// startServe runs slidegate serve with args until the returned stop is
// called; it returns the started server's addresses, or nil and the exit
// code and stderr if serve ended before listening. It learns the bound
// addresses from the "slidegate serving" log line, as an operator would
// (the server has no start hook).
func startServe(t *testing.T, args ...string) (srv *served, stop func() (int, string)) {
	t.Helper()
	stderr := &logWatch{started: make(chan *served, 1)}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan int, 1)
	go func() {
		args := append([]string{"--drain-delay=0"}, args...)
		done <- serve(ctx, args, io.Discard, stderr)
	}()
	select {
	case s := <-stderr.started:
		return s, func() (int, string) { cancel(); return <-done, stderr.String() }
	case code := <-done:
		cancel()
		return nil, func() (int, string) { return code, stderr.String() }
	}
}

// served is a started server's bound addresses.
type served struct{ addr, admin string }

func (s *served) Addr() string      { return s.addr }
func (s *served) AdminAddr() string { return s.admin }

// servingLine matches the server's start log line (slog's text format).
var servingLine = regexp.MustCompile(`msg="slidegate serving" listen=(\S+) admin=("[^"]*"|\S+)`)

// logWatch keeps what serve logs and reports the bound addresses once
// the start line is written. It is safe for concurrent use.
type logWatch struct {
	mu      sync.Mutex
	b       bytes.Buffer
	seen    bool
	started chan *served
}

func (w *logWatch) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if m := servingLine.FindSubmatch(p); m != nil && !w.seen {
		w.seen = true
		w.started <- &served{addr: string(m[1]), admin: strings.Trim(string(m[2]), `"`)}
	}
	return w.b.Write(p)
}

func (w *logWatch) String() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.b.String()
}

// TestServeWithoutConfig: slidegate serve with no file runs the embedded
// default policies, answers the decision API, and exits 0 on shutdown.
func TestServeWithoutConfig(t *testing.T) {
	// IgnoreCurrent: a Redis test before this one may leave rueidis's
	// connection closer sleeping out its 5 s (see redis_test.go); what this
	// test starts must still be gone when it ends.
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	srv, stop := startServe(t, "--listen", "127.0.0.1:0", "--admin", "127.0.0.1:0")
	if srv == nil {
		code, stderr := stop()
		t.Fatalf("serve exited %d: %s", code, stderr)
	}
	tr := &http.Transport{}
	c := &http.Client{Transport: tr}
	resp, err := c.Post("http://"+srv.Addr()+"/v1/allow", "application/json", strings.NewReader(`{"key":"alice"}`))
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	// The body names the default policy (free, 100 per 60 s); the decision
	// API sends no rate-limit header on a 200 by default (decision_headers).
	if resp.StatusCode != 200 || !strings.Contains(string(body), `"policy":"free","limit":100,"remaining":99,`) ||
		!strings.Contains(string(body), `"reset_seconds":60}`) || resp.Header.Get("RateLimit-Policy") != "" || resp.Header.Get("RateLimit") != "" {
		t.Errorf("default policy: %d %v %s", resp.StatusCode, resp.Header, body)
	}
	resp, err = c.Get("http://" + srv.AdminAddr() + "/readyz")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Errorf("readyz %d", resp.StatusCode)
	}
	tr.CloseIdleConnections()
	if code, stderr := stop(); code != 0 {
		t.Fatalf("exit %d: %s", code, stderr)
	} else if !strings.Contains(stderr, "slidegate serving") || !strings.Contains(stderr, "stopped") {
		t.Errorf("log: %s", stderr)
	}
}

// TestServeConfigFileAndFlags: the file is read, flags override it, and a
// bad file stops start-up with the field named.
func TestServeConfigFileAndFlags(t *testing.T) {
	// IgnoreCurrent: a Redis test before this one may leave rueidis's
	// connection closer sleeping out its 5 s (see redis_test.go); what this
	// test starts must still be gone when it ends.
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	dir := t.TempDir()
	good := filepath.Join(dir, "good.yaml")
	os.WriteFile(good, []byte("listen: 127.0.0.1:1\nadmin: 'off'\npolicies:\n  - {name: gold, limit: 3, window: 10s}\n"), 0o644)
	srv, stop := startServe(t, "--config", good, "--listen", "127.0.0.1:0")
	if srv == nil {
		code, stderr := stop()
		t.Fatalf("serve exited %d: %s", code, stderr)
	}
	// The file's policy is the default one, --listen overrode its listen
	// address, and its admin listener is off.
	tr := &http.Transport{}
	resp, err := (&http.Client{Transport: tr}).Post("http://"+srv.Addr()+"/v1/allow", "application/json", strings.NewReader(`{"key":"x"}`))
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	tr.CloseIdleConnections()
	if !strings.Contains(string(body), `"policy":"gold"`) || !strings.Contains(string(body), `"limit":3`) || srv.AdminAddr() != "" || strings.HasSuffix(srv.Addr(), ":1") {
		t.Errorf("config in force: %s at %s, admin %q", body, srv.Addr(), srv.AdminAddr())
	}
	if code, _ := stop(); code != 0 {
		t.Fatalf("exit %d", code)
	}

	bad := filepath.Join(dir, "bad.yaml")
	os.WriteFile(bad, []byte("policies:\n  - {name: free, limit: 100, window: 0s}\n"), 0o644)
	for _, tc := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{"--config", bad}, 1, "policies[0] (free).window"},
		{[]string{"--config", filepath.Join(dir, "none.yaml")}, 1, "none.yaml"},
		{[]string{"--listen", "nowhere"}, 1, `listen: "nowhere" is not host:port`},
		{[]string{"--default-policy", "gold"}, 1, `default_policy: "gold"`},
		{[]string{"--store", "redis://127.0.0.1:1"}, 1, `cannot connect to redis://127.0.0.1:1`},
		{[]string{"--bogus"}, 2, "flag provided but not defined"},
		{[]string{"extra"}, 2, "unexpected argument"},
		{[]string{"--log-level", "loud"}, 2, "--log-level"},
	} {
		srv, stop := startServe(t, tc.args...)
		code, stderr := stop()
		if srv != nil || code != tc.code || !strings.Contains(stderr, tc.want) {
			t.Errorf("serve %v: exit %d, stderr %q; want %d and %q", tc.args, code, stderr, tc.code, tc.want)
		}
	}
}

func TestPrintConfigAndHelp(t *testing.T) {
	var out, errb bytes.Buffer
	if code := serve(context.Background(), []string{"--print-config", "--upstream", "http://127.0.0.1:9"}, &out, &errb); code != 0 {
		t.Fatalf("print-config: %d %s", code, errb.String())
	}
	cfg, err := config.ParseConfig(out.Bytes())
	if err != nil || cfg.Upstream != "http://127.0.0.1:9" || cfg.Policies[0].Name != "free" {
		t.Fatalf("printed config %v: %s", err, out.String())
	}
	out.Reset()
	if code := serve(context.Background(), []string{"-h"}, &out, &errb); code != 0 || !strings.Contains(out.String(), "POST /v1/allow") || !strings.Contains(out.String(), "-upstream") {
		t.Errorf("serve -h: %d %s", code, out.String())
	}
	var usageOut bytes.Buffer
	usage(&usageOut)
	for _, want := range []string{"serve", "version", "help", "slidegate serve --print-config"} {
		if !strings.Contains(usageOut.String(), want) {
			t.Errorf("usage lacks %q", want)
		}
	}
	var stderr bytes.Buffer
	if code := dispatch([]string{"frobnicate"}, io.Discard, &stderr); code != 2 || !strings.Contains(stderr.String(), `unknown command "frobnicate"`) {
		t.Errorf("unknown command: %d %s", code, stderr.String())
	}
	if code := dispatch(nil, io.Discard, &stderr); code != 2 {
		t.Errorf("no command: %d", code)
	}
	v, _, _ := buildInfo()
	if v == "" {
		t.Error("empty version")
	}
}

// TestPrintConfigChecksAndRedacts (points 5 and 8): --print-config runs
// serve's checks (a store scheme this build lacks is an error; a public
// admin address warns), shows the store URL serve runs, from
// $SLIDEGATE_STORE or read from --store-file, and never prints its
// password.
func TestPrintConfigChecksAndRedacts(t *testing.T) {
	var out, errb bytes.Buffer
	if code := serve(context.Background(), []string{"--print-config", "--store", "memcached://127.0.0.1:1"}, &out, &errb); code != 1 ||
		!strings.Contains(errb.String(), `store: no backend for "memcached://"`) {
		t.Errorf("unknown store scheme: exit %d, %s", code, errb.String())
	}
	out.Reset()
	errb.Reset()
	if code := serve(context.Background(), []string{"--print-config", "--admin", "0.0.0.0:9090"}, &out, &errb); code != 0 ||
		!strings.Contains(errb.String(), "warning: admin: 0.0.0.0:9090 is reachable from the network") {
		t.Errorf("public admin: exit %d, %s", code, errb.String())
	}

	t.Setenv(StoreEnv, "redis://:env-s3cret@127.0.0.1:6379/0")
	out.Reset()
	errb.Reset()
	if code := serve(context.Background(), []string{"--print-config"}, &out, &errb); code != 0 ||
		!strings.Contains(out.String(), "store: redis://:xxxxx@127.0.0.1:6379/0") || strings.Contains(out.String()+errb.String(), "env-s3cret") {
		t.Errorf("$%s: exit %d\n%s%s", StoreEnv, code, out.String(), errb.String())
	}
	path := filepath.Join(t.TempDir(), "url")
	if err := os.WriteFile(path, []byte("redis://:file-s3cret@127.0.0.1:6379/0\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	out.Reset()
	errb.Reset()
	if code := serve(context.Background(), []string{"--print-config", "--store-file", path}, &out, &errb); code != 0 ||
		!strings.Contains(out.String(), "store: redis://:xxxxx@127.0.0.1:6379/0") || !strings.Contains(out.String(), "\nstore_file: \"\"\n") ||
		strings.Contains(out.String()+errb.String(), "s3cret") {
		t.Errorf("--store-file: exit %d\n%s%s", code, out.String(), errb.String())
	}
}
