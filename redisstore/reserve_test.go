package redisstore

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/slidegate/slidegate/engine"
	"github.com/slidegate/slidegate/internal/reference"
)

// Random traces of reservations, decisions and cancels on a caller clock,
// against the reservation model, standalone and on a cluster.
func TestReserveMatchesReference(t *testing.T) {
	for _, tc := range []struct{ name, url string }{{"standalone", standaloneURL(t)}, {"cluster", clusterURL(t)}} {
		t.Run(tc.name, func(t *testing.T) {
			for seed := range uint64(4) {
				r := rand.New(rand.NewPCG(seed, 31))
				limit := 1 + r.IntN(4)
				const wus = 1000
				clk := engine.NewManualClock()
				l := newTestLimiter(t, tc.url, engine.Policy{Name: fmt.Sprint("r", seed), Limit: limit, Window: wus * time.Microsecond},
					WithClock(clk), WithRefusalCache(0), WithTimeout(5*time.Second))
				m := reference.NewReserveLog(limit, wus)
				type resv struct {
					key string
					n   int
					r   *Reservation
				}
				var live []resv
				now := int64(1)
				ctx := context.Background()
				for step := range 400 {
					if r.IntN(8) == 0 {
						now = max(1, now-int64(r.IntN(wus/4)))
					} else {
						now += int64(r.IntN(wus / 5))
					}
					clk.Set(time.Duration(now) * time.Microsecond)
					key := fmt.Sprint("k", r.IntN(2))
					n := 1 + r.IntN(min(2, limit))
					switch op := r.IntN(10); {
					case op < 4:
						d, err := l.Decide(ctx, key, n)
						want, at := m.Allow(key, n, now)
						if err != nil || d.Allowed != want.Allowed || d.Remaining != want.Remaining ||
							d.RetryAfter != time.Duration(want.RetryAfter)*time.Microsecond || d.At != at*1000 {
							t.Fatalf("seed %d step %d: decide(%s, %d) at %d: %+v, %v; want %+v at %d; entries %v", seed, step, key, n, now, d, err, want, at, m.Entries(key))
						}
					case op < 8:
						res, err := l.ReserveN(ctx, key, n, -1)
						at, _, made := m.Reserve(key, n, now, 1<<50)
						if err != nil || res.At() != at*1000 || res.made != made {
							t.Fatalf("seed %d step %d: reserve(%s, %d) at %d: %+v, %v; want slot %d made %d; entries %v", seed, step, key, n, now, res, err, at, made, m.Entries(key))
						}
						live = append(live, resv{key, n, res})
					default:
						if len(live) == 0 {
							continue
						}
						i := r.IntN(len(live))
						c := live[i]
						live = slices.Delete(live, i, i+1)
						got, err := c.r.Cancel(ctx)
						if want := m.Cancel(c.key, c.n, c.r.at, now); err != nil || got != want {
							t.Fatalf("seed %d step %d: cancel(%s, %d) of %d at %d: %v, %v; want %v", seed, step, c.key, c.n, c.r.at, now, got, err, want)
						}
					}
				}
			}
		})
	}
}

func TestReserveBadInput(t *testing.T) {
	ctx := context.Background()
	l := newTestLimiter(t, standaloneURL(t), engine.Policy{Name: "bad", Limit: 2, Window: time.Hour}, WithFailurePolicy(FailClosed))
	for _, n := range []int{0, -1, 3} {
		if _, err := l.ReserveN(ctx, "k", n, -1); !errors.Is(err, engine.ErrInvalidCost) {
			t.Errorf("ReserveN(%d): %v", n, err)
		}
		if err := l.WaitN(ctx, "k", n); !errors.Is(err, engine.ErrInvalidCost) {
			t.Errorf("WaitN(%d): %v", n, err)
		}
	}
	//lint:ignore SA1012 a nil context is the input under test
	if err := l.WaitN(nil, "k", 1); !errors.Is(err, engine.ErrNilContext) { //nolint:staticcheck
		t.Errorf("WaitN(nil): %v", err)
	}
	if _, err := l.Decide(ctx, "k", 2); err != nil {
		t.Fatal(err)
	}
	short, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	if err := l.WaitN(short, "k", 1); !errors.Is(err, engine.ErrWaitTooLong) || !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("a slot an hour away with a minute's deadline: %v", err)
	}
	c := newTestLimiter(t, standaloneURL(t), engine.Policy{Name: "ctr", Limit: 2, Window: time.Hour, Algorithm: engine.SlidingCounter})
	if err := c.WaitN(ctx, "k", 1); !errors.Is(err, engine.ErrNotReservable) {
		t.Errorf("counter WaitN: %v", err)
	}
}

// The environment of a child process of TestReserveFleet.
const (
	envFleetChild = "SLIDEGATE_FLEET_CHILD" // the store URL
	envFleetSpec  = "SLIDEGATE_FLEET_SPEC"  // prefix,limit,window,goroutines,requests
)

// Processes, not goroutines, share one key on one Redis: the test binary
// runs itself as children, each waiting with many goroutines and printing
// every reservation it was admitted by. All the admitted instants hold L
// per W exactly, and replayed in the order Redis decided them through the
// reservation model they are exactly the instants it gives: each waiter
// got the earliest slot after those before it.
func TestReserveFleet(t *testing.T) {
	if os.Getenv(envFleetChild) != "" {
		fleetChild(t)
		return
	}
	for _, tc := range []struct{ name, url string }{{"standalone", standaloneURL(t)}, {"cluster", clusterURL(t)}} {
		t.Run(tc.name, func(t *testing.T) {
			const procs, goroutines, requests, limit = 3, 8, 12, 10
			w := 200 * time.Millisecond
			prefix := testPrefix(t)
			var mu sync.Mutex
			type rec struct{ made, at int64 }
			var recs []rec
			var wg sync.WaitGroup
			for range procs {
				cmd := exec.Command(os.Args[0], "-test.run=^TestReserveFleet$", "-test.count=1")
				cmd.Env = append(os.Environ(), envFleetChild+"="+tc.url,
					fmt.Sprintf("%s=%s,%d,%d,%d,%d", envFleetSpec, prefix, limit, w, goroutines, requests))
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
						if len(f) == 3 && f[0] == "slot" {
							made, _ := strconv.ParseInt(f[1], 10, 64)
							at, _ := strconv.ParseInt(f[2], 10, 64)
							mu.Lock()
							recs = append(recs, rec{made, at})
							mu.Unlock()
						}
					}
					if err := cmd.Wait(); err != nil {
						t.Errorf("child: %v", err)
					}
				}()
			}
			wg.Wait()
			if len(recs) != procs*goroutines*requests {
				t.Fatalf("%d slots reported, want %d", len(recs), procs*goroutines*requests)
			}
			slices.SortFunc(recs, func(a, b rec) int {
				if a.made != b.made {
					return int(a.made - b.made)
				}
				return int(a.at - b.at)
			})
			m := reference.NewReserveLog(limit, int64(w/time.Microsecond))
			var ats []int64
			for i, r := range recs {
				at, _, _ := m.Reserve("k", 1, r.made, 1<<62)
				if at != r.at {
					t.Fatalf("slot %d (made at %d µs): at %d µs, the model says %d", i, r.made, r.at, at)
				}
				ats = append(ats, r.at)
			}
			for i := limit; i < len(ats); i++ {
				if ats[i]-ats[i-limit] < int64(w/time.Microsecond) {
					t.Fatalf("%d slots within one window ending at %d µs", limit+1, ats[i])
				}
			}
			span := time.Duration(ats[len(ats)-1]-ats[0]) * time.Microsecond
			t.Logf("%d processes × %d goroutines: %d slots over %v (%d per %v at most)", procs, goroutines, len(ats), span, limit, w)
		})
	}
}

// fleetChild is one process of TestReserveFleet.
func fleetChild(t *testing.T) {
	f := strings.Split(os.Getenv(envFleetSpec), ",")
	limit, _ := strconv.Atoi(f[1])
	w, _ := strconv.ParseInt(f[2], 10, 64)
	goroutines, _ := strconv.Atoi(f[3])
	requests, _ := strconv.Atoi(f[4])
	l, err := New(os.Getenv(envFleetChild), engine.Policy{Name: "fleet", Limit: limit, Window: time.Duration(w)}, WithKeyPrefix(f[0]), WithTimeout(5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	var mu sync.Mutex
	var wg sync.WaitGroup
	for range goroutines {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range requests {
				r, err := l.WaitReserved(context.Background(), "k", 1)
				if err != nil {
					t.Errorf("WaitReserved: %v", err)
					return
				}
				mu.Lock()
				fmt.Printf("slot %d %d\n", r.made, r.at)
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
}
