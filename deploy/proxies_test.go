package deploy_test

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
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// app is the real upstream behind the proxy: it counts the requests that
// reach it and keeps the RateLimit header each carried (Caddy's
// copy_headers).
type app struct {
	srv *httptest.Server
	mu  sync.Mutex
	got []string
}

func newApp(t *testing.T) *app {
	t.Helper()
	a := &app{}
	a.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		a.mu.Lock()
		a.got = append(a.got, r.Header.Get("RateLimit"))
		a.mu.Unlock()
		if r.URL.Path == "/forbidden" {
			w.WriteHeader(http.StatusForbidden)
			fmt.Fprintln(w, "forbidden by the app")
			return
		}
		fmt.Fprintf(w, "hello from the app: %s %s\n", r.Method, r.URL.RequestURI())
	}))
	t.Cleanup(a.srv.Close)
	return a
}

func (a *app) seen() []string {
	a.mu.Lock()
	defer a.mu.Unlock()
	return append([]string(nil), a.got...)
}

// fivePerMinute sends six requests through the proxy at base: at limit 5
// in 60 s, five reach the app and the sixth is a 429 with Retry-After.
// The first is one the app itself forbids: its 403 reaches the client
// unchanged (nginx turns only auth_request's 403 into a 429). With
// allowedHeaders the allowed responses carry RateLimit too.
func fivePerMinute(t *testing.T, base string, a *app, allowedHeaders bool) {
	t.Helper()
	c := &http.Client{}
	defer c.CloseIdleConnections()
	for i := 1; i <= 6; i++ {
		path := "/hello"
		if i == 1 {
			path = "/forbidden"
		}
		resp, err := c.Get(base + path + "?n=" + strconv.Itoa(i))
		if err != nil {
			t.Fatalf("request %d: %v", i, err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		ra := resp.Header.Get("Retry-After")
		if i == 1 {
			if resp.StatusCode != 403 || !strings.HasPrefix(string(body), "forbidden by the app") {
				t.Fatalf("request 1: %d %q, want the app's own 403", resp.StatusCode, body)
			}
			continue
		}
		if i <= 5 {
			if resp.StatusCode != 200 || !strings.HasPrefix(string(body), "hello from the app: GET /hello?n="+strconv.Itoa(i)) {
				t.Fatalf("request %d: %d %q, want the app's 200", i, resp.StatusCode, body)
			}
			if want := fmt.Sprintf("r=%d", 5-i); allowedHeaders && !strings.Contains(resp.Header.Get("RateLimit"), want) {
				t.Errorf("request %d: RateLimit %q, want %s", i, resp.Header.Get("RateLimit"), want)
			}
			continue
		}
		secs, err := strconv.Atoi(ra)
		if resp.StatusCode != 429 || err != nil || secs < 1 || secs > 60 {
			t.Fatalf("request 6: %d, Retry-After %q, want 429 with Retry-After in 1..60 s; headers %v", resp.StatusCode, ra, resp.Header)
		}
		if !strings.Contains(resp.Header.Get("RateLimit"), "r=0") {
			t.Errorf("request 6: RateLimit %q, want r=0", resp.Header.Get("RateLimit"))
		}
	}
	if n := len(a.seen()); n != 5 {
		t.Fatalf("%d requests reached the app, want 5", n)
	}
}

func TestNginxAuthRequest(t *testing.T) {
	a := newApp(t)
	listen, dir := startNginx(t, a, slidegate(t, "nginx/slidegate.yaml"))
	fivePerMinute(t, "http://"+listen, a, true)
	if t.Failed() {
		t.Log(readLog(filepath.Join(dir, "error.log")))
	}
}

// TestNginxFragment: through the shipped
// nginx configuration, "POST /login#x" reaches the app, which routes it
// as /login, so it counts against slidegate's /login route; a POST naming
// DELETE in a method override counts against DELETE /account. The
// configuration is nginx/slidegate.yaml with those two routes added.
func TestNginxFragment(t *testing.T) {
	a := newApp(t)
	cfg := filepath.Join(t.TempDir(), "slidegate.yaml")
	yaml := readFile(t, "nginx/slidegate.yaml") + `  - {name: login, limit: 2, window: 60s}
  - {name: account, limit: 1, window: 60s}
routes:
  - {method: POST, path: /login, limits: [{policy: login}]}
  - {method: DELETE, path: /account, limits: [{policy: account}]}
`
	if err := os.WriteFile(cfg, []byte(yaml), 0o644); err != nil {
		t.Fatal(err)
	}
	listen, dir := startNginx(t, a, slidegate(t, cfg))
	var codes []int
	for _, target := range []string{"/login", "/login", "/login#x", "/login#x", "/login?a=1#x"} {
		resp, _ := rawRequest(t, listen, "POST "+target+" HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
		codes = append(codes, resp.StatusCode)
	}
	if want := []int{200, 200, 429, 429, 429}; fmt.Sprint(codes) != fmt.Sprint(want) {
		t.Errorf("statuses %v, want %v: POST /login#x is /login to the app", codes, want)
	}
	if n := len(a.seen()); n != 2 {
		t.Errorf("%d requests reached the app, want 2", n)
	}
	// Issue 40, point 10: nginx passes the original request's headers to
	// the check, so a POST that the application would run as the DELETE
	// its override names counts against DELETE /account.
	codes = codes[:0]
	for _, req := range []string{
		"DELETE /account HTTP/1.1\r\n",
		"POST /account HTTP/1.1\r\nX-HTTP-Method-Override: DELETE\r\n",
		"POST /account?_method=DELETE HTTP/1.1\r\n",
		"POST /account HTTP/1.1\r\n",
	} {
		resp, _ := rawRequest(t, listen, req+"Host: x\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
		codes = append(codes, resp.StatusCode)
	}
	if want := []int{200, 429, 429, 200}; fmt.Sprint(codes) != fmt.Sprint(want) {
		t.Errorf("statuses %v, want %v: a POST naming DELETE counts as DELETE", codes, want)
	}
	if t.Failed() {
		t.Log(readLog(filepath.Join(dir, "error.log")))
	}
}

// rawRequest sends one request as written (a "#" in the target, which
// net/http's client would cut) and reads the answer.
func rawRequest(t *testing.T, addr, request string) (*http.Response, []byte) {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(30 * time.Second))
	if _, err := io.WriteString(c, request); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp, b
}

// startNginx starts a real nginx with the shipped configuration in front
// of a, asking the slidegate at sg; it returns nginx's address and its
// directory.
func startNginx(t *testing.T, a *app, sg string) (string, string) {
	t.Helper()
	nginx := need(t, "nginx")
	dir := t.TempDir()
	listen := startOn(t, func(listen string) (<-chan struct{}, func() string) {
		conf := replaceAll(t, readFile(t, "nginx/slidegate.conf"),
			"127.0.0.1:8080", sg, "127.0.0.1:3000", strings.TrimPrefix(a.srv.URL, "http://"), "127.0.0.1:8000", listen)
		if err := os.WriteFile(filepath.Join(dir, "slidegate.conf"), []byte(conf), 0o644); err != nil {
			t.Fatal(err)
		}
		// The test's own main file: everything under dir, in the foreground.
		main := fmt.Sprintf(`daemon off;
worker_processes 1;
pid %[1]s/nginx.pid;
error_log %[1]s/error.log warn;
events { worker_connections 64; }
http {
    access_log off;
    client_body_temp_path %[1]s/body;
    proxy_temp_path %[1]s/proxy;
    fastcgi_temp_path %[1]s/fastcgi;
    uwsgi_temp_path %[1]s/uwsgi;
    scgi_temp_path %[1]s/scgi;
    include %[1]s/slidegate.conf;
}
`, dir)
		if err := os.WriteFile(filepath.Join(dir, "nginx.conf"), []byte(main), 0o644); err != nil {
			t.Fatal(err)
		}
		cmd := exec.Command(nginx, "-p", dir, "-e", filepath.Join(dir, "error.log"), "-c", filepath.Join(dir, "nginx.conf"))
		out := new(output)
		cmd.Stdout, cmd.Stderr = out, out
		return run(t, cmd), func() string { return out.String() + readLog(filepath.Join(dir, "error.log")) }
	})
	return listen, dir
}

func TestCaddyForwardAuth(t *testing.T) {
	caddy := need(t, "caddy")
	a := newApp(t)
	sg := slidegate(t, "caddy/slidegate.yaml")
	dir := t.TempDir()
	var out *output
	listen := startOn(t, func(listen string) (<-chan struct{}, func() string) {
		conf := replaceAll(t, readFile(t, "caddy/Caddyfile"),
			"127.0.0.1:8080", sg, "127.0.0.1:3000", strings.TrimPrefix(a.srv.URL, "http://"), "127.0.0.1:8001", listen)
		path := filepath.Join(dir, "Caddyfile")
		if err := os.WriteFile(path, []byte(conf), 0o644); err != nil {
			t.Fatal(err)
		}
		cmd := exec.Command(caddy, "run", "--config", path, "--adapter", "caddyfile")
		// Caddy keeps its data and configuration under these: the test's own.
		cmd.Env = append(os.Environ(), "HOME="+dir, "XDG_DATA_HOME="+dir, "XDG_CONFIG_HOME="+dir)
		out = new(output)
		cmd.Stdout, cmd.Stderr = out, out
		return run(t, cmd), out.String
	})
	fivePerMinute(t, "http://"+listen, a, false)
	for i, rl := range a.seen() {
		if want := fmt.Sprintf("r=%d", 4-i); !strings.Contains(rl, want) {
			t.Errorf("request %d reached the app with RateLimit %q, want %s (copy_headers)", i+1, rl, want)
		}
	}
	if t.Failed() {
		t.Log(out.String())
	}
}

// output collects a program's output; safe to read while it runs.
type output struct {
	mu sync.Mutex
	b  strings.Builder
}

func (o *output) Write(p []byte) (int, error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.b.Write(p)
}

func (o *output) String() string {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.b.String()
}

func readLog(path string) string {
	b, _ := os.ReadFile(path)
	return string(b)
}
