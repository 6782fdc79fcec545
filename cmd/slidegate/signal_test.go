package main

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// TestHelperProcess is slidegate itself when run by the tests below as a
// child process (the usual os/exec helper pattern); otherwise it does
// nothing.
func TestHelperProcess(t *testing.T) {
	if os.Getenv("SLIDEGATE_HELPER") != "1" {
		t.Skip("helper process only")
	}
	args := os.Args
	for i, a := range args {
		if a == "--" {
			args = args[i+1:]
			break
		}
	}
	os.Exit(dispatch(args, os.Stdout, os.Stderr))
}

// TestServeSIGTERM runs slidegate serve as a real process in gateway mode,
// sends SIGTERM while a request is in flight at the upstream, and checks
// that the request still gets its answer and the process exits 0.
func TestServeSIGTERM(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a process")
	}
	release := make(chan struct{})
	arrived := make(chan struct{}, 1)
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		arrived <- struct{}{}
		<-release
		io.WriteString(w, "slow answer")
	}))
	defer up.Close()

	cmd := exec.Command(os.Args[0], "-test.run=^TestHelperProcess$", "--",
		"serve", "--listen", "127.0.0.1:0", "--admin", "off", "--drain-delay", "0", "--upstream", up.URL, "--key", "header:X-Client")
	cmd.Env = append(os.Environ(), "SLIDEGATE_HELPER=1")
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Process.Kill()
	lines := bufio.NewScanner(stderr)
	listen := regexp.MustCompile(`listen=(127\.0\.0\.1:\d+)`)
	var addr string
	var log strings.Builder
	for lines.Scan() {
		log.WriteString(lines.Text() + "\n")
		if m := listen.FindStringSubmatch(lines.Text()); m != nil {
			addr = m[1]
			break
		}
	}
	if addr == "" {
		t.Fatalf("no listen address in the log:\n%s", log.String())
	}
	rest := make(chan string, 1)
	go func() {
		var b strings.Builder
		for lines.Scan() {
			b.WriteString(lines.Text() + "\n")
		}
		rest <- b.String()
	}()

	type res struct {
		status int
		body   string
		err    error
	}
	done := make(chan res, 1)
	tr := &http.Transport{}
	defer tr.CloseIdleConnections()
	go func() {
		req, _ := http.NewRequest("GET", "http://"+addr+"/x", nil)
		req.Header.Set("X-Client", "c1")
		resp, err := (&http.Client{Transport: tr}).Do(req)
		if err != nil {
			done <- res{err: err}
			return
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		done <- res{status: resp.StatusCode, body: string(b)}
	}()
	<-arrived
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	// Shutdown has begun once the listener refuses connections; the
	// request is still in flight at the upstream. Then let it answer.
	for {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			break
		}
		c.Close()
		time.Sleep(time.Millisecond)
	}
	select {
	case r := <-done:
		t.Fatalf("the in-flight request ended before the upstream answered: %+v", r)
	default:
	}
	close(release)
	r := <-done
	if r.err != nil || r.status != 200 || r.body != "slow answer" {
		t.Errorf("in-flight request: %d %q %v", r.status, r.body, r.err)
	}
	err = cmd.Wait()
	out := <-rest
	if err != nil {
		t.Fatalf("exit: %v\n%s", err, out)
	}
	if !strings.Contains(out, "shutting down") || !strings.Contains(out, "stopped") {
		t.Errorf("log after SIGTERM:\n%s", out)
	}
}

// helper is slidegate serve running as a child process.
type helper struct {
	cmd          *exec.Cmd
	listen, admn string
	mu           sync.Mutex
	log          strings.Builder
	exited       chan error
}

// startHelper runs slidegate serve args as a child process and waits
// until it logs its addresses.
func startHelper(t *testing.T, env []string, args ...string) *helper {
	t.Helper()
	h := &helper{exited: make(chan error, 1)}
	h.cmd = exec.Command(os.Args[0], append([]string{"-test.run=^TestHelperProcess$", "--", "serve"}, args...)...)
	h.cmd.Env = append(append(os.Environ(), "SLIDEGATE_HELPER=1"), env...)
	stderr, err := h.cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := h.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = h.cmd.Process.Kill() })
	addrs := make(chan [2]string, 1)
	go func() {
		re := regexp.MustCompile(`listen=(\S+) admin=(\S*)`)
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			h.mu.Lock()
			h.log.WriteString(sc.Text() + "\n")
			h.mu.Unlock()
			if m := re.FindStringSubmatch(sc.Text()); m != nil {
				addrs <- [2]string{m[1], m[2]}
			}
		}
		h.exited <- h.cmd.Wait()
	}()
	select {
	case a := <-addrs:
		h.listen, h.admn = a[0], a[1]
	case err := <-h.exited:
		t.Fatalf("serve exited (%v) before listening:\n%s", err, h.logs())
	case <-time.After(30 * time.Second):
		t.Fatalf("serve did not listen within 30 s:\n%s", h.logs())
	}
	return h
}

func (h *helper) logs() string {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.log.String()
}

// waitFor polls cond every millisecond for up to 30 s.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(time.Millisecond)
	}
}

// TestServeSIGHUPAndDrain runs slidegate serve as a real process: SIGHUP
// reloads the file (an unchanged policy keeps its keys' state, a new one
// serves), a bad file is logged and the old configuration keeps serving;
// SIGTERM turns /readyz to 503 while requests are still answered, and a
// second SIGTERM ends the drain at once with exit code 0.
func TestServeSIGHUPAndDrain(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a process")
	}
	path := filepath.Join(t.TempDir(), "slidegate.yaml")
	write := func(s string) {
		if err := os.WriteFile(path, []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("policies:\n  - {name: free, limit: 2, window: 1h}\n")
	h := startHelper(t, nil, "--config", path, "--listen", "127.0.0.1:0", "--admin", "127.0.0.1:0", "--drain-delay", "1h")
	tr := &http.Transport{}
	defer tr.CloseIdleConnections()
	c := &http.Client{Transport: tr}
	allow := func(body string) int {
		resp, err := c.Post("http://"+h.listen+"/v1/allow", "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp.StatusCode
	}
	get := func(url string) (int, string) {
		resp, err := c.Get(url)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		return resp.StatusCode, string(b)
	}
	for range 2 {
		if st := allow(`{"key":"a"}`); st != 200 {
			t.Fatalf("before reload: %d", st)
		}
	}
	write("policies:\n  - {name: free, limit: 2, window: 1h}\n  - {name: paid, limit: 1, window: 1h}\n")
	if err := h.cmd.Process.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the reloaded policy", func() bool { return allow(`{"key":"a","policy":"paid"}`) != 400 })
	if st := allow(`{"key":"a"}`); st != 429 {
		t.Errorf("free was unchanged by the reload and should remember a's two requests: %d", st)
	}

	write("policies:\n  - {name: free, limit: 2, window: 1h\n") // broken YAML
	if err := h.cmd.Process.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the failed reload to be counted", func() bool {
		_, m := get("http://" + h.admn + "/metrics")
		return strings.Contains(m, `slidegate_config_reloads_total{result="failure",surface="http"} 1`)
	})
	if st := allow(`{"key":"b","policy":"paid"}`); st != 200 {
		t.Errorf("after a bad reload the previous configuration should serve: %d", st)
	}
	if !strings.Contains(h.logs(), "configuration reload failed") {
		t.Errorf("the bad reload was not logged:\n%s", h.logs())
	}

	if err := h.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "/readyz to turn 503", func() bool { st, _ := get("http://" + h.admn + "/readyz"); return st == 503 })
	if st := allow(`{"key":"c"}`); st != 200 {
		t.Errorf("a request during the drain delay: %d", st)
	}
	select {
	case err := <-h.exited:
		t.Fatalf("serve exited during the drain delay: %v\n%s", err, h.logs())
	default:
	}
	tr.CloseIdleConnections()
	if err := h.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-h.exited:
		if err != nil {
			t.Fatalf("exit: %v\n%s", err, h.logs())
		}
	case <-time.After(30 * time.Second):
		t.Fatalf("a second SIGTERM did not end the drain:\n%s", h.logs())
	}
	if l := h.logs(); !strings.Contains(l, "drain cut short") || !strings.Contains(l, "stopped") {
		t.Errorf("log:\n%s", l)
	}
}

// TestServeSIGHUPRoutes runs slidegate serve as a gateway with routes: a
// route of two limits decides all or nothing, and SIGHUP reloads a file
// that changes one policy and adds a route while the unchanged policy
// keeps its keys' state.
func TestServeSIGHUPRoutes(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a process")
	}
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, "up") }))
	defer up.Close()
	path := filepath.Join(t.TempDir(), "slidegate.yaml")
	write := func(s string) {
		if err := os.WriteFile(path, []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	const head = "key: header:X-User\nupstream: %s\npolicies:\n  - {name: free, limit: 100, window: 1h}\n  - {name: per_hour, limit: 3, window: 1h}\n"
	write(fmt.Sprintf(head, up.URL) + "  - {name: per_minute, limit: 2, window: 1m}\n" +
		"routes:\n  - {path: /api, limits: [{policy: per_minute}, {policy: per_hour}]}\n")
	h := startHelper(t, nil, "--config", path, "--listen", "127.0.0.1:0", "--admin", "127.0.0.1:0", "--drain-delay", "0s")
	tr := &http.Transport{}
	defer tr.CloseIdleConnections()
	c := &http.Client{Transport: tr}
	get := func(p, user string) (int, string) {
		req, _ := http.NewRequest("GET", "http://"+h.listen+p, nil)
		req.Header.Set("X-User", user)
		resp, err := c.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp.StatusCode, resp.Header.Get("RateLimit-Policy")
	}
	for i, want := range []int{200, 200, 429} {
		if st, pol := get("/api/x", "u1"); st != want || pol != `"per_minute";q=2;w=60, "per_hour";q=3;w=3600` {
			t.Fatalf("request %d: %d %q, want %d", i, st, pol, want)
		}
	}
	// per_minute goes to 5; per_hour is unchanged and remembers u1's two
	// requests (not three: the refusal charged it nothing); /admin is a
	// new route on per_hour alone.
	write(fmt.Sprintf(head, up.URL) + "  - {name: per_minute, limit: 5, window: 1m}\n" +
		"routes:\n  - {path: /api, limits: [{policy: per_minute}, {policy: per_hour}]}\n  - {path: /admin, limits: [{policy: per_hour, key: 'const:admin'}]}\n")
	if err := h.cmd.Process.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the reloaded routes", func() bool { _, pol := get("/admin", "u9"); return pol == `"per_hour";q=3;w=3600` })
	if st, _ := get("/api/x", "u1"); st != 200 {
		t.Fatalf("after the reload: u1's third request of the hour: %d", st)
	}
	if st, _ := get("/api/x", "u1"); st != 429 {
		t.Fatalf("per_hour kept u1's state across the reload and must refuse a fourth: %d", st)
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
		t.Fatalf("SIGTERM did not stop serve:\n%s", h.logs())
	}
}
