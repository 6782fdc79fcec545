package server_test

// Tests of issue 28's server-side points (hostile clients, round two):
// route spellings, a key header sent twice, secrets in errors and logs,
// the admin listener's Host allow-list and token, spoofable headers, log
// floods and connection hoarding. Each goes through a real listener.

import (
	"crypto/sha256"
	"encoding/hex"
	"log/slog"
	"net/url"
	"strings"
	"testing"

	"github.com/slidegate/slidegate/engine"
	"github.com/slidegate/slidegate/server"
)

// TestRouteSpellings (issue 28, point 4): with POST /login and GET /api
// spent, no other spelling of them reaches the upstream under the default
// policy: HEAD counts where GET is limited, path parameters after ";" do
// not escape a prefix.
func TestRouteSpellings(t *testing.T) {
	up, hits := upstream(t)
	cfg := mustParse(t, `
key: ip
policies:
  - {name: free, limit: 100, window: 60s}
  - {name: login, limit: 1, window: 60s}
  - {name: api, limit: 1, window: 60s}
routes:
  - {method: POST, path: /login, limits: [{policy: login}]}
  - {method: GET, path: /api, limits: [{policy: api}]}
`)
	cfg.Upstream = up.URL
	e := start(t, cfg, server.WithClock(engine.NewManualClock()))
	if r := e.do("POST", e.base+"/login", ""); r.status != 200 {
		t.Fatalf("first POST /login: %d %s", r.status, r.body)
	}
	if r := e.do("GET", e.base+"/api/items", ""); r.status != 200 {
		t.Fatalf("first GET /api/items: %d %s", r.status, r.body)
	}
	before := hits.Load()
	for _, c := range []struct{ method, target string }{
		{"POST", "/login"},
		{"HEAD", "/api/items"},
		{"HEAD", "/api"},
		{"POST", "/login;jsessionid=1"},
		{"POST", "/login;"},
		{"POST", "/static/..;/login"},
		{"GET", "/api;v=2/items"},
		{"GET", "/api/items;x=1"},
	} {
		resp, _ := rawDo(t, e.base[len("http://"):], c.method+" "+c.target+" HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
		if resp.StatusCode != 429 {
			t.Errorf("%s %s: %d, want 429 (the route's limit is spent)", c.method, c.target, resp.StatusCode)
		}
	}
	if n := hits.Load() - before; n != 0 {
		t.Errorf("%d respellings reached the upstream", n)
	}
	// Other routes and methods are unaffected.
	if r := e.do("GET", e.base+"/login", ""); r.status != 200 {
		t.Errorf("GET /login (no route): %d", r.status)
	}
	if r := e.do("POST", e.base+"/api/items", ""); r.status != 200 {
		t.Errorf("POST /api/items (no route for POST): %d", r.status)
	}
}

// TestKeyHeaderTwice (issue 28, point 5): X-API-Key on two lines is
// ambiguous, answered 400 and not forwarded, so a decoy beside the real
// key gets no fresh bucket.
func TestKeyHeaderTwice(t *testing.T) {
	up, hits := upstream(t)
	cfg := mustParse(t, "key: header:X-API-Key\npolicies:\n  - {name: free, limit: 2, window: 60s}\n")
	cfg.Upstream = up.URL
	e := start(t, cfg, server.WithClock(engine.NewManualClock()))
	addr := e.base[len("http://"):]
	allowed, bad := 0, 0
	for i := range 6 {
		resp, _ := rawDo(t, addr, "GET / HTTP/1.1\r\nHost: x\r\nX-API-Key: decoy"+string(rune('a'+i))+"\r\nX-API-Key: REALKEY\r\nConnection: close\r\n\r\n")
		switch resp.StatusCode {
		case 200:
			allowed++
		case 400:
			bad++
		}
	}
	if allowed != 0 || bad != 6 || hits.Load() != 0 {
		t.Errorf("6 requests with the key header twice: %d allowed, %d answered 400, %d forwarded", allowed, bad, hits.Load())
	}
	for i := range 3 {
		want := 200
		if i == 2 {
			want = 429
		}
		if r := e.do("GET", e.base+"/", "", "X-API-Key", "REALKEY"); r.status != want {
			t.Errorf("REALKEY request %d: %d, want %d", i+1, r.status, want)
		}
	}
}

// TestStorePasswordNeverPrinted (issue 28, point 7): a store URL that
// does not parse (base64 passwords hold / and +; #, spaces and quotes get
// pasted) is refused without its password.
func TestStorePasswordNeverPrinted(t *testing.T) {
	for _, pw := range []string{"Zm9v/YmFy+S3cr3t", "S3cr3t#frag", "S3cr3t with spaces", `S3cr3t"quote`, "1234/S3cr3t", "S3cr3t%zz"} {
		cfg := mustParse(t, "policies:\n  - {name: free, limit: 5, window: 60s}\n")
		cfg.Store = "redis://:" + pw + "@127.0.0.1:6379/0"
		_, err := server.Check(cfg, server.WithStore("redis", memoryStore(nil)))
		if err != nil && strings.Contains(err.Error(), "S3cr3t") {
			t.Errorf("password %q: %v", pw, err)
		}
		if err == nil {
			out, merr := cfg.Marshal()
			if merr != nil || strings.Contains(string(out), "S3cr3t") {
				t.Errorf("password %q: Marshal: %v\n%s", pw, merr, out)
			}
		}
	}
}

// TestAdminKeyNotLogged (issue 28, point 7): an API key is a credential,
// so /admin/keys logs its hash, never the key.
func TestAdminKeyNotLogged(t *testing.T) {
	cfg := mustParse(t, "policies:\n  - {name: free, limit: 3, window: 60s}\n")
	var logs syncBuffer
	e := start(t, cfg, server.WithLogger(slog.New(slog.NewTextHandler(&logs, nil))))
	const key = "sk_live_4eC39HqLyjWDarjtT1zdp7dc"
	for _, m := range []string{"GET", "DELETE"} {
		if r := e.do(m, e.admin+"/admin/keys?"+url.Values{"key": {key}}.Encode(), ""); r.status != 200 {
			t.Fatalf("%s /admin/keys: %d %s", m, r.status, r.body)
		}
	}
	sum := sha256.Sum256([]byte(key))
	if l := logs.String(); strings.Contains(l, "sk_live") || strings.Count(l, "sha256:"+hex.EncodeToString(sum[:8])) != 2 {
		t.Errorf("log:\n%s", l)
	}
}
