package remote_test

import (
	"context"
	"errors"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httptrace"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/slidegate/slidegate/engine"
	"github.com/slidegate/slidegate/httplimit"
	"github.com/slidegate/slidegate/remote"
)

// deadAddr returns a loopback address nothing listens on: a port that
// was just bound and released.
func deadAddr(t *testing.T) string {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := lis.Addr().String()
	lis.Close()
	return addr
}

// blackHole accepts connections and never answers, as a hung server
// does; it closes them at the end of the test.
func blackHole(t *testing.T) string {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var conns []net.Conn
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			c, err := lis.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
		}
	}()
	t.Cleanup(func() {
		lis.Close()
		<-done
		mu.Lock()
		for _, c := range conns {
			c.Close()
		}
		mu.Unlock()
	})
	return lis.Addr().String()
}

var pol = engine.Policy{Name: "api", Limit: 3, Window: time.Minute}

func TestFailurePolicies(t *testing.T) {
	for _, tc := range []struct {
		name string
		addr func(*testing.T) string
	}{
		{"ConnectionRefused", deadAddr},
		{"Timeout", blackHole},
	} {
		t.Run(tc.name, func(t *testing.T) {
			base := "http://" + tc.addr(t)
			t.Run("closed", func(t *testing.T) {
				var hooked atomic.Int32
				c := dial(t, base, remote.WithFailurePolicy(remote.FailClosed), remote.WithTimeout(200*time.Millisecond),
					remote.WithFallbackHook(func(key string, cause error) { hooked.Add(1) }))
				defer c.Close()
				l, _ := c.Limiter(pol)
				d, err := l.Decide(context.Background(), "alice", 1)
				if !errors.Is(err, remote.ErrUnavailable) || d.Allowed || d.RetryAfter <= 0 || d.Limit != 3 {
					t.Fatalf("got %+v, %v; want a refusal and ErrUnavailable", d, err)
				}
				if !strings.Contains(err.Error(), "failure policy closed") || !strings.Contains(err.Error(), base) {
					t.Errorf("error %q does not say which policy and server", err)
				}
				if tc.name == "Timeout" && !errors.Is(err, context.DeadlineExceeded) {
					t.Errorf("error %q does not wrap context.DeadlineExceeded", err)
				}
				if hooked.Load() != 1 {
					t.Errorf("fallback hook called %d times, want 1", hooked.Load())
				}
			})
			t.Run("open", func(t *testing.T) {
				c := dial(t, base, remote.WithFailurePolicy(remote.FailOpen), remote.WithTimeout(200*time.Millisecond))
				defer c.Close()
				l, _ := c.Limiter(pol)
				for i := range 5 {
					d, err := l.Decide(context.Background(), "alice", 1)
					if err != nil || !d.Allowed {
						t.Fatalf("request %d: %+v, %v; want allowed", i, d, err)
					}
				}
			})
			t.Run("local", func(t *testing.T) {
				c := dial(t, base, remote.WithTimeout(200*time.Millisecond))
				defer c.Close()
				l, _ := c.Limiter(pol)
				for i := range 4 {
					d, err := l.Decide(context.Background(), "alice", 1)
					if err != nil || d.Allowed != (i < 3) {
						t.Fatalf("request %d: %+v, %v; want the local limit of 3", i, d, err)
					}
				}
				g, err := c.Group(pol, engine.Policy{Name: "ip", Limit: 1, Window: time.Minute})
				if err != nil {
					t.Fatal(err)
				}
				refs := []engine.Ref{{Policy: 0, Key: "bob"}, {Policy: 1, Key: "10.0.0.1"}}
				for i := range 2 {
					gd, err := g.DecideGroup(context.Background(), nil, engine.GroupRequest{Refs: refs, N: 1})
					if err != nil || gd.Allowed != (i == 0) {
						t.Fatalf("group request %d: %+v, %v", i, gd, err)
					}
				}
			})
		})
	}
}

// A caller's own cancellation is its error, not a server failure.
func TestCallerCancel(t *testing.T) {
	var hooked atomic.Int32
	c := dial(t, "http://"+blackHole(t), remote.WithTimeout(time.Minute),
		remote.WithFallbackHook(func(string, error) { hooked.Add(1) }))
	defer c.Close()
	l, _ := c.Limiter(pol)
	ctx, cancel := context.WithCancel(context.Background())
	go func() { time.Sleep(20 * time.Millisecond); cancel() }()
	if _, err := l.Decide(ctx, "alice", 1); !errors.Is(err, context.Canceled) {
		t.Fatalf("got %v, want context.Canceled", err)
	}
	if hooked.Load() != 0 {
		t.Fatal("a caller's cancellation went to the failure policy")
	}
}

// Bad requests are the caller's errors: no failure policy, even FailOpen.
func TestRejected(t *testing.T) {
	base, _, _ := serve(t, []engine.Policy{pol}, nil)
	c := dial(t, base, remote.WithFailurePolicy(remote.FailOpen))
	defer c.Close()
	unknown, _ := c.Limiter(engine.Policy{Name: "nope", Limit: 3, Window: time.Minute})
	if d, err := unknown.Decide(context.Background(), "alice", 1); !errors.Is(err, remote.ErrRejected) || d.Allowed || !strings.Contains(err.Error(), `unknown policy "nope"`) {
		t.Fatalf("unknown policy: %+v, %v; want ErrRejected naming it", d, err)
	}
	wrong, _ := c.Limiter(engine.Policy{Name: "api", Limit: 5, Window: time.Minute})
	if _, err := wrong.Decide(context.Background(), "alice", 1); !errors.Is(err, remote.ErrPolicyMismatch) {
		t.Fatalf("limit 5 against the server's 3: %v, want ErrPolicyMismatch", err)
	}
	right, _ := c.Limiter(pol)
	if _, err := right.Decide(context.Background(), "alice", 4); !errors.Is(err, engine.ErrInvalidCost) {
		t.Fatalf("cost 4: %v, want engine.ErrInvalidCost", err)
	}
	if _, err := right.Decide(context.Background(), "", 1); !errors.Is(err, remote.ErrRejected) {
		t.Fatalf("empty key: %v, want ErrRejected", err)
	}
	// None of the above was charged: the policy-mismatch request was
	// decided by the server, so alice has 2 left.
	d, err := right.Decide(context.Background(), "alice", 1)
	if err != nil || d.Remaining != 1 {
		t.Fatalf("after the bad requests: %+v, %v; want remaining 1", d, err)
	}
	c.Close()
	if _, err := right.Decide(context.Background(), "alice", 1); !errors.Is(err, remote.ErrClosed) {
		t.Fatalf("after Close: %v, want ErrClosed", err)
	}
}

// Sequential decisions reuse one connection.
func TestConnectionReuse(t *testing.T) {
	base, _, _ := serve(t, []engine.Policy{{Name: "api", Limit: 1000, Window: time.Minute}}, nil)
	c := dial(t, base)
	defer c.Close()
	l, _ := c.Limiter(engine.Policy{Name: "api", Limit: 1000, Window: time.Minute})
	var fresh, reused atomic.Int32
	ctx := httptrace.WithClientTrace(context.Background(), &httptrace.ClientTrace{GotConn: func(i httptrace.GotConnInfo) {
		if i.Reused {
			reused.Add(1)
		} else {
			fresh.Add(1)
		}
	}})
	for i := range 50 {
		if _, err := l.Decide(ctx, "k", 1); err != nil {
			t.Fatalf("decision %d: %v", i, err)
		}
	}
	if fresh.Load() != 1 || reused.Load() != 49 {
		t.Fatalf("%d new connections and %d reused for 50 decisions, want 1 and 49", fresh.Load(), reused.Load())
	}
}

// httplimit enforces a remote limit unchanged: the server's state is the
// one every middleware shares.
func TestHTTPLimit(t *testing.T) {
	base, _, _ := serve(t, []engine.Policy{pol}, nil)
	var handlers []http.Handler
	for range 2 { // two replicas of a service
		c := dial(t, base)
		defer c.Close()
		l, _ := c.Limiter(pol)
		mw, err := httplimit.New(httplimit.WithBackend(l), httplimit.WithKeyFunc(func(*http.Request) (string, error) { return "everyone", nil }))
		if err != nil {
			t.Fatal(err)
		}
		handlers = append(handlers, mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusNoContent) })))
	}
	var codes []int
	for i := range 4 {
		rec := httptest.NewRecorder()
		handlers[i%2].ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/", nil))
		codes = append(codes, rec.Code)
		if i == 3 && rec.Header().Get("Retry-After") == "" {
			t.Errorf("the refusal has no Retry-After: %v", rec.Header())
		}
	}
	if want := []int{204, 204, 204, 429}; !equal(codes, want) {
		t.Fatalf("statuses %v, want %v (the limit of 3 shared by both replicas)", codes, want)
	}
}

func equal(a, b []int) bool {
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

func TestDialErrors(t *testing.T) {
	for _, u := range []string{"", "localhost:8080", "ftp://x", "http://"} {
		if _, err := remote.Dial(u); !errors.Is(err, remote.ErrInvalidOption) {
			t.Errorf("Dial(%q): %v, want ErrInvalidOption", u, err)
		}
	}
	if _, err := remote.Dial("http://user:hunter2@[::1", remote.WithTimeout(time.Second)); err == nil || strings.Contains(err.Error(), "hunter2") {
		t.Errorf("a bad URL's error shows its password or is nil: %v", err)
	}
	c := dial(t, "http://127.0.0.1:1")
	defer c.Close()
	if _, err := c.Group(pol, engine.Policy{Limit: 1, Window: time.Second}); !errors.Is(err, remote.ErrInvalidOption) {
		t.Errorf("a group with an unnamed policy: %v", err)
	}
}
