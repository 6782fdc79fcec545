package server_test

import (
	"encoding/json"
	"fmt"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/slidegate/slidegate/engine"
	"github.com/slidegate/slidegate/internal/server"
	"github.com/slidegate/slidegate/internal/server/config"
)

// checkConfig is gateway-style configuration that the check tests share:
// a per-IP top-level limit, a route with two limits (per client and one
// global), a route by method, and tiers chosen by a header.
const checkConfig = `
key: ip
trusted_proxies: [127.0.0.1/32, "::1/128"]
tier_header: X-Plan
policies:
  - {name: ip, limit: 3, window: 60s}
  - {name: login, limit: 2, window: 60s}
  - {name: login-all, limit: 3, window: 60s}
  - {name: upload, limit: 1, window: 60s}
  - {name: pro, limit: 4, window: 60s}
routes:
  - path: /login
    limits: [{policy: login}, {policy: login-all, key: "const:all"}]
  - method: POST
    path: /files
    limits: [{policy: upload, key: "header:X-User"}]
    tiers: {pro: [{policy: pro, key: "header:X-User"}]}
`

// check asks e's /v1/check about method and uri as Caddy would (the
// X-Forwarded pair), with the client address in X-Forwarded-For and
// further header pairs.
func (e *env) check(method, uri, client string, hdr ...string) reply {
	e.t.Helper()
	return e.do("GET", e.base+"/v1/check", "", append([]string{"X-Forwarded-Method", method, "X-Forwarded-Uri", uri, "X-Forwarded-For", client}, hdr...)...)
}

func TestCheckCaddyStyle(t *testing.T) {
	e := start(t, mustParse(t, checkConfig), server.WithClock(engine.NewManualClock()))
	for i := range 4 {
		r := e.check("GET", "/anything?q=1", "203.0.113.7")
		if want := []int{200, 200, 200, 429}[i]; r.status != want {
			t.Fatalf("request %d: status %d, want %d: %s", i, r.status, want, r.body)
		}
		if r.header.Get("RateLimit-Policy") == "" || r.header.Get("X-RateLimit-Limit") != "3" {
			t.Errorf("request %d: rate-limit headers missing: %v", i, r.header)
		}
		if r.status == 200 && len(r.body) != 0 {
			t.Errorf("request %d: an allowed check has a body: %q", i, r.body)
		}
		if r.status == 429 && r.header.Get("Retry-After") != "60" {
			t.Errorf("refusal: Retry-After %q, want 60", r.header.Get("Retry-After"))
		}
	}
	// The key is the original client's address, not the proxy's.
	if r := e.check("GET", "/", "203.0.113.8"); r.status != 200 || r.header.Get("X-RateLimit-Remaining") != "2" {
		t.Fatalf("another client: %d %v", r.status, r.header)
	}
}

func TestCheckNginxStyleDenyStatus(t *testing.T) {
	cfg := mustParse(t, checkConfig)
	cfg.CheckDenyStatus = 403
	e := start(t, cfg, server.WithClock(engine.NewManualClock()))
	ask := func() reply {
		// What nginx's auth_request sends: the X-Original pair, the
		// subrequest's own method and path.
		return e.do("GET", e.base+"/v1/check", "", "X-Original-Method", "POST", "X-Original-URI", "/login/form", "X-Forwarded-For", "198.51.100.1")
	}
	for i := range 3 {
		r := ask()
		if want := []int{200, 200, 403}[i]; r.status != want {
			t.Fatalf("request %d: status %d, want %d: %s", i, r.status, want, r.body)
		}
		if i == 2 {
			if r.header.Get("Retry-After") != "60" || !strings.Contains(string(r.body), `rate limited by policy \"login\"`) {
				t.Errorf("refusal: %v %s", r.header, r.body)
			}
		}
	}
}

func TestCheckRoutesAndTiers(t *testing.T) {
	e := start(t, mustParse(t, checkConfig), server.WithClock(engine.NewManualClock()))
	// /login: 2 per client and 3 in all, all or nothing.
	statuses := func(method, uri string, clients ...string) string {
		var out []string
		for _, c := range clients {
			out = append(out, fmt.Sprint(e.check(method, uri, c, "X-User", c).status))
		}
		return strings.Join(out, " ")
	}
	if got := statuses("GET", "/login", "10.0.0.1", "10.0.0.1", "10.0.0.1", "10.0.0.2", "10.0.0.3"); got != "200 200 429 200 429" {
		t.Errorf("/login: %s, want 200 200 429 200 429 (2 per client, 3 in all)", got)
	}
	// POST /files: 1 per user; GET /files is the top-level per-IP limit.
	if got := statuses("POST", "/files/a", "u1", "u1"); got != "200 429" {
		t.Errorf("POST /files: %s", got)
	}
	if got := statuses("GET", "/files/a", "10.9.9.9", "10.9.9.9"); got != "200 200" {
		t.Errorf("GET /files: %s", got)
	}
	// The pro tier of POST /files: 4 per user.
	var pro []string
	for range 5 {
		pro = append(pro, fmt.Sprint(e.check("POST", "/files", "10.1.1.1", "X-User", "u2", "X-Plan", "pro").status))
	}
	if got := strings.Join(pro, " "); got != "200 200 200 200 429" {
		t.Errorf("pro tier: %s", got)
	}
	if r := e.check("POST", "/files", "10.1.1.1", "X-User", "u2", "X-Plan", "nope"); r.status != 400 {
		t.Errorf("unknown tier: %d, want 400", r.status)
	}
}

func TestCheckBadRequests(t *testing.T) {
	e := start(t, mustParse(t, checkConfig), server.WithClock(engine.NewManualClock()))
	for _, c := range []struct {
		name string
		hdr  []string
		want string
	}{
		{"no headers", nil, "missing the original request's URI"},
		{"no method", []string{"X-Forwarded-Uri", "/a"}, "missing the original request's method"},
		{"no uri", []string{"X-Original-Method", "GET"}, "missing the original request's URI"},
	} {
		r := e.do("GET", e.base+"/v1/check", "", append(c.hdr, "X-Forwarded-For", "192.0.2.1")...)
		var p struct{ Detail string }
		if r.status != 400 || r.header.Get("Content-Type") != "application/problem+json" || json.Unmarshal(r.body, &p) != nil || !strings.Contains(p.Detail, c.want) {
			t.Errorf("%s: %d %s %s, want a 400 problem saying %q", c.name, r.status, r.header.Get("Content-Type"), r.body, c.want)
		}
	}
	// None of them was decided: the client still has its full limit.
	if r := e.check("GET", "/", "192.0.2.1"); r.header.Get("X-RateLimit-Remaining") != "2" {
		t.Errorf("after the bad requests: %v, want remaining 2", r.header)
	}
	// A URI that does not parse is still decided, by its raw path.
	if r := e.check("GET", "/login/%zz", "192.0.2.2"); r.status != 200 || r.header.Get("X-RateLimit-Limit") != "2" {
		t.Errorf("unparsable URI: %d %v, want decided by the /login route", r.status, r.header)
	}
}

func TestCheckUntrustedPeer(t *testing.T) {
	cfg := mustParse(t, strings.Replace(checkConfig, `[127.0.0.1/32, "::1/128"]`, `[10.0.0.0/8]`, 1))
	e := start(t, cfg)
	r := e.check("GET", "/", "203.0.113.7")
	if r.status != 403 || !strings.Contains(string(r.body), "trusted_proxies") {
		t.Fatalf("untrusted peer: %d %s, want 403", r.status, r.body)
	}
}

// Envoy's ext_authz with path_prefix /v1/check: the original path follows
// the prefix and the method is the check's own.
func TestCheckEnvoyPathPrefix(t *testing.T) {
	e := start(t, mustParse(t, checkConfig), server.WithClock(engine.NewManualClock()))
	for i := range 3 {
		r := e.do("DELETE", e.base+"/v1/check/login/x?y=1", "", "X-Forwarded-For", "192.0.2.9")
		if want := []int{200, 200, 429}[i]; r.status != want || r.header.Get("X-RateLimit-Limit") != "2" {
			t.Fatalf("request %d: %d %v, want %d from the /login route", i, r.status, r.header, want)
		}
	}
}

// The check endpoint decides exactly as the gateway does: one sequence of
// requests, sent to a gateway and asked of /v1/check on the same clock,
// gets the same statuses and rate-limit headers.
func TestCheckMatchesGateway(t *testing.T) {
	up, _ := upstream(t)
	gcfg := mustParse(t, checkConfig)
	gcfg.Upstream = config.UpstreamURL(up.URL)
	clk := engine.NewManualClock()
	gw := start(t, gcfg, server.WithClock(clk))
	ck := start(t, mustParse(t, checkConfig), server.WithClock(clk))
	type req struct {
		method, uri, user, plan string
	}
	var seq []req
	for i := range 40 {
		seq = append(seq, req{
			method: []string{"GET", "POST"}[i%2],
			uri:    []string{"/login", "/files/x", "/other", "/login/a?b"}[i%4],
			user:   fmt.Sprint("u", i%3),
			plan:   []string{"", "pro"}[i/20],
		})
	}
	headers := []string{"RateLimit", "RateLimit-Policy", "Retry-After", "X-RateLimit-Limit", "X-RateLimit-Remaining"}
	refused := 0
	for i, q := range seq {
		clk.Advance(700 * time.Millisecond)
		hdr := []string{"X-User", q.user}
		if q.plan != "" {
			hdr = append(hdr, "X-Plan", q.plan)
		}
		g := gw.do(q.method, gw.base+q.uri, "", hdr...)
		c := ck.check(q.method, q.uri, "127.0.0.1", hdr...)
		if (g.status == 200) != (c.status == 200) || (g.status != 200 && g.status != c.status) {
			t.Fatalf("request %d %+v: gateway %d, check %d (%s)", i, q, g.status, c.status, c.body)
		}
		if c.status == 429 {
			refused++
		}
		for _, h := range headers {
			if g.header.Get(h) != c.header.Get(h) {
				t.Errorf("request %d %+v: %s: gateway %q, check %q", i, q, h, g.header.Get(h), c.header.Get(h))
			}
		}
	}
	if refused == 0 || refused == len(seq) {
		t.Fatalf("%d of %d refused: the sequence did not exercise both outcomes", refused, len(seq))
	}
	t.Logf("%d of %d requests refused by both", refused, len(seq))
}

func TestCheckDenyStatusConfig(t *testing.T) {
	for _, c := range []struct {
		v  string
		ok bool
	}{{"401", true}, {"403", true}, {"429", true}, {"500", false}, {"200", false}} {
		_, err := config.ParseConfig([]byte("check_deny_status: " + c.v + "\npolicies: [{name: a, limit: 1, window: 1s}]\n"))
		if (err == nil) != c.ok || (err != nil && !strings.Contains(err.Error(), "check_deny_status")) {
			t.Errorf("check_deny_status %s: %v", c.v, err)
		}
	}
}

// FuzzCheck: whatever a client makes of the original URI and method (a
// proxy passes them on as sent), /v1/check answers with a decision or a
// 400, never a panic or a 5xx.
func FuzzCheck(f *testing.F) {
	for _, s := range [][2]string{{"GET", "/"}, {"POST", "/login/x?y=1"}, {"", "/a"}, {"GET", "%zz"}, {"get", "http://h/files/a"}, {"PUT", "*"}, {"GET", "?x"}, {"GET", "//../files/./a"}} {
		f.Add(s[0], s[1])
	}
	cfg, err := config.ParseConfig([]byte(strings.Replace(checkConfig, `[127.0.0.1/32, "::1/128"]`, `[192.0.2.0/24]`, 1)))
	if err != nil {
		f.Fatal(err)
	}
	s, err := server.New(cfg, server.WithLogger(quiet))
	if err != nil {
		f.Fatal(err)
	}
	defer s.Close()
	h := s.Handler()
	f.Fuzz(func(t *testing.T, method, uri string) {
		req := httptest.NewRequest("GET", "/v1/check", nil) // from 192.0.2.1
		req.Header["X-Forwarded-Method"] = []string{method}
		req.Header["X-Forwarded-Uri"] = []string{uri}
		req.Header["X-User"] = []string{"u"}
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		switch rec.Code {
		case 200, 429, 400:
		default:
			t.Fatalf("method %q uri %q: %d %s", method, uri, rec.Code, rec.Body)
		}
	})
}
