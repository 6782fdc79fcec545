package server_test

import (
	"cmp"
	"encoding/json"
	"fmt"
	"maps"
	"math/rand/v2"
	"reflect"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/slidegate/slidegate/engine"
	"github.com/slidegate/slidegate/internal/reference"
	"github.com/slidegate/slidegate/internal/server"
	"github.com/slidegate/slidegate/internal/server/config"
)

// overridesYAML is a configuration of two policies, free with the given
// overrides and other without.
func overridesYAML(window string, overrides map[string]int) string {
	var o []string
	for _, k := range slices.Sorted(maps.Keys(overrides)) {
		o = append(o, strconv.Quote(k)+": "+strconv.Itoa(overrides[k]))
	}
	return `
policies:
  - name: free
    limit: 3
    window: ` + window + `
    overrides: {` + strings.Join(o, ", ") + `}
  - {name: other, limit: 50, window: ` + window + `}
`
}

// perKey is the reference log with one model per key, each at the limit
// the server should apply to it: a key keeps its instants when its limit
// changes.
type perKey map[string]*reference.Log

func (m perKey) of(key string, limit int, window int64) *reference.Log {
	lm, ok := m[key]
	if !ok {
		lm = reference.NewLog(limit, window)
		m[key] = lm
	}
	lm.Limit = limit
	return lm
}

// answerOf is a decision body as a model result.
func answerOf(d server.AllowResponse) reference.Result {
	return reference.Result{Allowed: d.Allowed, Remaining: d.Remaining, RetryAfter: d.RetryAfterNs, Reset: d.ResetNs}
}

// TestOverridesMatchReference: through the real listener, single
// requests, batches and two-limit requests on keys with and without
// overrides, the overrides reloaded now and then, every decision is the
// reference log's at the key's limit (its override's, else the policy's),
// in every field, and names that limit.
func TestOverridesMatchReference(t *testing.T) {
	const window = 100 // ns
	r := rand.New(rand.NewPCG(43, 5))
	keys := []string{"a", "b", "c", "d"}
	randomOverrides := func() map[string]int {
		o := map[string]int{}
		for _, k := range keys[:3] { // d never has one
			if r.IntN(3) > 0 {
				o[k] = 1 + r.IntN(7)
			}
		}
		return o
	}
	overrides := map[string]int{"a": 5, "b": 1}
	clk := engine.NewManualClock()
	e := start(t, mustParse(t, overridesYAML("100ns", overrides)), server.WithClock(clk))
	free, other := perKey{}, perKey{}
	limitOf := func(key string) int {
		if l, ok := overrides[key]; ok {
			return l
		}
		return 3
	}
	var now int64
	reloads, decisions := 0, 0
	check := func(step int, what string, key string, cost int, d server.AllowResponse, want reference.Result, limit int) {
		t.Helper()
		decisions++
		want.Remaining = max(want.Remaining, 0) // the server reports 0 for a key over a lowered limit
		if d.At != now || d.Limit != limit || answerOf(d) != want {
			t.Fatalf("step %d %s: key %q cost %d at %d: got %+v, want %+v at limit %d", step, what, key, cost, now, d, want, limit)
		}
	}
	for step := range 600 {
		if r.IntN(25) == 0 {
			overrides = randomOverrides()
			clk.Set(time.Duration(now))
			if err := e.srv.Reload(mustParse(t, overridesYAML("100ns", overrides))); err != nil {
				t.Fatal(err)
			}
			reloads++
			continue
		}
		now += int64(r.IntN(12))
		clk.Set(time.Duration(now))
		key := keys[r.IntN(len(keys))]
		limit := limitOf(key)
		cost := 1 + r.IntN(limit)
		switch r.IntN(3) {
		case 0:
			resp, d := e.allow(fmt.Sprintf(`{"policy":"free","key":%q,"cost":%d}`, key, cost))
			if resp.status != 200 && resp.status != 429 {
				t.Fatalf("step %d: %d %s", step, resp.status, resp.body)
			}
			check(step, "allow", key, cost, d, free.of(key, limit, window).Decide(key, cost, now), limit)
		case 1:
			key2 := keys[r.IntN(len(keys))]
			l2 := limitOf(key2)
			cost2 := 1 + r.IntN(l2)
			resp := e.do("POST", e.base+"/v1/allow/batch", fmt.Sprintf(`[{"policy":"free","key":%q,"cost":%d},{"policy":"other","key":"x"},{"policy":"free","key":%q,"cost":%d}]`, key, cost, key2, cost2))
			var ds []server.AllowResponse
			if resp.status != 200 || json.Unmarshal(resp.body, &ds) != nil || len(ds) != 3 {
				t.Fatalf("step %d: batch: %d %s", step, resp.status, resp.body)
			}
			check(step, "batch[0]", key, cost, ds[0], free.of(key, limit, window).Decide(key, cost, now), limit)
			check(step, "batch[1]", "x", 1, ds[1], other.of("x", 50, window).Decide("x", 1, now), 50)
			check(step, "batch[2]", key2, cost2, ds[2], free.of(key2, l2, window).Decide(key2, cost2, now), l2)
		case 2:
			cost = 1 + r.IntN(min(limit, 3)) // a group's bound: its policies' limits, and the keys' if lower
			resp, g := e.group(fmt.Sprintf(`{"limits":[{"policy":"free","key":%q},{"policy":"other","key":%q}],"cost":%d}`, key, key, cost))
			if resp.status != 200 && resp.status != 429 || len(g.Limits) != 2 {
				t.Fatalf("step %d: group: %d %s", step, resp.status, resp.body)
			}
			m0, m1 := free.of(key, limit, window), other.of(key, 50, window)
			p0, p1 := m0.Peek(key, cost, now), m1.Peek(key, cost, now)
			if p0.Allowed && p1.Allowed {
				p0, p1 = m0.Decide(key, cost, now), m1.Decide(key, cost, now)
			}
			check(step, "group[0]", key, cost, g.Limits[0], p0, limit)
			check(step, "group[1]", key, cost, g.Limits[1], p1, 50)
		}
	}
	if reloads < 10 || decisions < 500 {
		t.Fatalf("only %d reloads, %d decisions", reloads, decisions)
	}
}

// A reload keeps every key's state: a key at its override's limit stays
// refused after a reload that changes only another key's override; a key
// whose override rises gets exactly the extra room, and one whose
// override goes away is back at the policy's limit with its requests
// still counted; a key without an override is untouched throughout.
// Headers and the refusal name the key's own limit.
func TestReloadOverridesKeepState(t *testing.T) {
	clk := engine.NewManualClock()
	// The draft headers are off by default on the decision API; on here,
	// RateLimit-Policy names each key's limit.
	cfg := func(o map[string]int) config.Config {
		return mustParse(t, "decision_headers: {draft: true}\n"+overridesYAML("60s", o))
	}
	e := start(t, cfg(map[string]int{"a": 5, "b": 2}), server.WithClock(clk))
	allowed := func(key string, n int) int {
		t.Helper()
		got := 0
		for range n {
			r, d := e.allow(`{"policy":"free","key":"` + key + `"}`)
			switch {
			case r.status == 200 && d.Allowed:
				got++
			case r.status != 429:
				t.Fatalf("%s: %d %s", key, r.status, r.body)
			}
		}
		return got
	}
	limitIs := func(key string, want int) {
		t.Helper()
		r, d := e.allow(`{"policy":"free","key":"` + key + `"}`)
		if d.Limit != want || r.header.Get("Ratelimit-Policy") != `"free";q=`+strconv.Itoa(want)+";w=60" {
			t.Fatalf("%s: limit %d, RateLimit-Policy %q; want %d", key, d.Limit, r.header.Get("Ratelimit-Policy"), want)
		}
	}
	for _, c := range []struct {
		key  string
		n    int
		want int
	}{{"a", 8, 5}, {"b", 4, 2}, {"c", 4, 3}} {
		if got := allowed(c.key, c.n); got != c.want {
			t.Fatalf("%s: %d of %d allowed, want %d", c.key, got, c.n, c.want)
		}
	}
	steps := []struct {
		overrides map[string]int
		key       string
		want      int // allowed of 10 after the reload
		limit     int
	}{
		{map[string]int{"a": 5, "b": 3}, "a", 0, 5}, // only b's changed: a stays refused
		{map[string]int{"a": 5, "b": 3}, "b", 1, 3}, // b rose by one: exactly one more
		{map[string]int{"a": 8, "b": 3}, "a", 3, 8}, // a rose by three
		{map[string]int{"a": 8, "b": 3}, "c", 0, 3}, // c untouched
		{map[string]int{"b": 3}, "a", 0, 3},         // a's override removed: its 8 count against 3
		{map[string]int{"b": 1, "c": 4}, "c", 1, 4}, // c gets an override: its 3 count
		{map[string]int{"b": 1, "c": 4}, "b", 0, 1}, // b lowered below what it holds
	}
	for i, s := range steps {
		if err := e.srv.Reload(cfg(s.overrides)); err != nil {
			t.Fatal(err)
		}
		if got := allowed(s.key, 10); got != s.want {
			t.Fatalf("step %d (%v): %s: %d of 10 allowed, want %d", i, s.overrides, s.key, got, s.want)
		}
		limitIs(s.key, s.limit)
	}
	// The refusal of a key with an override names its limit.
	r, d := e.allow(`{"policy":"free","key":"c"}`)
	if r.status != 429 || d.Limit != 4 || d.Remaining != 0 {
		t.Fatalf("c refused: %d %+v", r.status, d)
	}
	// A cost above the key's limit is a client error, as above a policy's;
	// above the policy's, a key whose override allows it is decided.
	if r, _ := e.allow(`{"policy":"free","key":"b","cost":2}`); r.status != 400 || !strings.Contains(string(r.body), "1..1") {
		t.Fatalf("cost 2 for b (override 1): %d %s", r.status, r.body)
	}
	clk.Advance(time.Minute)
	if r, d := e.allow(`{"policy":"free","key":"c","cost":4}`); r.status != 200 || !d.Allowed || d.Limit != 4 {
		t.Fatalf("cost 4 for c (override 4) a window later: %d %s", r.status, r.body)
	}
}

// The gateway and /v1/check apply a key's override too, with its limit in
// the headers and in the refusal's body; a reload that changes it keeps
// the key's count.
func TestOverridesGatewayAndCheck(t *testing.T) {
	up, hits := upstream(t)
	gcfg := func(o string) config.Config {
		c := mustParse(t, "key: header:X-Client\npolicies:\n  - {name: free, limit: 2, window: 60s, overrides: {"+o+"}}\n")
		c.Upstream = config.UpstreamURL(up.URL)
		return c
	}
	clk := engine.NewManualClock()
	g := start(t, gcfg(`tenant-a: 4`), server.WithClock(clk))
	count := func(client string, n int) int {
		t.Helper()
		got := 0
		for range n {
			r := g.do("GET", g.base+"/x", "", "X-Client", client)
			switch r.status {
			case 200:
				got++
				if want := map[string]string{"tenant-a": "4", "tenant-b": "2"}[client]; r.header.Get("X-Ratelimit-Limit") != want {
					t.Fatalf("%s: X-RateLimit-Limit %q, want %s", client, r.header.Get("X-Ratelimit-Limit"), want)
				}
			case 429:
			default:
				t.Fatalf("%s: %d %s", client, r.status, r.body)
			}
		}
		return got
	}
	if a, b := count("tenant-a", 6), count("tenant-b", 6); a != 4 || b != 2 || hits.Load() != 6 {
		t.Fatalf("gateway: tenant-a %d of 6, tenant-b %d of 6, upstream saw %d", a, b, hits.Load())
	}
	r := g.do("GET", g.base+"/x", "", "X-Client", "tenant-a")
	var p struct {
		Limit  int    `json:"limit"`
		Detail string `json:"detail"`
	}
	if r.status != 429 || json.Unmarshal(r.body, &p) != nil || p.Limit != 4 || !strings.Contains(p.Detail, "(4 per 1m0s)") {
		t.Fatalf("tenant-a's refusal: %d %s", r.status, r.body)
	}
	if err := g.srv.Reload(gcfg(`tenant-a: 5`)); err != nil {
		t.Fatal(err)
	}
	if a := g.do("GET", g.base+"/x", "", "X-Client", "tenant-a"); a.status != 200 || a.header.Get("X-Ratelimit-Limit") != "5" {
		t.Fatalf("tenant-a after its override rose to 5: %d %s", a.status, a.header)
	}
	if a := g.do("GET", g.base+"/x", "", "X-Client", "tenant-a"); a.status != 429 {
		t.Fatalf("tenant-a's sixth: %d", a.status)
	}

	// /v1/check keys by the client address from a trusted proxy.
	c := start(t, mustParse(t, `
key: ip
trusted_proxies: [127.0.0.1/32, "::1/128"]
policies:
  - {name: ip, limit: 1, window: 60s, overrides: {"192.0.2.7": 3}}
`), server.WithClock(clk))
	allowed := func(client string) int {
		got := 0
		for range 5 {
			if c.check("GET", "/", client).status == 200 {
				got++
			}
		}
		return got
	}
	if a, b := allowed("192.0.2.7"), allowed("192.0.2.8"); a != 3 || b != 1 {
		t.Fatalf("/v1/check: 192.0.2.7 %d of 5 (override 3), 192.0.2.8 %d of 5 (limit 1)", a, b)
	}
}

// Overrides are checked: a limit out of range, too many keys, a key the
// server could never decide, and any override on a store other than
// memory, which is refused at start naming the key. No error shows a key.
func TestOverridesConfigErrors(t *testing.T) {
	many := make([]string, config.MaxPolicyOverrides+1)
	for i := range many {
		many[i] = fmt.Sprintf("k%d: 1", i)
	}
	for _, c := range []struct{ yaml, want string }{
		{"policies:\n  - {name: free, limit: 3, window: 60s, overrides: {secret-key: 0}}\n", "policies[0] (free).overrides: key sha256:"},
		{"policies:\n  - {name: free, limit: 3, window: 60s, overrides: {secret-key: 1048577}}\n", "outside 1..1048576"},
		{"policies:\n  - {name: free, limit: 3, window: 60s, overrides: {secret-key: 2.5}}\n", "whole number"},
		{"policies:\n  - {name: free, limit: 3, window: 60s, overrides: {\"\": 2}}\n", "missing the key"},
		{"policies:\n  - {name: free, limit: 3, window: 60s, overrides: {" + strings.Join(many, ", ") + "}}\n", "10001 keys; at most 10000"},
		{"store: redis://127.0.0.1:1/0\npolicies:\n  - {name: free, limit: 3, window: 60s, overrides: {secret-key: 5}}\n", "policies[0] (free).overrides: need the memory store; store redis://"},
	} {
		_, err := config.ParseConfig([]byte(c.yaml))
		if err == nil || !strings.Contains(err.Error(), c.want) || strings.Contains(err.Error(), "secret-key") {
			t.Errorf("%.90q: %v; want an error with %q and no key", c.yaml, err, c.want)
		}
	}
	// A key longer than a request's key can be (YAML's implicit keys stop
	// at 1,024 characters: a configuration built in code).
	cfg := config.DefaultConfig()
	long := strings.Repeat("s", 1025)
	cfg.Policies[0].Overrides = map[string]config.Int{long: 2}
	if err := cfg.Validate(); err == nil || !strings.Contains(err.Error(), "longer than 1024 bytes") || strings.Contains(err.Error(), long) {
		t.Errorf("a key of 1,025 bytes: %v", err)
	}
}

// overrideRec is one decision of the stress, as the client saw it.
type overrideRec struct {
	key  string
	cost int
	d    server.AllowResponse
}

func (r overrideRec) liveBefore() int {
	if r.d.Allowed {
		return r.d.Limit - r.d.Remaining - r.cost
	}
	return r.d.Limit - r.d.Remaining
}

// replayTies replays recs, decisions of one key at one instant, through
// m in some order in which each matches, and reports whether there is
// one: such decisions may have taken effect in any order.
func replayTies(m *reference.Log, recs []overrideRec) bool {
	if len(recs) == 0 {
		return true
	}
	key := recs[0].key
	for i := range recs {
		saved := m.Entries(key)
		rec := recs[i]
		m.Limit = rec.d.Limit
		want := m.Decide(key, rec.cost, rec.d.At)
		want.Remaining = max(want.Remaining, 0)
		if want == answerOf(rec.d) {
			recs[0], recs[i] = recs[i], recs[0]
			if replayTies(m, recs[1:]) {
				return true
			}
			recs[0], recs[i] = recs[i], recs[0]
		}
		m.Restore(key, saved)
	}
	return false
}

// TestOverridesReloadStress: many clients decide on a few keys through
// the real listener while the overrides are reloaded in a loop, on a
// window of milliseconds, at several GOMAXPROCS. Ordered by At, every
// decision replays through the reference log at the limit it names, and
// keys without an override always get the policy's.
func TestOverridesReloadStress(t *testing.T) {
	for _, procs := range []int{2, 8, 32} {
		t.Run(fmt.Sprintf("GOMAXPROCS=%d", procs), func(t *testing.T) {
			defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(procs))
			overridesReloadStress(t, uint64(procs))
		})
	}
}

func overridesReloadStress(t *testing.T, seed uint64) {
	const window = 3 * time.Millisecond
	yaml := func(o map[string]int) string { return overridesYAML(window.String(), o) }
	e := start(t, mustParse(t, yaml(map[string]int{"a": 4})))
	keys := []string{"a", "b", "c", "plain"}
	stop := make(chan struct{})
	var reloads int
	var rwg sync.WaitGroup
	rwg.Go(func() {
		r := rand.New(rand.NewPCG(seed, 1))
		for {
			select {
			case <-stop:
				return
			default:
			}
			o := map[string]int{}
			for _, k := range keys[:3] {
				if r.IntN(3) > 0 {
					o[k] = 2 + r.IntN(5)
				}
			}
			if err := e.srv.Reload(mustParse(t, yaml(o))); err != nil {
				t.Error(err)
				return
			}
			reloads++
		}
	})
	const clients, perClient = 8, 150
	recs := make([][]overrideRec, clients)
	var wg sync.WaitGroup
	for c := range clients {
		wg.Go(func() {
			r := rand.New(rand.NewPCG(seed, uint64(c)+2))
			for range perClient {
				key := keys[r.IntN(len(keys))]
				cost := 1 + r.IntN(2) // within every limit: never a 400
				resp := e.do("POST", e.base+"/v1/allow", fmt.Sprintf(`{"policy":"free","key":%q,"cost":%d}`, key, cost))
				var d server.AllowResponse
				if resp.status != 200 && resp.status != 429 || json.Unmarshal(resp.body, &d) != nil {
					t.Errorf("%s: %d %s", key, resp.status, resp.body)
					return
				}
				if key == "plain" && d.Limit != 3 {
					t.Errorf("plain has no override but got limit %d", d.Limit)
				}
				recs[c] = append(recs[c], overrideRec{key, cost, d})
			}
		})
	}
	wg.Wait()
	close(stop)
	rwg.Wait()
	all := slices.Concat(recs...)
	slices.SortFunc(all, func(a, b overrideRec) int {
		return cmp.Or(cmp.Compare(a.key, b.key), cmp.Compare(a.d.At, b.d.At),
			cmp.Compare(a.liveBefore(), b.liveBefore()), cmp.Compare(boolInt(a.d.Allowed), boolInt(b.d.Allowed)))
	})
	m := reference.NewLog(1, int64(window))
	limits := map[int]bool{}
	refused, mismatches := 0, 0
	var examples []string
	for lo := 0; lo < len(all); {
		hi := lo + 1
		for hi < len(all) && all[hi].key == all[lo].key && all[hi].d.At == all[lo].d.At {
			hi++
		}
		for _, rec := range all[lo:hi] {
			limits[rec.d.Limit] = true
			if !rec.d.Allowed {
				refused++
			}
		}
		if !replayTies(m, all[lo:hi]) {
			mismatches += hi - lo
			if len(examples) < 5 {
				examples = append(examples, fmt.Sprintf("%+v", all[lo]))
			}
		}
		lo = hi
	}
	if mismatches > 0 {
		t.Fatalf("%d of %d decisions do not replay; e.g.\n%s", mismatches, len(all), strings.Join(examples, "\n"))
	}
	if reloads < 10 || refused == 0 || len(limits) < 4 {
		t.Fatalf("the run did not exercise the overrides: %d reloads, %d refused, limits %v", reloads, refused, limits)
	}
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}

// TestPolicyConfigFields: a reload compares policies field by field
// (every field but overrides, which a limiter takes in place), so a new
// field of PolicyConfig must join that comparison, and this list.
func TestPolicyConfigFields(t *testing.T) {
	var got []string
	for f := range reflect.TypeFor[config.PolicyConfig]().Fields() {
		got = append(got, f.Name)
	}
	want := []string{"Name", "Limit", "Window", "Algorithm", "MaxKeys", "Overflow", "Overrides"}
	if !slices.Equal(got, want) {
		t.Fatalf("PolicyConfig's fields are %v; a reload compares %v (server/config.go, sameBut)", got, want)
	}
}
