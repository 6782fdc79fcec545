package server_test

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/slidegate/slidegate/engine"
	"github.com/slidegate/slidegate/httplimit"
	"github.com/slidegate/slidegate/internal/reference"
	"github.com/slidegate/slidegate/internal/server"
	"github.com/slidegate/slidegate/internal/server/config"
)

const apiConfig = `
default_policy: free
max_body_bytes: 1024
max_batch: 3
policies:
  - {name: free, limit: 5, window: 60s}
  - {name: paid, limit: 10, window: 60s}
`

func TestDecisionAPI(t *testing.T) {
	clk := engine.NewManualClock()
	// The draft pair is off by default (TestDecisionHeaders checks the
	// default); on here, so that its values are checked with the body's.
	e := start(t, mustParse(t, "decision_headers: {draft: true}\n"+apiConfig), server.WithClock(clk))

	clk.Set(1500 * time.Millisecond)
	r, d := e.allow(`{"key":"alice"}`)
	want := server.AllowResponse{Allowed: true, Policy: "free", Limit: 5, Remaining: 4, ResetNs: int64(time.Minute), At: int64(1500 * time.Millisecond), ResetSeconds: 60}
	if r.status != 200 || d != want {
		t.Fatalf("first: %d %+v, want %+v", r.status, d, want)
	}
	// The draft pair as switched on, and no X-RateLimit-* (x stays at its
	// default, off; TestDecisionHeaders covers decision_headers).
	if r.header.Get("Content-Type") != "application/json" || r.header.Get("RateLimit") != `"free";r=4;t=60` ||
		r.header.Get("RateLimit-Policy") != `"free";q=5;w=60` || r.header.Get("Content-Length") != fmt.Sprint(len(r.body)) {
		t.Fatalf("headers %v", r.header)
	}
	for _, k := range []string{"X-RateLimit-Limit", "X-RateLimit-Remaining", "X-RateLimit-Reset"} {
		if v, ok := r.header[http.CanonicalHeaderKey(k)]; ok {
			t.Fatalf("%s: %q, but decision_headers.x is off by default", k, v)
		}
	}
	r, d = e.allow(`{"key":"alice","policy":"free","cost":4}`)
	if r.status != 200 || d.Remaining != 0 {
		t.Fatalf("cost 4: %d %+v", r.status, d)
	}
	clk.Set(20 * time.Second)
	r, d = e.allow(`{"key":"alice","cost":1}`)
	want = server.AllowResponse{Allowed: false, Policy: "free", Limit: 5, Remaining: 0,
		RetryAfterNs: int64(41500 * time.Millisecond), ResetNs: int64(41500 * time.Millisecond), At: int64(20 * time.Second),
		RetryAfterSeconds: 42, ResetSeconds: 42}
	if r.status != 429 || d != want {
		t.Fatalf("refused: %d %+v, want %+v", r.status, d, want)
	}
	if r.header.Get("Retry-After") != "42" {
		t.Fatalf("Retry-After %q", r.header.Get("Retry-After"))
	}
	r, d = e.allow(`{"key":"alice","policy":"paid","cost":10}`)
	if r.status != 200 || d.Policy != "paid" || d.Remaining != 0 || r.header.Get("RateLimit-Policy") != `"paid";q=10;w=60` {
		t.Fatalf("paid: %d %+v %v", r.status, d, r.header)
	}

	// Batch: in order, each decided.
	r = e.do("POST", e.base+"/v1/allow/batch", `[{"key":"bob"},{"key":"bob","cost":5},{"key":"carol","policy":"paid","cost":2}]`)
	var out []server.AllowResponse
	if err := json.Unmarshal(r.body, &out); err != nil || r.status != 200 || len(out) != 3 {
		t.Fatalf("batch: %d %s %v", r.status, r.body, err)
	}
	if !out[0].Allowed || out[0].Remaining != 4 || out[1].Allowed || out[1].RetryAfterNs != int64(time.Minute) || !out[2].Allowed || out[2].Policy != "paid" || out[2].Remaining != 8 {
		t.Fatalf("batch items %+v", out)
	}

	// Unknown routes (there is no test route either).
	if r := e.do("POST", e.base+"/v1/noop", `{"key":"x"}`); r.status != http.StatusNotFound {
		t.Errorf("/v1/noop: %d, want 404", r.status)
	}
	if r := e.do("GET", e.base+"/nope", ""); r.status != 404 || !strings.Contains(string(r.body), `"status":404`) {
		t.Errorf("unknown route: %d %s", r.status, r.body)
	}
}

// TestBadInput: every malformed request is a 4xx with a JSON body naming
// the problem, never a 500, and changes nothing.
func TestBadInput(t *testing.T) {
	clk := engine.NewManualClock()
	e := start(t, mustParse(t, apiConfig), server.WithClock(clk))
	big := `{"key":"` + strings.Repeat("x", 2000) + `"}`
	cases := []struct {
		path, method, body string
		status             int
		detail             string
	}{
		{"/v1/allow", "POST", `{"key":`, 400, "malformed JSON"},
		{"/v1/allow", "POST", ``, 400, "empty body"},
		{"/v1/allow", "POST", `not json`, 400, "malformed JSON"},
		{"/v1/allow", "POST", `{"key":"a"} {"key":"b"}`, 400, "data after the value"},
		{"/v1/allow", "POST", `{"key":"a","polcy":"free"}`, 400, `unknown field \"polcy\"`},
		{"/v1/allow", "POST", `[{"key":"a"}]`, 400, "malformed JSON"},
		{"/v1/allow", "POST", `{"policy":"free"}`, 400, `missing \"key\"`},
		{"/v1/allow", "POST", `{"key":""}`, 400, `missing \"key\"`},
		{"/v1/allow", "POST", `{"key":"a","policy":"gold"}`, 400, `unknown policy \"gold\"`},
		{"/v1/allow", "POST", `{"key":"a","cost":0}`, 400, "cost 0 is outside 1..5"},
		{"/v1/allow", "POST", `{"key":"a","cost":-3}`, 400, "cost -3 is outside 1..5"},
		{"/v1/allow", "POST", `{"key":"a","cost":6}`, 400, "cost 6 is outside 1..5"},
		{"/v1/allow", "POST", `{"key":"a","policy":"paid","cost":11}`, 400, "outside 1..10"},
		{"/v1/allow", "POST", `{"key":"a","cost":1.5}`, 400, "malformed JSON"},
		{"/v1/allow", "POST", `{"key":"a","cost":"1"}`, 400, "malformed JSON"},
		{"/v1/allow", "POST", `{"key":"a","cost":1e30}`, 400, "malformed JSON"},
		{"/v1/allow", "POST", `{"key":7}`, 400, "malformed JSON"},
		{"/v1/allow", "POST", big, 413, "max_body_bytes (1024 bytes)"},
		{"/v1/allow", "GET", ``, 405, "use POST"},
		{"/v1/allow/batch", "POST", `[]`, 400, "empty batch"},
		{"/v1/allow/batch", "POST", `{"key":"a"}`, 400, "want an array"},
		{"/v1/allow/batch", "POST", `[{"key":"a"},{"key":"a"},{"key":"a"},{"key":"a"}]`, 413, "exceeds max_batch (3)"},
		{"/v1/allow/batch", "POST", `[{"key":"a"},{"key":"a","cost":9}]`, 400, "item 1: cost 9 is outside 1..5"},
		{"/v1/allow/batch", "POST", `[{"key":"a"},{"key":"a","policy":"x"}]`, 400, `item 1: unknown policy`},
		{"/v1/allow/batch", "POST", `[` + big + `]`, 413, "max_body_bytes"},
	}
	for _, c := range cases {
		r := e.do(c.method, e.base+c.path, c.body)
		if r.status != c.status {
			t.Errorf("%s %s %.40q: status %d, want %d (%s)", c.method, c.path, c.body, r.status, c.status, r.body)
			continue
		}
		var p httplimit.Problem
		if err := json.Unmarshal(r.body, &p); err != nil || p.Status != c.status || !strings.Contains(p.Detail, strings.ReplaceAll(c.detail, `\"`, `"`)) {
			t.Errorf("%s %.40q: body %s (%v), want detail containing %q", c.path, c.body, r.body, err, c.detail)
		}
		if ct := r.header.Get("Content-Type"); ct != "application/problem+json" {
			t.Errorf("%s %.40q: content type %q", c.path, c.body, ct)
		}
	}
	// Nothing was charged: "a" still has its whole budget, and the bad
	// batch decided none of its items.
	if _, d := e.allow(`{"key":"a","cost":5}`); !d.Allowed {
		t.Errorf("bad requests consumed budget: %+v", d)
	}
	mfs, err := e.srv.Registry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == server.MetricBadRequests {
			total := 0.0
			for _, m := range mf.GetMetric() {
				total += m.GetCounter().GetValue()
			}
			if int(total) != len(cases) {
				t.Errorf("bad requests counted %v, want %d", total, len(cases))
			}
		}
	}
}

// TestMetrics checks the server's own registry with client_golang's
// testutil: decisions by policy and outcome, the latency histogram, the
// engine's Stats collected at scrape time, and the admin endpoints.
func TestMetrics(t *testing.T) {
	clk := engine.NewManualClock()
	e := start(t, mustParse(t, apiConfig), server.WithClock(clk))
	for i := range 7 {
		e.allow(fmt.Sprintf(`{"key":"k%d"}`, i%2)) // k0: 4, k1: 3 → all allowed
	}
	for range 6 {
		e.allow(`{"key":"k0"}`) // 1 more allowed, then 5 refused
	}
	e.allow(`{"key":"p","policy":"paid","cost":3}`)
	e.allow(`{"key":"p","cost":0}`) // bad request, not a decision

	const want = `
# HELP slidegate_decisions_total Decisions made, by policy and outcome (allowed, refused, error).
# TYPE slidegate_decisions_total counter
slidegate_decisions_total{outcome="allowed",policy="free"} 8
slidegate_decisions_total{outcome="allowed",policy="paid"} 1
slidegate_decisions_total{outcome="error",policy="free"} 0
slidegate_decisions_total{outcome="error",policy="paid"} 0
slidegate_decisions_total{outcome="refused",policy="free"} 5
slidegate_decisions_total{outcome="refused",policy="paid"} 0
# HELP slidegate_keys Keys holding state, by surface (http: per policy; rls: over every rule).
# TYPE slidegate_keys gauge
slidegate_keys{policy="free",surface="http"} 2
slidegate_keys{policy="paid",surface="http"} 1
# HELP slidegate_stored_instants Log entries held, by surface (some may have expired since their key was last decided).
# TYPE slidegate_stored_instants gauge
slidegate_stored_instants{policy="free",surface="http"} 8
slidegate_stored_instants{policy="paid",surface="http"} 3
# HELP slidegate_bad_requests_total Requests answered with a 4xx error before any decision, by status code.
# TYPE slidegate_bad_requests_total counter
slidegate_bad_requests_total{code="400"} 1
`
	reg := e.srv.Registry()
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want),
		server.MetricDecisions, server.MetricKeys, server.MetricStoredInstants, server.MetricBadRequests); err != nil {
		t.Error(err)
	}
	if n, err := testutil.GatherAndCount(reg, server.MetricLatency); err != nil || n != 2 {
		t.Errorf("latency histograms: %d, %v (want one per policy)", n, err)
	}
	if n, err := testutil.GatherAndCount(reg, server.MetricStoreBytes, server.MetricSweptKeys); err != nil || n != 4 {
		t.Errorf("bytes and swept series: %d, %v", n, err)
	}
	if n, err := testutil.GatherAndCount(reg, "go_goroutines", "go_memstats_heap_alloc_bytes"); err != nil || n != 2 {
		t.Errorf("Go runtime metrics: %d, %v", n, err)
	}
	// Sweeping after the window drops the keys, and the collector sees it.
	clk.Set(2 * time.Minute)
	for _, p := range []string{"free", "paid"} {
		b, _ := e.srv.Backend(p)
		b.(*engine.Limiter).Sweep()
	}
	if err := testutil.GatherAndCompare(reg, strings.NewReader(`
# HELP slidegate_keys Keys holding state, by surface (http: per policy; rls: over every rule).
# TYPE slidegate_keys gauge
slidegate_keys{policy="free",surface="http"} 0
slidegate_keys{policy="paid",surface="http"} 0
# HELP slidegate_swept_keys_total Idle keys dropped by the sweeper since start, by surface.
# TYPE slidegate_swept_keys_total counter
slidegate_swept_keys_total{policy="free",surface="http"} 2
slidegate_swept_keys_total{policy="paid",surface="http"} 1
`), server.MetricKeys, server.MetricSweptKeys); err != nil {
		t.Error(err)
	}

	// The admin listener serves the same registry, pprof and health.
	r := e.do("GET", e.admin+"/metrics", "")
	if r.status != 200 || !strings.Contains(string(r.body), `slidegate_decisions_total{outcome="refused",policy="free"} 5`) || !strings.Contains(string(r.body), "go_gc_duration_seconds") {
		t.Errorf("/metrics: %d\n%.600s", r.status, r.body)
	}
	for path, want := range map[string]string{"/healthz": "ok", "/readyz": "ready", "/debug/pprof/": "goroutine"} {
		r := e.do("GET", e.admin+path, "")
		if r.status != 200 || !strings.Contains(string(r.body), want) {
			t.Errorf("%s: %d %.100s", path, r.status, r.body)
		}
	}
	if r := e.do("GET", e.admin+"/debug/pprof/goroutine?debug=1", ""); r.status != 200 {
		t.Errorf("goroutine profile: %d", r.status)
	}
}

// TestParallelReplay: many goroutines on few keys through the real HTTP
// server, every decision recorded (recordingStore) and replayed in At order
// through the reference log: zero mismatches, over- and under-admissions.
// The clock is the real monotonic one, so that decisions of one key race.
func TestParallelReplay(t *testing.T) {
	cfg := mustParse(t, `
policies:
  - {name: tight, limit: 7, window: 40ms}
  - {name: wide, limit: 50, window: 200ms}
  - {name: hour, limit: 20, window: 1h}
`)
	rec := &recorder{}
	opt := recordingStore(&cfg, rec)
	e := start(t, cfg, opt)
	const goroutines, perG = 16, 150
	keys := []string{"k0", "k1", "k2"}
	var (
		wg      sync.WaitGroup
		mu      sync.Mutex
		allowed = map[string]int{}
	)
	for g := range goroutines {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range perG {
				policy := [...]string{"tight", "tight", "wide", "hour"}[(g+i)%4]
				body := fmt.Sprintf(`{"key":%q,"policy":%q,"cost":%d}`, keys[(g*7+i)%len(keys)], policy, 1+i%2)
				req, _ := http.NewRequest("POST", e.base+"/v1/allow", strings.NewReader(body))
				req.Header.Set("Content-Type", "application/json")
				resp, err := e.client.Do(req)
				if err != nil {
					t.Error(err)
					return
				}
				var d server.AllowResponse
				err = json.NewDecoder(resp.Body).Decode(&d)
				resp.Body.Close()
				if err != nil || (resp.StatusCode != 200 && resp.StatusCode != 429) {
					t.Errorf("status %d: %v", resp.StatusCode, err)
					return
				}
				if d.Allowed {
					mu.Lock()
					allowed[policy]++
					mu.Unlock()
				}
			}
		}()
	}
	wg.Wait()
	if rec.Len() != goroutines*perG {
		t.Fatalf("%d records for %d requests", rec.Len(), goroutines*perG)
	}
	for _, p := range []struct {
		name   string
		limit  int
		window time.Duration
	}{{"tight", 7, 40 * time.Millisecond}, {"wide", 50, 200 * time.Millisecond}, {"hour", 20, time.Hour}} {
		recs := referenceRecords(rec, p.name)
		rep := reference.VerifyLog(p.limit, int64(p.window), recs)
		t.Logf("%s: %d decisions, %d allowed, %d refused; mismatches %d, over %d, under %d",
			p.name, rep.Decisions, rep.Allowed, rep.Refused, rep.Mismatches, rep.OverAdmissions, rep.UnderAdmissions)
		if !rep.OK() {
			t.Errorf("%s: %+v", p.name, rep)
		}
		// The short windows slide during the test (how often they refuse
		// depends on the machine's speed); the hour-long one must both
		// admit exactly its budget per key and refuse the rest, whatever
		// the speed, so the check has something to check.
		if p.name == "hour" {
			admitted := 0
			for _, r := range recs {
				if r.Allowed {
					admitted += r.Cost
				}
			}
			if admitted != 20*len(keys) || rep.Refused == 0 {
				t.Errorf("hour: %d admitted (want %d: 20 for each key), %d refused", admitted, 20*len(keys), rep.Refused)
			}
		}
		if rep.Allowed != allowed[p.name] {
			t.Errorf("%s: recorder saw %d allowed, clients %d", p.name, rep.Allowed, allowed[p.name])
		}
	}
}

// TestParallelReplayGateway is the parallel replay through the gateway:
// the middleware decides, the upstream is real, every decision recorded.
func TestParallelReplayGateway(t *testing.T) {
	up, hits := upstream(t)
	cfg := mustParse(t, `
key: header:X-Client
tier_header: X-Plan
policies:
  - {name: tight, limit: 5, window: 30ms}
  - {name: hour, limit: 25, window: 1h}
`)
	cfg.Upstream = config.UpstreamURL(up.URL)
	rec := &recorder{}
	opt := recordingStore(&cfg, rec)
	e := start(t, cfg, opt)
	const goroutines, perG = 12, 120
	var wg sync.WaitGroup
	var allowed atomic.Int64
	for g := range goroutines {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range perG {
				req, _ := http.NewRequest("GET", e.base+"/p", nil)
				req.Header.Set("X-Client", fmt.Sprint("c", (g+i)%2))
				if i%4 == 0 {
					req.Header.Set("X-Plan", "hour")
				}
				resp, err := e.client.Do(req)
				if err != nil {
					t.Error(err)
					return
				}
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				switch resp.StatusCode {
				case 200:
					allowed.Add(1)
				case 429:
				default:
					t.Errorf("status %d", resp.StatusCode)
					return
				}
			}
		}()
	}
	wg.Wait()
	total := 0
	for _, p := range []struct {
		name   string
		limit  int
		window time.Duration
	}{{"tight", 5, 30 * time.Millisecond}, {"hour", 25, time.Hour}} {
		rep := reference.VerifyLog(p.limit, int64(p.window), referenceRecords(rec, p.name))
		t.Logf("%s: %d decisions, %d allowed; mismatches %d, over %d, under %d",
			p.name, rep.Decisions, rep.Allowed, rep.Mismatches, rep.OverAdmissions, rep.UnderAdmissions)
		if !rep.OK() || rep.Allowed == 0 {
			t.Errorf("%s: %+v", p.name, rep)
		}
		if p.name == "hour" && (rep.Allowed != 2*25 || rep.Refused == 0) {
			t.Errorf("hour: %d allowed (want 50: 25 for each of 2 clients), %d refused", rep.Allowed, rep.Refused)
		}
		total += rep.Allowed
	}
	if int64(total) != allowed.Load() || hits.Load() != allowed.Load() {
		t.Errorf("recorded %d allowed, clients saw %d, upstream %d", total, allowed.Load(), hits.Load())
	}
}

// TestDecisionAPIFallbackCost: a body the fast parser gives up on after
// reading a cost is decided by the fallback's reading alone: a later
// "cost": null means the default cost of 1, an escape in the key keeps
// the cost given.
func TestDecisionAPIFallbackCost(t *testing.T) {
	e := start(t, mustParse(t, apiConfig))
	for _, tc := range []struct {
		body      string
		remaining int
	}{
		{`{"key":"dave","cost":3,"cost":null}`, 4},
		{`{"cost":3,"key":"d\u0061ve2"}`, 2},
		{`{"cost":2,"key":"dave3"}`, 3}, // the fast path itself
	} {
		r, d := e.allow(tc.body)
		if r.status != 200 || d.Remaining != tc.remaining {
			t.Errorf("%s: %d %+v, want remaining %d", tc.body, r.status, d, tc.remaining)
		}
	}
}

// TestAllowPathRouting: the decision API's path goes straight to its
// handler, and every other spelling of it is routed as the mux routes it:
// an escaped letter is the same path, an escaped slash is another path, an
// unclean path is redirected (307 for a POST), a trailing slash is no
// route. Each case answers as it did before the bypass (checked on the
// mux alone).
func TestAllowPathRouting(t *testing.T) {
	s := handlerServer(t, "policies:\n  - {name: free, limit: 100, window: 1m}\n")
	defer s.Close()
	h := s.Handler()
	for _, tc := range []struct {
		method, target string
		want           int
	}{
		{http.MethodPost, "/v1/allow", http.StatusOK},
		{http.MethodPost, "/v1/%61llow", http.StatusOK},
		{http.MethodPost, "/v1%2Fallow", http.StatusNotFound},
		{http.MethodPost, "/v1//allow", http.StatusTemporaryRedirect},
		{http.MethodPost, "/v1/./allow", http.StatusTemporaryRedirect},
		{http.MethodPost, "/v1/allow/", http.StatusNotFound},
		{http.MethodGet, "/v1/allow", http.StatusMethodNotAllowed},
		{http.MethodPost, "/v1/allow?x=1", http.StatusOK},
	} {
		r := httptest.NewRequest(tc.method, tc.target, strings.NewReader(`{"key":"k"}`))
		r.Header.Set("Content-Type", "application/json")
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		if w.Code != tc.want {
			t.Errorf("%s %s: %d, want %d: %s", tc.method, tc.target, w.Code, tc.want, w.Body.String())
		}
	}
}
