package httplimit_test

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"time"

	"github.com/slidegate/slidegate/engine"
	"github.com/slidegate/slidegate/httplimit"
)

// 5 requests per client in any 60 s, keyed by an API key, with the headers of every response. A manual clock makes the
// output reproducible; leave WithClock out in real code.
func Example() {
	clk := engine.NewManualClock()
	lim, err := engine.New(engine.Policy{Name: "free", Limit: 5, Window: time.Minute}, engine.WithClock(clk))
	if err != nil {
		panic(err)
	}
	defer lim.Close()
	limit, err := httplimit.Limit(
		httplimit.WithBackend(lim),
		httplimit.WithKeyFunc(httplimit.HeaderKey("X-API-Key")),
	)
	if err != nil {
		panic(err)
	}
	srv := httptest.NewServer(limit(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, "hello")
	})))
	defer srv.Close()

	for _, at := range []time.Duration{0, 10, 20, 30, 40, 50, 60} {
		clk.Set(at * time.Second)
		req, _ := http.NewRequest("GET", srv.URL, nil)
		req.Header.Set("X-API-Key", "alice")
		resp, err := srv.Client().Do(req)
		if err != nil {
			panic(err)
		}
		resp.Body.Close()
		fmt.Printf("t=%2ds %d RateLimit: %s Remaining: %s Retry-After: %q\n", at, resp.StatusCode,
			resp.Header.Get("RateLimit"), resp.Header.Get("X-RateLimit-Remaining"), resp.Header.Get("Retry-After"))
	}
	// Output:
	// t= 0s 200 RateLimit: "free";r=4;t=60 Remaining: 4 Retry-After: ""
	// t=10s 200 RateLimit: "free";r=3;t=50 Remaining: 3 Retry-After: ""
	// t=20s 200 RateLimit: "free";r=2;t=40 Remaining: 2 Retry-After: ""
	// t=30s 200 RateLimit: "free";r=1;t=30 Remaining: 1 Retry-After: ""
	// t=40s 200 RateLimit: "free";r=0;t=20 Remaining: 0 Retry-After: ""
	// t=50s 429 RateLimit: "free";r=0;t=10 Remaining: 0 Retry-After: "10"
	// t=60s 200 RateLimit: "free";r=0;t=10 Remaining: 0 Retry-After: ""
}

// A client IP key behind a trusted proxy: forwarding headers are believed
// only from the proxy's range, and IPv6 clients share their /64.
func ExampleClientIP() {
	ip := httplimit.ClientIP{TrustedProxies: []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")}}
	for _, c := range []struct{ remote, xff string }{
		{"203.0.113.7:5000", "198.51.100.1"},  // not the proxy: header ignored
		{"10.0.0.2:5000", "198.51.100.1"},     // the proxy: header believed
		{"10.0.0.2:5000", "2001:db8:1:2::99"}, // IPv6 client: its /64
	} {
		r, _ := http.NewRequest("GET", "http://example.com/", nil)
		r.RemoteAddr = c.remote
		r.Header.Set("X-Forwarded-For", c.xff)
		key, _ := ip.Key(r)
		fmt.Println(key)
	}
	// Output:
	// 203.0.113.7
	// 198.51.100.1
	// 2001:db8:1:2::/64
}

// Per-second plus per-hour on one API key, in one tier decided all or
// nothing: the request refused by per_second at t=0 is not counted by
// per_hour, so the client still gets its third request of the hour at
// t=2s. The headers report the binding limit.
func ExampleWithLimits() {
	clk := engine.NewManualClock()
	g, err := engine.NewGroup([]engine.Policy{
		{Name: "per_second", Limit: 2, Window: time.Second},
		{Name: "per_hour", Limit: 3, Window: time.Hour},
	}, engine.WithClock(clk))
	if err != nil {
		panic(err)
	}
	defer g.Close()
	key := httplimit.HeaderKey("X-API-Key")
	limit, err := httplimit.Limit(httplimit.WithLimits("api", g,
		httplimit.GroupLimit{Policy: "per_second", Key: key},
		httplimit.GroupLimit{Policy: "per_hour", Key: key},
	))
	if err != nil {
		panic(err)
	}
	srv := httptest.NewServer(limit(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, "hello")
	})))
	defer srv.Close()

	for _, at := range []time.Duration{0, 0, 0, 2, 3} {
		clk.Set(at * time.Second)
		req, _ := http.NewRequest("GET", srv.URL, nil)
		req.Header.Set("X-API-Key", "alice")
		resp, err := srv.Client().Do(req)
		if err != nil {
			panic(err)
		}
		resp.Body.Close()
		fmt.Printf("t=%ds %d RateLimit: %s Retry-After: %q\n", at, resp.StatusCode,
			resp.Header.Get("RateLimit"), resp.Header.Get("Retry-After"))
	}
	// Output:
	// t=0s 200 RateLimit: "per_second";r=1;t=1 Retry-After: ""
	// t=0s 200 RateLimit: "per_second";r=0;t=1 Retry-After: ""
	// t=0s 429 RateLimit: "per_second";r=0;t=1 Retry-After: "1"
	// t=2s 200 RateLimit: "per_hour";r=0;t=3598 Retry-After: ""
	// t=3s 429 RateLimit: "per_hour";r=0;t=3597 Retry-After: "3597"
}
