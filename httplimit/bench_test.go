package httplimit_test

import (
	"net/http"
	"strconv"
	"testing"
	"time"

	"github.com/slidegate/slidegate/engine"
	"github.com/slidegate/slidegate/httplimit"
)

// benchWriter is a minimal ResponseWriter, reset per request, so that the
// benchmark measures the middleware rather than a recorder.
type benchWriter struct {
	h      http.Header
	status int
}

func (w *benchWriter) Header() http.Header         { return w.h }
func (w *benchWriter) Write(b []byte) (int, error) { return len(b), nil }
func (w *benchWriter) WriteHeader(s int)           { w.status = s }

var benchHandler = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
	w.WriteHeader(http.StatusOK)
	_, _ = w.Write([]byte("ok"))
})

// BenchmarkMiddleware measures, in one run, the same handler bare and
// behind the middleware, so that the difference is the middleware's cost:
// key from a header (no allocation), 4,096 clients round-robin, all
// allowed (a limit no client reaches), every header family on. The only
// allocation the middleware makes is the block of header values.
//
//	go test -run '^$' -bench Middleware -benchmem ./httplimit
func BenchmarkMiddleware(b *testing.B) {
	const keys = 4096
	reqs := make([]*http.Request, keys)
	for i := range reqs {
		r, _ := http.NewRequest("GET", "http://example.com/v1/things", nil)
		r.Header.Set("X-API-Key", "client-"+strconv.Itoa(i))
		r.RemoteAddr = "192.0." + strconv.Itoa(i>>8) + "." + strconv.Itoa(i&255) + ":1234"
		reqs[i] = r
	}
	runStatus := func(b *testing.B, h http.Handler, status int) {
		w := &benchWriter{h: make(http.Header, 8)}
		b.ReportAllocs()
		i := 0
		for b.Loop() {
			clear(w.h)
			h.ServeHTTP(w, reqs[i&(keys-1)])
			if w.status != status {
				b.Fatalf("status %d", w.status)
			}
			i++
		}
	}
	run := func(b *testing.B, h http.Handler) { runStatus(b, h, http.StatusOK) }
	b.Run("bare", func(b *testing.B) { run(b, benchHandler) })
	// The refusal path: what an abusive client costs per request (429,
	// headers, problem+json body).
	b.Run("refused", func(b *testing.B) {
		lim, err := engine.New(engine.Policy{Name: "free", Limit: 1, Window: time.Hour})
		if err != nil {
			b.Fatal(err)
		}
		defer lim.Close()
		for _, r := range reqs {
			lim.Allow(r.Header.Get("X-API-Key"))
		}
		m, err := httplimit.New(httplimit.WithBackend(lim), httplimit.WithKeyFunc(httplimit.HeaderKey("X-API-Key")))
		if err != nil {
			b.Fatal(err)
		}
		runStatus(b, m.Handler(benchHandler), http.StatusTooManyRequests)
	})
	newLimiter := func(b *testing.B) *engine.Limiter {
		// A 10 ms window keeps every client's ring at a few entries however
		// long the benchmark runs (no ring growth in the profile); 4,096
		// clients round-robin at a few million requests per second send
		// about 10 each per window, far below the limit of 100, so every
		// request is allowed.
		lim, err := engine.New(engine.Policy{Name: "free", Limit: 100, Window: 10 * time.Millisecond})
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { lim.Close() })
		return lim
	}
	// The engine's share: the same decisions without HTTP.
	b.Run("engine-only", func(b *testing.B) {
		lim := newLimiter(b)
		keys := make([]string, len(reqs))
		for i, r := range reqs {
			keys[i] = r.Header.Get("X-API-Key")
		}
		b.ReportAllocs()
		i := 0
		for b.Loop() {
			if !lim.Allow(keys[i&(len(keys)-1)]).Allowed {
				b.Fatal("refused")
			}
			i++
		}
	})
	for _, tc := range []struct {
		name string
		opts []httplimit.Option
	}{
		{"limited", []httplimit.Option{httplimit.WithKeyFunc(httplimit.HeaderKey("X-API-Key"))}},
		{"limited-noheaders", []httplimit.Option{httplimit.WithKeyFunc(httplimit.HeaderKey("X-API-Key")), httplimit.WithHeaders(0)}},
		{"limited-ip", []httplimit.Option{httplimit.WithKeyFunc(func(r *http.Request) (string, error) {
			return httplimit.ClientIP{}.Key(r)
		})}},
	} {
		b.Run(tc.name, func(b *testing.B) {
			lim := newLimiter(b)
			m, err := httplimit.New(append([]httplimit.Option{httplimit.WithBackend(lim)}, tc.opts...)...)
			if err != nil {
				b.Fatal(err)
			}
			run(b, m.Handler(benchHandler))
		})
	}
	// Two limits per request: one multi-limit tier (all or nothing), and
	// the two middlewares stacked that it replaces (which over-count; here
	// nothing is refused, so both allow every request).
	two := []engine.Policy{
		{Name: "short", Limit: 100, Window: 10 * time.Millisecond},
		{Name: "long", Limit: 1000, Window: 100 * time.Millisecond},
	}
	key := httplimit.HeaderKey("X-API-Key")
	b.Run("limits-2", func(b *testing.B) {
		g, err := engine.NewGroup(two)
		if err != nil {
			b.Fatal(err)
		}
		defer g.Close()
		m, err := httplimit.New(httplimit.WithKeyFunc(key), httplimit.WithLimits("api", g,
			httplimit.GroupLimit{Policy: "short"}, httplimit.GroupLimit{Policy: "long"}))
		if err != nil {
			b.Fatal(err)
		}
		run(b, m.Handler(benchHandler))
	})
	b.Run("stacked-2", func(b *testing.B) {
		h := http.Handler(benchHandler)
		for _, p := range two {
			lim, err := engine.New(p)
			if err != nil {
				b.Fatal(err)
			}
			defer lim.Close()
			m, err := httplimit.New(httplimit.WithBackend(lim), httplimit.WithKeyFunc(key))
			if err != nil {
				b.Fatal(err)
			}
			h = m.Handler(h)
		}
		run(b, h)
	})
}

// BenchmarkHeaderWriter is the header-writing share alone: five headers
// of an allowed decision, into a reused header map.
func BenchmarkHeaderWriter(b *testing.B) {
	lim, err := engine.New(engine.Policy{Name: "free", Limit: 100, Window: time.Minute})
	if err != nil {
		b.Fatal(err)
	}
	defer lim.Close()
	hw, err := httplimit.NewHeaderWriter(lim, httplimit.HeadersAll)
	if err != nil {
		b.Fatal(err)
	}
	d := lim.Allow("k")
	h := make(http.Header, 8)
	b.ReportAllocs()
	for b.Loop() {
		clear(h)
		hw.Write(h, d)
	}
}
