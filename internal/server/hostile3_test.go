package server_test

// Tests of the HTTP server against hostile clients,
// each through a real listener.

import (
	"bytes"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/slidegate/slidegate/engine"
	"github.com/slidegate/slidegate/internal/server"
	"github.com/slidegate/slidegate/internal/server/config"
	"github.com/slidegate/slidegate/internal/tlsfiles/tlstest"
)

// TestCheckFragment (point 3): behind nginx, the original URI arrives
// with its fragment ("/login#x"), which the application routes as
// "/login". It counts against the /login route.
func TestCheckFragment(t *testing.T) {
	e := start(t, mustParse(t, checkConfig), server.WithClock(engine.NewManualClock()))
	for i, uri := range []string{"/login", "/login#x", "/login?a=1#x", "/login#/../other", "/login/#"} {
		r := e.do("GET", e.base+"/v1/check", "", "X-Original-Method", "POST", "X-Original-URI", uri, "X-Forwarded-For", "203.0.113.30")
		if want := []int{200, 200, 429, 429, 429}[i]; r.status != want {
			t.Errorf("POST %s: status %d, want %d (the login limit is 2): %s", uri, r.status, want, r.body)
		}
		if i >= 2 && !strings.Contains(string(r.body), `policy \"login\"`) {
			t.Errorf("POST %s: %s, want a refusal by the login policy", uri, r.body)
		}
	}
}

// TestForwardedUnterminatedQuote (point 7): behind a trusted proxy that
// appends to Forwarded, a client's own element with an unterminated quote
// would swallow the proxy's: it is a 400, not a key of the client's
// choosing.
func TestForwardedUnterminatedQuote(t *testing.T) {
	cfg := mustParse(t, `
key: ip
trusted_proxies: [127.0.0.1/32]
client_ip_header: Forwarded
policies:
  - {name: free, limit: 2, window: 60s}
`)
	e := start(t, cfg, server.WithClock(engine.NewManualClock()))
	real := "for=198.51.100.40"
	ask := func(fwd string) reply {
		return e.do("GET", e.base+"/v1/check", "", "X-Forwarded-Method", "GET", "X-Forwarded-Uri", "/", "Forwarded", fwd)
	}
	for i := range 3 {
		r := ask(real)
		if want := []int{200, 200, 429}[i]; r.status != want {
			t.Fatalf("the real client's request %d: %d %s, want %d", i, r.status, r.body, want)
		}
	}
	for i := range 10 {
		spoof := `for=192.0.2.` + string(rune('0'+i)) + `;by="`
		r := ask(spoof + ", " + real)
		if r.status != 400 || r.header.Get("Content-Type") != "application/problem+json" {
			t.Fatalf("spoof %d: %d %s %s, want a 400 problem+json", i, r.status, r.header.Get("Content-Type"), r.body)
		}
	}
}

// TestPrintConfigRedactsStoreOptions (point 11): what --print-config
// prints (Config.Marshal) hides every credential among store_options and
// the upstream URL's password, and still parses.
func TestPrintConfigRedactsStoreOptions(t *testing.T) {
	cfg := mustParse(t, `
store: redis://:urlpass@127.0.0.1:6379/0
store_options:
  sentinel_username: watcher
  sentinel_password: s3ntinel-pw
  key_prefix: "sg:"
upstream: http://user:upstream-pw@127.0.0.1:3000
policies:
  - {name: free, limit: 2, window: 60s}
`)
	out, err := cfg.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	for _, secret := range []string{"urlpass", "s3ntinel-pw", "upstream-pw"} {
		if bytes.Contains(out, []byte(secret)) {
			t.Errorf("--print-config shows %q:\n%s", secret, out)
		}
	}
	for _, kept := range []string{"sentinel_username: watcher", "sentinel_password: xxxxx", "key_prefix: 'sg:'", "http://user:xxxxx@127.0.0.1:3000"} {
		if !bytes.Contains(out, []byte(kept)) {
			t.Errorf("--print-config lacks %q:\n%s", kept, out)
		}
	}
	if _, err := config.ParseConfig(out); err != nil {
		t.Errorf("the printed configuration does not parse: %v\n%s", err, out)
	}
	if cfg.StoreOptions["sentinel_password"] != "s3ntinel-pw" {
		t.Errorf("Marshal changed the configuration: %v", cfg.StoreOptions)
	}
}

// TestHandshakeErrorsThrottled (point 8): a client that fails TLS
// handshakes as fast as it connects makes a few log lines, which count
// every failure, and the metric counts each; what the client sent
// (garbage bytes, ALPN names) is never in the log.
func TestHandshakeErrorsThrottled(t *testing.T) {
	dir := t.TempDir()
	ca := tlstest.NewCA(t, "test-ca")
	certFile, keyFile := ca.WriteServer(t, dir, "server", "localhost")
	cfg := mustParse(t, "policies:\n  - {name: free, limit: 100, window: 60s}\n")
	cfg.TLS = config.TLSConfig{CertFile: certFile, KeyFile: keyFile}
	var logs syncBuffer
	e, shutdown := startLogged(t, cfg, &logs, server.WithClock(engine.NewManualClock()))
	const garbage, alpn = 150, 10
	begin := time.Now()
	for i := range garbage {
		c, err := net.Dial("tcp", e.srv.Addr())
		if err != nil {
			t.Fatal(err)
		}
		// Not a TLS record and not HTTP (which net/http answers 400
		// without logging).
		_, _ = fmt.Fprintf(c, "\x01\x02GARBAGE-%d-BYTES\r\n\r\n", i)
		_ = c.SetReadDeadline(time.Now().Add(30 * time.Second))
		_, _ = c.Read(make([]byte, 64)) // until the server closes it
		c.Close()
	}
	for range alpn {
		c, err := tls.Dial("tcp", e.srv.Addr(), &tls.Config{RootCAs: ca.Pool(), ServerName: "localhost", NextProtos: []string{"EVIL-ALPN-NAME"}})
		if err == nil {
			c.Close()
			t.Fatal("a handshake offering only an unknown ALPN name succeeded")
		}
	}
	// HTTP/2 connections whose preface is not HTTP/2's: Go quotes what
	// the client sent in its error.
	const preface = 10
	for range preface {
		c, err := tls.Dial("tcp", e.srv.Addr(), &tls.Config{RootCAs: ca.Pool(), ServerName: "localhost", NextProtos: []string{"h2"}})
		if err != nil {
			t.Fatal(err)
		}
		_, _ = c.Write([]byte("GET /EVIL-PREFACE HTTP/1.1\r\nHost: x\r\n\r\n"))
		_ = c.SetReadDeadline(time.Now().Add(30 * time.Second))
		_, _ = io.Copy(io.Discard, c) // until the server closes it
		c.Close()
	}
	counted := func(kind string) int {
		re := regexp.MustCompile(`slidegate_connection_errors_total\{kind="` + kind + `",listener="main"\} (\d+)`)
		m := re.FindSubmatch(e.do("GET", e.admin+"/metrics", "").body)
		if m == nil {
			return -1
		}
		got, _ := strconv.Atoi(string(m[1]))
		return got
	}
	for deadline := time.Now().Add(time.Minute); counted("tls_handshake") < garbage+alpn || counted("http2") < preface; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			break
		}
	}
	if got := counted("tls_handshake"); got != garbage+alpn {
		t.Fatalf("the metric counts %d failed handshakes, want %d", got, garbage+alpn)
	}
	if got := counted("http2"); got != preface {
		t.Fatalf("the metric counts %d HTTP/2 errors, want %d", got, preface)
	}
	checkThrottled(t, &logs, shutdown, "connection error", garbage+alpn+preface, time.Since(begin))
	for _, leak := range []string{"GARBAGE", "EVIL-ALPN", "EVIL-PREFACE"} {
		if strings.Contains(logs.String(), leak) {
			t.Errorf("the log echoes the client's bytes (%s):\n%s", leak, logs.String())
		}
	}
}

// networkAddr returns an address of this machine beyond loopback, or
// skips the test: the admin listener's peer must be one.
func networkAddr(t *testing.T) string {
	t.Helper()
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		t.Skip(err)
	}
	for _, a := range addrs {
		if n, ok := a.(*net.IPNet); ok {
			if ip, ok := netip.AddrFromSlice(n.IP); ok && ip.Unmap().Is4() && !ip.IsLoopback() && !ip.IsLinkLocalUnicast() {
				return ip.Unmap().String()
			}
		}
	}
	t.Skip("this machine has no IPv4 address beyond loopback")
	return ""
}

// TestAdminBeyondLoopbackNeedsToken (point 4): an admin listener on an
// address beyond loopback, without admin_token_file, refuses key
// operations and pprof to a peer on the network (403), while /metrics
// and the probes answer. A key spent on the main listener stays spent.
// With a token, the same peer gets them with the token only.
func TestAdminBeyondLoopbackNeedsToken(t *testing.T) {
	ip := networkAddr(t)
	cfg := mustParse(t, "policies:\n  - {name: free, limit: 2, window: 60s}\n")
	cfg.Admin = net.JoinHostPort(ip, "0")
	e := start(t, cfg, server.WithClock(engine.NewManualClock()))
	for range 2 {
		if r, _ := e.allow(`{"key":"mallory"}`); r.status != 200 {
			t.Fatalf("allow: %d %s", r.status, r.body)
		}
	}
	for _, c := range []struct{ method, path string }{
		{"DELETE", "/admin/keys?key=mallory"},
		{"GET", "/admin/keys?key=mallory"},
		{"GET", "/debug/pprof/"},
		{"GET", "/debug/pprof/cmdline"},
		{"GET", "/debug/pprof/heap"},
		{"GET", "/debug/pprof/symbol"},
		{"GET", "/debug//pprof/goroutine"},
	} {
		r := e.do(c.method, e.admin+c.path, "")
		if r.status == http.StatusMovedPermanently {
			r = e.do(c.method, e.admin+r.header.Get("Location"), "")
		}
		if r.status != 403 || !strings.Contains(string(r.body), "admin_token_file") {
			t.Errorf("%s %s from %s: %d %.200s, want 403 naming admin_token_file", c.method, c.path, ip, r.status, r.body)
		}
	}
	if r, _ := e.allow(`{"key":"mallory"}`); r.status != 429 {
		t.Errorf("after the refused reset: %d, want 429 (the key is still spent)", r.status)
	}
	for _, p := range []string{"/metrics", "/healthz", "/readyz"} {
		if r := e.do("GET", e.admin+p, ""); r.status != 200 {
			t.Errorf("GET %s: %d", p, r.status)
		}
	}

	tok := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(tok, []byte("s3cret-admin-token\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg.AdminTokenFile = tok
	e = start(t, cfg)
	if r := e.do("GET", e.admin+"/debug/pprof/cmdline", ""); r.status != 401 {
		t.Errorf("pprof without the token: %d", r.status)
	}
	if r := e.do("GET", e.admin+"/debug/pprof/cmdline", "", "Authorization", "Bearer s3cret-admin-token"); r.status != 200 {
		t.Errorf("pprof with the token: %d %.200s", r.status, r.body)
	}
	if r := e.do("DELETE", e.admin+"/admin/keys?key=mallory", "", "Authorization", "Bearer s3cret-admin-token"); r.status != 200 {
		t.Errorf("reset with the token: %d %.200s", r.status, r.body)
	}
}

// runsAs is what a Rails, Laravel or Symfony application behind the
// gateway runs a request as: a POST's X-HTTP-Method-Override (or
// sibling) header, else its _method query parameter, else its method.
func runsAs(r *http.Request) string {
	if r.Method == "POST" {
		for _, h := range []string{"X-HTTP-Method-Override", "X-HTTP-Method", "X-Method-Override", "X_HTTP_Method_Override"} {
			if v := r.Header.Get(h); v != "" {
				return strings.ToUpper(v)
			}
		}
		if v := r.URL.Query().Get("_method"); v != "" {
			return strings.ToUpper(v)
		}
	}
	return r.Method
}

// TestMethodOverrideGateway (point 10): with DELETE /account spent, no
// POST reaches the upstream as a DELETE: the override headers are
// dropped (the application runs the POST that was counted), and a
// _method=DELETE query parameter counts against DELETE /account.
func TestMethodOverrideGateway(t *testing.T) {
	var mu sync.Mutex
	var ran []string
	up := newUpstream(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		ran = append(ran, runsAs(r)+" "+r.URL.Path)
		mu.Unlock()
	}))
	cfg := mustParse(t, `
key: ip
policies:
  - {name: free, limit: 100, window: 60s}
  - {name: delete, limit: 1, window: 60s}
routes:
  - {method: DELETE, path: /account, limits: [{policy: delete}]}
`)
	cfg.Upstream = config.UpstreamURL(up)
	e := start(t, cfg, server.WithClock(engine.NewManualClock()))
	if r := e.do("DELETE", e.base+"/account", ""); r.status != 200 {
		t.Fatalf("first DELETE: %d %s", r.status, r.body)
	}
	if r := e.do("DELETE", e.base+"/account", ""); r.status != 429 {
		t.Fatalf("second DELETE: %d %s", r.status, r.body)
	}
	for _, h := range []string{"X-HTTP-Method-Override", "X-HTTP-Method", "X-Method-Override", "x-http-method-override"} {
		e.do("POST", e.base+"/account", "x", h, "DELETE")
	}
	// An underscore spelling, which CGI-style upstreams read as a dash.
	resp, _ := rawDo(t, e.srv.Addr(), "POST /account HTTP/1.1\r\nHost: x\r\nX_HTTP_Method_Override: DELETE\r\nContent-Length: 0\r\n\r\n")
	_ = resp
	for _, target := range []string{"/account?_method=DELETE", "/account?_method=delete&x=1", "/account?a=1&_method=Delete"} {
		if r := e.do("POST", e.base+target, "x"); r.status != 429 {
			t.Errorf("POST %s: %d, want 429 (counted as the DELETE the application runs)", target, r.status)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	for _, m := range ran {
		if strings.HasPrefix(m, "DELETE") && m != ran[0] {
			t.Errorf("the upstream ran %s after the limit of 1: %v", m, ran)
		}
	}
	if len(ran) != 6 {
		t.Errorf("the upstream ran %v, want the first DELETE and the 5 POSTs", ran)
	}
}

// TestMethodOverrideCheck (point 10): /v1/check, whose proxy forwards
// the override headers, counts a request as each method it names: with
// DELETE /account spent, a POST naming DELETE is refused, and a plain
// POST is not.
func TestMethodOverrideCheck(t *testing.T) {
	e := start(t, mustParse(t, checkConfig+`  - {method: DELETE, path: /account, limits: [{policy: upload, key: "const:x"}]}
`), server.WithClock(engine.NewManualClock()))
	const client = "203.0.113.50"
	if r := e.check("DELETE", "/account", client); r.status != 200 {
		t.Fatalf("first DELETE: %d %s", r.status, r.body)
	}
	for _, c := range []struct {
		uri string
		hdr []string
	}{
		{"/account", []string{"X-HTTP-Method-Override", "DELETE"}},
		{"/account", []string{"X-HTTP-Method", "delete"}},
		{"/account", []string{"X-Method-Override", "DELETE"}},
		{"/account?_method=DELETE", nil},
		{"/account", []string{"X-HTTP-Method-Override", "PATCH", "X-HTTP-Method", "DELETE"}},
	} {
		if r := e.check("POST", c.uri, client, c.hdr...); r.status != 429 {
			t.Errorf("POST %s %v: %d %s, want 429", c.uri, c.hdr, r.status, r.body)
		}
	}
	if r := e.check("POST", "/account", client); r.status != 200 {
		t.Errorf("a plain POST: %d %s, want 200 (DELETE's limit is not POST's)", r.status, r.body)
	}
	hdr := []string{"X-HTTP-Method-Override", "PUT", "X-HTTP-Method", "PATCH", "X-Method-Override", "GET"}
	if r := e.check("POST", "/account?_method=DELETE&_method=OPTIONS", client, hdr...); r.status != 400 {
		t.Errorf("five override methods: %d %s, want 400", r.status, r.body)
	}
}
