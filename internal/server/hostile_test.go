package server_test

// Tests of the server against hostile clients:
// route spellings, a key header sent twice, secrets in errors and logs,
// the admin listener's Host allow-list and token, spoofable headers, log
// floods and connection hoarding. Each goes through a real listener.

import (
	"bufio"
	"crypto/sha256"
	"encoding/hex"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/slidegate/slidegate/engine"
	"github.com/slidegate/slidegate/internal/server"
	"github.com/slidegate/slidegate/internal/server/config"
)

// TestRouteSpellings: with POST /login and GET /api
// spent, no other spelling of them reaches the upstream under the default
// policy: HEAD counts where GET is limited, path parameters after ";" do
// not escape a prefix.
func TestRouteSpellings(t *testing.T) {
	up, hits := upstream(t)
	cfg := mustParse(t, `
key: ip
policies:
  - {name: free, limit: 100, window: 60s}
  - {name: login, limit: 1, window: 60s}
  - {name: api, limit: 1, window: 60s}
routes:
  - {method: POST, path: /login, limits: [{policy: login}]}
  - {method: GET, path: /api, limits: [{policy: api}]}
`)
	cfg.Upstream = config.UpstreamURL(up.URL)
	e := start(t, cfg, server.WithClock(engine.NewManualClock()))
	if r := e.do("POST", e.base+"/login", ""); r.status != 200 {
		t.Fatalf("first POST /login: %d %s", r.status, r.body)
	}
	if r := e.do("GET", e.base+"/api/items", ""); r.status != 200 {
		t.Fatalf("first GET /api/items: %d %s", r.status, r.body)
	}
	before := hits.Load()
	for _, c := range []struct{ method, target string }{
		{"POST", "/login"},
		{"HEAD", "/api/items"},
		{"HEAD", "/api"},
		{"POST", "/login;jsessionid=1"},
		{"POST", "/login;"},
		{"POST", "/static/..;/login"},
		{"GET", "/api;v=2/items"},
		{"GET", "/api/items;x=1"},
	} {
		resp, _ := rawDo(t, e.base[len("http://"):], c.method+" "+c.target+" HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
		if resp.StatusCode != 429 {
			t.Errorf("%s %s: %d, want 429 (the route's limit is spent)", c.method, c.target, resp.StatusCode)
		}
	}
	if n := hits.Load() - before; n != 0 {
		t.Errorf("%d respellings reached the upstream", n)
	}
	// Other routes and methods are unaffected.
	if r := e.do("GET", e.base+"/login", ""); r.status != 200 {
		t.Errorf("GET /login (no route): %d", r.status)
	}
	if r := e.do("POST", e.base+"/api/items", ""); r.status != 200 {
		t.Errorf("POST /api/items (no route for POST): %d", r.status)
	}
}

// TestKeyHeaderTwice: X-API-Key on two lines is
// ambiguous, answered 400 and not forwarded, so a decoy beside the real
// key gets no fresh bucket.
func TestKeyHeaderTwice(t *testing.T) {
	up, hits := upstream(t)
	cfg := mustParse(t, "key: header:X-API-Key\npolicies:\n  - {name: free, limit: 2, window: 60s}\n")
	cfg.Upstream = config.UpstreamURL(up.URL)
	e := start(t, cfg, server.WithClock(engine.NewManualClock()))
	addr := e.base[len("http://"):]
	allowed, bad := 0, 0
	for i := range 6 {
		resp, _ := rawDo(t, addr, "GET / HTTP/1.1\r\nHost: x\r\nX-API-Key: decoy"+string(rune('a'+i))+"\r\nX-API-Key: REALKEY\r\nConnection: close\r\n\r\n")
		switch resp.StatusCode {
		case 200:
			allowed++
		case 400:
			bad++
		}
	}
	if allowed != 0 || bad != 6 || hits.Load() != 0 {
		t.Errorf("6 requests with the key header twice: %d allowed, %d answered 400, %d forwarded", allowed, bad, hits.Load())
	}
	for i := range 3 {
		want := 200
		if i == 2 {
			want = 429
		}
		if r := e.do("GET", e.base+"/", "", "X-API-Key", "REALKEY"); r.status != want {
			t.Errorf("REALKEY request %d: %d, want %d", i+1, r.status, want)
		}
	}
}

// TestStorePasswordNeverPrinted: a store URL that
// does not parse (base64 passwords hold / and +; #, spaces and quotes get
// pasted) is refused without its password.
func TestStorePasswordNeverPrinted(t *testing.T) {
	var urls []string
	for _, pw := range []string{"Zm9v/YmFy+S3cr3t", "S3cr3t#frag", "S3cr3t with spaces", `S3cr3t"quote`, "1234/S3cr3t", "S3cr3t%zz"} {
		urls = append(urls, "redis://:"+pw+"@127.0.0.1:6379/0")
	}
	// Without a scheme, or without its //, no password can be told apart.
	urls = append(urls, "//:S3cr3t@127.0.0.1:6379", "redis:/:S3cr3t@127.0.0.1:6379", ":S3cr3t@127.0.0.1:6379")
	for _, u := range urls {
		cfg := mustParse(t, "policies:\n  - {name: free, limit: 5, window: 60s}\n")
		cfg.Store = u
		_, _, err := server.Check(cfg, server.WithStore("redis", memoryStore(nil)))
		if err != nil && strings.Contains(err.Error(), "S3cr3t") {
			t.Errorf("store %q: %v", u, err)
		}
		if err == nil {
			out, merr := cfg.Marshal()
			if merr != nil || strings.Contains(string(out), "S3cr3t") {
				t.Errorf("store %q: Marshal: %v\n%s", u, merr, out)
			}
		}
	}
}

// TestAdminKeyNotLogged: an API key is a credential,
// so /admin/keys logs its hash, never the key.
func TestAdminKeyNotLogged(t *testing.T) {
	cfg := mustParse(t, "policies:\n  - {name: free, limit: 3, window: 60s}\n")
	var logs syncBuffer
	e := start(t, cfg, server.WithLogger(slog.New(slog.NewTextHandler(&logs, nil))))
	const key = "sk_live_4eC39HqLyjWDarjtT1zdp7dc"
	for _, m := range []string{"GET", "DELETE"} {
		if r := e.do(m, e.admin+"/admin/keys?"+url.Values{"key": {key}}.Encode(), ""); r.status != 200 {
			t.Fatalf("%s /admin/keys: %d %s", m, r.status, r.body)
		}
	}
	sum := sha256.Sum256([]byte(key))
	if l := logs.String(); strings.Contains(l, "sk_live") || strings.Count(l, "sha256:"+hex.EncodeToString(sum[:8])) != 2 {
		t.Errorf("log:\n%s", l)
	}
}

// TestMethodCase: a method in lower case ("post",
// which Django and Flask serve as POST) is answered 400 and not
// forwarded, so it cannot dodge the POST route's limit.
func TestMethodCase(t *testing.T) {
	up, hits := upstream(t)
	cfg := mustParse(t, `
policies:
  - {name: free, limit: 100, window: 60s}
  - {name: login, limit: 1, window: 60s}
routes:
  - {method: POST, path: /login, limits: [{policy: login}]}
`)
	cfg.Upstream = config.UpstreamURL(up.URL)
	e := start(t, cfg, server.WithClock(engine.NewManualClock()))
	addr := e.base[len("http://"):]
	for _, m := range []string{"post", "Post", "pOST", "get"} {
		resp, body := rawDo(t, addr, m+" /login HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
		if resp.StatusCode != 400 || !strings.Contains(string(body), "lower-case") {
			t.Errorf("%s /login: %d %s", m, resp.StatusCode, body)
		}
	}
	if hits.Load() != 0 {
		t.Errorf("%d requests with a lower-case method reached the upstream", hits.Load())
	}
	if r := e.do("POST", e.base+"/login", ""); r.status != 200 {
		t.Errorf("POST /login: %d", r.status)
	}
}

// adminDo sends one request to the admin listener with the given Host
// header and Authorization (none when empty).
func adminDo(t *testing.T, e *env, method, path, host, auth string) int {
	t.Helper()
	req, err := http.NewRequest(method, e.admin+path, nil)
	if err != nil {
		t.Fatal(err)
	}
	if host != "" {
		req.Host = host
	}
	if auth != "" {
		req.Header.Set("Authorization", auth)
	}
	resp, err := e.client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode
}

// TestAdminHostAllowList: the admin listener answers
// loopback names and its own address only, so a page whose name is
// rebound to 127.0.0.1 cannot reset keys; admin_hosts widens the list.
func TestAdminHostAllowList(t *testing.T) {
	cfg := mustParse(t, "policies:\n  - {name: free, limit: 3, window: 60s}\n")
	e := start(t, cfg)
	reset := "/admin/keys?policy=free&key=alice"
	for _, c := range []struct {
		method, path, host string
		want               int
	}{
		{"DELETE", reset, "rebind.example:9090", 403},
		{"GET", reset, "rebind.example", 403},
		{"GET", "/metrics", "rebind.example:9090", 403},
		{"GET", "/debug/pprof/cmdline", "evil.localhost.example", 403},
		{"GET", reset, "10.1.2.3:9090", 403},
		{"DELETE", reset, "127.0.0.1:9090", 200},
		{"DELETE", reset, "localhost:9090", 200},
		{"DELETE", reset, "LOCALHOST", 200},
		{"DELETE", reset, "[::1]:9090", 200},
		{"GET", "/healthz", "rebind.example:9090", 200}, // probes send the pod's address
		{"GET", "/readyz", "rebind.example:9090", 200},
	} {
		if got := adminDo(t, e, c.method, c.path, c.host, ""); got != c.want {
			t.Errorf("%s %s with Host %s: %d, want %d", c.method, c.path, c.host, got, c.want)
		}
	}
	cfg.AdminHosts = []string{"admin.internal", "10.0.0.0/8"}
	e2 := start(t, cfg)
	for host, want := range map[string]int{"admin.internal:9090": 200, "10.1.2.3": 200, "rebind.example": 403, "127.0.0.1": 200} {
		if got := adminDo(t, e2, "GET", reset, host, ""); got != want {
			t.Errorf("admin_hosts %v, Host %s: %d, want %d", cfg.AdminHosts, host, got, want)
		}
	}
	cfg.AdminHosts = []string{"*"}
	if got := adminDo(t, start(t, cfg), "GET", reset, "rebind.example", ""); got != 200 {
		t.Errorf("admin_hosts [*]: %d", got)
	}
	cfg.AdminHosts = []string{"not a host"}
	if err := cfg.Validate(); err == nil || !strings.Contains(err.Error(), "admin_hosts[0]") {
		t.Errorf("a bad admin_hosts entry: %v", err)
	}
}

// TestAdminToken: with admin_token_file, every admin
// request but the probes needs the bearer token.
func TestAdminToken(t *testing.T) {
	path := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(path, []byte("  s3cret-admin-token\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg := mustParse(t, "policies:\n  - {name: free, limit: 3, window: 60s}\n")
	cfg.AdminTokenFile = path
	var logs syncBuffer
	e := start(t, cfg, server.WithLogger(slog.New(slog.NewTextHandler(&logs, nil))))
	reset := "/admin/keys?policy=free&key=alice"
	for _, c := range []struct {
		path, auth string
		want       int
	}{
		{reset, "", 401},
		{reset, "Bearer wrong", 401},
		{reset, "Bearer s3cret-admin-token-and-more", 401},
		{reset, "Basic czNjcmV0LWFkbWluLXRva2Vu", 401},
		{reset, "Bearer s3cret-admin-token", 200},
		{reset, "bearer s3cret-admin-token", 200},
		{"/metrics", "", 401},
		{"/metrics", "Bearer s3cret-admin-token", 200},
		{"/debug/pprof/cmdline", "", 401},
		{"/healthz", "", 200},
		{"/readyz", "", 200},
	} {
		if got := adminDo(t, e, "GET", c.path, "", c.auth); got != c.want {
			t.Errorf("GET %s with %q: %d, want %d", c.path, c.auth, got, c.want)
		}
	}
	if strings.Contains(logs.String(), "s3cret") {
		t.Errorf("the token is in the log:\n%s", logs.String())
	}
	if out, err := cfg.Marshal(); err != nil || strings.Contains(string(out), "s3cret") {
		t.Errorf("Marshal: %v", err)
	}
	// An empty or missing file is a configuration error.
	empty := filepath.Join(t.TempDir(), "empty")
	_ = os.WriteFile(empty, []byte("\n"), 0o600)
	for _, f := range []string{empty, filepath.Join(t.TempDir(), "missing")} {
		cfg.AdminTokenFile = f
		if _, err := server.New(cfg, server.WithLogger(quiet)); err == nil || !strings.Contains(err.Error(), "admin_token_file") {
			t.Errorf("admin_token_file %s: %v", f, err)
		}
	}
}

// TestSpoofableHeadersDropped: headers upstreams take
// for the client's address or URL never reach the upstream from a client;
// drop_headers adds more; the client_ip_header is passed on from a trusted
// proxy.
func TestSpoofableHeadersDropped(t *testing.T) {
	var mu sync.Mutex
	var got http.Header
	up := newUpstream(t, http.HandlerFunc(func(_ http.ResponseWriter, r *http.Request) {
		mu.Lock()
		got = r.Header.Clone()
		mu.Unlock()
	}))
	sent := []string{"X-Real-IP", "True-Client-IP", "X-Original-URL", "X-Rewrite-URL", "X-Client-IP", "CF-Connecting-IP", "X-Internal-User",
		"X_Real_IP", "True_Client_IP", "X_Original_URL", "X_Forwarded_For"} // CGI reads _ as -
	send := func(e *env) http.Header {
		t.Helper()
		var hdr []string
		for _, h := range sent {
			hdr = append(hdr, h, "198.51.100.7")
		}
		hdr = append(hdr, "X-Kept", "yes", "X_Kept_Too", "yes")
		req, err := http.NewRequest("GET", e.base+"/", nil)
		if err != nil {
			t.Fatal(err)
		}
		for i := 0; i+1 < len(hdr); i += 2 {
			req.Header[hdr[i]] = []string{hdr[i+1]} // as spelt: http.Header.Set would canonicalize
		}
		resp, err := e.client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != 200 {
			t.Fatalf("gateway: %d", resp.StatusCode)
		}
		mu.Lock()
		defer mu.Unlock()
		return got
	}
	cfg := mustParse(t, "drop_headers: [X-Internal-User]\npolicies:\n  - {name: free, limit: 100, window: 60s}\n")
	cfg.Upstream = config.UpstreamURL(up)
	h := send(start(t, cfg))
	for _, name := range sent {
		if v := h.Values(name); len(v) > 0 {
			t.Errorf("%s reached the upstream: %q", name, v)
		}
		for k, v := range h {
			if strings.EqualFold(k, name) {
				t.Errorf("%s reached the upstream as %s: %q", name, k, v)
			}
		}
	}
	if h.Get("X-Kept") != "yes" || len(h["X_kept_too"]) == 0 {
		t.Errorf("an ordinary header was dropped: %v", h)
	}
	// From a trusted proxy, the client_ip_header it wrote is passed on;
	// the rest are still dropped.
	cfg.TrustedProxies, cfg.ClientIPHeader = []string{"127.0.0.1"}, "X-Real-IP"
	h = send(start(t, cfg))
	if h.Get("X-Real-IP") != "198.51.100.7" || h.Get("True-Client-IP") != "" || h.Get("X-Original-URL") != "" {
		t.Errorf("behind a trusted proxy: X-Real-IP %q, True-Client-IP %q, X-Original-URL %q", h.Get("X-Real-IP"), h.Get("True-Client-IP"), h.Get("X-Original-URL"))
	}
}

// TestRefusalClosesConnection: a gateway 429 closes
// its connection, so a refused client holds no slot with it.
func TestRefusalClosesConnection(t *testing.T) {
	up, _ := upstream(t)
	cfg := mustParse(t, "policies:\n  - {name: free, limit: 1, window: 60s}\n")
	cfg.Upstream = config.UpstreamURL(up.URL)
	e := start(t, cfg, server.WithClock(engine.NewManualClock()))
	c, err := net.Dial("tcp", e.base[len("http://"):])
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(20 * time.Second))
	br := bufio.NewReader(c)
	for i, want := range []int{200, 429} {
		if _, err := io.WriteString(c, "GET / HTTP/1.1\r\nHost: x\r\n\r\n"); err != nil {
			t.Fatalf("request %d: %v", i+1, err)
		}
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatalf("request %d: %v", i+1, err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != want {
			t.Fatalf("request %d: %d, want %d", i+1, resp.StatusCode, want)
		}
	}
	if _, err := br.ReadByte(); err != io.EOF {
		t.Errorf("after the 429 the connection is still open (read: %v)", err)
	}
}

// TestCheckRouteSpellings: /v1/check, which cannot
// refuse the original request's method, counts "post" as POST, HEAD as
// GET and drops path parameters, as the gateway's routes do.
func TestCheckRouteSpellings(t *testing.T) {
	cfg := mustParse(t, `
key: ip
trusted_proxies: [127.0.0.1/32]
policies:
  - {name: free, limit: 100, window: 60s}
  - {name: login, limit: 1, window: 60s}
  - {name: api, limit: 1, window: 60s}
routes:
  - {method: POST, path: /login, limits: [{policy: login}]}
  - {method: GET, path: /api, limits: [{policy: api}]}
`)
	e := start(t, cfg, server.WithClock(engine.NewManualClock()))
	if r := e.check("POST", "/login", "10.0.0.1"); r.status != 200 {
		t.Fatalf("first POST /login: %d %s", r.status, r.body)
	}
	if r := e.check("GET", "/api/items", "10.0.0.1"); r.status != 200 {
		t.Fatalf("first GET /api/items: %d %s", r.status, r.body)
	}
	for _, c := range []struct{ method, uri string }{
		{"post", "/login"}, {"Post", "/login"}, {"POST", "/login;jsessionid=1"},
		{"HEAD", "/api/items"}, {"head", "/api"}, {"GET", "/api;x=1/items"},
	} {
		if r := e.check(c.method, c.uri, "10.0.0.1"); r.status != 429 {
			t.Errorf("check %s %s: %d, want 429", c.method, c.uri, r.status)
		}
	}
}

// TestAdminTokenReload: a reload reads admin_token_file again, so a
// rotated token takes effect without a restart; admin_hosts too.
func TestAdminTokenReload(t *testing.T) {
	path := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(path, []byte("first-token\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg := mustParse(t, "policies:\n  - {name: free, limit: 3, window: 60s}\n")
	cfg.AdminTokenFile = path
	e := start(t, cfg)
	if got := adminDo(t, e, "GET", "/metrics", "", "Bearer first-token"); got != 200 {
		t.Fatalf("first token: %d", got)
	}
	if err := os.WriteFile(path, []byte("second-token\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg.AdminHosts = []string{"admin.internal"}
	if err := e.srv.Reload(cfg); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		host, auth string
		want       int
	}{
		{"", "Bearer first-token", 401},
		{"", "Bearer second-token", 200},
		{"admin.internal:9090", "Bearer second-token", 200},
		{"rebind.example", "Bearer second-token", 403},
	} {
		if got := adminDo(t, e, "GET", "/metrics", c.host, c.auth); got != c.want {
			t.Errorf("after the reload, Host %q with %q: %d, want %d", c.host, c.auth, got, c.want)
		}
	}
	// A token file that went missing fails the reload; the token in
	// force keeps working.
	_ = os.Remove(path)
	if err := e.srv.Reload(cfg); err == nil || !strings.Contains(err.Error(), "admin_token_file") {
		t.Errorf("reload without the token file: %v", err)
	}
	if got := adminDo(t, e, "GET", "/metrics", "", "Bearer second-token"); got != 200 {
		t.Errorf("after the failed reload: %d", got)
	}
}

// TestKeyHeaderUnderscoreDropped: a second spelling
// of the key header with _ for - (which a CGI-style upstream reads as the
// same header) is not forwarded beside the key the gateway counted.
func TestKeyHeaderUnderscoreDropped(t *testing.T) {
	var mu sync.Mutex
	var got http.Header
	up := newUpstream(t, http.HandlerFunc(func(_ http.ResponseWriter, r *http.Request) {
		mu.Lock()
		got = r.Header.Clone()
		mu.Unlock()
	}))
	cfg := mustParse(t, "key: header:X-API-Key\ntier_header: X-Plan\npolicies:\n  - {name: free, limit: 100, window: 60s}\n")
	cfg.Upstream = config.UpstreamURL(up)
	e := start(t, cfg)
	req, err := http.NewRequest("GET", e.base+"/", nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header["X-Api-Key"] = []string{"REALKEY"}
	req.Header["X_API_Key"] = []string{"decoy"}
	req.Header["X_Plan"] = []string{"paid"}
	resp, err := e.client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("gateway: %d", resp.StatusCode)
	}
	mu.Lock()
	defer mu.Unlock()
	if got.Get("X-API-Key") != "REALKEY" {
		t.Errorf("the key header: %q", got.Get("X-API-Key"))
	}
	for k := range got {
		if strings.Contains(k, "_") {
			t.Errorf("%s reached the upstream", k)
		}
	}
}
