package main

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"
)

// TestServeRedis runs slidegate serve on the Redis servers that make test
// starts (scripts/redis-env.sh): standalone and cluster, by redis and by
// valkey URLs, the failure policy and key prefix from store_options, the
// store's metrics on /metrics.
func TestServeRedis(t *testing.T) {
	addr, cluster := os.Getenv("SLIDEGATE_REDIS_ADDR"), os.Getenv("SLIDEGATE_REDIS_CLUSTER_ADDRS")
	if addr == "" || cluster == "" {
		t.Skip("SLIDEGATE_REDIS_ADDR / SLIDEGATE_REDIS_CLUSTER_ADDRS not set: run make test (scripts/redis-env.sh starts Redis)")
	}
	defer goleak.VerifyNone(t, goleak.IgnoreAnyFunction("github.com/redis/rueidis.(*clusterClient)._refresh.func2"))
	// The valkey schemes are the redis ones under Valkey's name.
	for _, store := range []string{"redis://" + addr + "/0", "redis-cluster://" + cluster, "valkey://" + addr + "/0", "valkey-cluster://" + cluster} {
		t.Run(strings.SplitN(store, ":", 2)[0], func(t *testing.T) {
			cfg := filepath.Join(t.TempDir(), "c.yaml")
			prefix := fmt.Sprintf("serve-test-%d:", time.Now().UnixNano())
			os.WriteFile(cfg, []byte(`policies:
  - {name: tiny, limit: 3, window: 60s}
store_options:
  key_prefix: "`+prefix+`"
  failure_policy: closed
  timeout: 500ms
  breaker_threshold: 3
  breaker_cooldown: 1s
`), 0o644)
			srv, stop := startServe(t, "--config", cfg, "--store", store, "--listen", "127.0.0.1:0", "--admin", "127.0.0.1:0")
			if srv == nil {
				code, stderr := stop()
				t.Fatalf("serve exited %d: %s", code, stderr)
			}
			c := &http.Client{Transport: &http.Transport{}}
			defer c.Transport.(*http.Transport).CloseIdleConnections()
			for i, want := range []int{200, 200, 200, 429} {
				resp, err := c.Post("http://"+srv.Addr()+"/v1/allow", "application/json", strings.NewReader(`{"key":"alice","policy":"tiny"}`))
				if err != nil {
					t.Fatal(err)
				}
				body, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				if resp.StatusCode != want {
					t.Errorf("request %d: %d %s, want %d", i, resp.StatusCode, body, want)
				}
			}
			// The admin listener inspects and resets a key on Redis.
			admin := "http://" + srv.AdminAddr() + "/admin/keys?policy=tiny&key=alice"
			for _, step := range []struct{ method, want string }{
				{"GET", `"used":3,"remaining":0`},
				{"DELETE", `"reset":true`},
				{"GET", `"exists":false`},
			} {
				req, _ := http.NewRequest(step.method, admin, nil)
				resp, err := c.Do(req)
				if err != nil {
					t.Fatal(err)
				}
				body, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				if resp.StatusCode != 200 || !strings.Contains(string(body), step.want) {
					t.Errorf("%s /admin/keys: %d %s, want %s", step.method, resp.StatusCode, body, step.want)
				}
			}
			if resp, err := c.Post("http://"+srv.Addr()+"/v1/allow", "application/json", strings.NewReader(`{"key":"alice","policy":"tiny"}`)); err != nil || resp.StatusCode != 200 {
				t.Errorf("after the reset: %v %v, want 200", resp, err)
			} else {
				resp.Body.Close()
			}
			resp, err := c.Get("http://" + srv.AdminAddr() + "/metrics")
			if err != nil {
				t.Fatal(err)
			}
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			for _, m := range []string{"slidegate_redis_call_duration_seconds", "slidegate_redis_breaker_state"} {
				if !strings.Contains(string(body), m) {
					t.Errorf("/metrics lacks %s", m)
				}
			}
			if code, stderr := stop(); code != 0 {
				t.Errorf("serve exited %d: %s", code, stderr)
			}
		})
	}
	t.Run("bad-options", func(t *testing.T) {
		cfg := filepath.Join(t.TempDir(), "c.yaml")
		os.WriteFile(cfg, []byte("policies:\n  - {name: tiny, limit: 3, window: 60s}\nstore_options:\n  bogus: 1\n"), 0o644)
		srv, stop := startServe(t, "--config", cfg, "--store", "redis://"+addr)
		code, stderr := stop()
		if srv != nil || code != 1 || !strings.Contains(stderr, "store_options.bogus: unknown") {
			t.Errorf("exit %d, stderr %q", code, stderr)
		}
	})
}

// TestServeRedisSeveralLimits: on standalone Redis, a "limits" request of
// two limits is decided all or nothing by the store's group (the second
// limit is not charged for requests the first refuses); on Redis Cluster,
// a route whose limits use different keys is refused at start-up unless it
// names a cluster_tag, and with one it is decided all or nothing.
func TestServeRedisSeveralLimits(t *testing.T) {
	addr, cluster := os.Getenv("SLIDEGATE_REDIS_ADDR"), os.Getenv("SLIDEGATE_REDIS_CLUSTER_ADDRS")
	if addr == "" || cluster == "" {
		t.Skip("SLIDEGATE_REDIS_ADDR / SLIDEGATE_REDIS_CLUSTER_ADDRS not set: run make test (scripts/redis-env.sh starts Redis)")
	}
	defer goleak.VerifyNone(t, goleak.IgnoreAnyFunction("github.com/redis/rueidis.(*clusterClient)._refresh.func2"))
	// A round trip slower than the default timeout on a loaded machine
	// would answer 504 and shift every later request's expected answer;
	// the test checks Redis's decisions, so it waits for them.
	policies := fmt.Sprintf(`policies:
  - {name: tiny, limit: 2, window: 60s}
  - {name: hourly, limit: 5, window: 1h}
store_options:
  key_prefix: "serve-group-%d:"
  failure_policy: closed
  timeout: 30s
`, time.Now().UnixNano())
	t.Run("standalone", func(t *testing.T) {
		cfg := filepath.Join(t.TempDir(), "c.yaml")
		os.WriteFile(cfg, []byte(policies), 0o644)
		srv, stop := startServe(t, "--config", cfg, "--store", "redis://"+addr+"/0", "--listen", "127.0.0.1:0", "--admin", "off")
		if srv == nil {
			code, stderr := stop()
			t.Fatalf("serve exited %d: %s", code, stderr)
		}
		c := &http.Client{Transport: &http.Transport{}}
		defer c.Transport.(*http.Transport).CloseIdleConnections()
		both := `{"limits":[{"policy":"tiny","key":"bob"},{"policy":"hourly","key":"bob"}],"cost":1}`
		for i, want := range []int{200, 200, 429, 429} {
			resp, err := c.Post("http://"+srv.Addr()+"/v1/allow", "application/json", strings.NewReader(both))
			if err != nil {
				t.Fatal(err)
			}
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != want {
				t.Errorf("request %d: %d %s, want %d", i, resp.StatusCode, body, want)
			}
		}
		// The two refusals charged nothing to the hourly limit: 3 left.
		resp, err := c.Post("http://"+srv.Addr()+"/v1/allow", "application/json", strings.NewReader(`{"key":"bob","policy":"hourly"}`))
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 || !strings.Contains(string(body), `"remaining":2`) {
			t.Errorf("hourly alone after two refused group requests: %d %s, want 200 with 2 remaining", resp.StatusCode, body)
		}
		if code, stderr := stop(); code != 0 {
			t.Errorf("serve exited %d: %s", code, stderr)
		}
	})
	t.Run("cluster", func(t *testing.T) {
		var hits atomic.Int64
		up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { hits.Add(1) }))
		defer up.Close()
		route := policies + "upstream: " + up.URL + "\nroutes:\n  - path: /api\n    limits: [{policy: tiny, key: ip}, {policy: hourly, key: \"header:X-User\"}]\n"
		// Limits on different keys need a tag that places them in one slot.
		cfg := filepath.Join(t.TempDir(), "c.yaml")
		os.WriteFile(cfg, []byte(route), 0o644)
		srv, stop := startServe(t, "--config", cfg, "--store", "redis-cluster://"+cluster, "--listen", "127.0.0.1:0", "--admin", "off")
		code, stderr := stop()
		if srv != nil || code != 1 || !strings.Contains(stderr, "routes[0].cluster_tag: required") {
			t.Errorf("a route of two limits on different keys without a tag: exit %d, stderr %q", code, stderr)
		}
		// With the tag, the route is decided all or nothing in one slot.
		os.WriteFile(cfg, []byte(route+"    cluster_tag: \"header:X-User\"\n"), 0o644)
		srv, stop = startServe(t, "--config", cfg, "--store", "redis-cluster://"+cluster, "--listen", "127.0.0.1:0", "--admin", "off")
		if srv == nil {
			code, stderr := stop()
			t.Fatalf("serve with cluster_tag exited %d: %s", code, stderr)
		}
		c := &http.Client{Transport: &http.Transport{}}
		defer c.Transport.(*http.Transport).CloseIdleConnections()
		get := func(user string) int {
			req, _ := http.NewRequest("GET", "http://"+srv.Addr()+"/api/x", nil)
			req.Header.Set("X-User", user)
			resp, err := c.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			return resp.StatusCode
		}
		// tiny (2 per minute per IP, counted per user through the tag)
		// refuses the third; the refusals charge nothing to hourly (5).
		for i, want := range []int{200, 200, 429, 429} {
			if got := get("carol"); got != want {
				t.Errorf("request %d: %d, want %d", i, got, want)
			}
		}
		if hits.Load() != 2 {
			t.Errorf("the upstream saw %d requests, want 2", hits.Load())
		}
		if code, stderr := stop(); code != 0 {
			t.Errorf("serve exited %d: %s", code, stderr)
		}
		// The decision API: limits on different keys are decided on a
		// cluster without "tag" too (across their slots, all or nothing),
		// and with it in one call.
		os.WriteFile(cfg, []byte(policies), 0o644)
		srv, stop = startServe(t, "--config", cfg, "--store", "redis-cluster://"+cluster, "--listen", "127.0.0.1:0", "--admin", "off")
		if srv == nil {
			code, stderr := stop()
			t.Fatalf("serve exited %d: %s", code, stderr)
		}
		post := func(body string) (int, string) {
			resp, err := c.Post("http://"+srv.Addr()+"/v1/allow", "application/json", strings.NewReader(body))
			if err != nil {
				t.Fatal(err)
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			return resp.StatusCode, string(b)
		}
		const limits = `"limits":[{"policy":"tiny","key":"10.0.0.9"},{"policy":"hourly","key":"erin"}]`
		if code, body := post(`{` + limits + `}`); code != 200 {
			t.Errorf("untagged request over different keys: %d %s, want 200 (decided across slots)", code, body)
		}
		for i, want := range []int{200, 200, 429} {
			if code, body := post(`{` + limits + `,"tag":"erin"}`); code != want {
				t.Errorf("tagged request %d: %d %s, want %d", i, code, body, want)
			}
		}
		if code, body := post(`{"key":"x","tag":"erin"}`); code != 400 {
			t.Errorf("a tag on a single-limit request: %d %s, want 400", code, body)
		}
		if code, stderr := stop(); code != 0 {
			t.Errorf("serve exited %d: %s", code, stderr)
		}
	})
}
