package server_test

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"net/url"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/slidegate/slidegate/engine"
	"github.com/slidegate/slidegate/internal/server"
)

// Support staff read and reset a key on the admin listener; the main
// listener has no such route; every operation is logged and counted.
func TestAdminKeys(t *testing.T) {
	cfg := mustParse(t, "policies:\n  - {name: free, limit: 3, window: 60s}\n  - {name: paid, limit: 10, window: 60s}\n")
	var logs syncBuffer
	e := start(t, cfg, server.WithLogger(slog.New(slog.NewTextHandler(&logs, nil))))
	for range 2 {
		if r, _ := e.allow(`{"key":"alice","policy":"free"}`); r.status != 200 {
			t.Fatalf("allow: %d %s", r.status, r.body)
		}
	}
	keyURL := func(policy, key string) string {
		return e.admin + "/admin/keys?" + url.Values{"policy": {policy}, "key": {key}}.Encode()
	}
	inspect := func(policy, key string) map[string]any {
		t.Helper()
		r := e.do("GET", keyURL(policy, key), "")
		if r.status != 200 {
			t.Fatalf("inspect %s/%s: %d %s", policy, key, r.status, r.body)
		}
		var m map[string]any
		if err := json.Unmarshal(r.body, &m); err != nil {
			t.Fatal(err)
		}
		return m
	}
	st := inspect("free", "alice")
	if st["exists"] != true || st["used"] != 2.0 || st["remaining"] != 1.0 || st["limit"] != 3.0 {
		t.Fatalf("alice under free: %v", st)
	}
	if st := inspect("paid", "alice"); st["exists"] != false || st["remaining"] != 10.0 {
		t.Fatalf("alice under paid: %v", st)
	}
	// Inspecting spent nothing: one request left, then a refusal.
	e.allow(`{"key":"alice","policy":"free"}`)
	if r, _ := e.allow(`{"key":"alice","policy":"free"}`); r.status != 429 {
		t.Fatalf("fourth request: %d", r.status)
	}
	if r := e.do("DELETE", keyURL("free", "alice"), ""); r.status != 200 || !strings.Contains(string(r.body), `"reset":true`) {
		t.Fatalf("reset: %d %s", r.status, r.body)
	}
	if r, _ := e.allow(`{"key":"alice","policy":"free"}`); r.status != 200 {
		t.Fatalf("after the reset: %d %s", r.status, r.body)
	}
	if r := e.do("DELETE", keyURL("free", "nobody"), ""); r.status != 200 || !strings.Contains(string(r.body), `"reset":false`) {
		t.Fatalf("reset of an absent key: %d %s", r.status, r.body)
	}
	// Bad input: 4xx with a problem body, counted as errors.
	for _, c := range []struct {
		method, url string
		status      int
	}{
		{"GET", e.admin + "/admin/keys?policy=free", 400},
		{"GET", keyURL("nope", "alice"), 404},
		{"GET", keyURL("free", strings.Repeat("k", 2000)), 400},
		{"GET", e.admin + "/admin/keys?policy=free&key=%ff", 400},
		{"POST", keyURL("free", "alice"), 405},
	} {
		r := e.do(c.method, c.url, "")
		if r.status != c.status {
			t.Errorf("%s %s: %d %s, want %d", c.method, c.url, r.status, r.body, c.status)
		}
		if r.status != 405 && r.header.Get("Content-Type") != "application/problem+json" {
			t.Errorf("%s %s: Content-Type %q", c.method, c.url, r.header.Get("Content-Type"))
		}
	}
	// The main listener does not serve it.
	if r := e.do("GET", e.base+"/admin/keys?policy=free&key=alice", ""); r.status == 200 {
		t.Fatalf("the main listener served /admin/keys")
	}
	ops := e.srv.Registry()
	for _, c := range []struct {
		op, result string
		want       float64
	}{{"inspect", "found", 1}, {"inspect", "absent", 1}, {"reset", "found", 1}, {"reset", "absent", 1}, {"inspect", "error", 4}} {
		got, err := testutil.GatherAndCount(ops, server.MetricAdminKeyOps)
		if err != nil || got != 6 {
			t.Fatalf("%s series: %d, %v", server.MetricAdminKeyOps, got, err)
		}
		m, _ := ops.Gather()
		var v float64
		for _, mf := range m {
			if mf.GetName() != server.MetricAdminKeyOps {
				continue
			}
			for _, s := range mf.Metric {
				labels := map[string]string{}
				for _, l := range s.Label {
					labels[l.GetName()] = l.GetValue()
				}
				if labels["op"] == c.op && labels["result"] == c.result {
					v = s.Counter.GetValue()
				}
			}
		}
		if v != c.want {
			t.Errorf("%s{op=%s,result=%s} = %v, want %v", server.MetricAdminKeyOps, c.op, c.result, v, c.want)
		}
	}
	if !strings.Contains(logs.String(), "admin: key reset") || !strings.Contains(logs.String(), "admin: key inspected") {
		t.Fatalf("the operations were not logged:\n%s", logs.String())
	}
}

// adminFailOn fails the key operations for the key "down", as a remote
// store fails, with an error that names an address.
type adminFailOn struct{ *engine.Limiter }

var errAdminDown = errors.New("redisstore: dial tcp 10.1.2.3:6379: connection refused")

func (f adminFailOn) InspectKey(ctx context.Context, key string) (engine.KeyState, bool, error) {
	if key == "down" {
		return engine.KeyState{}, false, errAdminDown
	}
	return f.Limiter.InspectKey(ctx, key)
}

func (f adminFailOn) ResetKey(ctx context.Context, key string) (bool, error) {
	if key == "down" {
		return false, errAdminDown
	}
	return f.Limiter.ResetKey(ctx, key)
}

// TestAdminKeysStoreFailure: a store that fails a key operation gives a
// 503 problem that names no address; the failure is logged under its
// operation and counted as an error of it.
func TestAdminKeysStoreFailure(t *testing.T) {
	factory := func(_ context.Context, spec server.StoreSpec) (server.Store, error) {
		var out []engine.Backend
		for _, p := range spec.Policies {
			l, err := engine.New(p)
			if err != nil {
				return server.Store{}, err
			}
			out = append(out, adminFailOn{l})
		}
		return server.Store{Backends: out}, nil
	}
	cfg := mustParse(t, "store: fail://x\npolicies:\n  - {name: free, limit: 3, window: 60s}\n")
	var logs syncBuffer
	e := start(t, cfg, server.WithStore("fail", factory), server.WithLogger(slog.New(slog.NewTextHandler(&logs, nil))))
	down := e.admin + "/admin/keys?" + url.Values{"policy": {"free"}, "key": {"down"}}.Encode()
	for _, c := range []struct{ method, op string }{{"GET", "inspect"}, {"DELETE", "reset"}} {
		r := e.do(c.method, down, "")
		if r.status != 503 || r.header.Get("Content-Type") != "application/problem+json" ||
			strings.Contains(string(r.body), "10.1.2.3") || !strings.Contains(string(r.body), "rate-limit store is unavailable") {
			t.Errorf("%s of a key the store fails: %d %q %s", c.op, r.status, r.header.Get("Content-Type"), r.body)
		}
		if !strings.Contains(logs.String(), `msg="admin: `+c.op+` key failed"`) {
			t.Errorf("the failed %s was not logged:\n%s", c.op, logs.String())
		}
		if v := adminOpsCount(t, e.srv, c.op, "error"); v != 1 {
			t.Errorf("%s errors counted: %v, want 1", c.op, v)
		}
	}
	if r := e.do("GET", e.admin+"/admin/keys?policy=free&key=up", ""); r.status != 200 {
		t.Errorf("inspect of a key the store answers: %d %s", r.status, r.body)
	}
}

// adminOpsCount reads MetricAdminKeyOps{op, result} from the server's
// registry; 0 when the series does not exist.
func adminOpsCount(t *testing.T, srv *server.Server, op, result string) float64 {
	t.Helper()
	mfs, err := srv.Registry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != server.MetricAdminKeyOps {
			continue
		}
		for _, m := range mf.Metric {
			labels := map[string]string{}
			for _, l := range m.Label {
				labels[l.GetName()] = l.GetValue()
			}
			if labels["op"] == op && labels["result"] == result {
				return m.Counter.GetValue()
			}
		}
	}
	return 0
}

// /admin/keys shows a key's own limit (overrides), and a store whose
// backends cannot show keys answers 501 for every policy.
func TestAdminKeysCapabilities(t *testing.T) {
	cfg := mustParse(t, "policies:\n  - {name: free, limit: 3, window: 60s, overrides: {vip: 7}}\n")
	e := start(t, cfg)
	for key, limit := range map[string]float64{"vip": 7, "alice": 3} {
		r := e.do("GET", e.admin+"/admin/keys?"+url.Values{"policy": {"free"}, "key": {key}}.Encode(), "")
		var m map[string]any
		if err := json.Unmarshal(r.body, &m); err != nil || r.status != 200 || m["limit"] != limit || m["remaining"] != limit {
			t.Errorf("%s: %d %s, want limit and remaining %v", key, r.status, r.body, limit)
		}
	}
	cfg = mustParse(t, "store: plain://x\npolicies:\n  - {name: free, limit: 3, window: 60s}\n")
	e = start(t, cfg, server.WithStore("plain", plainStore))
	for _, policy := range []string{"free", ""} {
		r := e.do("GET", e.admin+"/admin/keys?"+url.Values{"policy": {policy}, "key": {"alice"}}.Encode(), "")
		if r.status != 501 || r.header.Get("Content-Type") != "application/problem+json" {
			t.Errorf("policy %q on a store that cannot show keys: %d %s", policy, r.status, r.body)
		}
	}
}

// plainStore's backends are the memory engine seen as engine.Backend
// only: they cannot show or reset keys.
func plainStore(_ context.Context, spec server.StoreSpec) (server.Store, error) {
	var out []engine.Backend
	for _, p := range spec.Policies {
		l, err := engine.New(p)
		if err != nil {
			return server.Store{}, err
		}
		out = append(out, plainBackend{l})
	}
	return server.Store{Backends: out, Close: func() error {
		for _, b := range out {
			_ = b.Close()
		}
		return nil
	}}, nil
}

type plainBackend struct{ engine.Backend }
