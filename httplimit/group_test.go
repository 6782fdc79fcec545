package httplimit_test

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/slidegate/slidegate/engine"
	"github.com/slidegate/slidegate/httplimit"
)

// TestStackedMiddlewaresOverCount shows the bug multi-limit tiers fix:
// two middlewares stacked, 3 per minute outside 2 per second. The outer
// one logs the requests the inner one refuses, so that after two served
// requests every later one is refused for the rest of the minute.
func TestStackedMiddlewaresOverCount(t *testing.T) {
	clk := engine.NewManualClock()
	perSecond, err := engine.New(engine.Policy{Name: "per_second", Limit: 2, Window: time.Second}, engine.WithClock(clk))
	if err != nil {
		t.Fatal(err)
	}
	defer perSecond.Close()
	perMinute := mustLimiter(t, "per_minute", 3, clk)
	inner, _ := httplimit.New(httplimit.WithBackend(perSecond), httplimit.WithKeyFunc(constKey("k")))
	outer, _ := httplimit.New(httplimit.WithBackend(perMinute), httplimit.WithKeyFunc(constKey("k")))
	srv := startServer(t, outer.Handler(inner.Handler(okHandler)))
	c := srv.Client()
	var got []int
	for _, at := range []time.Duration{0, 0, 0, 2 * time.Second} {
		clk.Set(at)
		got = append(got, get(t, c, srv.URL).status)
	}
	// 200, 200, 429 (per second), then 429 at 2 s although only two were
	// served: per_minute logged the third.
	if want := []int{200, 200, 429, 429}; !equalInts(got, want) {
		t.Fatalf("stacked: %v, want the over-counting %v", got, want)
	}
}

func equalInts(a, b []int) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// groupServer serves okHandler behind one multi-limit tier over ps, every
// limit keyed by keys[i] (nil: X-API-Key), on a real listener.
func groupServer(t *testing.T, clk engine.Clock, ps []engine.Policy, keys []httplimit.KeyFunc, opts ...httplimit.Option) (*testServer, *engine.Group) {
	t.Helper()
	g, err := engine.NewGroup(ps, engine.WithClock(clk))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { g.Close() })
	var limits []httplimit.GroupLimit
	for i, p := range ps {
		limits = append(limits, httplimit.GroupLimit{Policy: p.Name, Key: keys[i]})
	}
	m, err := httplimit.New(append([]httplimit.Option{
		httplimit.WithKeyFunc(httplimit.HeaderKey("X-API-Key")),
		httplimit.WithLimits("api", g, limits...),
	}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	return startServer(t, m.Handler(okHandler)), g
}

// TestLimitsAllOrNothing is the stacked case again with one multi-limit
// tier: a refusal by per_second leaves per_minute untouched, so that the
// client gets its three requests a minute.
func TestLimitsAllOrNothing(t *testing.T) {
	clk := engine.NewManualClock()
	ps := []engine.Policy{
		{Name: "per_second", Limit: 2, Window: time.Second},
		{Name: "per_minute", Limit: 3, Window: time.Minute},
	}
	srv, _ := groupServer(t, clk, ps, []httplimit.KeyFunc{nil, nil})
	c := srv.Client()
	type row struct {
		at        time.Duration
		status    int
		remaining string // X-RateLimit-Remaining: the binding limit's
		limit     string // X-RateLimit-Limit
		retry     string // Retry-After
		why       string
	}
	rows := []row{
		{0, 200, "1", "2", "", "first: per_second has 1 left, per_minute 2; the least is per_second's"},
		{0, 200, "0", "2", "", "second: per_second 0, per_minute 1"},
		{0, 429, "0", "2", "1", "third: per_second refuses, for 1 s; per_minute is not charged"},
		{2 * time.Second, 200, "0", "3", "", "per_second is free again; per_minute takes the third request and binds with 0"},
		{3 * time.Second, 429, "0", "3", "57", "per_minute refuses until its first entry leaves at 60 s"},
		{60 * time.Second, 200, "1", "2", "", "the two entries of 0 s left per_minute: 1 left after this one, and per_second 1; the tie goes to the earlier policy"},
	}
	for i, r := range rows {
		clk.Set(r.at)
		got := get(t, c, srv.URL, "X-API-Key", "u1")
		if got.status != r.status || got.header.Get("X-RateLimit-Remaining") != r.remaining ||
			got.header.Get("X-RateLimit-Limit") != r.limit || got.header.Get("Retry-After") != r.retry {
			t.Fatalf("step %d (%s) at %v: status %d remaining %q limit %q retry %q; want %d %q %q %q",
				i, r.why, r.at, got.status, got.header.Get("X-RateLimit-Remaining"), got.header.Get("X-RateLimit-Limit"),
				got.header.Get("Retry-After"), r.status, r.remaining, r.limit, r.retry)
		}
		if p := got.header.Get("RateLimit-Policy"); p != `"per_second";q=2;w=1, "per_minute";q=3;w=60` {
			t.Fatalf("step %d: RateLimit-Policy %q does not list both policies", i, p)
		}
	}
}

// TestLimitsRefusalBody: a refusal names the binding policy in its
// problem+json body and RateLimit header.
func TestLimitsRefusalBody(t *testing.T) {
	clk := engine.NewManualClock()
	ps := []engine.Policy{
		{Name: "per_user", Limit: 5, Window: time.Minute},
		{Name: "per_ip", Limit: 2, Window: time.Minute},
	}
	srv, _ := groupServer(t, clk, ps, []httplimit.KeyFunc{nil, httplimit.ClientIP{}.Key})
	c := srv.Client()
	for i := range 2 {
		if st := get(t, c, srv.URL, "X-API-Key", "u"+string(rune('a'+i))).status; st != 200 {
			t.Fatalf("request %d: %d", i, st)
		}
	}
	// A third user from the same address: per_ip refuses, and per_user
	// for "uc" is left untouched.
	got := get(t, c, srv.URL, "X-API-Key", "uc")
	if got.status != 429 {
		t.Fatalf("third user from one address: %d", got.status)
	}
	var p httplimit.Problem
	if err := json.Unmarshal([]byte(got.body), &p); err != nil || p.Policy != "per_ip" || p.Limit != 2 {
		t.Fatalf("problem %+v (%v), want policy per_ip limit 2: %s", p, err, got.body)
	}
	if rl := got.header.Get("RateLimit"); !strings.HasPrefix(rl, `"per_ip";r=0;`) {
		t.Fatalf("RateLimit %q is not the binding per_ip's", rl)
	}
}

// TestLimitsBadInput: a request without one of its keys, or with a cost
// above the smallest limit, is an error and charges nothing.
func TestLimitsBadInput(t *testing.T) {
	clk := engine.NewManualClock()
	ps := []engine.Policy{
		{Name: "per_user", Limit: 5, Window: time.Minute},
		{Name: "per_ip", Limit: 3, Window: time.Minute},
	}
	cost := 1
	srv, g := groupServer(t, clk, ps, []httplimit.KeyFunc{nil, httplimit.ClientIP{}.Key},
		httplimit.WithCostFunc(func(*http.Request) (int, error) { return cost, nil }))
	c := srv.Client()
	if st := get(t, c, srv.URL).status; st != 400 {
		t.Fatalf("no X-API-Key: %d, want 400", st)
	}
	cost = 4
	if got := get(t, c, srv.URL, "X-API-Key", "u"); got.status != 400 || !strings.Contains(got.body, "1..3") {
		t.Fatalf("cost 4 over a limit of 3: %d %s", got.status, got.body)
	}
	if n := g.Stats().Keys; n != 0 {
		t.Fatalf("bad requests left %d keys", n)
	}
	cost = 3
	if st := get(t, c, srv.URL, "X-API-Key", "u").status; st != 200 {
		t.Fatalf("cost 3: %d", st)
	}
}

// TestLimitsOptions: the option errors.
func TestLimitsOptions(t *testing.T) {
	g, err := engine.NewGroup([]engine.Policy{{Name: "a", Limit: 1, Window: time.Second}})
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	l, _ := engine.New(engine.Policy{Name: "a", Limit: 1, Window: time.Second})
	defer l.Close()
	many := make([]httplimit.GroupLimit, httplimit.MaxLimitsForTest+1)
	for i := range many {
		many[i] = httplimit.GroupLimit{Policy: "a", Key: constKey(string(rune('a' + i)))}
	}
	for name, opts := range map[string][]httplimit.Option{
		"no limits":      {httplimit.WithLimits("t", g)},
		"too many":       {httplimit.WithLimits("t", g, many...)},
		"unknown policy": {httplimit.WithLimits("t", g, httplimit.GroupLimit{Policy: "b"})},
		"twice":          {httplimit.WithLimits("t", g, httplimit.GroupLimit{Policy: "a"}, httplimit.GroupLimit{Policy: "a"})},
		"nil group":      {httplimit.WithLimits("t", nil, httplimit.GroupLimit{Policy: "a"})},
		"bad name":       {httplimit.WithLimits("", g, httplimit.GroupLimit{Policy: "a"})},
		"name clash":     {httplimit.WithBackend(l), httplimit.WithLimits("a", g, httplimit.GroupLimit{Policy: "a"})},
	} {
		if _, err := httplimit.New(opts...); !errors.Is(err, httplimit.ErrInvalidOption) {
			t.Errorf("%s: %v, want ErrInvalidOption", name, err)
		}
	}
}

// TestLimitsTagThroughAWrapper: a tier over a wrapper of a group that
// keeps keys in partitions still names the request's tag (WithTag):
// whether a backend needs a tag is part of the group interface, which a
// wrapper passes on.
func TestLimitsTagThroughAWrapper(t *testing.T) {
	ps := []engine.Policy{{Name: "per_user", Limit: 5, Window: time.Minute}, {Name: "per_ip", Limit: 5, Window: time.Minute}}
	g, err := engine.NewGroup(ps, engine.WithClock(engine.NewManualClock()))
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	tg := &taggedGroup{Group: g}
	m, err := httplimit.New(
		httplimit.WithKeyFunc(httplimit.HeaderKey("X-API-Key")),
		httplimit.WithLimits("api", passThrough{tg}, httplimit.GroupLimit{Policy: "per_user"}, httplimit.GroupLimit{Policy: "per_ip", Key: constKey("ip-1")}),
		httplimit.WithTag(httplimit.HeaderKey("X-API-Key")),
	)
	if err != nil {
		t.Fatal(err)
	}
	srv := startServer(t, m.Handler(okHandler))
	if r := get(t, srv.Client(), srv.URL, "X-API-Key", "u1"); r.status != 200 {
		t.Fatalf("status %d", r.status)
	}
	tg.mu.Lock()
	defer tg.mu.Unlock()
	if len(tg.tags) != 1 || tg.tags[0] != "u1" {
		t.Fatalf("tags the group saw: %q, want [u1]", tg.tags)
	}
}

// taggedGroup is the engine's group posing as one that keeps keys in
// partitions, recording the tag of each request.
type taggedGroup struct {
	*engine.Group
	mu   sync.Mutex
	tags []string
}

func (g *taggedGroup) NeedsTag() bool { return true }

func (g *taggedGroup) DecideGroup(ctx context.Context, dst []engine.Decision, req engine.GroupRequest) (engine.GroupDecision, error) {
	g.mu.Lock()
	g.tags = append(g.tags, req.Tag)
	g.mu.Unlock()
	return g.Group.DecideGroup(ctx, dst, req)
}

// passThrough shows nothing of the group it wraps beyond the interface.
type passThrough struct{ engine.GroupBackend }
