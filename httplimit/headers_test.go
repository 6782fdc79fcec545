package httplimit_test

import (
	"math/rand/v2"
	"net/http"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/slidegate/slidegate/engine"
	"github.com/slidegate/slidegate/httplimit"
	"github.com/slidegate/slidegate/internal/reference"
)

// fixedWall is a backend whose wall-clock mapping is pinned, so that
// X-RateLimit-Reset can be checked to the second, boundaries included.
type fixedWall struct {
	*engine.Limiter
	epoch time.Time
}

func (f fixedWall) WallTime(at int64) time.Time { return f.epoch.Add(time.Duration(at)) }

var wallEpoch = time.Unix(1_700_000_000, 0)

func ceilDiv(ns int64) int64 { return (ns + int64(time.Second) - 1) / int64(time.Second) }

// TestHeadersExact drives the middleware through a real listener with a
// manual clock and checks every header of every response against the
// reference log model, on a policy of 5 per 60 s. The rows hit the
// boundaries: a refusal whose exact Retry-After is a whole number of
// seconds (and one nanosecond either side), the request exactly W after the
// oldest entry (allowed: that entry has expired), and equal instants.
func TestHeadersExact(t *testing.T) {
	clk := engine.NewManualClock()
	lim, err := engine.New(engine.Policy{Name: "free", Limit: 5, Window: time.Minute}, engine.WithClock(clk))
	if err != nil {
		t.Fatal(err)
	}
	defer lim.Close()
	b := fixedWall{lim, wallEpoch}
	srv := newServer(t, b, httplimit.WithKeyFunc(httplimit.HeaderKey("X-API-Key")))

	model := reference.NewLog(5, int64(time.Minute))
	const s = time.Second
	steps := []struct {
		at   time.Duration
		note string
		// Literal expectations for the rows that pin the rounding; ""
		// means "only compare with the model".
		retryAfter, rateLimit, xReset string
	}{
		{0, "first request: window of 60 s from 0", "", `"free";r=4;t=60`, "1700000060"},
		{1 * s, "", "", `"free";r=3;t=59`, "1700000060"},
		{2*s + 500*time.Millisecond, "reset rounds 57.5 s up", "", `"free";r=2;t=58`, "1700000060"},
		{3 * s, "", "", "", ""},
		{3 * s, "equal instant, fifth accept", "", `"free";r=0;t=57`, "1700000060"},
		{10 * s, "refused: retry exactly 50 s, a whole number", "50", `"free";r=0;t=50`, "1700000060"},
		{10*s + 1, "one ns later: 49.999999999 s rounds up to 50", "50", `"free";r=0;t=50`, "1700000060"},
		{10*s - 1, "clock back 2 ns: decided at the refusal's 10 s + 1 ns, 49.999999999 s rounds up to 50", "50", `"free";r=0;t=50`, "1700000060"},
		{20*s + 300*time.Millisecond, "refused: 39.7 s rounds up to 40", "40", `"free";r=0;t=40`, "1700000060"},
		{60*s - 1, "one ns before the oldest entry expires: refused, 1 ns rounds up to 1 s", "1", `"free";r=0;t=1`, "1700000060"},
		{60 * s, "exactly W after the oldest entry: it has expired, allowed", "", `"free";r=0;t=1`, "1700000061"},
		{60 * s, "equal instant: full again, next expiry at 61 s", "1", `"free";r=0;t=1`, "1700000061"},
		{61 * s, "", "", `"free";r=0;t=2`, "1700000063"},
		{62*s + 500*time.Millisecond, "entry at 2.5 s expires exactly now", "", "", ""},
		{200 * s, "long idle: everything expired", "", `"free";r=4;t=60`, "1700000260"},
	}
	last := int64(0)
	for i, st := range steps {
		clk.Set(st.at)
		req, _ := http.NewRequest("GET", srv.URL+"/x", nil)
		req.Header.Set("X-API-Key", "client-1")
		resp, err := srv.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()

		// A key's time never goes back past its last decision, accepted or
		// refused, when the instants come from a clock that can be set
		// back (engine.Decision.At).
		at := max(int64(st.at), last)
		want := model.Decide("client-1", 1, at)
		last = at
		h := resp.Header
		ctx := func() string { return "step " + strconv.Itoa(i) + " at " + st.at.String() + " (" + st.note + ")" }

		wantStatus := http.StatusOK
		if !want.Allowed {
			wantStatus = http.StatusTooManyRequests
		}
		if resp.StatusCode != wantStatus {
			t.Errorf("%s: status %d, model says %d", ctx(), resp.StatusCode, wantStatus)
		}
		check := func(name, got, want string) {
			t.Helper()
			if got != want {
				t.Errorf("%s: %s = %q, want %q", ctx(), name, got, want)
			}
		}
		check("RateLimit-Policy", h.Get("RateLimit-Policy"), `"free";q=5;w=60`)
		check("RateLimit", h.Get("RateLimit"), `"free";r=`+strconv.Itoa(want.Remaining)+`;t=`+strconv.FormatInt(ceilDiv(want.Reset), 10))
		check("X-RateLimit-Limit", h.Get("X-RateLimit-Limit"), "5")
		check("X-RateLimit-Remaining", h.Get("X-RateLimit-Remaining"), strconv.Itoa(want.Remaining))
		check("X-RateLimit-Reset", h.Get("X-RateLimit-Reset"), strconv.FormatInt(1_700_000_000+ceilDiv(at+want.Reset), 10))
		if want.Allowed {
			check("Retry-After", h.Get("Retry-After"), "")
		} else {
			check("Retry-After", h.Get("Retry-After"), strconv.FormatInt(ceilDiv(want.RetryAfter), 10))
		}
		if st.retryAfter != "" {
			check("Retry-After (literal)", h.Get("Retry-After"), st.retryAfter)
		}
		if st.rateLimit != "" {
			check("RateLimit (literal)", h.Get("RateLimit"), st.rateLimit)
		}
		if st.xReset != "" {
			check("X-RateLimit-Reset (literal)", h.Get("X-RateLimit-Reset"), st.xReset)
		}
	}
}

// TestResetUsesLimiterWallTime checks X-RateLimit-Reset against the
// engine's own wall-clock mapping (no pinned epoch).
func TestResetUsesLimiterWallTime(t *testing.T) {
	clk := engine.NewManualClock()
	clk.Set(5*time.Second + 250*time.Millisecond)
	lim, err := engine.New(engine.Policy{Name: "p", Limit: 2, Window: 10 * time.Second}, engine.WithClock(clk))
	if err != nil {
		t.Fatal(err)
	}
	defer lim.Close()
	hw, err := httplimit.NewHeaderWriter(lim, httplimit.HeadersAll)
	if err != nil {
		t.Fatal(err)
	}
	d := lim.Allow("k")
	h := http.Header{}
	hw.Write(h, d)
	wall := lim.WallTime(d.At + int64(d.Reset))
	want := wall.Unix()
	if wall.Nanosecond() > 0 {
		want++
	}
	if got := h.Get("X-RateLimit-Reset"); got != strconv.FormatInt(want, 10) {
		t.Fatalf("X-RateLimit-Reset = %s, want %d (wall %v)", got, want, wall)
	}
}

// TestHeaderFamiliesSwitch checks that each family can be turned off on
// its own and that none is written when all are.
func TestHeaderFamiliesSwitch(t *testing.T) {
	clk := engine.NewManualClock()
	lim, err := engine.New(engine.Policy{Name: "p", Limit: 1, Window: time.Minute}, engine.WithClock(clk))
	if err != nil {
		t.Fatal(err)
	}
	defer lim.Close()
	families := map[string][]string{
		"draft": {"RateLimit-Policy", "RateLimit"},
		"x":     {"X-RateLimit-Limit", "X-RateLimit-Remaining", "X-RateLimit-Reset"},
		"retry": {"Retry-After"},
	}
	bits := map[string]httplimit.Headers{"draft": httplimit.HeaderDraft, "x": httplimit.HeaderX, "retry": httplimit.HeaderRetryAfter}
	for _, which := range []httplimit.Headers{0, httplimit.HeaderDraft, httplimit.HeaderX, httplimit.HeaderRetryAfter, httplimit.HeadersAll, httplimit.HeaderDraft | httplimit.HeaderRetryAfter} {
		hw, err := httplimit.NewHeaderWriter(lim, which)
		if err != nil {
			t.Fatal(err)
		}
		d := lim.Allow("k-" + strconv.Itoa(int(which)))
		d2 := lim.Allow("k-" + strconv.Itoa(int(which))) // refused
		h := http.Header{}
		hw.Write(h, d)
		hw.Write(h, d2)
		for fam, names := range families {
			on := which&bits[fam] != 0
			for _, n := range names {
				if got := h.Get(n) != ""; got != on {
					t.Errorf("headers %03b: %s present=%v, want %v", which, n, got, on)
				}
			}
		}
	}
}

func TestPolicyNameEscapedAndChecked(t *testing.T) {
	for _, tc := range []struct {
		name    string
		wantErr bool
		policy  string
	}{
		{`a"b\c`, false, `"a\"b\\c";q=3;w=2`},
		{"", true, ""},
		{"tab\tname", true, ""},
		{string(make([]byte, 65)), true, ""},
	} {
		lim, err := engine.New(engine.Policy{Name: tc.name, Limit: 3, Window: 1500 * time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		hw, err := httplimit.NewHeaderWriter(lim, httplimit.HeadersAll)
		lim.Close()
		if (err != nil) != tc.wantErr {
			t.Errorf("name %q: err = %v, want error %v", tc.name, err, tc.wantErr)
			continue
		}
		if err != nil {
			continue
		}
		h := http.Header{}
		hw.Write(h, lim.Allow("k"))
		if got := h.Get("RateLimit-Policy"); got != tc.policy {
			t.Errorf("name %q: RateLimit-Policy = %q, want %q (window 1.5 s rounds up to w=2)", tc.name, got, tc.policy)
		}
	}
}

// TestHeaderCachesNeverStale writes many random decisions through one
// writer, so that its caches collide and evict constantly, and checks each
// value against a fresh rendering, concurrently (run with -race).
func TestHeaderCachesNeverStale(t *testing.T) {
	lim, err := engine.New(engine.Policy{Name: "p", Limit: 5000, Window: 2 * time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	defer lim.Close()
	b := fixedWall{lim, wallEpoch}
	hw, err := httplimit.NewHeaderWriter(b, httplimit.HeadersAll)
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(g), 7))
			for range 20000 {
				d := engine.Decision{
					Allowed:    rng.IntN(2) == 0,
					Limit:      5000,
					Remaining:  rng.IntN(5001),
					Reset:      time.Duration(rng.Int64N(int64(2 * time.Hour))),
					RetryAfter: time.Duration(rng.Int64N(int64(2 * time.Hour))),
					At:         rng.Int64N(int64(1000 * time.Hour)),
				}
				h := http.Header{}
				hw.Write(h, d)
				want := map[string]string{
					"RateLimit":             `"p";r=` + strconv.Itoa(d.Remaining) + ";t=" + strconv.FormatInt(ceilDiv(int64(d.Reset)), 10),
					"X-RateLimit-Remaining": strconv.Itoa(d.Remaining),
					"X-RateLimit-Reset":     strconv.FormatInt(1_700_000_000+ceilDiv(d.At+int64(d.Reset)), 10),
				}
				if !d.Allowed {
					want["Retry-After"] = strconv.FormatInt(ceilDiv(int64(d.RetryAfter)), 10)
				}
				for k, v := range want {
					if got := h.Get(k); got != v {
						t.Errorf("%+v: %s = %q, want %q", d, k, got, v)
						return
					}
				}
			}
		}()
	}
	wg.Wait()
}
