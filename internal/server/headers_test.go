package server_test

import (
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/slidegate/slidegate/engine"
	"github.com/slidegate/slidegate/httplimit"
	"github.com/slidegate/slidegate/internal/server"
	"github.com/slidegate/slidegate/internal/server/config"
)

// The header families of the decision API (decision_headers) and of the
// gateway (headers) are switched separately; all through real listeners.

// present lists which of the rate-limit headers r carries.
func present(h http.Header) string {
	var out []string
	for _, k := range []string{"RateLimit-Policy", "RateLimit", "X-RateLimit-Limit", "X-RateLimit-Remaining", "X-RateLimit-Reset", "Retry-After"} {
		if _, ok := h[http.CanonicalHeaderKey(k)]; ok {
			out = append(out, k)
		}
	}
	return strings.Join(out, " ")
}

// TestDecisionHeaders: POST /v1/allow sends only Retry-After, on a
// refusal, by default; the draft pair only when decision_headers.draft
// is on, the X-RateLimit-* trio only when decision_headers.x is on, and
// nothing of a family switched off; a multi-limit request follows the
// same switches.
func TestDecisionHeaders(t *testing.T) {
	const pols = `policies:
  - {name: free, limit: 2, window: 60s}
  - {name: hour, limit: 5, window: 1h}
`
	const draft, x, retry = "RateLimit-Policy RateLimit", "X-RateLimit-Limit X-RateLimit-Remaining X-RateLimit-Reset", "Retry-After"
	cases := []struct {
		name, yaml          string
		allowed, refused    string // present(): the headers of a 200, of a 429
		groupOK, groupRefus string
	}{
		{"default", pols, "", retry, "", retry},
		{"draft on", "decision_headers: {draft: true}\n" + pols, draft, draft + " " + retry, draft, draft + " " + retry},
		{"x on", "decision_headers: {x: true}\n" + pols, x, x + " " + retry, x, x + " " + retry},
		{"draft and x on", "decision_headers: {draft: true, x: true}\n" + pols, draft + " " + x, draft + " " + x + " " + retry,
			draft + " " + x, draft + " " + x + " " + retry},
		{"draft and retry_after off", "decision_headers: {draft: false, retry_after: false}\n" + pols, "", "", "", ""},
		{"x only", "decision_headers: {draft: false, x: true, retry_after: false}\n" + pols, x, x, x, x},
		{"the gateway's headers do not apply", "headers: {draft: false, x: false, retry_after: false}\ndecision_headers: {draft: true}\n" + pols,
			draft, draft + " " + retry, draft, draft + " " + retry},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			clk := engine.NewManualClock()
			e := start(t, mustParse(t, c.yaml), server.WithClock(clk))
			clk.Set(1500 * time.Millisecond)
			check := func(what string, r reply, status int, want string) {
				t.Helper()
				if r.status != status || present(r.header) != want {
					t.Errorf("%s: %d with [%s], want %d with [%s]", what, r.status, present(r.header), status, want)
				}
			}
			r, d := e.allow(`{"key":"a"}`)
			check("allowed", r, 200, c.allowed)
			if strings.Contains(c.allowed, "X-RateLimit") {
				// The trio's values, when on.
				b, _ := e.srv.Backend("free")
				reset := fmt.Sprint(wallCeil(b.WallTime(d.At + d.ResetNs)))
				if r.header.Get("X-RateLimit-Limit") != "2" || r.header.Get("X-RateLimit-Remaining") != "1" || r.header.Get("X-RateLimit-Reset") != reset {
					t.Errorf("X-RateLimit-*: %v, want 2, 1, %s", r.header, reset)
				}
			}
			if strings.Contains(c.allowed, "RateLimit-Policy") && (r.header.Get("RateLimit-Policy") != `"free";q=2;w=60` || r.header.Get("RateLimit") != `"free";r=1;t=60`) {
				t.Errorf("draft headers: %v", r.header)
			}
			e.allow(`{"key":"a"}`)
			r, _ = e.allow(`{"key":"a"}`)
			check("refused", r, 429, c.refused)
			if strings.Contains(c.refused, "Retry-After") && r.header.Get("Retry-After") != "60" {
				t.Errorf("Retry-After %q, want 60", r.header.Get("Retry-After"))
			}
			const group = `{"limits":[{"policy":"free","key":"g"},{"policy":"hour","key":"g"}]}`
			r, _ = e.group(group)
			check("multi-limit allowed", r, 200, c.groupOK)
			e.group(group)
			r, _ = e.group(group)
			check("multi-limit refused", r, 429, c.groupRefus)
			if strings.Contains(c.groupRefus, "X-RateLimit") && (r.header.Get("X-RateLimit-Limit") != "2" || r.header.Get("X-RateLimit-Remaining") != "0") {
				t.Errorf("multi-limit X-RateLimit-*: %v, want the binding limit's (free: 2, 0)", r.header)
			}
		})
	}
}

// TestDefaultHeadersBySurface: with neither headers nor decision_headers
// set, each surface sends its default families through a real listener.
// The decision API sends only Retry-After on a refusal (its body says the
// rest); a batch sends none; /v1/check, which nginx's auth_request and
// Caddy's forward_auth read the headers of, sends every family.
func TestDefaultHeadersBySurface(t *testing.T) {
	e := start(t, mustParse(t, `
key: ip
trusted_proxies: [127.0.0.1/32, "::1/128"]
policies:
  - {name: free, limit: 1, window: 60s}
`), server.WithClock(engine.NewManualClock()))
	const all = "RateLimit-Policy RateLimit X-RateLimit-Limit X-RateLimit-Remaining X-RateLimit-Reset"
	if r, d := e.allow(`{"key":"a"}`); r.status != 200 || present(r.header) != "" || d.Limit != 1 || d.Remaining != 0 || d.ResetSeconds != 60 {
		t.Errorf("/v1/allow allowed: %d [%s] %+v, want 200 with no rate-limit header and the decision in the body", r.status, present(r.header), d)
	}
	if r, d := e.allow(`{"key":"a"}`); r.status != 429 || present(r.header) != "Retry-After" || r.header.Get("Retry-After") != "60" || d.RetryAfterSeconds != 60 {
		t.Errorf("/v1/allow refused: %d [%s] Retry-After %q %+v, want 429 with Retry-After: 60 only", r.status, present(r.header), r.header.Get("Retry-After"), d)
	}
	if r := e.do("POST", e.base+"/v1/allow/batch", `[{"key":"b"},{"key":"b"}]`); r.status != 200 || present(r.header) != "" {
		t.Errorf("/v1/allow/batch: %d [%s], want 200 with no rate-limit header", r.status, present(r.header))
	}
	if r := e.check("GET", "/", "203.0.113.7"); r.status != 200 || present(r.header) != all || r.header.Get("RateLimit") != `"free";r=0;t=60` {
		t.Errorf("/v1/check allowed: %d [%s] %v, want 200 with [%s]", r.status, present(r.header), r.header, all)
	}
	if r := e.check("GET", "/", "203.0.113.7"); r.status != 429 || present(r.header) != all+" Retry-After" || r.header.Get("Retry-After") != "60" {
		t.Errorf("/v1/check refused: %d [%s] %v, want 429 with [%s Retry-After]", r.status, present(r.header), r.header, all)
	}
}

// TestDecisionHeadersReload: decision_headers takes effect on a reload,
// and keeps the policies' state.
func TestDecisionHeadersReload(t *testing.T) {
	const pols = "policies:\n  - {name: free, limit: 5, window: 60s}\n"
	e := start(t, mustParse(t, pols), server.WithClock(engine.NewManualClock()))
	if r, _ := e.allow(`{"key":"a"}`); present(r.header) != "" {
		t.Fatalf("before: [%s]", present(r.header))
	}
	if err := e.srv.Reload(mustParse(t, "decision_headers: {draft: true, x: true}\n"+pols)); err != nil {
		t.Fatal(err)
	}
	r, d := e.allow(`{"key":"a"}`)
	if present(r.header) != "RateLimit-Policy RateLimit X-RateLimit-Limit X-RateLimit-Remaining X-RateLimit-Reset" ||
		r.header.Get("X-RateLimit-Remaining") != "3" || d.Remaining != 3 {
		t.Fatalf("after draft and x: true: [%s] %v %+v", present(r.header), r.header, d)
	}
	if err := e.srv.Reload(mustParse(t, "decision_headers: {draft: false}\n"+pols)); err != nil {
		t.Fatal(err)
	}
	if r, _ := e.allow(`{"key":"a"}`); present(r.header) != "" {
		t.Fatalf("after draft: false: [%s]", present(r.header))
	}
	if got := e.srv.Config().DecisionHeaders.Which(); got != httplimit.HeaderRetryAfter {
		t.Errorf("Config().DecisionHeaders after the reload: %v, want Retry-After only", got)
	}
}

// TestGatewayIgnoresDecisionHeaders: in gateway mode the end clients get
// every family by default (they read X-RateLimit-*), whatever
// decision_headers says, and the configuration warns that it is unused.
func TestGatewayIgnoresDecisionHeaders(t *testing.T) {
	up, _ := upstream(t)
	cfg := mustParse(t, `
key: header:X-Client
decision_headers: {draft: false, x: false, retry_after: false}
policies:
  - {name: free, limit: 1, window: 60s}
`)
	cfg.Upstream = config.UpstreamURL(up.URL)
	if w := strings.Join(cfg.Warnings(), "\n"); !strings.Contains(w, "decision_headers: applies to the decision API only") {
		t.Errorf("warnings %q", w)
	}
	e := start(t, cfg, server.WithClock(engine.NewManualClock()))
	const all = "RateLimit-Policy RateLimit X-RateLimit-Limit X-RateLimit-Remaining X-RateLimit-Reset"
	if r := e.do("GET", e.base+"/", "", "X-Client", "c"); r.status != 200 || present(r.header) != all {
		t.Errorf("allowed: %d [%s], want [%s]", r.status, present(r.header), all)
	}
	if r := e.do("GET", e.base+"/", "", "X-Client", "c"); r.status != 429 || present(r.header) != all+" Retry-After" {
		t.Errorf("refused: %d [%s], want [%s Retry-After]", r.status, present(r.header), all)
	}
}
