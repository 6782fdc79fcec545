package httplimit_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/netip"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/slidegate/slidegate/engine"
	"github.com/slidegate/slidegate/httplimit"
)

func mustLimiter(t *testing.T, name string, limit int, clk engine.Clock) *engine.Limiter {
	t.Helper()
	l, err := engine.New(engine.Policy{Name: name, Limit: limit, Window: time.Minute}, engine.WithClock(clk))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	return l
}

type result struct {
	status int
	header http.Header
	body   string
}

func get(t *testing.T, c *http.Client, url string, hdr ...string) result {
	t.Helper()
	req, _ := http.NewRequest("GET", url, nil)
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return result{resp.StatusCode, resp.Header, string(b)}
}

func TestTiers(t *testing.T) {
	clk := engine.NewManualClock()
	free, paid := mustLimiter(t, "free", 2, clk), mustLimiter(t, "paid", 4, clk)
	m, err := httplimit.New(
		httplimit.WithBackend(free), httplimit.WithBackend(paid),
		httplimit.WithTierFunc(httplimit.HeaderTier("X-Plan")),
		httplimit.WithKeyFunc(httplimit.HeaderKey("X-API-Key")),
	)
	if err != nil {
		t.Fatal(err)
	}
	srv := newHTTPServer(t, m.Handler(okHandler))
	c := srv.Client()
	count := func(plan string) int {
		n := 0
		for range 10 {
			r := get(t, c, srv.URL, "X-API-Key", "k", "X-Plan", plan)
			if r.status == http.StatusOK {
				n++
			}
		}
		return n
	}
	if n := count(""); n != 2 {
		t.Errorf("default tier (free, 2): %d allowed", n)
	}
	if n := count("paid"); n != 4 {
		t.Errorf("paid tier (4): %d allowed", n)
	}
	r := get(t, c, srv.URL, "X-API-Key", "k", "X-Plan", "paid")
	if got := r.header.Get("RateLimit-Policy"); got != `"paid";q=4;w=60` {
		t.Errorf("paid RateLimit-Policy = %q", got)
	}
	r = get(t, c, srv.URL, "X-API-Key", "k", "X-Plan", "gold")
	if r.status != http.StatusBadRequest || !strings.Contains(r.body, `unknown policy \"gold\"`) {
		t.Errorf("unknown tier: %d %s", r.status, r.body)
	}
	if r.header.Get("Content-Type") != "application/problem+json" {
		t.Errorf("unknown tier content type %q", r.header.Get("Content-Type"))
	}

	// WithDefaultTier picks another default.
	m2, err := httplimit.New(httplimit.WithBackend(free), httplimit.WithBackend(paid), httplimit.WithDefaultTier("paid"))
	if err != nil {
		t.Fatal(err)
	}
	if hw, _ := m2.Tier(""); hw.Policy().Name != "paid" {
		t.Errorf("default tier %q", hw.Policy().Name)
	}
}

func newHTTPServer(t *testing.T, h http.Handler) *testServer {
	t.Helper()
	return startServer(t, h)
}

func TestRefusalBodyAndKeyErrors(t *testing.T) {
	clk := engine.NewManualClock()
	lim := mustLimiter(t, "free", 1, clk)
	srv := newServer(t, lim, httplimit.WithKeyFunc(httplimit.HeaderKey("X-API-Key")))
	c := srv.Client()

	r := get(t, c, srv.URL)
	if r.status != http.StatusBadRequest || r.header.Get("Content-Type") != "application/problem+json" {
		t.Fatalf("no key: %d %q", r.status, r.header.Get("Content-Type"))
	}
	var p httplimit.Problem
	if err := json.Unmarshal([]byte(r.body), &p); err != nil || p.Status != 400 || !strings.Contains(p.Error, "X-Api-Key") {
		t.Fatalf("no key body %q (%v)", r.body, err)
	}
	if r.header.Get("X-RateLimit-Remaining") != "" {
		t.Error("undecided request carries rate-limit headers")
	}

	clk.Set(time.Second)
	get(t, c, srv.URL, "X-API-Key", "a")
	clk.Set(30*time.Second + 1)
	r = get(t, c, srv.URL, "X-API-Key", "a")
	if r.status != http.StatusTooManyRequests {
		t.Fatalf("second request: %d", r.status)
	}
	if err := json.Unmarshal([]byte(r.body), &p); err != nil {
		t.Fatalf("429 body %q: %v", r.body, err)
	}
	if r.header.Get("Content-Type") != "application/problem+json" || p.Status != 429 || p.Policy != "free" ||
		p.RetryAfterSeconds != 31 || p.RetryAfterNs != int64(31*time.Second-1) || p.Limit != 1 || p.WindowSeconds != 60 ||
		!strings.Contains(p.Detail, `"free"`) || !strings.Contains(p.Detail, "retry in 31 s") {
		t.Fatalf("429 body %+v", p)
	}
	if r.header.Get("Retry-After") != "31" {
		t.Fatalf("Retry-After %q", r.header.Get("Retry-After"))
	}
}

func TestExemptShadowCostObserver(t *testing.T) {
	clk := engine.NewManualClock()
	lim := mustLimiter(t, "p", 3, clk)
	var (
		mu     sync.Mutex
		events []httplimit.Event
	)
	srv := newServer(t, lim,
		httplimit.WithKeyFunc(httplimit.HeaderKey("X-API-Key")),
		httplimit.WithExempt(func(r *http.Request) bool { return r.URL.Path == "/healthz" }),
		httplimit.WithShadow(true),
		httplimit.WithCostFunc(func(r *http.Request) (int, error) {
			if v := r.URL.Query().Get("cost"); v != "" {
				return strconv.Atoi(v)
			}
			return 1, nil
		}),
		httplimit.WithObserver(func(ev httplimit.Event) {
			mu.Lock()
			events = append(events, ev)
			mu.Unlock()
		}),
	)
	c := srv.Client()
	r := get(t, c, srv.URL+"/healthz")
	if r.status != 200 || r.header.Get("X-RateLimit-Limit") != "" {
		t.Fatalf("exempt: %d, headers %v", r.status, r.header)
	}
	r = get(t, c, srv.URL+"/?cost=3", "X-API-Key", "k")
	if r.status != 200 || r.header.Get("X-RateLimit-Remaining") != "0" {
		t.Fatalf("cost 3: %d remaining %q", r.status, r.header.Get("X-RateLimit-Remaining"))
	}
	// Shadow mode: would be refused, is served, headers say so, no
	// Retry-After.
	r = get(t, c, srv.URL+"/", "X-API-Key", "k")
	if r.status != 200 || r.body != "ok" || r.header.Get("X-RateLimit-Remaining") != "0" || r.header.Get("Retry-After") != "" {
		t.Fatalf("shadow: %d %q remaining %q retry %q", r.status, r.body, r.header.Get("X-RateLimit-Remaining"), r.header.Get("Retry-After"))
	}
	r = get(t, c, srv.URL+"/?cost=4", "X-API-Key", "k")
	if r.status != http.StatusBadRequest || !strings.Contains(r.body, "outside 1..3") {
		t.Fatalf("cost 4 > limit: %d %s", r.status, r.body)
	}
	r = get(t, c, srv.URL+"/?cost=x", "X-API-Key", "k")
	if r.status != http.StatusBadRequest {
		t.Fatalf("bad cost: %d %s", r.status, r.body)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(events) != 3 {
		t.Fatalf("%d events, want 3 (the exempt and unparsable requests are not decided)", len(events))
	}
	if e := events[0]; e.Policy != "p" || e.Key != "k" || e.Cost != 3 || !e.Decision.Allowed || e.Err != nil {
		t.Errorf("event 0: %+v", e)
	}
	if e := events[1]; e.Decision.Allowed {
		t.Errorf("event 1 (shadow refusal) allowed: %+v", e)
	}
	if e := events[2]; !errors.Is(e.Err, engine.ErrInvalidCost) {
		t.Errorf("event 2 err %v", e.Err)
	}
}

// failing is a backend whose store is down, to check the error path.
type failing struct{ *engine.Limiter }

func (failing) Decide(context.Context, string, int) (engine.Decision, error) {
	return engine.Decision{}, errors.New("store unreachable")
}

func TestBackendErrorIs503(t *testing.T) {
	lim := mustLimiter(t, "p", 3, engine.NewManualClock())
	srv := newServer(t, failing{lim})
	r := get(t, srv.Client(), srv.URL)
	if r.status != http.StatusServiceUnavailable || !strings.Contains(r.body, "store unreachable") {
		t.Fatalf("%d %s", r.status, r.body)
	}
}

func TestRefusalHandlerAndLimit(t *testing.T) {
	lim := mustLimiter(t, "p", 1, engine.NewManualClock())
	limit, err := httplimit.Limit(httplimit.WithBackend(lim),
		httplimit.WithRefusalHandler(func(w http.ResponseWriter, r *http.Request, ref httplimit.Refusal) {
			w.WriteHeader(http.StatusServiceUnavailable)
			fmt.Fprintf(w, "slow down %s (%s)", ref.Key, ref.Policy.Name)
		}))
	if err != nil {
		t.Fatal(err)
	}
	srv := startServer(t, limit(okHandler))
	get(t, srv.Client(), srv.URL)
	r := get(t, srv.Client(), srv.URL)
	if r.status != http.StatusServiceUnavailable || r.body != "slow down 127.0.0.1 (p)" || r.header.Get("Retry-After") != "60" {
		t.Fatalf("%d %q retry %q", r.status, r.body, r.header.Get("Retry-After"))
	}
}

func TestNewErrors(t *testing.T) {
	lim := mustLimiter(t, "p", 1, engine.NewManualClock())
	lim2 := mustLimiter(t, "p", 2, engine.NewManualClock())
	for name, opts := range map[string][]httplimit.Option{
		"no backend":         nil,
		"nil backend":        {httplimit.WithBackend(nil)},
		"duplicate tier":     {httplimit.WithBackend(lim), httplimit.WithBackend(lim2)},
		"unknown default":    {httplimit.WithBackend(lim), httplimit.WithDefaultTier("q")},
		"nil key func":       {httplimit.WithBackend(lim), httplimit.WithKeyFunc(nil)},
		"nil tag func":       {httplimit.WithBackend(lim), httplimit.WithTag(nil)},
		"unknown header bit": {httplimit.WithBackend(lim), httplimit.WithHeaders(1 << 6)},
	} {
		if _, err := httplimit.New(opts...); !errors.Is(err, httplimit.ErrInvalidOption) {
			t.Errorf("%s: err = %v", name, err)
		}
	}
}

// TestBoundedKeysAndTiers: a composed key over MaxKeyLen and a request
// naming its tier twice are refused with 400 and charge nothing; a key
// refused by the key cap says so in its problem body.
func TestBoundedKeysAndTiers(t *testing.T) {
	clk := engine.NewManualClock()
	free, paid := mustLimiter(t, "free", 1, clk), mustLimiter(t, "paid", 1, clk)
	srv := newServer(t, free, httplimit.WithBackend(paid),
		httplimit.WithTierFunc(httplimit.HeaderTier("X-Plan")),
		httplimit.WithKeyFunc(httplimit.Compose(httplimit.HeaderKey("X-API-Key"), httplimit.RouteKey)))
	c := srv.Client()
	long := strings.Repeat("k", httplimit.MaxKeyLen-10) // fits alone, not with the route
	if r := get(t, c, srv.URL+"/some/route", "X-API-Key", long); r.status != 400 || !strings.Contains(r.body, "longer than 1024 bytes") {
		t.Errorf("composed key over MaxKeyLen: %d %s", r.status, r.body)
	}
	req, _ := http.NewRequest("GET", srv.URL+"/", nil)
	req.Header.Set("X-API-Key", "k")
	req.Header.Add("X-Plan", "free")
	req.Header.Add("X-Plan", "paid")
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 400 {
		t.Errorf("two X-Plan headers: %d", resp.StatusCode)
	}
	for _, plan := range []string{"free", "paid"} {
		if r := get(t, c, srv.URL+"/", "X-API-Key", "k", "X-Plan", plan); r.status != 200 {
			t.Errorf("plan %s after the refused requests: %d (they were charged)", plan, r.status)
		}
	}

	capped, err := engine.New(engine.Policy{Name: "capped", Limit: 5, Window: time.Minute},
		engine.WithClock(clk), engine.WithMaxKeys(1))
	if err != nil {
		t.Fatal(err)
	}
	defer capped.Close()
	srv2 := newServer(t, capped, httplimit.WithKeyFunc(httplimit.HeaderKey("X-API-Key")))
	if r := get(t, srv2.Client(), srv2.URL, "X-API-Key", "first"); r.status != 200 {
		t.Fatalf("first key: %d", r.status)
	}
	r := get(t, srv2.Client(), srv2.URL, "X-API-Key", "second")
	var p httplimit.Problem
	if err := json.Unmarshal([]byte(r.body), &p); err != nil || r.status != 429 || p.Reason != "key_cap" || !strings.Contains(p.Detail, "key cap") {
		t.Errorf("second key at the cap: %d %s", r.status, r.body)
	}
}

// TestForwardedKeyErrorHidesProxies: when a trusted proxy forwards a
// chain without a usable client address, the 400 the client sees names
// the bad entry but no address of the proxies in front of the service.
func TestForwardedKeyErrorHidesProxies(t *testing.T) {
	ip := httplimit.ClientIP{TrustedProxies: []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8"), netip.MustParsePrefix("10.0.0.0/8")}}
	srv := newServer(t, mustLimiter(t, "free", 5, engine.NewManualClock()), httplimit.WithKeyFunc(ip.Key))
	for _, xff := range []string{"unknown", "unknown, 10.9.8.7"} {
		r := get(t, srv.Client(), srv.URL, "X-Forwarded-For", xff)
		if r.status != http.StatusBadRequest || !strings.Contains(r.body, `\"unknown\"`) {
			t.Errorf("XFF %q: %d %s", xff, r.status, r.body)
		}
		if strings.Contains(r.body, "10.9.8.7") || strings.Contains(r.body, "127.0.0.1") {
			t.Errorf("XFF %q: the answer names a proxy: %s", xff, r.body)
		}
	}
}
