package server_test

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/slidegate/slidegate/engine"
	"github.com/slidegate/slidegate/internal/reference"
	"github.com/slidegate/slidegate/internal/server"
	"github.com/slidegate/slidegate/internal/server/config"
)

// upstream is a real HTTP server behind the gateway that counts what it
// is sent and echoes it.
func upstream(t *testing.T) (*httptest.Server, *atomic.Int64) {
	t.Helper()
	var n atomic.Int64
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n.Add(1)
		body, _ := io.ReadAll(r.Body)
		w.Header().Set("X-Upstream", "yes")
		fmt.Fprintf(w, "%s %s xff=%s body=%s", r.Method, r.URL.RequestURI(), r.Header.Get("X-Forwarded-For"), body)
	}))
	t.Cleanup(up.Close)
	return up, &n
}

func ceilSec(ns int64) int64 { return (ns + int64(time.Second) - 1) / int64(time.Second) }

func wallCeil(t time.Time) int64 {
	s := t.Unix()
	if t.Nanosecond() > 0 {
		s++
	}
	return s
}

// TestGatewayFivePerMinute is the canonical API-key exercise through the
// real server in gateway mode: 5 requests per client in any 60 s, a manual clock
// injected through the constructor, and on every response all three
// X-RateLimit headers and, on refusals, Retry-After, each checked against
// the reference log model.
func TestGatewayFivePerMinute(t *testing.T) {
	up, hits := upstream(t)
	cfg := mustParse(t, `
key: header:X-Client
policies:
  - {name: free, limit: 5, window: 60s}
`)
	cfg.Upstream = config.UpstreamURL(up.URL)
	clk := engine.NewManualClock()
	e := start(t, cfg, server.WithClock(clk))
	b, _ := e.srv.Backend("free")
	model := reference.NewLog(5, int64(time.Minute))

	const s = time.Second
	steps := []struct {
		at     time.Duration
		client string
		note   string
	}{
		{0, "alice", "1st"}, {10 * s, "alice", "2nd"}, {20 * s, "alice", "3rd"}, {30 * s, "alice", "4th"},
		{40 * s, "alice", "5th: budget spent"},
		{50 * s, "alice", "refused: retry in exactly 10 s (the entry at 0 leaves at 60)"},
		{50 * s, "bob", "another client is not affected"},
		{59*s + 500*time.Millisecond, "alice", "refused: 0.5 s rounds up to 1"},
		{60*s - 1, "alice", "one ns before the entry at 0 expires: refused"},
		{60 * s, "alice", "exactly 60 s after the first: allowed"},
		{60 * s, "alice", "same instant: refused, retry in 10 s (the entry at 10)"},
		{70 * s, "alice", "allowed"},
		{200 * s, "alice", "all expired"},
	}
	allowed := 0
	for i, st := range steps {
		clk.Set(st.at)
		r := e.do("GET", e.base+"/orders?id="+strconv.Itoa(i), "", "X-Client", st.client)
		want := model.Decide(st.client, 1, int64(st.at))
		where := fmt.Sprintf("step %d at %v %s (%s)", i, st.at, st.client, st.note)
		h := r.header
		eq := func(name, got, want string) {
			t.Helper()
			if got != want {
				t.Errorf("%s: %s = %q, want %q", where, name, got, want)
			}
		}
		eq("X-RateLimit-Limit", h.Get("X-RateLimit-Limit"), "5")
		eq("X-RateLimit-Remaining", h.Get("X-RateLimit-Remaining"), strconv.Itoa(want.Remaining))
		eq("X-RateLimit-Reset", h.Get("X-RateLimit-Reset"), strconv.FormatInt(wallCeil(b.WallTime(int64(st.at)+want.Reset)), 10))
		eq("RateLimit", h.Get("RateLimit"), `"free";r=`+strconv.Itoa(want.Remaining)+";t="+strconv.FormatInt(ceilSec(want.Reset), 10))
		if want.Allowed {
			allowed++
			eq("status", strconv.Itoa(r.status), "200")
			eq("Retry-After", h.Get("Retry-After"), "")
			eq("upstream body", string(r.body), "GET /orders?id="+strconv.Itoa(i)+" xff=127.0.0.1 body=")
			eq("X-Upstream", h.Get("X-Upstream"), "yes")
		} else {
			eq("status", strconv.Itoa(r.status), "429")
			eq("Retry-After", h.Get("Retry-After"), strconv.FormatInt(ceilSec(want.RetryAfter), 10))
			eq("Content-Type", h.Get("Content-Type"), "application/problem+json")
			if !strings.Contains(string(r.body), `"policy":"free"`) || !strings.Contains(string(r.body), `"retry_after_seconds":`+h.Get("Retry-After")) {
				t.Errorf("%s: 429 body %s", where, r.body)
			}
		}
	}
	// Pin the rounding at the boundaries literally, too.
	for _, c := range []struct {
		at   time.Duration
		want string
	}{{50 * s, "10"}, {59*s + 500*time.Millisecond, "1"}, {60*s - 1, "1"}} {
		m := reference.NewLog(5, int64(time.Minute))
		for _, a := range []time.Duration{0, 10 * s, 20 * s, 30 * s, 40 * s} {
			m.Decide("x", 1, int64(a))
		}
		if got := strconv.FormatInt(ceilSec(m.Decide("x", 1, int64(c.at)).RetryAfter), 10); got != c.want {
			t.Errorf("model Retry-After at %v = %s, want %s", c.at, got, c.want)
		}
	}
	if got := hits.Load(); got != int64(allowed) {
		t.Errorf("upstream saw %d requests, %d were allowed", got, allowed)
	}
	if allowed != 9 {
		t.Errorf("%d allowed, want 9", allowed)
	}
}

// TestGatewayTiersAndProxying: the tier header picks the policy, the
// request (method, path, query, body) reaches the upstream intact, the
// upstream's answer comes back with the rate-limit headers, a missing key
// is 400, and an unreachable upstream is 502 JSON.
func TestGatewayTiersAndProxying(t *testing.T) {
	up, hits := upstream(t)
	cfg := mustParse(t, `
key: header:X-API-Key
tier_header: X-Plan
default_policy: free
policies:
  - {name: free, limit: 2, window: 60s}
  - {name: paid, limit: 4, window: 60s, algorithm: log}
  - {name: approx, limit: 3, window: 60s, algorithm: counter}
`)
	cfg.Upstream = config.UpstreamURL(up.URL)
	e := start(t, cfg, server.WithClock(engine.NewManualClock()))

	r := e.do("POST", e.base+"/a/b?c=d", "payload", "X-API-Key", "k1")
	if r.status != 200 || string(r.body) != "POST /a/b?c=d xff=127.0.0.1 body=payload" {
		t.Fatalf("proxied: %d %q", r.status, r.body)
	}
	count := func(plan string) int {
		n := 0
		for range 8 {
			if e.do("GET", e.base+"/", "", "X-API-Key", "k2", "X-Plan", plan).status == 200 {
				n++
			}
		}
		return n
	}
	for plan, want := range map[string]int{"": 2, "paid": 4, "approx": 3} {
		if got := count(plan); got != want {
			t.Errorf("plan %q: %d allowed, want %d", plan, got, want)
		}
	}
	r = e.do("GET", e.base+"/", "", "X-API-Key", "k3", "X-Plan", "paid")
	if r.header.Get("RateLimit-Policy") != `"paid";q=4;w=60` {
		t.Errorf("RateLimit-Policy %q", r.header.Get("RateLimit-Policy"))
	}
	r = e.do("GET", e.base+"/", "", "X-API-Key", "k3", "X-Plan", "gold")
	if r.status != 400 || !strings.Contains(string(r.body), "unknown policy") {
		t.Errorf("unknown plan: %d %s", r.status, r.body)
	}
	before := hits.Load()
	r = e.do("GET", e.base+"/", "")
	if r.status != 400 || !strings.Contains(string(r.body), "X-Api-Key") || r.header.Get("Content-Type") != "application/problem+json" {
		t.Errorf("no key: %d %s", r.status, r.body)
	}
	if hits.Load() != before {
		t.Error("a request without a key reached the upstream")
	}

	// An upstream that is gone.
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead := "http://" + l.Addr().String()
	l.Close()
	cfg.Upstream = config.UpstreamURL(dead)
	e2 := start(t, cfg)
	r = e2.do("GET", e2.base+"/", "", "X-API-Key", "k")
	if r.status != http.StatusBadGateway || !strings.Contains(string(r.body), `"status":502`) {
		t.Errorf("dead upstream: %d %s", r.status, r.body)
	}
}

// TestTrustedProxy: a spoofed X-Forwarded-For from an untrusted address
// must not change the key; from a trusted proxy it names the client.
func TestTrustedProxy(t *testing.T) {
	up, _ := upstream(t)
	cfg := mustParse(t, `
key: ip
trusted_proxies: [10.0.0.0/8]
policies:
  - {name: free, limit: 1, window: 60s}
`)
	cfg.Upstream = config.UpstreamURL(up.URL)
	e := start(t, cfg, server.WithClock(engine.NewManualClock()))
	// The test client is 127.0.0.1, not trusted: its headers are ignored.
	// The upstream sees only the address the gateway saw, not the claim.
	if r := e.do("GET", e.base+"/", "", "X-Forwarded-For", "198.51.100.1"); r.status != 200 || !strings.Contains(string(r.body), "xff=127.0.0.1 ") {
		t.Fatalf("first: %d %s", r.status, r.body)
	}
	for _, spoof := range []string{"198.51.100.2", "203.0.113.5, 10.0.0.1"} {
		if r := e.do("GET", e.base+"/", "", "X-Forwarded-For", spoof); r.status != 429 {
			t.Errorf("spoofed XFF %q from an untrusted peer got %d: it changed the key", spoof, r.status)
		}
	}
	if r := e.do("GET", e.base+"/", "", "Forwarded", "for=198.51.100.3"); r.status != 429 {
		t.Errorf("spoofed Forwarded got %d", r.status)
	}

	// Now trust loopback: the header names the client.
	cfg.TrustedProxies = []string{"127.0.0.0/8"}
	e2 := start(t, cfg, server.WithClock(engine.NewManualClock()))
	// The upstream gets the trusted chain with our peer appended.
	if r := e2.do("GET", e2.base+"/", "", "X-Forwarded-For", "192.0.2.200"); r.status != 200 || !strings.Contains(string(r.body), "xff=192.0.2.200, 127.0.0.1 ") {
		t.Errorf("trusted chain: %d %s", r.status, r.body)
	}
	for _, c := range []struct {
		xff  string
		want int
	}{
		{"198.51.100.1", 200}, {"198.51.100.2", 200}, {"198.51.100.1", 429},
		{"6.6.6.6, 198.51.100.2", 429},                      // the client-supplied left part is not the key
		{"2001:db8:1:2::1", 200}, {"2001:db8:1:2::ff", 429}, // one /64
		{"unknown", 400},
	} {
		r := e2.do("GET", e2.base+"/", "", "X-Forwarded-For", c.xff)
		if r.status != c.want {
			t.Errorf("trusted proxy, XFF %q: %d, want %d (%s)", c.xff, r.status, c.want, r.body)
		}
	}
}

// TestGracefulShutdown: with requests in flight at the upstream, shutdown
// stops accepting new connections, lets the in-flight requests finish with
// their real answers, then returns nil; goleak (TestMain) checks that the
// listeners, the proxy's connections and the engine's sweepers are gone.
func TestGracefulShutdown(t *testing.T) {
	release := make(chan struct{})
	var inFlight sync.WaitGroup
	const n = 3
	inFlight.Add(n)
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		inFlight.Done()
		<-release
		io.WriteString(w, "finished")
	}))
	defer up.Close()
	cfg := mustParse(t, `
key: header:X-Client
policies:
  - {name: free, limit: 100, window: 60s}
`)
	cfg.Upstream = config.UpstreamURL(up.URL)
	noDrain := config.Duration(0) // TestDrain covers the delay
	cfg.DrainDelay = &noDrain
	s, cancel, runErr := run(t, cfg)
	defer cancel()
	addr := s.Addr()
	tr := &http.Transport{}
	defer tr.CloseIdleConnections()
	client := &http.Client{Transport: tr}
	type res struct {
		status int
		body   string
		err    error
	}
	results := make(chan res, n)
	for i := range n {
		go func() {
			req, _ := http.NewRequest("GET", "http://"+addr+"/slow", nil)
			req.Header.Set("X-Client", "c"+strconv.Itoa(i))
			resp, err := client.Do(req)
			if err != nil {
				results <- res{err: err}
				return
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			results <- res{status: resp.StatusCode, body: string(b)}
		}()
	}
	inFlight.Wait() // all three are at the upstream
	cancel()        // what SIGTERM does in slidegate serve
	// New connections are refused once the listener is closed.
	for {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			break
		}
		c.Close()
		time.Sleep(time.Millisecond)
	}
	select {
	case err := <-runErr:
		t.Fatalf("Run returned %v with requests in flight", err)
	default:
	}
	close(release)
	for range n {
		r := <-results
		if r.err != nil || r.status != 200 || r.body != "finished" {
			t.Errorf("in-flight request: %d %q %v", r.status, r.body, r.err)
		}
	}
	if err := <-runErr; err != nil {
		t.Fatalf("Run: %v", err)
	}
}

// TestGatewayShadowAndHeaderSwitches: shadow mode never refuses but says
// what it would have done; header families switched off in the
// configuration are absent.
func TestGatewayShadowAndHeaderSwitches(t *testing.T) {
	up, hits := upstream(t)
	cfg := mustParse(t, `
key: header:X-Client
shadow: true
headers: {x: false, retry_after: false}
policies:
  - {name: free, limit: 2, window: 60s}
`)
	cfg.Upstream = config.UpstreamURL(up.URL)
	e := start(t, cfg, server.WithClock(engine.NewManualClock()))
	for i := range 4 {
		r := e.do("GET", e.base+"/", "", "X-Client", "c")
		if r.status != 200 {
			t.Fatalf("shadow request %d: %d", i, r.status)
		}
		wantR := max(1-i, 0)
		if got := r.header.Get("RateLimit"); got != `"free";r=`+strconv.Itoa(wantR)+";t=60" {
			t.Errorf("request %d: RateLimit %q", i, got)
		}
		if r.header.Get("X-RateLimit-Remaining") != "" || r.header.Get("Retry-After") != "" {
			t.Errorf("request %d: switched-off headers present: %v", i, r.header)
		}
	}
	if hits.Load() != 4 {
		t.Errorf("upstream saw %d of 4", hits.Load())
	}
	// The metrics still count what would have been refused.
	mfs, _ := e.srv.Registry().Gather()
	for _, mf := range mfs {
		if mf.GetName() != server.MetricDecisions {
			continue
		}
		for _, m := range mf.GetMetric() {
			outcome := ""
			for _, l := range m.GetLabel() {
				if l.GetName() == "outcome" {
					outcome = l.GetValue()
				}
			}
			if want := map[string]float64{"allowed": 2, "refused": 2, "error": 0}[outcome]; m.GetCounter().GetValue() != want {
				t.Errorf("%s: %v, want %v", outcome, m.GetCounter().GetValue(), want)
			}
		}
	}
}
