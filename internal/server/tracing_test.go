package server_test

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/slidegate/slidegate/httplimit"
	"github.com/slidegate/slidegate/internal/server"
	"github.com/slidegate/slidegate/internal/server/config"
)

type traceKey struct{}

// traced is one call of Tracing.Decision.
type traced struct {
	surface, policy, span string
	cost                  int
	allowed               bool
	err                   error
}

// TestTracingHooks: over a real listener, the Handler hook wraps every
// request once, and Decision is called for each decision of the
// decision API (one, a batch's each, a multi-limit request's binding
// limit) with the context the Handler hook made, the surface, the policy
// and the cost; never with the key.
func TestTracingHooks(t *testing.T) {
	var (
		mu    sync.Mutex
		calls []traced
		wraps []string
	)
	hooks := server.Tracing{
		Handler: func(surface string, next http.Handler) http.Handler {
			wraps = append(wraps, surface)
			return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				next.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), traceKey{}, r.URL.Path)))
			})
		},
		Decision: func(ctx context.Context, surface string, ev httplimit.Event) {
			if ev.Key != "" || ev.Request != nil {
				t.Errorf("tracing hook handed key %q, request %v", ev.Key, ev.Request != nil)
			}
			span, _ := ctx.Value(traceKey{}).(string)
			mu.Lock()
			defer mu.Unlock()
			calls = append(calls, traced{surface, ev.Policy, span, ev.Cost, ev.Decision.Allowed, ev.Err})
		},
	}
	cfg, err := config.ParseConfig([]byte("policies:\n  - {name: free, limit: 2, window: 1h}\n  - {name: hourly, limit: 1, window: 1h}\n"))
	if err != nil {
		t.Fatal(err)
	}
	cfg.Admin = "off"
	s, err := server.New(cfg, server.WithLogger(quiet), server.WithTracing(hooks))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	ts := httptest.NewServer(s.Handler())
	defer ts.Close()
	const key = "user-secret-key"
	post := func(path, body string) int {
		t.Helper()
		resp, err := ts.Client().Post(ts.URL+path, "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp.StatusCode
	}
	post("/v1/allow", `{"key":"`+key+`","policy":"free","cost":2}`)
	post("/v1/allow/batch", `[{"key":"`+key+`","policy":"free"},{"key":"`+key+`","policy":"hourly"}]`)
	post("/v1/allow", `{"limits":[{"policy":"free","key":"`+key+`-2"},{"policy":"hourly","key":"`+key+`"}]}`)
	mu.Lock()
	defer mu.Unlock()
	if len(wraps) != 1 || wraps[0] != "api" {
		t.Errorf("Handler hook called for %v, want once for api", wraps)
	}
	want := []traced{
		{"api", "free", "/v1/allow", 2, true, nil},
		{"api", "free", "/v1/allow/batch", 1, false, nil},
		{"api", "hourly", "/v1/allow/batch", 1, true, nil},
		{"api", "hourly", "/v1/allow", 1, false, nil}, // hourly binds: its one request is spent
	}
	if len(calls) != len(want) {
		t.Fatalf("Decision hook called %d times: %+v, want %+v", len(calls), calls, want)
	}
	for i := range want {
		if calls[i] != want[i] {
			t.Errorf("decision %d: %+v, want %+v", i, calls[i], want[i])
		}
		if strings.Contains(calls[i].policy+calls[i].surface, key) {
			t.Errorf("decision %d carries the key", i)
		}
	}
}

// TestTracingHooksGateway: the gateway's decisions (the middleware's
// observer) reach the Decision hook with the surface, the policy and the
// outcome, never with the key or the request.
func TestTracingHooksGateway(t *testing.T) {
	up, _ := upstream(t)
	var (
		mu       sync.Mutex
		evs      []httplimit.Event
		surfaces []string
	)
	hooks := server.Tracing{Decision: func(_ context.Context, surface string, ev httplimit.Event) {
		mu.Lock()
		defer mu.Unlock()
		evs, surfaces = append(evs, ev), append(surfaces, surface)
	}}
	cfg, err := config.ParseConfig([]byte("key: header:X-Client\npolicies:\n  - {name: free, limit: 1, window: 1h}\n"))
	if err != nil {
		t.Fatal(err)
	}
	cfg.Admin = "off"
	cfg.Upstream = config.UpstreamURL(up.URL)
	s, err := server.New(cfg, server.WithLogger(quiet), server.WithTracing(hooks))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	ts := httptest.NewServer(s.Handler())
	defer ts.Close()
	const key = "user-secret-key"
	for range 2 {
		req, _ := http.NewRequest("GET", ts.URL+"/x", nil)
		req.Header.Set("X-Client", key)
		resp, err := ts.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}
	mu.Lock()
	defer mu.Unlock()
	if len(evs) != 2 {
		t.Fatalf("Decision hook called %d times, want 2", len(evs))
	}
	for i, ev := range evs {
		if surfaces[i] != "gateway" || ev.Policy != "free" || ev.Cost != 1 || ev.Decision.Allowed != (i == 0) || ev.Err != nil {
			t.Errorf("decision %d: surface %q, event %+v; want gateway, free, cost 1, allowed %v", i, surfaces[i], ev, i == 0)
		}
		if ev.Key != "" || ev.Request != nil || ev.Limits != nil {
			t.Errorf("decision %d: the hook was handed key %q, a request %v, limits %v", i, ev.Key, ev.Request != nil, ev.Limits)
		}
	}
}

// BenchmarkHandleAllowTracing is BenchmarkHandleAllow's request without
// tracing hooks and with hooks that do nothing: what the hooks' checks
// and calls cost a decision of the decision API.
func BenchmarkHandleAllowTracing(b *testing.B) {
	noop := server.Tracing{
		Handler:  func(_ string, next http.Handler) http.Handler { return next },
		Decision: func(context.Context, string, httplimit.Event) {},
	}
	for _, c := range []struct {
		name string
		opts []server.Option
	}{{"off", nil}, {"noop-hooks", []server.Option{server.WithTracing(noop)}}} {
		b.Run(c.name, func(b *testing.B) {
			cfg, err := config.ParseConfig([]byte("policies:\n  - {name: free, limit: 100, window: 1s}\n"))
			if err != nil {
				b.Fatal(err)
			}
			cfg.Admin = "off"
			s, err := server.New(cfg, append(c.opts, server.WithLogger(quiet))...)
			if err != nil {
				b.Fatal(err)
			}
			defer s.Close()
			h := s.Handler()
			const keys = 1 << 12
			bodies := make([][]byte, keys)
			for i := range bodies {
				bodies[i] = []byte(`{"key":"client-` + strconv.Itoa(i) + `","policy":"free","cost":1}`)
			}
			var body bytes.Reader
			r, _ := http.NewRequest(http.MethodPost, "/v1/allow", io.NopCloser(&body))
			r.Header.Set("Content-Type", "application/json")
			w := &reusedWriter{h: http.Header{}}
			b.ReportAllocs()
			i := 0
			for b.Loop() {
				body.Reset(bodies[i&(keys-1)])
				i++
				clear(w.h)
				w.code, w.n = 0, 0
				h.ServeHTTP(w, r)
				if w.code != http.StatusOK && w.code != http.StatusTooManyRequests {
					b.Fatalf("status %d", w.code)
				}
			}
		})
	}
}
