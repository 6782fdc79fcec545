package server_test

// Tests of the server against hostile clients and operator mistakes,
// one or more per point of docs/operations.md's hardening section. Every
// one goes through a real listener.

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/slidegate/slidegate/engine"
	"github.com/slidegate/slidegate/httplimit"
	"github.com/slidegate/slidegate/internal/server"
	"github.com/slidegate/slidegate/internal/server/config"
)

// rawDo sends one request written by hand (bytes a Go client would not
// send) on a fresh connection and returns the response.
func rawDo(t *testing.T, addr, request string) (*http.Response, []byte) {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
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

// TestClientIPHeaderIsTheOnlyOneBelieved (point 1): behind a trusted
// proxy that appends X-Forwarded-For, a client-sent Forwarded header must
// not choose the key.
func TestClientIPHeaderIsTheOnlyOneBelieved(t *testing.T) {
	up, _ := upstream(t)
	cfg := mustParse(t, `
key: ip
trusted_proxies: [127.0.0.1]
policies:
  - {name: free, limit: 5, window: 60s}
`)
	cfg.Upstream = config.UpstreamURL(up.URL)
	e := start(t, cfg, server.WithClock(engine.NewManualClock()))
	allowed := 0
	for i := range 8 {
		r := e.do("GET", e.base+"/", "", "Forwarded", fmt.Sprintf("for=198.51.100.%d", i+1))
		if r.status == 200 {
			allowed++
		}
	}
	if allowed != 5 {
		t.Errorf("8 requests with 8 Forwarded values: %d allowed at a limit of 5", allowed)
	}

	// client_ip_header: Forwarded believes that header, and only it.
	cfg.ClientIPHeader = "Forwarded"
	e2 := start(t, cfg, server.WithClock(engine.NewManualClock()))
	for i, c := range []struct {
		hdr  []string
		want int
	}{
		{[]string{"Forwarded", "for=198.51.100.1"}, 200},
		{[]string{"Forwarded", "for=198.51.100.1", "X-Forwarded-For", "198.51.100.77"}, 200},
	} {
		for range 5 {
			e2.do("GET", e2.base+"/", "", c.hdr...)
		}
		if r := e2.do("GET", e2.base+"/", "", c.hdr...); r.status != 429 {
			t.Errorf("case %d: the sixth request of client 198.51.100.1 got %d: X-Forwarded-For chose a key", i, r.status)
		}
	}
}

// TestRouteKeysBounded (point 2): one route spelt many ways is one key,
// long paths and header blocks are refused, and the bounds are those
// documented.
func TestRouteKeysBounded(t *testing.T) {
	up, hits := upstream(t)
	cfg := mustParse(t, `
key: ip+route
policies:
  - {name: free, limit: 1, window: 60s}
`)
	cfg.Upstream = config.UpstreamURL(up.URL)
	e := start(t, cfg, server.WithClock(engine.NewManualClock()))
	addr := strings.TrimPrefix(e.base, "http://")
	get := func(target string) int {
		resp, _ := rawDo(t, addr, "GET "+target+" HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
		return resp.StatusCode
	}
	if s := get("/a"); s != 200 {
		t.Fatalf("/a: %d", s)
	}
	for _, p := range []string{"/a/", "/./a", "//a", "/a%2f", "/b/../a", "/a/."} {
		if s := get(p); s != 429 {
			t.Errorf("%s got %d after /a used the route's only request: a fresh limit", p, s)
		}
	}
	if s := get("/A"); s != 200 {
		t.Errorf("/A: %d; routes are case-sensitive by default", s)
	}
	before := hits.Load()
	if s := get("/" + strings.Repeat("x", httplimit.MaxKeyLen)); s != 400 {
		t.Errorf("a path over MaxKeyLen: %d, want 400", s)
	}
	// A 1 MB path is over max_header_bytes: refused before any handler.
	if s := get("/" + strings.Repeat("y", 1<<20)); s != http.StatusRequestHeaderFieldsTooLarge {
		t.Errorf("a 1 MB path: %d, want 431", s)
	}
	if hits.Load() != before {
		t.Error("a refused long path reached the upstream")
	}
	big := "GET /c HTTP/1.1\r\nHost: x\r\nX-Pad: " + strings.Repeat("p", config.DefaultMaxHeaderBytes+4096) + "\r\nConnection: close\r\n\r\n"
	if resp, _ := rawDo(t, addr, big); resp.StatusCode != http.StatusRequestHeaderFieldsTooLarge {
		t.Errorf("a header block over the default max_header_bytes: %d, want 431", resp.StatusCode)
	}

	cfg.RouteFoldCase = true
	e2 := start(t, cfg, server.WithClock(engine.NewManualClock()))
	addr2 := strings.TrimPrefix(e2.base, "http://")
	for i, p := range []string{"/Users/x", "/users/X/", "/USERS/./x"} {
		resp, _ := rawDo(t, addr2, "GET "+p+" HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
		if want := map[bool]int{true: 200, false: 429}[i == 0]; resp.StatusCode != want {
			t.Errorf("route_fold_case, %s: %d, want %d", p, resp.StatusCode, want)
		}
	}
}

// TestTierHeaderOffByDefault (point 4): the built-in configuration trusts
// no tier header, and a request naming two tiers is refused.
func TestTierHeaderOffByDefault(t *testing.T) {
	up, _ := upstream(t)
	cfg := config.DefaultConfig()
	cfg.Listen, cfg.Admin, cfg.Upstream = "127.0.0.1:0", "off", config.UpstreamURL(up.URL)
	e := start(t, cfg)
	r := e.do("GET", e.base+"/", "", "X-Plan", "paid")
	if r.status != 200 || r.header.Get("RateLimit-Policy") != `"free";q=100;w=60` {
		t.Errorf("X-Plan: paid with the built-in configuration: %d, policy %q; want the free policy", r.status, r.header.Get("RateLimit-Policy"))
	}

	cfg.TierHeader = "X-Plan"
	e2 := start(t, cfg)
	addr := strings.TrimPrefix(e2.base, "http://")
	for _, hdrs := range []string{"X-Plan: free\r\nX-Plan: paid\r\n", "X-Plan: free, paid\r\n"} {
		resp, body := rawDo(t, addr, "GET / HTTP/1.1\r\nHost: x\r\n"+hdrs+"Connection: close\r\n\r\n")
		if resp.StatusCode != 400 || !bytes.Contains(body, []byte("more than once")) {
			t.Errorf("%q: %d %s", hdrs, resp.StatusCode, body)
		}
	}
}

// memoryStore is a store factory for URLs of a scheme the test names,
// backed by the engine: the tests of logging and reloads need a store
// URL, and what they check is what the server prints, not the store.
func memoryStore(got *string) server.StoreFactory {
	return func(_ context.Context, spec server.StoreSpec) (server.Store, error) {
		if got != nil {
			*got = spec.URL
		}
		var out []engine.Backend
		for _, p := range spec.Policies {
			l, err := engine.New(p)
			if err != nil {
				return server.Store{}, err
			}
			out = append(out, l)
		}
		return server.Store{Backends: out}, nil // no group: one limit per request
	}
}

// syncBuffer is a bytes.Buffer for a logger written from several
// goroutines.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// TestSecretsRedacted (point 5): a store password is never logged,
// printed or served by /debug/pprof/cmdline, and the URL can come from a
// file.
func TestSecretsRedacted(t *testing.T) {
	const url = "redis://:s3cret-pw@127.0.0.1:6379/0"
	cfg := mustParse(t, "policies:\n  - {name: free, limit: 5, window: 60s}\n")
	cfg.Store = url
	var logs syncBuffer
	var got string
	s, err := server.New(cfg, server.WithLogger(slog.New(slog.NewTextHandler(&logs, nil))), server.WithStore("redis", memoryStore(&got)))
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Start(); err != nil {
		t.Fatal(err)
	}
	args := os.Args
	os.Args = []string{"slidegate", "serve", "--store", url}
	defer func() { os.Args = args }()
	resp, err := http.Get("http://" + s.AdminAddr() + "/debug/pprof/cmdline")
	if err != nil {
		t.Fatal(err)
	}
	cmdline, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	_ = s.Shutdown(context.Background())
	if got != url {
		t.Errorf("the store was given %q", got)
	}
	if strings.Contains(logs.String(), "s3cret") || !strings.Contains(logs.String(), "redis://:xxxxx@127.0.0.1:6379/0") {
		t.Errorf("log:\n%s", logs.String())
	}
	if strings.Contains(string(cmdline), "s3cret") || !strings.Contains(string(cmdline), "redis://:xxxxx@") {
		t.Errorf("/debug/pprof/cmdline: %q", cmdline)
	}
	out, err := cfg.Marshal()
	if err != nil || bytes.Contains(out, []byte("s3cret")) {
		t.Errorf("Marshal: %v\n%s", err, out)
	}
	// A store URL with a bad port is refused without echoing the password.
	bad := cfg
	bad.Store = "redis://:s3cret-pw@host:port/0"
	if err := bad.Validate(); err == nil || strings.Contains(err.Error(), "s3cret") {
		t.Errorf("bad store URL: %v", err)
	}

	// store_file: the URL is read from the file.
	path := filepath.Join(t.TempDir(), "store-url")
	if err := os.WriteFile(path, []byte(url+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg.Store, cfg.StoreFile = "", path
	got = ""
	e := start(t, cfg, server.WithStore("redis", memoryStore(&got)))
	if got != url {
		t.Errorf("store_file: the store was given %q", got)
	}
	if _, d := e.allow(`{"key":"a"}`); !d.Allowed {
		t.Errorf("decision with a store from store_file: %+v", d)
	}
	cfg.Store = url
	if err := cfg.Validate(); err == nil || !strings.Contains(err.Error(), "store_file") || strings.Contains(err.Error(), "s3cret") {
		t.Errorf("store and store_file both set: %v", err)
	}
}

// TestAnswersLeakNothing (point 7): 5xx answers say what failed, not
// where or how; the decision API takes only application/json and exact
// field names, and its errors name fields, not Go types.
func TestAnswersLeakNothing(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead := l.Addr().String()
	l.Close()
	cfg := mustParse(t, "key: header:X-Client\npolicies:\n  - {name: free, limit: 5, window: 60s}\n")
	cfg.Upstream = config.UpstreamURL("http://" + dead)
	var logs syncBuffer
	e := start(t, cfg, server.WithLogger(slog.New(slog.NewTextHandler(&logs, nil))))
	r := e.do("GET", e.base+"/", "", "X-Client", "c")
	if r.status != 502 || bytes.Contains(r.body, []byte(dead)) || bytes.Contains(r.body, []byte("refused")) || !bytes.Contains(r.body, []byte("upstream is unavailable")) {
		t.Errorf("502 body: %s", r.body)
	}
	if !strings.Contains(logs.String(), dead) {
		t.Errorf("the log lacks the detail:\n%s", logs.String())
	}

	api := start(t, mustParse(t, apiConfig), server.WithClock(engine.NewManualClock()))
	for _, ct := range []string{"text/plain", "application/x-www-form-urlencoded", "multipart/form-data; boundary=x", ""} {
		r := api.do("POST", api.base+"/v1/allow", `{"key":"victim","cost":5}`, "Content-Type", ct)
		if r.status != http.StatusUnsupportedMediaType {
			t.Errorf("Content-Type %q: %d, want 415", ct, r.status)
		}
	}
	if r := api.do("POST", api.base+"/v1/allow", `{"key":"ok"}`, "Content-Type", "application/json; charset=utf-8"); r.status != 200 {
		t.Errorf("application/json; charset=utf-8: %d %s", r.status, r.body)
	}
	if _, d := api.allow(`{"key":"victim","cost":5}`); !d.Allowed {
		t.Errorf("a refused cross-site POST spent the victim's quota: %+v", d)
	}
	for body, want := range map[string]string{
		`{"KEY":"a"}`:              `unknown field \"KEY\"`,
		`{"key":"b","Cost":5}`:     `unknown field \"Cost\"`,
		`{"key":7}`:                `\"key\" must be a string`,
		`{"key":"a","cost":"1"}`:   `\"cost\" must be a whole number`,
		`{"key":"a","cost":1.5}`:   `\"cost\" must be a whole number`,
		`{"key":"a","policy":[]}`:  `\"policy\" must be a string`,
		`[{"key":"a"}]`:            `want an object`,
		`{"key":"a","cost":1e400}`: `\"cost\" must be a whole number`,
	} {
		r := api.do("POST", api.base+"/v1/allow", body)
		if r.status != 400 || !strings.Contains(string(r.body), want) || strings.Contains(string(r.body), "Go ") || strings.Contains(string(r.body), "AllowRequest") {
			t.Errorf("%s: %d %s, want 400 with %s", body, r.status, r.body, want)
		}
	}
	r = api.do("POST", api.base+"/v1/allow/batch", `[{"key":"a"},{"Key":"b"}]`)
	if r.status != 400 || !strings.Contains(string(r.body), `item 1: malformed JSON: unknown field \"Key\"`) {
		t.Errorf("batch with a miscased field: %d %s", r.status, r.body)
	}
}

// TestKeysNotUTF8 (point 13): keys that encoding/json would turn into
// the same U+FFFD string are refused, so two clients never merge.
func TestKeysNotUTF8(t *testing.T) {
	e := start(t, mustParse(t, "policies:\n  - {name: free, limit: 100, window: 60s}\n"), server.WithClock(engine.NewManualClock()))
	for _, body := range []string{
		"{\"key\":\"coll\xff\",\"cost\":50}",
		"{\"key\":\"coll\xfe\",\"cost\":50}",
		`{"key":"coll\ud800","cost":50}`,
		`{"key":"coll\udfff","cost":50}`,
		"{\"key\":\"coll\xef\xbf\xbd\",\"cost\":50}", // U+FFFD itself
	} {
		r := e.do("POST", e.base+"/v1/allow", body)
		if r.status != 400 || !strings.Contains(string(r.body), "UTF-8") {
			t.Errorf("%q: %d %s", body, r.status, r.body)
		}
	}
	r := e.do("POST", e.base+"/v1/allow/batch", "[{\"key\":\"coll\xfd\"}]")
	if r.status != 400 || !strings.Contains(string(r.body), "UTF-8") {
		t.Errorf("batch: %d %s", r.status, r.body)
	}
	// Valid non-ASCII keys are distinct keys.
	for _, k := range []string{"coll\u00e9", "coll\u00e8"} {
		if _, d := e.allow(fmt.Sprintf(`{"key":%q,"cost":100}`, k)); !d.Allowed {
			t.Errorf("key %q: %+v", k, d)
		}
	}
}

// TestTrustedProxyIPv4Mapped: an IPv4-mapped range of trusted_proxies
// matches the IPv4 peers it means.
func TestTrustedProxyIPv4Mapped(t *testing.T) {
	const pol = "policies:\n  - {name: free, limit: 5, window: 60s}\n"
	up, _ := upstream(t)
	cfg := mustParse(t, "trusted_proxies: ['::ffff:127.0.0.0/104']\n"+pol)
	cfg.Upstream = config.UpstreamURL(up.URL)
	e := start(t, cfg, server.WithClock(engine.NewManualClock()))
	for i := range 6 {
		if r := e.do("GET", e.base+"/", "", "X-Forwarded-For", fmt.Sprintf("198.51.100.%d", i)); r.status != 200 {
			t.Errorf("client %d behind the trusted proxy ::ffff:127.0.0.0/104: %d (the range never matched)", i, r.status)
		}
	}
}

// TestGatewayTimeouts (point 6): a hung upstream is answered 504 after
// upstream_header_timeout, a client that stops reading is cut off after
// write_timeout (so the upstream connection is released), and the admin
// listener does not wait forever for a slow body.
func TestGatewayTimeouts(t *testing.T) {
	hang := make(chan struct{})
	defer close(hang)
	released := make(chan struct{}, 1)
	up := newUpstream(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/stream" {
			// Write until the gateway stops reading (the client stalled
			// and was cut off), then report it.
			chunk := bytes.Repeat([]byte("z"), 64<<10)
			for {
				if _, err := w.Write(chunk); err != nil {
					released <- struct{}{}
					return
				}
			}
		}
		select {
		case <-hang:
		case <-r.Context().Done():
		}
	}))
	cfg := mustParse(t, `
key: header:X-Client
upstream_header_timeout: 50ms
write_timeout: 300ms
read_timeout: 200ms
policies:
  - {name: free, limit: 100, window: 60s}
`)
	cfg.Upstream = config.UpstreamURL(up)
	e := start(t, cfg)
	r := e.do("GET", e.base+"/hang", "", "X-Client", "c")
	if r.status != http.StatusGatewayTimeout || !bytes.Contains(r.body, []byte("did not answer in time")) {
		t.Errorf("hung upstream: %d %s", r.status, r.body)
	}

	// A client that never reads its response.
	c, err := net.Dial("tcp", strings.TrimPrefix(e.base, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.(*net.TCPConn).SetReadBuffer(4096)
	if _, err := io.WriteString(c, "GET /stream HTTP/1.1\r\nHost: x\r\nX-Client: s\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	select {
	case <-released:
	case <-time.After(10 * time.Second):
		t.Error("a client that stopped reading still holds the upstream exchange after 10 s (write_timeout 300ms)")
	}

	// Admin: headers complete, body promised but never sent.
	a, err := net.Dial("tcp", strings.TrimPrefix(e.admin, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	if _, err := io.WriteString(a, "POST /healthz HTTP/1.1\r\nHost: x\r\nContent-Length: 100000\r\n\r\nxx"); err != nil {
		t.Fatal(err)
	}
	_ = a.SetReadDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.Copy(io.Discard, a); err != nil {
		t.Errorf("the admin listener held a slow body past its read timeout: %v", err)
	}
}

// newUpstream starts a real HTTP upstream; its URL is returned.
func newUpstream(t *testing.T, h http.Handler) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: h}
	go srv.Serve(l)
	t.Cleanup(func() { _ = srv.Close() })
	return "http://" + l.Addr().String()
}

// decodeProblem decodes a problem+json body.
func decodeProblem(t *testing.T, b []byte) httplimit.Problem {
	t.Helper()
	var p httplimit.Problem
	if err := json.Unmarshal(b, &p); err != nil {
		t.Fatalf("problem body %q: %v", b, err)
	}
	return p
}

// TestMaxKeys (point 3): a policy's key cap holds under a flood of new
// keys; a new key past it is refused with a 429 that names the cap (or
// admitted untracked), keys already tracked keep exact limits, and the
// overflows are counted.
func TestMaxKeys(t *testing.T) {
	up, _ := upstream(t)
	cfg := mustParse(t, `
key: header:X-Client
policies:
  - {name: free, limit: 5, window: 60s, max_keys: 3}
  - {name: open, limit: 5, window: 60s, max_keys: 3, overflow: allow}
`)
	e := start(t, cfg, server.WithClock(engine.NewManualClock()))
	// A flood: 20 batches of 100 new keys each, on both policies.
	for b := range 20 {
		var items []string
		for i := range 100 {
			pol := []string{"free", "open"}[i%2]
			items = append(items, fmt.Sprintf(`{"key":"flood-%d-%d","policy":%q}`, b, i, pol))
		}
		if r := e.do("POST", e.base+"/v1/allow/batch", "["+strings.Join(items, ",")+"]"); r.status != 200 {
			t.Fatalf("batch %d: %d %s", b, r.status, r.body)
		}
	}
	for _, p := range []string{"free", "open"} {
		b, _ := e.srv.Backend(p)
		if st := b.(*engine.Limiter).Stats(); st.Keys != 3 || st.Overflows != 1000-3 {
			t.Errorf("%s after 1000 new keys: %d keys tracked, %d overflows; want 3 and 997", p, st.Keys, st.Overflows)
		}
	}
	// The three tracked keys keep exact limits; a new key is refused,
	// and says why.
	for i := range 4 {
		if r, d := e.allow(`{"key":"flood-0-0"}`); r.status != 200 || d.Remaining != 3-i || d.Overflow {
			t.Errorf("tracked key, request %d: %d %+v", i+2, r.status, d)
		}
	}
	if r, _ := e.allow(`{"key":"flood-0-0"}`); r.status != 429 {
		t.Errorf("tracked key past its limit: %d", r.status)
	}
	r, d := e.allow(`{"key":"newcomer"}`)
	if r.status != 429 || !d.Overflow || !bytes.Contains(r.body, []byte(`"overflow":true`)) {
		t.Errorf("new key at the cap: %d %s", r.status, r.body)
	}
	for i := range 7 {
		if r, d := e.allow(`{"key":"newcomer","policy":"open"}`); r.status != 200 || !d.Overflow {
			t.Errorf("overflow allow, request %d: %d %+v", i, r.status, d)
		}
	}
	m := e.do("GET", e.admin+"/metrics", "")
	for _, want := range []string{`slidegate_key_overflows_total{policy="free",surface="http"} 998`, `slidegate_key_overflows_total{policy="open",surface="http"} 1004`, `slidegate_keys{policy="free",surface="http"} 3`} {
		if !bytes.Contains(m.body, []byte(want)) {
			t.Errorf("/metrics lacks %s", want)
		}
	}

	// Gateway: the problem body names the cap.
	cfg.Upstream = config.UpstreamURL(up.URL)
	g := start(t, cfg, server.WithClock(engine.NewManualClock()))
	for i := range 3 {
		if r := g.do("GET", g.base+"/", "", "X-Client", fmt.Sprint("c", i)); r.status != 200 {
			t.Fatalf("client %d: %d", i, r.status)
		}
	}
	r = g.do("GET", g.base+"/", "", "X-Client", "c3")
	if p := decodeProblem(t, r.body); r.status != 429 || p.Reason != "key_cap" || !strings.Contains(p.Detail, "key cap") || r.header.Get("Retry-After") != "60" {
		t.Errorf("gateway, new client at the cap: %d %s %v", r.status, r.body, r.header)
	}
}
