package redisstore

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/slidegate/slidegate/engine"
	"github.com/slidegate/slidegate/internal/reference"
)

// TestFastPathsReplay drives the log script's straight-line paths (Redis
// TIME, cost 1: a new client, its second entry, appends to a ring read
// whole, refusals of a full ring) and its general code (costs 2 and 3,
// expired entries, rebuilds, rings longer than the first read) from many
// callers on one server and on a cluster, and replays every decision
// through the reference model: allowed, remaining, retry-after and reset
// must all match. The window is short, so keys also go quiet and come
// back (an expired field in the bucket, an expired ring).
func TestFastPathsReplay(t *testing.T) {
	for _, tc := range []struct {
		name string
		url  func(testing.TB) string
	}{{"standalone", standaloneURL}, {"cluster", clusterURL}} {
		t.Run(tc.name, func(t *testing.T) {
			// L = 70 rings outgrow the first read (280 bytes) at 4-byte slots.
			for _, p := range []engine.Policy{
				{Name: "fast3", Limit: 3, Window: 150 * time.Millisecond},
				{Name: "fast70", Limit: 70, Window: 300 * time.Millisecond},
			} {
				l, err := New(tc.url(t), p, WithKeyPrefix(testPrefix(t)), WithRefusalCache(0), WithTimeout(5*time.Second))
				if err != nil {
					t.Fatal(err)
				}
				defer l.Close()
				var (
					mu   sync.Mutex
					recs []reference.Record
					wg   sync.WaitGroup
				)
				errs := make(chan error, 16)
				stop := time.Now().Add(time.Second)
				for g := range 16 {
					wg.Add(1)
					go func() {
						defer wg.Done()
						r := rand.New(rand.NewPCG(uint64(g), 7))
						var mine []reference.Record
						for time.Now().Before(stop) {
							// Half the calls on a few busy keys (rings, refusals),
							// half on many (new clients, second entries).
							key := fmt.Sprintf("busy-%d", r.IntN(4))
							if r.IntN(2) == 0 {
								key = fmt.Sprintf("many-%d", r.IntN(400))
							}
							n := 1
							if r.IntN(10) == 0 {
								n = min(p.Limit, 2+r.IntN(2))
							}
							d, err := l.Decide(context.Background(), key, n)
							if err != nil {
								errs <- err
								return
							}
							mine = append(mine, record(key, n, d))
						}
						mu.Lock()
						recs = append(recs, mine...)
						mu.Unlock()
					}()
				}
				wg.Wait()
				close(errs)
				for err := range errs {
					t.Fatal(err)
				}
				rep := reference.VerifyLog(p.Limit, int64(p.Window), recs)
				t.Logf("%s: %d decisions, %d allowed, %d refused", p.Name, rep.Decisions, rep.Allowed, rep.Refused)
				if !rep.OK() || rep.Allowed == 0 || rep.Refused == 0 {
					t.Fatalf("%s: replay: %+v", p.Name, rep)
				}
			}
		})
	}
}
