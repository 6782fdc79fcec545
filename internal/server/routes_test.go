package server_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/slidegate/slidegate/engine"
	"github.com/slidegate/slidegate/httplimit"
	"github.com/slidegate/slidegate/internal/backendtest"
	"github.com/slidegate/slidegate/internal/reference"
	"github.com/slidegate/slidegate/internal/server"
	"github.com/slidegate/slidegate/internal/server/config"
)

// group posts a multi-limit request and decodes the answer strictly.
func (e *env) group(body string) (reply, server.GroupResponse) {
	e.t.Helper()
	r := e.do("POST", e.base+"/v1/allow", body)
	var gr server.GroupResponse
	if r.status == 200 || r.status == 429 {
		dec := json.NewDecoder(bytes.NewReader(r.body))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&gr); err != nil {
			e.t.Fatalf("group body %q: %v", r.body, err)
		}
	}
	return r, gr
}

// groupConfig turns on the draft pair and the X-RateLimit-* trio (both
// off by default on the decision API) so that runGroupSteps checks every
// family's binding limit.
const groupConfig = `
max_batch: 4
decision_headers: {draft: true, x: true}
policies:
  - {name: per_second, limit: 2, window: 1s}
  - {name: per_hour, limit: 3, window: 1h}
  - {name: per_user, limit: 3, window: 60s}
  - {name: per_ip, limit: 2, window: 60s}
`

// gstep is one row of a multi-limit step table: the request, when, and
// what the answer must say.
type gstep struct {
	at        time.Duration
	body      string
	status    int
	remaining []int // each limit's remaining, in the request's order
	binding   int
	retry     string // Retry-After
	why       string
}

func runGroupSteps(t *testing.T, e *env, clk *engine.ManualClock, rows []gstep) {
	t.Helper()
	for i, s := range rows {
		clk.Set(s.at)
		r, gr := e.group(s.body)
		var rem []int
		for _, l := range gr.Limits {
			rem = append(rem, l.Remaining)
		}
		if r.status != s.status || fmt.Sprint(rem) != fmt.Sprint(s.remaining) || gr.Binding != s.binding ||
			r.header.Get("Retry-After") != s.retry || gr.Allowed != (s.status == 200) {
			t.Fatalf("step %d (%s) at %v: status %d remaining %v binding %d retry %q; want %d %v %d %q\n%s",
				i, s.why, s.at, r.status, rem, gr.Binding, r.header.Get("Retry-After"), s.status, s.remaining, s.binding, s.retry, r.body)
		}
		// The headers report the binding limit.
		b := gr.Limits[gr.Binding]
		if got := r.header.Get("X-RateLimit-Remaining"); got != fmt.Sprint(b.Remaining) {
			t.Fatalf("step %d: X-RateLimit-Remaining %q, binding limit has %d", i, got, b.Remaining)
		}
		if got := r.header.Get("X-RateLimit-Limit"); got != fmt.Sprint(b.Limit) {
			t.Fatalf("step %d: X-RateLimit-Limit %q, binding limit is %d", i, got, b.Limit)
		}
		if got := r.header.Get("RateLimit"); !strings.HasPrefix(got, fmt.Sprintf("%q;r=%d;", b.Policy, b.Remaining)) {
			t.Fatalf("step %d: RateLimit %q is not the binding %s's", i, got, b.Policy)
		}
	}
}

// TestAPIGroupSteps: per-second plus per-hour on one key, and per-user
// plus per-IP, through POST /v1/allow; a refusal by either limit leaves
// both untouched.
func TestAPIGroupSteps(t *testing.T) {
	clk := engine.NewManualClock()
	e := start(t, mustParse(t, groupConfig), server.WithClock(clk))
	const both = `{"limits":[{"policy":"per_second","key":"u1"},{"policy":"per_hour","key":"u1"}]}`
	const s = time.Second
	runGroupSteps(t, e, clk, []gstep{
		{0, both, 200, []int{1, 2}, 0, "", "first: per_second has the least left"},
		{0, both, 200, []int{0, 1}, 0, "", "second: per_second 0, per_hour 1"},
		{0, both, 429, []int{0, 1}, 0, "1", "per_second refuses; per_hour is not charged (still 1)"},
		{0, both, 429, []int{0, 1}, 0, "1", "again: still not charged"},
		{2 * s, both, 200, []int{1, 0}, 1, "", "per_second is free; per_hour takes its third and binds"},
		{3 * s, both, 429, []int{2, 0}, 1, "3597", "per_hour refuses until 1 h; per_second is not charged (2 left)"},
		{3 * s, `{"limits":[{"policy":"per_second","key":"u1"}]}`, 200, []int{1}, 0, "", "per_second alone: the refusals charged it nothing"},
	})
	const user = `{"limits":[{"policy":"per_user","key":"%s"},{"policy":"per_ip","key":"10.0.0.1"}]}`
	runGroupSteps(t, e, clk, []gstep{
		{10 * s, fmt.Sprintf(user, "alice"), 200, []int{2, 1}, 1, "", "alice from 10.0.0.1"},
		{10 * s, fmt.Sprintf(user, "bob"), 200, []int{2, 0}, 1, "", "bob from the same address: per_ip binds"},
		{11 * s, fmt.Sprintf(user, "carol"), 429, []int{3, 0}, 1, "59", "carol: per_ip refuses; per_user of carol untouched (3 left)"},
		{11 * s, `{"limits":[{"policy":"per_user","key":"carol"},{"policy":"per_ip","key":"10.0.0.2"}],"cost":2}`, 200, []int{1, 0}, 1, "",
			"carol from another address, cost 2: per_ip's refusal charged her nothing, so 1 is left"},
		{11 * s, `{"limits":[{"policy":"per_user","key":"carol"},{"policy":"per_ip","key":"10.0.0.3"}]}`, 200, []int{0, 1}, 0, "",
			"carol spends her last"},
		{12 * s, `{"limits":[{"policy":"per_user","key":"carol"},{"policy":"per_ip","key":"10.0.0.9"}]}`, 429, []int{0, 2}, 0, "59",
			"per_user refuses carol; the new address is not charged (2 left)"},
	})
	if r, d := e.allow(`{"key":"10.0.0.9","policy":"per_ip","cost":2}`); r.status != 200 || d.Remaining != 0 {
		t.Fatalf("per_ip of 10.0.0.9 was charged by a refused request: %d %+v", r.status, d)
	}
	// RateLimit-Policy lists every policy of the request.
	clk.Set(time.Hour + 10*s)
	r, _ := e.group(both)
	if got := r.header.Get("RateLimit-Policy"); got != `"per_second";q=2;w=1, "per_hour";q=3;w=3600` {
		t.Errorf("RateLimit-Policy %q", got)
	}
}

// TestAPIGroupBadInput: every malformed multi-limit request is a 4xx
// problem+json and charges nothing.
func TestAPIGroupBadInput(t *testing.T) {
	clk := engine.NewManualClock()
	e := start(t, mustParse(t, groupConfig), server.WithClock(clk))
	many := make([]string, config.MaxLimits+1)
	for i := range many {
		many[i] = fmt.Sprintf(`{"policy":"per_user","key":"k%d"}`, i)
	}
	long := strings.Repeat("x", httplimit.MaxKeyLen+1)
	const ok = `{"policy":"per_user","key":"a"}`
	cases := []struct {
		body   string
		status int
		detail string
	}{
		{`{"limits":[` + ok + `,{"policy":"gold","key":"a"}]}`, 400, `limits[1]: unknown policy "gold"`},
		{`{"limits":[` + strings.Join(many, ",") + `]}`, 400, fmt.Sprintf("at most %d", config.MaxLimits)},
		{`{"limits":[` + ok + `,{"policy":"per_ip","key":"a"}],"cost":3}`, 400, "cost 3 is outside 1..2 (the smallest limit"},
		{`{"limits":[` + ok + `],"cost":0}`, 400, "cost 0 is outside 1..3"},
		{`{"limits":[` + ok + `],"cost":1.5}`, 400, "malformed JSON"},
		{`{"limits":[` + ok + `,` + ok + `]}`, 400, "limits[1] repeats limits[0]"},
		{`{"limits":[]}`, 400, `"limits" is empty`},
		{`{"limits":{}}`, 400, `"limits" must be an array`},
		{`{"limits":[` + ok + `],"key":"a"}`, 400, "not both"},
		{`{"limits":[{"key":"a"}]}`, 400, `limits[0]: missing "policy"`},
		{`{"limits":[{"policy":"per_user"}]}`, 400, `limits[0]: missing "key"`},
		{`{"limits":[{"policy":"per_user","key":"` + long + `"}]}`, 400, "longer than"},
		{`{"limits":[{"policy":"per_user","key":"a","cost":2}]}`, 400, `limits[0]: unknown field "cost"`},
		{`{"limits":[{"policy":"per_user","key":7}]}`, 400, `"key" must be a string`},
	}
	for _, c := range cases {
		r := e.do("POST", e.base+"/v1/allow", c.body)
		p := decodeProblem(t, r.body)
		if r.status != c.status || !strings.Contains(p.Detail, c.detail) || r.header.Get("Content-Type") != "application/problem+json" {
			t.Errorf("%.60s: %d %s, want %d with %q", c.body, r.status, r.body, c.status, c.detail)
		}
		// The same item in a batch: the whole batch is refused.
		r = e.do("POST", e.base+"/v1/allow/batch", `[{"key":"a","policy":"per_ip"},`+c.body+`]`)
		if p := decodeProblem(t, r.body); r.status != c.status || !strings.Contains(p.Detail, "item 1: ") {
			t.Errorf("batch with %.60s: %d %s", c.body, r.status, r.body)
		}
	}
	// Nothing was charged.
	for _, k := range []string{"a", "k0"} {
		for _, p := range []string{"per_user", "per_ip"} {
			b, _ := e.srv.Backend(p)
			if st, held, err := b.(engine.KeyAdmin).InspectKey(context.Background(), k); err != nil || held {
				t.Errorf("%s of %q holds state after bad requests: %+v", p, k, st)
			}
		}
	}
}

// TestAPIGroupBatch: a batch mixes single and multi-limit items, each
// decided on its own (the multi-limit ones all or nothing).
func TestAPIGroupBatch(t *testing.T) {
	clk := engine.NewManualClock()
	e := start(t, mustParse(t, groupConfig), server.WithClock(clk))
	r := e.do("POST", e.base+"/v1/allow/batch", `[
		{"key":"ip1","policy":"per_ip","cost":2},
		{"limits":[{"policy":"per_user","key":"u"},{"policy":"per_ip","key":"ip1"}]},
		{"limits":[{"policy":"per_user","key":"u"},{"policy":"per_ip","key":"ip2"}]}]`)
	var out []json.RawMessage
	if err := json.Unmarshal(r.body, &out); r.status != 200 || err != nil || len(out) != 3 {
		t.Fatalf("batch: %d %s (%v)", r.status, r.body, err)
	}
	var g1, g2 server.GroupResponse
	_ = json.Unmarshal(out[1], &g1)
	_ = json.Unmarshal(out[2], &g2)
	if g1.Allowed || g1.Binding != 1 || g1.Limits[0].Remaining != 3 {
		t.Errorf("item 1 (per_ip spent by item 0): %s", out[1])
	}
	if !g2.Allowed || g2.Limits[0].Remaining != 2 {
		t.Errorf("item 2: per_user must be charged once, by this item only: %s", out[2])
	}
}

// failingStore is the memory engine behind a store URL whose backends
// fail for the key "down", as a remote store fails: for the reports of
// a batch the store cannot finish.
func failingStore(_ context.Context, spec server.StoreSpec) (server.Store, error) {
	var opts []engine.Option
	if spec.Clock != nil {
		opts = append(opts, engine.WithClock(spec.Clock))
	}
	var out []engine.Backend
	for _, p := range spec.Policies {
		l, err := engine.New(p, opts...)
		if err != nil {
			return server.Store{}, err
		}
		out = append(out, failOn{l})
	}
	return server.Store{Backends: out}, nil
}

type failOn struct{ *engine.Limiter }

func (f failOn) Decide(ctx context.Context, key string, n int) (engine.Decision, error) {
	if key == "down" {
		return engine.Decision{}, errors.New("redisstore: dial tcp 10.1.2.3:6379: connection refused")
	}
	return f.Limiter.Decide(ctx, key, n)
}

// TestBatchStoreFailure: the store fails on item 2; the answer is a 503
// that says items 0 and 1 were decided (their decisions are in it, and
// what they charged stays charged), item 2 and later were not, and it
// names no address.
func TestBatchStoreFailure(t *testing.T) {
	clk := engine.NewManualClock()
	cfg := mustParse(t, "store: fail://x\npolicies:\n  - {name: free, limit: 5, window: 60s}\n")
	e := start(t, cfg, server.WithClock(clk), server.WithStore("fail", failingStore))
	r := e.do("POST", e.base+"/v1/allow/batch", `[{"key":"a","cost":2},{"key":"b"},{"key":"down"},{"key":"a"}]`)
	var body struct {
		httplimit.Problem
		FailedItem int                    `json:"failed_item"`
		Decided    []server.AllowResponse `json:"decided"`
	}
	if err := json.Unmarshal(r.body, &body); err != nil || r.status != 503 || body.FailedItem != 2 || len(body.Decided) != 2 ||
		body.Decided[0].Remaining != 3 || body.Decided[1].Remaining != 4 {
		t.Fatalf("batch with a failing item: %d %s (%v)", r.status, r.body, err)
	}
	if strings.Contains(string(r.body), "10.1.2.3") || !strings.Contains(body.Detail, "items 0 to 1 were decided") {
		t.Errorf("detail: %s", r.body)
	}
	// Exactly what the answer says was charged: a's 2, not item 3's 1.
	if _, d := e.allow(`{"key":"a"}`); d.Remaining != 2 {
		t.Errorf("a after the failed batch: %+v, want 2 left (only item 0 charged)", d)
	}
	r = e.do("POST", e.base+"/v1/allow/batch", `[{"key":"down"},{"key":"a"}]`)
	if err := json.Unmarshal(r.body, &body); err != nil || r.status != 503 || body.FailedItem != 0 || len(body.Decided) != 0 || !strings.Contains(body.Detail, "no item was decided") {
		t.Errorf("failing first item: %d %s", r.status, r.body)
	}
	// No group in this store: a multi-limit request is 501, and a route
	// of two limits is refused at start-up.
	if r := e.do("POST", e.base+"/v1/allow", `{"limits":[{"policy":"free","key":"a"},{"policy":"free","key":"b"}]}`); r.status != 501 {
		t.Errorf("multi-limit request on a store without a group: %d %s", r.status, r.body)
	}
	if r, gr := e.group(`{"limits":[{"policy":"free","key":"a"}]}`); r.status != 200 || gr.Limits[0].Remaining != 1 {
		t.Errorf("a \"limits\" request of one limit needs no group: %d %s", r.status, r.body)
	}
	cfg = mustParse(t, `
store: fail://x
upstream: http://127.0.0.1:1
policies:
  - {name: free, limit: 5, window: 60s}
  - {name: hour, limit: 50, window: 1h}
routes:
  - {path: /api, limits: [{policy: free}, {policy: hour}]}
`)
	if _, err := server.New(cfg, server.WithLogger(quiet), server.WithStore("fail", failingStore)); err == nil ||
		!strings.Contains(err.Error(), "routes[0].limits: 2 limits, but store fail:// cannot decide several limits at once") {
		t.Errorf("a route of two limits on a store without a group: %v", err)
	}
	cfg.Routes[0].Limits = cfg.Routes[0].Limits[:1]
	s, err := server.New(cfg, server.WithLogger(quiet), server.WithStore("fail", failingStore))
	if err != nil {
		t.Fatalf("a route of one limit needs no group: %v", err)
	}
	_ = s.Close()
}

// TestParallelGroupReplay: goroutines send multi-limit and single-limit
// requests over overlapping sets of few keys and three policies with tiny
// windows, through the real listener; every decision, sorted by instant,
// must replay exactly through one reference log per policy.
func TestParallelGroupReplay(t *testing.T) {
	for _, procs := range []int{1, 2, 8} {
		t.Run(fmt.Sprintf("GOMAXPROCS=%d", procs), func(t *testing.T) {
			defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(procs))
			cfg := mustParse(t, `
max_batch: 8
policies:
  - {name: a, limit: 4, window: 15ms}
  - {name: b, limit: 6, window: 40ms}
  - {name: c, limit: 9, window: 1h}
`)
			// Recorded from the responses, which carry every limit's
			// decision, so that the built-in memory store is what runs.
			rec := &recorder{}
			e := start(t, cfg)
			names := []string{"a", "b", "c"}
			keys := []string{"k0", "k1", "k2"}
			const goroutines, perG = 12, 80
			var wg sync.WaitGroup
			for g := range goroutines {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for i := range perG {
						var (
							parts []string
							sent  []recordLimit
						)
						for j := range 1 + (g+i)%3 {
							p, k := names[(g+i+j)%3], keys[(g*5+i+2*j)%3]
							parts = append(parts, fmt.Sprintf(`{"policy":%q,"key":%q}`, p, k))
							sent = append(sent, recordLimit{Policy: p, Key: k})
						}
						cost := 1 + i%2
						body := fmt.Sprintf(`{"limits":[%s],"cost":%d}`, strings.Join(parts, ","), cost)
						single := []recordLimit{{Policy: names[g%3], Key: keys[i%3]}}
						batch := i%5 == 0
						if batch {
							body = fmt.Sprintf(`[%s,{"key":%q,"policy":%q}]`, body, single[0].Key, single[0].Policy)
						}
						path := "/v1/allow"
						if batch {
							path += "/batch"
						}
						req, _ := http.NewRequest("POST", e.base+path, strings.NewReader(body))
						req.Header.Set("Content-Type", "application/json")
						resp, err := e.client.Do(req)
						if err != nil {
							t.Error(err)
							return
						}
						data, err := io.ReadAll(resp.Body)
						resp.Body.Close()
						if err != nil {
							t.Error(err)
							return
						}
						if resp.StatusCode != 200 && resp.StatusCode != 429 {
							t.Errorf("%s: status %d", body, resp.StatusCode)
							return
						}
						items := []json.RawMessage{data}
						if batch {
							if err := json.Unmarshal(data, &items); err != nil || len(items) != 2 {
								t.Errorf("%s: batch answer %s (%v)", body, data, err)
								return
							}
						}
						r, err := responseRecord(sent, cost, true, items[0])
						if err == nil {
							rec.add(r)
							if batch {
								r, err = responseRecord(single, 1, false, items[1])
								rec.add(r)
							}
						}
						if err != nil {
							t.Errorf("%s: %v", body, err)
							return
						}
					}
				}()
			}
			wg.Wait()
			if want := goroutines*perG + goroutines*perG/5; rec.Len() != want {
				t.Fatalf("%d records for %d decisions", rec.Len(), want)
			}
			ps := make([]engine.Policy, len(names))
			idx := map[string]int{}
			for i, n := range names {
				b, _ := e.srv.Backend(n)
				ps[i], idx[n] = b.Policy(), i
			}
			var recs []reference.GroupRecord
			for _, r := range rec.Records() {
				recs = append(recs, groupRecord(idx, r))
			}
			backendtest.VerifyGroup(t, ps, recs)
		})
	}
}

// groupRecord turns a server record, of one limit or several, into the
// reference's form.
func groupRecord(idx map[string]int, r record) reference.GroupRecord {
	ls := r.Limits
	if ls == nil {
		ls = []recordLimit{{Policy: r.Policy, Key: r.Key, Decision: r.Decision}}
	}
	gr := reference.GroupRecord{Cost: r.Cost, At: ls[0].Decision.At, Allowed: true}
	for _, l := range ls {
		d := l.Decision
		gr.Allowed = gr.Allowed && d.Allowed
		gr.Keys = append(gr.Keys, l.Key)
		gr.Policies = append(gr.Policies, idx[l.Policy])
		gr.Limits = append(gr.Limits, reference.Result{Allowed: d.Allowed, Remaining: d.Remaining,
			RetryAfter: int64(d.RetryAfter), Reset: int64(d.Reset)})
	}
	return gr
}

// responseRecord turns a decision API response to a request of cost
// cost over the limits sent into a record: a GroupResponse when the
// request gave "limits" (group), else an AllowResponse.
func responseRecord(sent []recordLimit, cost int, group bool, data []byte) (record, error) {
	var ars []server.AllowResponse
	binding := 0
	if !group {
		var ar server.AllowResponse
		if err := json.Unmarshal(data, &ar); err != nil {
			return record{}, err
		}
		ars = []server.AllowResponse{ar}
	} else {
		var gr server.GroupResponse
		if err := json.Unmarshal(data, &gr); err != nil {
			return record{}, err
		}
		ars, binding = gr.Limits, gr.Binding
	}
	if len(ars) != len(sent) || binding < 0 || binding >= len(ars) {
		return record{}, fmt.Errorf("%d decisions (binding %d) for %d limits", len(ars), binding, len(sent))
	}
	r := record{Cost: cost, Limits: make([]recordLimit, len(sent))}
	for i, ar := range ars {
		if ar.Policy != sent[i].Policy {
			return record{}, fmt.Errorf("decision %d is policy %q's, %q was sent", i, ar.Policy, sent[i].Policy)
		}
		r.Limits[i] = recordLimit{Policy: ar.Policy, Key: sent[i].Key, Decision: engine.Decision{
			Allowed: ar.Allowed, Limit: ar.Limit, Remaining: ar.Remaining,
			RetryAfter: time.Duration(ar.RetryAfterNs), Reset: time.Duration(ar.ResetNs), At: ar.At,
		}}
	}
	b := r.Limits[binding]
	r.Policy, r.Key, r.Decision = b.Policy, b.Key, b.Decision
	return r, nil
}

const routesConfig = `
key: header:X-User
tier_header: X-Plan
policies:
  - {name: free, limit: 100, window: 60s}
  - {name: login_ip, limit: 2, window: 60s}
  - {name: per_second, limit: 2, window: 1s}
  - {name: per_hour, limit: 4, window: 1h}
  - {name: paid_second, limit: 5, window: 1s}
  - {name: export, limit: 1, window: 60s}
routes:
  - {method: POST, path: /login, limits: [{policy: login_ip, key: ip}]}
  - path: /api
    limits: [{policy: per_second}, {policy: per_hour}]
    tiers:
      paid: [{policy: paid_second}, {policy: per_hour}]
  - path: /api/export/
    limits: [{policy: export, key: "const:all"}, {policy: per_hour}]
`

// TestGatewayRoutes: the longest prefix and the method choose a route,
// matched on the cleaned path; every limit of the route is decided at
// once; the headers report the binding limit and list every policy; a
// route's tiers choose among its lists.
func TestGatewayRoutes(t *testing.T) {
	up, hits := upstream(t)
	cfg := mustParse(t, routesConfig)
	cfg.Upstream = config.UpstreamURL(up.URL)
	clk := engine.NewManualClock()
	e := start(t, cfg, server.WithClock(clk))
	type row struct {
		method, path string
		hdr          []string
		status       int
		policy       string // RateLimit-Policy
		remaining    string // X-RateLimit-Remaining
		why          string
	}
	const (
		login = `"login_ip";q=2;w=60`
		api   = `"per_second";q=2;w=1, "per_hour";q=4;w=3600`
		paid  = `"paid_second";q=5;w=1, "per_hour";q=4;w=3600`
		exp   = `"export";q=1;w=60, "per_hour";q=4;w=3600`
		free  = `"free";q=100;w=60`
	)
	u1 := []string{"X-User", "u1"}
	steps := []struct {
		at time.Duration
		row
	}{
		{0, row{"POST", "/login", nil, 200, login, "1", "POST /login: one limit by address, no X-User needed"}},
		{0, row{"POST", "//login", nil, 200, login, "0", "the cleaned path is /login"}},
		{0, row{"POST", "/./login/", nil, 429, login, "0", "so is this one: refused"}},
		{0, row{"POST", "/login/step2", nil, 429, login, "0", "below /login: the same route"}},
		{0, row{"POST", "/loginx", u1, 200, free, "99", "not below /login: no route; the default policy by X-User"}},
		{0, row{"GET", "/login", u1, 200, free, "98", "the route is POST only"}},
		{0, row{"POST", "/login", []string{"X-Plan", "gold"}, 429, login, "0", "a route without tiers ignores the tier header"}},
		{0, row{"GET", "/api/v1/items", u1, 200, api, "1", "/api: per_second binds"}},
		{0, row{"GET", "/api", u1, 200, api, "0", ""}},
		{0, row{"GET", "/api/v1", u1, 429, api, "0", "per_second refuses; per_hour not charged"}},
		{0, row{"GET", "/api", []string{"X-User", "u1", "X-Plan", "paid"}, 200, paid, "1", "the paid list: per_hour has 1 left after 3"}},
		{0, row{"GET", "/api", []string{"X-User", "u1", "X-Plan", "gold"}, 400, "", "", "a tier the route does not have"}},
		{0, row{"GET", "/api/export/csv", u1, 200, exp, "0", "the longer prefix wins; export is global and binds"}},
		{0, row{"GET", "/api/export/csv", []string{"X-User", "u2"}, 429, exp, "0", "export is one key for everybody"}},
		{2 * time.Second, row{"GET", "/api", u1, 429, api, "0", "per_hour has had 4 (2 + 1 paid + 1 export): refused"}},
		{2 * time.Second, row{"GET", "/api", []string{"X-User", "u2"}, 200, api, "1", "another user; export's refusal charged u2 nothing"}},
	}
	sent := int64(0)
	for i, s := range steps {
		clk.Set(s.at)
		r := e.do(s.method, e.base+s.path, "", s.hdr...)
		if r.status != s.status || r.header.Get("RateLimit-Policy") != s.policy || r.header.Get("X-RateLimit-Remaining") != s.remaining {
			t.Fatalf("step %d (%s): %s %s: %d policy %q remaining %q; want %d %q %q\n%s", i, s.why, s.method, s.path,
				r.status, r.header.Get("RateLimit-Policy"), r.header.Get("X-RateLimit-Remaining"), s.status, s.policy, s.remaining, r.body)
		}
		if s.status == 200 {
			sent++
		}
		if hits.Load() != sent {
			t.Fatalf("step %d: the upstream saw %d requests, %d were allowed", i, hits.Load(), sent)
		}
	}
}

// TestReloadStressGroups: reloads in a tight loop (changing one policy,
// so that every reload builds a new group over the kept limiters and a
// fresh one) while goroutines send multi-limit requests over the two kept
// policies and overlapping keys through the real listener. Every decision
// over the kept policies, sorted by instant, replays exactly through the
// reference: the groups of successive configurations share the kept
// limiters' logs.
func TestReloadStressGroups(t *testing.T) {
	for _, procs := range []int{2, 8, 32} {
		t.Run(fmt.Sprint("GOMAXPROCS=", procs), func(t *testing.T) {
			defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(procs))
			const base = `
policies:
  - {name: a, limit: 4, window: 3ms}
  - {name: b, limit: 7, window: 250ms}
  - {name: churn, limit: %d, window: 1ms}
`
			// a's window slides many times a run; b's is long enough to
			// refuse even on a loaded machine, where a key's requests come
			// further apart than a's 3 ms.
			// The memory store is the subject (its reload keeps a and b's
			// limiters and builds a new group over them), so the decisions
			// are recorded from the responses, which carry every limit's.
			rec := &recorder{}
			cfgs := []config.Config{mustParse(t, fmt.Sprintf(base, 3)), mustParse(t, fmt.Sprintf(base, 4))}
			e := start(t, cfgs[0])
			stop := make(chan struct{})
			var (
				reloads int
				wg      sync.WaitGroup
			)
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := 0; ; i++ {
					select {
					case <-stop:
						return
					default:
					}
					if err := e.srv.Reload(cfgs[i%2]); err != nil {
						t.Errorf("reload: %v", err)
						return
					}
					reloads++
				}
			}()
			const workers, each = 8, 120
			var dwg sync.WaitGroup
			for w := range workers {
				dwg.Add(1)
				go func() {
					defer dwg.Done()
					for i := range each {
						k1, k2 := fmt.Sprint("k", (w+i)%3), fmt.Sprint("k", (w+2*i)%3)
						sent := []recordLimit{{Policy: "a", Key: k1}, {Policy: "b", Key: k1}, {Policy: "a", Key: k2}}
						body := fmt.Sprintf(`{"limits":[{"policy":"a","key":%q},{"policy":"b","key":%q},{"policy":"a","key":%q}]}`, k1, k1, k2)
						if i%3 == 0 {
							sent = []recordLimit{{Policy: "churn", Key: k2}, {Policy: "churn", Key: k1}}
							body = fmt.Sprintf(`{"limits":[{"policy":"churn","key":%q},{"policy":"churn","key":%q}]}`, k2, k1)
							if k1 == k2 {
								sent = sent[:1]
								body = fmt.Sprintf(`{"key":%q,"policy":"churn"}`, k1)
							}
						}
						req, _ := http.NewRequest("POST", e.base+"/v1/allow", strings.NewReader(body))
						req.Header.Set("Content-Type", "application/json")
						resp, err := e.client.Do(req)
						if err != nil {
							t.Errorf("request: %v", err)
							return
						}
						data, err := io.ReadAll(resp.Body)
						resp.Body.Close()
						if err != nil {
							t.Errorf("reading the response: %v", err)
							return
						}
						if resp.StatusCode != 200 && resp.StatusCode != 429 {
							t.Errorf("status %d during reloads", resp.StatusCode)
							return
						}
						r, err := responseRecord(sent, 1, len(sent) > 1, data)
						if err != nil {
							t.Errorf("%s: %v", data, err)
							return
						}
						rec.add(r)
					}
				}()
			}
			dwg.Wait()
			close(stop)
			wg.Wait()
			if reloads == 0 {
				t.Fatal("no reload ran")
			}
			// The requests over churn, a policy each reload renews, touch
			// no kept policy; the others are over the kept a and b only.
			idx := map[string]int{"a": 0, "b": 1}
			var recs []reference.GroupRecord
			for _, r := range rec.Records() {
				if r.Policy != "churn" {
					recs = append(recs, groupRecord(idx, r))
				}
			}
			ps := []engine.Policy{{Name: "a", Limit: 4, Window: 3 * time.Millisecond}, {Name: "b", Limit: 7, Window: 250 * time.Millisecond}}
			backendtest.VerifyGroup(t, ps, recs)
			t.Logf("%d decisions over the kept policies across %d reloads", len(recs), reloads)
		})
	}
}

// TestParallelReplayRoutes: goroutines send requests through the gateway
// to routes whose lists overlap (per-user limits shared between routes, a
// global limit), with tiny windows, at GOMAXPROCS 2, 8 and 32; every
// decision the middleware made, sorted by instant, replays exactly
// through one reference log per policy.
func TestParallelReplayRoutes(t *testing.T) {
	for _, procs := range []int{2, 8, 32} {
		t.Run(fmt.Sprint("GOMAXPROCS=", procs), func(t *testing.T) {
			defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(procs))
			up, hits := upstream(t)
			cfg := mustParse(t, `
key: header:X-User
policies:
  - {name: p1, limit: 3, window: 5ms}
  - {name: p2, limit: 5, window: 20ms}
  - {name: global, limit: 8, window: 10ms}
routes:
  - {path: /a, limits: [{policy: p1}, {policy: p2}]}
  - {path: /b, limits: [{policy: p2}, {policy: global, key: "const:all"}]}
  - {path: /a/c, method: GET, limits: [{policy: global, key: "const:all"}, {policy: p1}, {policy: p2, key: "const:all"}]}
`)
			cfg.Upstream = config.UpstreamURL(up.URL)
			rec := &recorder{}
			opt := recordingStore(&cfg, rec)
			e := start(t, cfg, opt)
			paths := []string{"/a/x", "/b", "/a/c/d", "/other"}
			const workers, each = 8, 100
			var (
				wg      sync.WaitGroup
				allowed sync.Map
			)
			for w := range workers {
				wg.Add(1)
				go func() {
					defer wg.Done()
					n := 0
					for i := range each {
						req, _ := http.NewRequest("GET", e.base+paths[(w+i)%len(paths)], nil)
						req.Header.Set("X-User", fmt.Sprint("u", (w*3+i)%2))
						resp, err := e.client.Do(req) // not e.do: it calls t.Fatal
						if err != nil {
							t.Error(err)
							return
						}
						_, _ = io.Copy(io.Discard, resp.Body)
						resp.Body.Close()
						if resp.StatusCode != 200 && resp.StatusCode != 429 {
							t.Errorf("status %d", resp.StatusCode)
							return
						}
						if resp.StatusCode == 200 {
							n++
						}
					}
					allowed.Store(w, n)
				}()
			}
			wg.Wait()
			total := 0
			allowed.Range(func(_, v any) bool { total += v.(int); return true })
			if hits.Load() != int64(total) {
				t.Errorf("the upstream saw %d requests, clients got %d allowed", hits.Load(), total)
			}
			if rec.Len() != workers*each {
				t.Fatalf("%d records for %d requests", rec.Len(), workers*each)
			}
			idx := map[string]int{"p1": 0, "p2": 1, "global": 2}
			var recs []reference.GroupRecord
			for _, r := range rec.Records() {
				recs = append(recs, groupRecord(idx, r))
			}
			ps := []engine.Policy{
				{Name: "p1", Limit: 3, Window: 5 * time.Millisecond},
				{Name: "p2", Limit: 5, Window: 20 * time.Millisecond},
				{Name: "global", Limit: 8, Window: 10 * time.Millisecond},
			}
			backendtest.VerifyGroup(t, ps, recs)
		})
	}
}
