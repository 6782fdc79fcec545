package remote_test

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/slidegate/slidegate/internal/server"
	"github.com/slidegate/slidegate/internal/server/config"
	"github.com/slidegate/slidegate/remote"
)

// A hung server opens the breaker after threshold timeouts; then
// decisions go to the failure policy at once, with ErrBreakerOpen as the
// cause, without a call.
func TestBreakerOpens(t *testing.T) {
	var causes []error
	c := dial(t, "http://"+blackHole(t), remote.WithFailurePolicy(remote.FailClosed), remote.WithTimeout(100*time.Millisecond),
		remote.WithBreaker(2, time.Hour), remote.WithFallbackHook(func(_ string, cause error) { causes = append(causes, cause) }))
	defer c.Close()
	l, _ := c.Limiter(pol)
	for i := range 4 {
		d, err := l.Decide(context.Background(), "alice", 1)
		if !errors.Is(err, remote.ErrUnavailable) || d.Allowed {
			t.Fatalf("decision %d: %+v, %v", i, d, err)
		}
		if open := errors.Is(err, remote.ErrBreakerOpen); open != (i >= 2) {
			t.Fatalf("decision %d: %v; want the breaker open from the third decision on", i, err)
		}
	}
	if len(causes) != 4 || !errors.Is(causes[0], context.DeadlineExceeded) || !errors.Is(causes[3], remote.ErrBreakerOpen) {
		t.Fatalf("fallback causes %v", causes)
	}
}

// A server that comes back closes the breaker: after the cooldown a probe
// reaches it, and decisions are the server's again.
func TestBreakerRecovers(t *testing.T) {
	addr := deadAddr(t)
	var fallbacks atomic.Int32
	c := dial(t, "http://"+addr, remote.WithBreaker(1, time.Millisecond),
		remote.WithFallbackHook(func(string, error) { fallbacks.Add(1) }))
	defer c.Close()
	l, _ := c.Limiter(pol)
	if _, err := l.Decide(context.Background(), "alice", 1); err != nil || fallbacks.Load() != 1 {
		t.Fatalf("server down: %v, %d fallbacks (want the local decision)", err, fallbacks.Load())
	}
	cfg, err := config.ParseConfig([]byte("policies:\n  - {name: api, limit: 3, window: 1m}\n"))
	if err != nil {
		t.Fatal(err)
	}
	cfg.Listen, cfg.Admin = addr, "off"
	s, err := server.New(cfg, server.WithLogger(quiet))
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Start(); err != nil {
		t.Skipf("the released port was taken meanwhile: %v", err)
	}
	defer s.Close()
	deadline := time.Now().Add(time.Minute)
	for {
		before := fallbacks.Load()
		d, err := l.Decide(context.Background(), "bob", 1)
		if err != nil {
			t.Fatal(err)
		}
		if fallbacks.Load() == before {
			// The server's decision: bob's first request there.
			if d.Remaining != 2 {
				t.Fatalf("the server's decision: %+v", d)
			}
			return
		}
		if time.Now().After(deadline) {
			t.Fatal("the breaker did not let a probe through in a minute")
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func TestBreakerOptions(t *testing.T) {
	for _, o := range []remote.Option{remote.WithBreaker(-1, time.Second), remote.WithBreaker(1, 0)} {
		if _, err := remote.Dial("http://127.0.0.1:1", o); !errors.Is(err, remote.ErrInvalidOption) {
			t.Errorf("%v", err)
		}
	}
	if _, err := remote.Dial("http://127.0.0.1:1", remote.WithBreaker(0, 0)); err != nil {
		t.Errorf("breaker off: %v", err)
	}
}

// TestBreakerFailureRate: a server that fails every other call opens the
// breaker though no two failures are consecutive (the breaker is
// redisstore's: at least threshold failures, at least half of the recent
// calls).
func TestBreakerFailureRate(t *testing.T) {
	var n atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		if n.Add(1)%2 == 1 {
			http.Error(w, "overloaded", http.StatusServiceUnavailable)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`{"allowed":true,"policy":"api","limit":3,"remaining":2,"at":1}`))
	}))
	defer srv.Close()
	var opened atomic.Bool
	c := dial(t, srv.URL, remote.WithTimeout(10*time.Second), remote.WithBreaker(3, time.Hour),
		remote.WithFallbackHook(func(_ string, cause error) {
			if errors.Is(cause, remote.ErrBreakerOpen) {
				opened.Store(true)
			}
		}))
	defer c.Close()
	l, _ := c.Limiter(pol)
	for range 20 {
		if _, err := l.Decide(context.Background(), "alice", 1); err != nil {
			t.Fatal(err)
		}
	}
	if !opened.Load() {
		t.Fatalf("the breaker stayed closed over %d calls, half of them failed", n.Load())
	}
}
