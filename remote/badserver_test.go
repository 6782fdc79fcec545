package remote_test

// Tests of a bad server: the client believes an
// answer only within bounds it can check.

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/slidegate/slidegate/engine"
	"github.com/slidegate/slidegate/httplimit"
	"github.com/slidegate/slidegate/remote"
)

// badServer answers the decision API with body for the first answers
// requests and 503 after, as a server that answers nonsense and then goes
// down.
func badServer(t *testing.T, answers int64, body string) string {
	t.Helper()
	var n atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		if n.Add(1) > answers {
			http.Error(w, "down", http.StatusServiceUnavailable)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(body))
	}))
	t.Cleanup(srv.Close)
	return srv.URL
}

// TestBogusInstantKeepsTheFallbackClock: a first answer whose at is the
// largest int64 does not anchor the local fallback's clock. Were it
// anchored, the clock would stay at the largest time.Duration: during the
// outage a key refused once would be refused for good. Here the fallback
// allows again once its own RetryAfter has passed, and its instants move.
func TestBogusInstantKeepsTheFallbackClock(t *testing.T) {
	p := engine.Policy{Name: "api", Limit: 2, Window: 50 * time.Millisecond}
	for _, at := range []string{"9223372036854775807", "-9223372036854775808"} {
		t.Run(at, func(t *testing.T) {
			body := fmt.Sprintf(`{"allowed":true,"policy":"api","limit":2,"remaining":1,"at":%s}`, at)
			c := dial(t, badServer(t, 1, body), remote.WithBreaker(1000, time.Hour))
			defer c.Close()
			l, err := c.Limiter(p)
			if err != nil {
				t.Fatal(err)
			}
			d, err := l.Decide(context.Background(), "k", 1)
			if err != nil || !d.Allowed {
				t.Fatalf("the bad server's answer: %+v %v", d, err)
			}
			if d.At < 0 || d.At == 9223372036854775807 {
				t.Errorf("the bogus at %s came through: %d", at, d.At)
			}
			// The server is down from here: the local fallback decides.
			var last engine.Decision
			for i := range 3 {
				last, err = l.Decide(context.Background(), "k", 1)
				if err != nil {
					t.Fatal(err)
				}
				if i < 2 && !last.Allowed {
					t.Fatalf("fallback decision %d refused: %+v", i, last)
				}
			}
			if last.Allowed || last.RetryAfter <= 0 || last.RetryAfter > p.Window {
				t.Fatalf("third fallback decision: %+v, want a refusal within the window", last)
			}
			time.Sleep(last.RetryAfter)
			again, err := l.Decide(context.Background(), "k", 1)
			if err != nil {
				t.Fatal(err)
			}
			if !again.Allowed || again.At <= last.At {
				t.Fatalf("after the fallback's RetryAfter %v: %+v (previous at %d); the local clock stopped", last.RetryAfter, again, last.At)
			}
		})
	}
}

// TestBogusRetryAfterClamped: a refusal whose retry_after_ns is negative
// (or longer than the window) retries after the window, never after 0 s,
// through httplimit's Retry-After. The decision's other figures stay
// within the policy too.
func TestBogusRetryAfterClamped(t *testing.T) {
	p := engine.Policy{Name: "api", Limit: 3, Window: time.Minute}
	for _, ra := range []string{"-9000000000000000000", "0", "9000000000000000000"} {
		t.Run(ra, func(t *testing.T) {
			body := `{"allowed":false,"policy":"api","limit":3,"remaining":-7,"retry_after_ns":` + ra + `,"reset_ns":-5,"at":1000}`
			c := dial(t, badServer(t, 1<<30, body))
			defer c.Close()
			l, err := c.Limiter(p)
			if err != nil {
				t.Fatal(err)
			}
			d, err := l.Decide(context.Background(), "k", 1)
			if err != nil {
				t.Fatal(err)
			}
			if d.Allowed || d.RetryAfter != p.Window || d.Remaining != 0 || d.Reset != 0 {
				t.Errorf("decision %+v, want a refusal with RetryAfter %v, Remaining 0, Reset 0", d, p.Window)
			}
			mw, err := httplimit.New(httplimit.WithBackend(l), httplimit.WithKeyFunc(func(*http.Request) (string, error) { return "k", nil }))
			if err != nil {
				t.Fatal(err)
			}
			rec := httptest.NewRecorder()
			mw.Handler(http.NotFoundHandler()).ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/", nil))
			if secs, err := strconv.Atoi(rec.Header().Get("Retry-After")); rec.Code != 429 || err != nil || secs != 60 {
				t.Errorf("%d, Retry-After %q, want 429 and 60", rec.Code, rec.Header().Get("Retry-After"))
			}
			g, err := c.Group(p)
			if err != nil {
				t.Fatal(err)
			}
			gd, err := g.DecideGroup(context.Background(), nil, engine.GroupRequest{Refs: []engine.Ref{{Policy: 0, Key: "k"}}, N: 1})
			if err != nil || gd.Allowed || gd.Limits[0].RetryAfter != p.Window {
				t.Errorf("group decision %+v %v, want a refusal with RetryAfter %v", gd, err, p.Window)
			}
		})
	}
}

// TestBogusGroupAnswer: a group answer is all or nothing the stricter
// way. Refused overall with every limit claiming to allow, it is a
// refusal by every limit, each retrying after its window (never 0 s);
// allowed overall with a refusing limit, it is a refusal.
func TestBogusGroupAnswer(t *testing.T) {
	p1 := engine.Policy{Name: "a", Limit: 3, Window: time.Minute}
	p2 := engine.Policy{Name: "b", Limit: 3, Window: time.Hour}
	lim := func(allowed bool) string {
		return fmt.Sprintf(`{"allowed":%t,"limit":3,"remaining":1,"retry_after_ns":0,"at":5}`, allowed)
	}
	for _, c := range []struct {
		name, body string
	}{
		{"refused, no refusing limit", `{"allowed":false,"binding":0,"limits":[` + lim(true) + `,` + lim(true) + `]}`},
		{"allowed, a refusing limit", `{"allowed":true,"binding":0,"limits":[` + lim(true) + `,` + lim(false) + `]}`},
	} {
		t.Run(c.name, func(t *testing.T) {
			cl := dial(t, badServer(t, 1<<30, c.body))
			defer cl.Close()
			g, err := cl.Group(p1, p2)
			if err != nil {
				t.Fatal(err)
			}
			gd, err := g.DecideGroup(context.Background(), nil, engine.GroupRequest{Refs: []engine.Ref{{Policy: 0, Key: "k"}, {Policy: 1, Key: "k"}}, N: 1})
			if err != nil {
				t.Fatal(err)
			}
			b := gd.Limits[gd.Binding]
			if gd.Allowed || b.Allowed || b.RetryAfter <= 0 {
				t.Errorf("%+v, want a refusal whose binding limit retries after more than 0", gd)
			}
		})
	}
}
