package server_test

import (
	"log/slog"
	"strconv"
	"strings"
	"testing"

	"github.com/slidegate/slidegate/engine"
	"github.com/slidegate/slidegate/internal/server"
	"github.com/slidegate/slidegate/internal/server/config"
)

// A reload that changes a policy's limit or window keeps every key's log,
// through the real listener: limit 10 with 10 used, reloaded to 5, gives
// nothing more; back to 10, nothing more in that window. A gateway route
// of two limits (a group over the limiters) follows the new limit too. An
// algorithm change starts the policy empty and says so in the log.
func TestReloadKeepsStateOfAChangedPolicy(t *testing.T) {
	clk := engine.NewManualClock()
	cfg := func(limit int, alg string) config.Config {
		return mustParse(t, `
policies:
  - {name: free, limit: `+strconv.Itoa(limit)+`, window: 60s, algorithm: `+alg+`}
  - {name: other, limit: 100, window: 60s}
`)
	}
	var logs syncBuffer
	e := start(t, cfg(10, "log"), server.WithClock(clk), server.WithLogger(slog.New(slog.NewTextHandler(&logs, nil))))
	allowed := func(n int, body string) int {
		t.Helper()
		got := 0
		for range n {
			r, d := e.allow(body)
			switch {
			case r.status == 200 && d.Allowed:
				got++
			case r.status != 429:
				t.Fatalf("%s: %d %s", body, r.status, r.body)
			}
		}
		return got
	}
	const abuser = `{"key":"abuser"}`
	if got := allowed(10, abuser); got != 10 {
		t.Fatalf("%d of the first 10 allowed", got)
	}
	for _, step := range []struct {
		limit int
		want  int
	}{{5, 0}, {10, 0}, {3, 0}} {
		if err := e.srv.Reload(cfg(step.limit, "log")); err != nil {
			t.Fatal(err)
		}
		if got := allowed(10, abuser); got != step.want {
			t.Fatalf("reloaded to limit %d: %d more allowed, want %d", step.limit, got, step.want)
		}
		r, d := e.allow(abuser)
		if r.status != 429 || d.Limit != step.limit || d.Remaining != 0 {
			t.Fatalf("at limit %d: %d %+v", step.limit, r.status, d)
		}
		// A group of both limits (the decision API's "limits") uses the
		// limit in force too.
		if r := e.do("POST", e.base+"/v1/allow", `{"limits":[{"policy":"free","key":"abuser"},{"policy":"other","key":"abuser"}]}`); r.status != 429 {
			t.Fatalf("group at limit %d: %d %s", step.limit, r.status, r.body)
		}
	}
	// The default key cap written out (as --print-config prints it) is
	// the same policy: nothing changes.
	written := mustParse(t, `
policies:
  - {name: free, limit: 3, window: 60s, algorithm: log, max_keys: 1000000, overflow: refuse}
  - {name: other, limit: 100, window: 60s}
`)
	if err := e.srv.Reload(written); err != nil {
		t.Fatal(err)
	}
	if got := allowed(3, abuser); got != 0 {
		t.Fatalf("after reloading the same policy with its key cap written out: %d allowed", got)
	}
	if !strings.Contains(logs.String(), "policy changed in place; its keys keep their state") {
		t.Errorf("the in-place change was not logged:\n%s", logs.String())
	}
	// A fresh key gets the new limit, 3.
	if got := allowed(5, `{"key":"newcomer"}`); got != 3 {
		t.Errorf("a new key at limit 3: %d of 5 allowed", got)
	}
	// The algorithm changes: the policy starts empty, and the log says so.
	if err := e.srv.Reload(cfg(3, "counter")); err != nil {
		t.Fatal(err)
	}
	if got := allowed(5, abuser); got != 3 {
		t.Errorf("after the algorithm changed: %d of 5 allowed, want a fresh 3", got)
	}
	if l := logs.String(); !strings.Contains(l, "policy changed; its keys start empty") || !strings.Contains(l, "algorithm changed from log to counter") {
		t.Errorf("the reset was not logged:\n%s", l)
	}
}

// A policy with no max_keys on the memory store tracks at most
// DefaultMaxKeys keys, refusing new ones beyond (overflow "refuse"), and
// --print-config writes that out; a Redis store's policies show no cap,
// which they could not take.
func TestDefaultMaxKeys(t *testing.T) {
	for _, c := range []struct {
		yaml  string
		want  int
		print string
	}{
		{"policies:\n  - {name: free, limit: 5, window: 60s}\n", config.DefaultMaxKeys, "max_keys: 1000000\n      overflow: refuse"},
		{"policies:\n  - {name: free, limit: 5, window: 60s, overflow: allow}\n", config.DefaultMaxKeys, "max_keys: 1000000\n      overflow: allow"},
		{"policies:\n  - {name: free, limit: 5, window: 60s, max_keys: 7}\n", 7, "max_keys: 7\n      overflow: refuse"},
	} {
		e := start(t, mustParse(t, c.yaml))
		b, ok := e.srv.Backend("free")
		if !ok {
			t.Fatal("no backend for free")
		}
		if got := b.(*engine.Limiter).MaxKeys(); got != c.want {
			t.Errorf("%q: the limiter tracks at most %d keys, want %d", c.yaml, got, c.want)
		}
		out, err := e.srv.Config().Marshal()
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(string(out), c.print) {
			t.Errorf("%q: --print-config does not show %q:\n%s", c.yaml, c.print, out)
		}
	}
	cfg := mustParse(t, "store: redis://h:1/0\npolicies:\n  - {name: free, limit: 5, window: 60s}\n")
	out, _ := cfg.Marshal()
	policies, _, _ := strings.Cut(string(out)[strings.Index(string(out), "\npolicies:"):], "\nroutes:")
	if strings.Contains(policies, "max_keys") {
		t.Errorf("a Redis store's policy shows a key cap:\n%s", out)
	}
}

// Keys of 1,000 bytes cost the server's store no more than short ones do
// (the engine keeps a long key as a digest): slidegate_store_bytes per
// slidegate_keys, scraped from the admin listener after distinct keys
// arrived through the main one, stays under 200 bytes.
func TestLongKeysCostBoundedBytes(t *testing.T) {
	e := start(t, mustParse(t, "policies:\n  - {name: free, limit: 5, window: 60s}\n"))
	const keys = 1500
	for i := range keys {
		key := strconv.Itoa(i) + strings.Repeat("k", 1000-len(strconv.Itoa(i)))
		if r, _ := e.allow(`{"key":"` + key + `"}`); r.status != 200 {
			t.Fatalf("key %d: %d %s", i, r.status, r.body)
		}
	}
	m := string(e.do("GET", e.admin+"/metrics", "").body)
	metric := func(name string) float64 {
		t.Helper()
		for _, line := range strings.Split(m, "\n") {
			if v, ok := strings.CutPrefix(line, name+`{policy="free",surface="http"} `); ok {
				f, err := strconv.ParseFloat(v, 64)
				if err != nil {
					t.Fatal(err)
				}
				return f
			}
		}
		t.Fatalf("no %s in\n%s", name, m)
		return 0
	}
	n, bytes := metric(server.MetricKeys), metric(server.MetricStoreBytes)
	if n != keys || bytes/n > 200 {
		t.Errorf("%v keys of 1,000 bytes take %v bytes, %.0f per key; want %d keys and at most 200 per key", n, bytes, bytes/n, keys)
	}
}
