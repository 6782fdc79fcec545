package httplimit_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/time/rate"

	"github.com/slidegate/slidegate/engine"
	"github.com/slidegate/slidegate/httplimit"
)

// admittedKey carries, in a request's context, where the test's Waiter
// writes the instant the request was admitted at.
type admittedKey struct{}

// recWaiter is a Limiter that reports each admission's instant.
type recWaiter struct{ lim *engine.Limiter }

func (w recWaiter) WaitN(ctx context.Context, key string, n int) error {
	r, err := w.lim.WaitReserved(ctx, key, n)
	if err == nil {
		if p, ok := ctx.Value(admittedKey{}).(*time.Time); ok {
			*p = w.lim.WallTime(r.At())
		}
	}
	return err
}

// bucketWaiter paces with x/time/rate's token bucket at L per W (burst
// L), the usual choice, for comparison.
type bucketWaiter struct{ rl *rate.Limiter }

func (w bucketWaiter) WaitN(ctx context.Context, key string, n int) error {
	err := w.rl.WaitN(ctx, n)
	if p, ok := ctx.Value(admittedKey{}).(*time.Time); ok && err == nil {
		*p = time.Now()
	}
	return err
}

// strictServer is a remote API that admits at most limit requests per
// window, exactly, at the instants its own limiter decides them, and
// answers 429 otherwise. It records each request's decision instant by the
// X-Req header.
type strictServer struct {
	lim      *engine.Limiter
	mu       sync.Mutex
	arrived  map[int]time.Time
	refused  atomic.Int64
	accepted atomic.Int64
}

func newStrictServer(t *testing.T, p engine.Policy) (*strictServer, *testServer) {
	lim, err := engine.New(p)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { lim.Close() })
	s := &strictServer{lim: lim, arrived: map[int]time.Time{}}
	srv := startServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		d := s.lim.Allow("api")
		id, _ := strconv.Atoi(r.Header.Get("X-Req"))
		s.mu.Lock()
		s.arrived[id] = s.lim.WallTime(d.At)
		s.mu.Unlock()
		if !d.Allowed {
			s.refused.Add(1)
			w.WriteHeader(http.StatusTooManyRequests)
			return
		}
		s.accepted.Add(1)
	}))
	return s, srv
}

// pace sends requests requests from goroutines goroutines through a
// transport pacing at p plus margin, and returns each request's admission
// instant (by id) and the server.
func pace(t *testing.T, p engine.Policy, margin time.Duration, goroutines, requests int, bucket bool) (map[int]time.Time, *strictServer) {
	srv, ts := newStrictServer(t, p)
	paced := p
	paced.Window += margin
	lim, err := engine.New(paced)
	if err != nil {
		t.Fatal(err)
	}
	defer lim.Close()
	var w httplimit.Waiter = recWaiter{lim}
	if bucket {
		w = bucketWaiter{rate.NewLimiter(rate.Every(p.Window/time.Duration(p.Limit)), p.Limit)}
	}
	tr, err := httplimit.NewTransport(w)
	if err != nil {
		t.Fatal(err)
	}
	client := &http.Client{Transport: tr}
	defer client.CloseIdleConnections()
	admitted := make(map[int]time.Time)
	var mu sync.Mutex
	var next atomic.Int64
	var wg sync.WaitGroup
	for range goroutines {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				id := int(next.Add(1))
				if id > requests {
					return
				}
				var at time.Time
				ctx := context.WithValue(context.Background(), admittedKey{}, &at)
				req, _ := http.NewRequestWithContext(ctx, http.MethodGet, ts.URL, nil)
				req.Header.Set("X-Req", strconv.Itoa(id))
				resp, err := client.Do(req)
				if err != nil {
					t.Errorf("request %d: %v", id, err)
					return
				}
				resp.Body.Close()
				mu.Lock()
				admitted[id] = at
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	if st := tr.Stats(); st.Waited != int64(requests) || st.Remote429 != srv.refused.Load() {
		t.Errorf("stats %+v: want %d waited and %d 429s", st, requests, srv.refused.Load())
	}
	return admitted, srv
}

// maxInWindow returns the most instants of ts in any window (x − w, x].
func maxInWindow(ts []time.Time, w time.Duration) int {
	slices.SortFunc(ts, func(a, b time.Time) int { return a.Compare(b) })
	most, j := 0, 0
	for i := range ts {
		for ts[i].Sub(ts[j]) >= w {
			j++
		}
		most = max(most, i-j+1)
	}
	return most
}

// A transport paced at L per (W + margin) against a server enforcing L per
// W exactly: the admitted instants hold L per W + margin; the server's
// instants differ by each request's delay, and whenever that delay's
// spread stays below the margin the server refuses nothing (a window of
// the server holding L+1 would need L+1 admissions within W + spread).
func TestTransportPacesStrictServer(t *testing.T) {
	p := engine.Policy{Limit: 10, Window: 200 * time.Millisecond}
	const goroutines, requests = 16, 60
	for _, margin := range []time.Duration{httplimit.DefaultMargin, 0} {
		t.Run(fmt.Sprint("margin=", margin), func(t *testing.T) {
			admitted, srv := pace(t, p, margin, goroutines, requests, false)
			var ats []time.Time
			lo, hi := time.Duration(1<<62), time.Duration(-1<<62)
			for id, at := range admitted {
				ats = append(ats, at)
				d := srv.arrived[id].Sub(at)
				lo, hi = min(lo, d), max(hi, d)
			}
			if got := maxInWindow(ats, p.Window+margin); got > p.Limit {
				t.Fatalf("%d admissions in one window of %v; the limit is %d", got, p.Window+margin, p.Limit)
			}
			spread := hi - lo
			t.Logf("margin %v: delay from admission to the server %v..%v (spread %v), server refused %d of %d",
				margin, lo, hi, spread, srv.refused.Load(), requests)
			if margin > 0 && spread < margin && srv.refused.Load() != 0 {
				t.Fatalf("the server refused %d requests although the delay spread %v stayed below the margin %v", srv.refused.Load(), spread, margin)
			}
		})
	}
}

// The same load through x/time/rate's Wait at L per W: its burst lets
// about 2L through in a window, which the strict server refuses. Reported,
// not asserted.
func TestTransportBucketAgainstStrictServer(t *testing.T) {
	p := engine.Policy{Limit: 10, Window: 200 * time.Millisecond}
	admitted, srv := pace(t, p, 0, 16, 60, true)
	var ats []time.Time
	for _, at := range admitted {
		ats = append(ats, at)
	}
	t.Logf("x/time/rate at %d per %v: at most %d admissions in one window; server refused %d of %d",
		p.Limit, p.Window, maxInWindow(ats, p.Window), srv.refused.Load(), 60)
}

// The remote is the authority: a 429 with Retry-After, or a RateLimit
// header with no quota left, pauses the key until then.
func TestTransportObeysRemote(t *testing.T) {
	var mu sync.Mutex
	var arrivals []time.Time
	var n atomic.Int64
	ts := startServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		arrivals = append(arrivals, time.Now())
		mu.Unlock()
		switch n.Add(1) {
		case 1:
			w.Header().Set("Retry-After", "1")
			w.WriteHeader(http.StatusTooManyRequests)
		case 2:
			w.Header().Set("RateLimit", `"api";r=0;t=1`)
		}
	}))
	tr, err := httplimit.NewPacedTransport(engine.Policy{Limit: 100, Window: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer tr.Close()
	client := &http.Client{Transport: tr}
	defer client.CloseIdleConnections()
	for range 3 {
		resp, err := client.Get(ts.URL)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
	}
	if st := tr.Stats(); st.Paused != 2 || st.Remote429 != 1 || st.Waited != 3 {
		t.Fatalf("stats %+v: want 2 pauses, one 429, 3 requests", st)
	}
	for i := 1; i < len(arrivals); i++ {
		if gap := arrivals[i].Sub(arrivals[i-1]); gap < time.Second {
			t.Fatalf("request %d came %v after a response that asked for a second", i+1, gap)
		}
	}
}

// A request whose slot would come after its context's deadline fails at
// once, unsent, with nothing reserved; bad options are errors.
func TestTransportWaitErrors(t *testing.T) {
	var hits atomic.Int64
	ts := startServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { hits.Add(1) }))
	tr, err := httplimit.NewPacedTransport(engine.Policy{Limit: 1, Window: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	defer tr.Close()
	client := &http.Client{Transport: tr}
	defer client.CloseIdleConnections()
	resp, err := client.Get(ts.URL)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, ts.URL, nil)
	if _, err := client.Do(req); !errors.Is(err, engine.ErrWaitTooLong) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("a request an hour away with a minute's deadline: %v", err)
	}
	if st := tr.Stats(); hits.Load() != 1 || st.WaitErrs != 1 {
		t.Fatalf("server hits %d, stats %+v: want 1 hit and 1 wait error", hits.Load(), st)
	}
	if _, err := httplimit.NewTransport(nil); err == nil {
		t.Error("NewTransport(nil) succeeded")
	}
	if _, err := httplimit.NewPacedTransport(engine.Policy{Limit: 1, Window: time.Second}, httplimit.WithMargin(-1)); err == nil {
		t.Error("a negative margin was accepted")
	}
	if _, err := httplimit.NewPacedTransport(engine.Policy{Limit: 0, Window: time.Second}); err == nil {
		t.Error("an invalid policy was accepted")
	}
}

// What each header a remote sends asks for.
func TestRemotePause(t *testing.T) {
	now := time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)
	rows := []struct {
		status int
		h      map[string]string
		want   time.Duration
		ok     bool
	}{
		{429, map[string]string{"Retry-After": "7"}, 7 * time.Second, true},
		{503, map[string]string{"Retry-After": now.Add(90 * time.Second).Format(http.TimeFormat)}, 90 * time.Second, true},
		{200, map[string]string{"Retry-After": "7"}, 0, false},                        // only a refusal's Retry-After counts
		{429, map[string]string{}, httplimit.DefaultPause, true},                      // a bare 429
		{429, map[string]string{"Retry-After": "soon"}, httplimit.DefaultPause, true}, // unreadable
		{200, map[string]string{"RateLimit": `"api";r=0;t=5`}, 5 * time.Second, true},
		{200, map[string]string{"RateLimit": `"api";r=3;t=5`}, 0, false}, // quota left
		{200, map[string]string{"RateLimit": `limit=10, remaining=0, reset=4`}, 4 * time.Second, true},
		{200, map[string]string{"RateLimit-Remaining": "0", "RateLimit-Reset": "2"}, 2 * time.Second, true},
		{200, map[string]string{"X-RateLimit-Remaining": "0", "X-RateLimit-Reset": strconv.FormatInt(now.Add(time.Minute).Unix(), 10)}, time.Minute, true},
		{200, map[string]string{"X-RateLimit-Remaining": "0", "X-RateLimit-Reset": "-3"}, 0, false},
	}
	for i, r := range rows {
		resp := &http.Response{StatusCode: r.status, Header: http.Header{}}
		for k, v := range r.h {
			resp.Header.Set(k, v)
		}
		got, ok := httplimit.RemotePause(resp, now)
		if got != r.want || ok != r.ok {
			t.Errorf("row %d (%d %v): %v, %v; want %v, %v", i, r.status, r.h, got, ok, r.want, r.ok)
		}
	}
}
