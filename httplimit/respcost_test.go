package httplimit_test

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"strconv"
	"testing"
	"time"

	"github.com/slidegate/slidegate/engine"
	"github.com/slidegate/slidegate/httplimit"
	"github.com/slidegate/slidegate/internal/reference"
)

// TestResponseCostMatchesReference: random requests whose handlers take
// time and then report their whole cost in a header, in a trailer, not at
// all, malformed, or below the arrival cost. Every decision the middleware
// makes equals the reference model's, where the model admits at arrival on
// the arrival cost and, when the handler returns, reserves the rest (at
// most the limit) at the earliest instant it fits.
func TestResponseCostMatchesReference(t *testing.T) {
	for seed := range uint64(20) {
		t.Run(strconv.FormatUint(seed, 10), func(t *testing.T) {
			const limit, window = 10, int64(10 * time.Second)
			r := rand.New(rand.NewPCG(seed, 7))
			clk := engine.NewManualClock()
			clk.Set(time.Second)
			lim, err := engine.New(engine.Policy{Name: "tokens", Limit: limit, Window: time.Duration(window)}, engine.WithClock(clk))
			if err != nil {
				t.Fatal(err)
			}
			defer lim.Close()
			model := reference.NewReserveLog(limit, window)
			model.MaxAhead = int64(engine.MaxReserveAhead)
			var last engine.Decision
			mw, err := httplimit.New(httplimit.WithBackend(lim),
				httplimit.WithKeyFunc(httplimit.HeaderKey("X-Key")),
				httplimit.WithCostFunc(func(r *http.Request) (int, error) { return strconv.Atoi(r.Header.Get("X-Arrival-Cost")) }),
				httplimit.WithResponseCost("X-Tokens"),
				httplimit.WithObserver(func(ev httplimit.Event) { last = ev.Decision }))
			if err != nil {
				t.Fatal(err)
			}
			type plan struct {
				took  time.Duration
				how   int // 0 header, 1 trailer, 2 none, 3 malformed
				total int
			}
			var p plan
			h := mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
				clk.Advance(p.took)
				switch p.how {
				case 0:
					w.Header().Set("X-Tokens", strconv.Itoa(p.total))
					w.WriteHeader(http.StatusOK)
				case 1:
					w.Header().Set("Trailer", "X-Tokens")
					w.WriteHeader(http.StatusOK)
					_, _ = w.Write([]byte("streamed"))
					w.Header().Set("X-Tokens", strconv.Itoa(p.total))
				case 3:
					w.Header().Set("X-Tokens", "lots")
				}
			}))
			for step := range 400 {
				key := fmt.Sprintf("k%d", r.IntN(3))
				arrival := 1 + r.IntN(3)
				p = plan{took: time.Duration(r.Int64N(int64(2 * time.Second))), how: r.IntN(4), total: r.IntN(3 * limit)}
				req := httptest.NewRequest(http.MethodPost, "/complete", nil)
				req.Header.Set("X-Key", key)
				req.Header.Set("X-Arrival-Cost", strconv.Itoa(arrival))
				rec := httptest.NewRecorder()
				t1 := clk.Now()
				h.ServeHTTP(rec, req)
				want, _ := model.Allow(key, arrival, t1)
				if last.Allowed != want.Allowed || last.Remaining != want.Remaining || int64(last.RetryAfter) != want.RetryAfter {
					t.Fatalf("step %d (%s, cost %d): got allowed=%v remaining=%d retry=%v, model %+v", step, key, arrival,
						last.Allowed, last.Remaining, last.RetryAfter, want)
				}
				if want.Allowed && (p.how == 0 || p.how == 1) && p.total > arrival {
					rest := min(p.total-arrival, limit)
					if _, ok, _ := model.Reserve(key, rest, t1+int64(p.took), 1<<62); !ok {
						t.Fatalf("step %d: the model could not reserve %d", step, rest)
					}
				}
				clk.Advance(time.Duration(r.Int64N(int64(3 * time.Second))))
			}
		})
	}
}

// TestResponseCostOptions: WithResponseCost needs a backend that can
// reserve on the sliding log, and tiers of one backend.
func TestResponseCostOptions(t *testing.T) {
	counter, err := engine.New(engine.Policy{Name: "c", Limit: 5, Window: time.Second, Algorithm: engine.SlidingCounter})
	if err != nil {
		t.Fatal(err)
	}
	defer counter.Close()
	if _, err := httplimit.New(httplimit.WithBackend(counter), httplimit.WithResponseCost("X-Tokens")); !errors.Is(err, httplimit.ErrInvalidOption) {
		t.Errorf("the counter: %v, want ErrInvalidOption", err)
	}
	if _, err := httplimit.New(httplimit.WithResponseCost("")); !errors.Is(err, httplimit.ErrInvalidOption) {
		t.Errorf("an empty header: %v, want ErrInvalidOption", err)
	}
}
