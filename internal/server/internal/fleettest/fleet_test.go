// Package fleettest proves outgoing pacing against a strict server: a real
// slidegate server (server.New on a loopback listener) enforces L per W
// as the "remote API", and several client processes, each with many
// goroutines, pace their calls to it through one Redis with
// httplimit.Transport (docs/outgoing.md).
package fleettest

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"
	"golang.org/x/time/rate"

	"github.com/slidegate/slidegate/engine"
	"github.com/slidegate/slidegate/httplimit"
	"github.com/slidegate/slidegate/internal/reference"
	"github.com/slidegate/slidegate/internal/server"
	"github.com/slidegate/slidegate/internal/server/config"
	"github.com/slidegate/slidegate/redisstore"
)

const (
	envChild = "SLIDEGATE_FLEETTEST_CHILD" // mode: "margin=<ns>" or "bucket"
	envSpec  = "SLIDEGATE_FLEETTEST_SPEC"  // redis URL, server URL, key prefix
	envRedis = "SLIDEGATE_REDIS_ADDR"

	limit      = 10
	window     = 300 * time.Millisecond
	procs      = 3
	goroutines = 8
	requests   = 6 // per goroutine
)

// record is what a child reports for one request: its slot on Redis's
// clock (µs; 0 for x/time/rate), when it was decided, when it was sent and
// answered (Unix µs: one machine, one clock), and the server's status.
type record struct {
	made, slot, sent, recv int64
	status                 int
}

// TestFleetAgainstStrictServer runs the three clients of docs/outgoing.md
// against one strict server: the transport with a margin above the
// measured delay spread (every slot replays exactly through the model at
// L per W + margin, the server refuses nothing, the rate is L per
// W + margin), with no margin, and x/time/rate's Wait (each process at its
// share of L per W: it cannot pace with the others). The last two are
// reported.
func TestFleetAgainstStrictServer(t *testing.T) {
	if os.Getenv(envChild) != "" {
		child(t)
		return
	}
	addr := os.Getenv(envRedis)
	if addr == "" {
		t.Skip(envRedis + " is not set: run make test (scripts/redis-env.sh starts Redis)")
	}
	margin := 100 * time.Millisecond // httplimit's default margin
	for attempt := 0; ; attempt++ {
		recs, refused := run(t, addr, fmt.Sprint("margin=", int64(margin)))
		spread := delaySpread(recs)
		checkSlots(t, recs, margin)
		got := achieved(recs)
		want := float64(limit) / (window + margin).Seconds()
		t.Logf("transport, margin %v: delay spread at most %v; server refused %d of %d; rate %.2f/s, %.3f of L per (W + margin)",
			margin, spread, refused, len(recs), got, got/want)
		if got > want*1.0001 {
			t.Errorf("the slots came faster (%.2f/s) than L per W + margin allows (%.2f/s)", got, want)
		}
		if got < want*0.95 {
			t.Logf("the rate is %.1f %% below L per (W + margin): the callers did not keep the queue full", 100*(1-got/want))
		}
		if spread < margin {
			if refused != 0 {
				t.Errorf("the server refused %d requests although the delay spread %v stayed below the margin %v", refused, spread, margin)
			}
			break
		}
		if attempt == 2 {
			t.Logf("the delay spread stayed above the margin on this machine (%v ≥ %v): refusals are possible and not checked", spread, margin)
			break
		}
		margin = 2 * spread // the machine is loaded: a margin above what was measured
	}
	recs, refused := run(t, addr, "margin=0")
	checkSlots(t, recs, 0)
	t.Logf("transport, no margin: delay spread at most %v; server refused %d of %d", delaySpread(recs), refused, len(recs))
	recs, refused = run(t, addr, "bucket")
	t.Logf("x/time/rate Wait, %d processes at L/%d per W each: server refused %d of %d", procs, procs, refused, len(recs))
}

// run starts a strict server and procs children in mode, and returns
// their records sorted by decision and how many the server refused.
func run(t *testing.T, redisAddr, mode string) ([]record, int) {
	t.Helper()
	cfg, err := config.ParseConfig([]byte(fmt.Sprintf("policies:\n  - {name: api, limit: %d, window: %v}\n", limit, window)))
	if err != nil {
		t.Fatal(err)
	}
	cfg.Listen, cfg.Admin = "127.0.0.1:0", "off"
	srv, err := server.New(cfg, server.WithLogger(slog.New(slog.NewTextHandler(io.Discard, nil))))
	if err != nil {
		t.Fatal(err)
	}
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	defer srv.Shutdown(context.Background())
	prefix := fmt.Sprintf("fleettest:%d:%d:", os.Getpid(), time.Now().UnixNano())
	spec := strings.Join([]string{"redis://" + redisAddr, "http://" + srv.Addr() + "/v1/allow", prefix}, ",")
	var mu sync.Mutex
	var recs []record
	var wg sync.WaitGroup
	for range procs {
		cmd := exec.Command(os.Args[0], "-test.run=^TestFleetAgainstStrictServer$", "-test.count=1")
		cmd.Env = append(os.Environ(), envChild+"="+mode, envSpec+"="+spec)
		out, err := cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		cmd.Stderr = os.Stderr
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			sc := bufio.NewScanner(out)
			for sc.Scan() {
				f := strings.Fields(sc.Text())
				if len(f) != 6 || f[0] != "rec" {
					continue
				}
				var v [5]int64
				for i := range v {
					v[i], _ = strconv.ParseInt(f[i+1], 10, 64)
				}
				mu.Lock()
				recs = append(recs, record{made: v[0], slot: v[1], sent: v[2], recv: v[3], status: int(v[4])})
				mu.Unlock()
			}
			if err := cmd.Wait(); err != nil {
				t.Errorf("child: %v", err)
			}
		}()
	}
	wg.Wait()
	if len(recs) != procs*goroutines*requests {
		t.Fatalf("%s: %d records, want %d", mode, len(recs), procs*goroutines*requests)
	}
	slices.SortFunc(recs, func(a, b record) int {
		if a.made != b.made {
			return int(a.made - b.made)
		}
		return int(a.slot - b.slot)
	})
	refused := 0
	for _, r := range recs {
		if r.status == http.StatusTooManyRequests {
			refused++
		} else if r.status != http.StatusOK {
			t.Fatalf("%s: status %d from the server", mode, r.status)
		}
	}
	return recs, refused
}

// checkSlots replays the slots, in the order Redis decided them, through
// the reservation model at L per W + margin: each must be exactly the
// earliest instant the model gives.
func checkSlots(t *testing.T, recs []record, margin time.Duration) {
	t.Helper()
	m := reference.NewReserveLog(limit, int64((window+margin)/time.Microsecond))
	for i, r := range recs {
		if at, _, _ := m.Reserve("api", 1, r.made, 1<<62); at != r.slot {
			t.Fatalf("slot %d (decided at %d µs): %d µs, the model says %d", i, r.made, r.slot, at)
		}
	}
}

// achieved returns the rate of the slots while the queue was full: L over
// the median time from a slot to the L-th after it (the start and the end
// of a run, when fewer than L callers wait, do not move the median).
func achieved(recs []record) float64 {
	slots := make([]int64, len(recs))
	for i, r := range recs {
		slots[i] = r.slot
	}
	slices.Sort(slots)
	var gaps []int64
	for i := limit; i < len(slots); i++ {
		gaps = append(gaps, slots[i]-slots[i-limit])
	}
	slices.Sort(gaps)
	return float64(limit) / (float64(gaps[len(gaps)/2]) / 1e6)
}

// delaySpread bounds the spread of the requests' delays from their slot
// to their arrival at the server, which lies between sending and the
// answer: the most (answer − slot) less the least (sent − slot).
func delaySpread(recs []record) time.Duration {
	lo, hi := int64(1<<62), int64(-1<<62)
	for _, r := range recs {
		lo, hi = min(lo, r.sent-r.slot), max(hi, r.recv-r.slot)
	}
	return time.Duration(hi-lo) * time.Microsecond
}

// recKey carries a request's record in its context.
type recKey struct{}

// slotWaiter waits on Redis and notes the slot.
type slotWaiter struct{ l *redisstore.Limiter }

func (w slotWaiter) WaitN(ctx context.Context, key string, n int) error {
	r, err := w.l.WaitReserved(ctx, key, n)
	if err == nil {
		rec := ctx.Value(recKey{}).(*record)
		rec.made, rec.slot = r.Made()/1000, r.At()/1000
	}
	return err
}

// bucketWaiter is x/time/rate's Wait.
type bucketWaiter struct{ rl *rate.Limiter }

func (w bucketWaiter) WaitN(ctx context.Context, _ string, n int) error {
	err := w.rl.WaitN(ctx, n)
	if err == nil {
		rec := ctx.Value(recKey{}).(*record)
		rec.made = time.Now().UnixMicro()
		rec.slot = rec.made
	}
	return err
}

// timing notes when a request is sent and answered.
type timing struct{ base http.RoundTripper }

func (tr timing) RoundTrip(req *http.Request) (*http.Response, error) {
	rec := req.Context().Value(recKey{}).(*record)
	rec.sent = time.Now().UnixMicro()
	resp, err := tr.base.RoundTrip(req)
	rec.recv = time.Now().UnixMicro()
	return resp, err
}

// child is one client process: goroutines × requests calls to the server
// through a transport, each reported on stdout.
func child(t *testing.T) {
	spec := strings.Split(os.Getenv(envSpec), ",")
	mode := os.Getenv(envChild)
	p := engine.Policy{Name: "api", Limit: limit, Window: window}
	var w httplimit.Waiter
	if mode == "bucket" {
		share := max(1, limit/procs)
		w = bucketWaiter{rate.NewLimiter(rate.Every(window/time.Duration(share)), share)}
	} else {
		m, _ := strconv.ParseInt(strings.TrimPrefix(mode, "margin="), 10, 64)
		l, err := redisstore.New(spec[0], engine.Policy{Name: p.Name, Limit: p.Limit, Window: p.Window + time.Duration(m)},
			redisstore.WithKeyPrefix(spec[2]), redisstore.WithTimeout(5*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		defer l.Close()
		w = slotWaiter{l}
	}
	base := &http.Transport{MaxIdleConnsPerHost: goroutines}
	defer base.CloseIdleConnections()
	tr, err := httplimit.NewTransport(w, httplimit.WithBase(timing{base}))
	if err != nil {
		t.Fatal(err)
	}
	client := &http.Client{Transport: tr}
	var mu sync.Mutex
	var wg sync.WaitGroup
	for range goroutines {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range requests {
				rec := &record{}
				ctx := context.WithValue(context.Background(), recKey{}, rec)
				req, _ := http.NewRequestWithContext(ctx, http.MethodPost, spec[1], strings.NewReader(`{"key":"api"}`))
				req.Header.Set("Content-Type", "application/json")
				resp, err := client.Do(req)
				if err != nil {
					t.Errorf("request: %v", err)
					return
				}
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				mu.Lock()
				fmt.Printf("rec %d %d %d %d %d\n", rec.made, rec.slot, rec.sent, rec.recv, resp.StatusCode)
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
}

// TestMain checks that the servers, clients and waiters leave no goroutine
// behind.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }
