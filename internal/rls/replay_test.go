package rls_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/slidegate/slidegate/engine"
	"github.com/slidegate/slidegate/internal/backendtest"
	"github.com/slidegate/slidegate/internal/reference"
	"github.com/slidegate/slidegate/internal/rls"
	"github.com/slidegate/slidegate/redisstore"
)

// recorder is a GroupBackend that records every decision the service asks
// of the group it wraps, for replay through the reference.
type recorder struct {
	engine.GroupBackend
	mu   sync.Mutex
	recs []reference.GroupRecord
}

func (r *recorder) DecideGroup(ctx context.Context, dst []engine.Decision, req engine.GroupRequest) (engine.GroupDecision, error) {
	gd, err := r.GroupBackend.DecideGroup(ctx, dst, req)
	if err != nil {
		return gd, err
	}
	if req.Tag != "" && r.NeedsTag() {
		// Placed by the tag, a key counts per tag value: the reference
		// sees (tag, key) as the key.
		tagged := make([]engine.Ref, len(req.Refs))
		for i, ref := range req.Refs {
			tagged[i] = engine.Ref{Policy: ref.Policy, Key: req.Tag + "\x00" + ref.Key}
		}
		req.Refs = tagged
	}
	r.record(backendtest.RequestRecord(req, gd))
	return gd, nil
}

func (r *recorder) record(rec reference.GroupRecord) {
	r.mu.Lock()
	r.recs = append(r.recs, rec)
	r.mu.Unlock()
}

const replayConfig = `
domain: r
descriptors:
  - key: user
    rate_limit: {unit: second, requests_per_unit: 3, window: 2ms}
  - key: ip
    rate_limit: {unit: second, requests_per_unit: 5, window: 3ms}
    descriptors:
      - key: path
        rate_limit: {unit: second, requests_per_unit: 4, window: 1ms}
  - key: tenant
    rate_limit: {unit: second, requests_per_unit: 8, window: 5ms, algorithm: counter}
`

// Many clients at once through the gRPC service, tiny windows, few keys,
// and a sweeper in a tight loop: every decision the service made is
// replayed through the reference, and every answer agrees with the
// decision behind it.
func TestParallelReplay(t *testing.T) {
	for _, procs := range []int{2, 8, 32} {
		t.Run(fmt.Sprintf("GOMAXPROCS=%d", procs), func(t *testing.T) {
			defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(procs))
			var rec *recorder
			e := start(t, replayConfig, envOpts{real: true, wrap: func(b engine.GroupBackend) engine.GroupBackend {
				rec = &recorder{GroupBackend: b}
				return rec
			}})
			const workers, perWorker = 16, 150
			var ok, over atomic.Int64
			// Background work in a tight loop: sweeps dropping idle keys
			// while requests decide them.
			stopSweep, swept := make(chan struct{}), make(chan int)
			go func() {
				n, passes := 0, 0
				for {
					select {
					case <-stopSweep:
						swept <- n
						return
					default:
					}
					n += e.group.Sweep()
					if passes++; passes%64 == 0 {
						runtime.Gosched()
					}
				}
			}()
			var wg sync.WaitGroup
			errs := make(chan error, workers)
			for w := range workers {
				wg.Add(1)
				go func() {
					defer wg.Done()
					r := rand.New(rand.NewPCG(uint64(w), uint64(procs)))
					for range perWorker {
						var ds []*ratelimitv3.RateLimitDescriptor
						if r.IntN(3) > 0 {
							ds = append(ds, desc("user", fmt.Sprint("u", r.IntN(3))))
						}
						switch r.IntN(3) {
						case 0:
							ds = append(ds, desc("ip", fmt.Sprint("i", r.IntN(2))))
						case 1:
							ds = append(ds, desc("ip", fmt.Sprint("i", r.IntN(2)), "path", "/p"))
						}
						if r.IntN(2) == 0 || len(ds) == 0 {
							ds = append(ds, desc("tenant", "t0"))
						}
						resp, err := e.client.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{
							Domain: "r", Descriptors: ds, HitsAddend: uint32(r.IntN(3))})
						if err != nil {
							errs <- err
							return
						}
						if resp.OverallCode == rlsv3.RateLimitResponse_OK {
							ok.Add(1)
						} else {
							over.Add(1)
						}
					}
				}()
			}
			wg.Wait()
			close(stopSweep)
			nSwept := <-swept
			close(errs)
			for err := range errs {
				t.Fatal(err)
			}
			rep := backendtest.VerifyGroup(t, e.cfg.Policies(), rec.recs)
			if rep.Decisions != workers*perWorker || int64(rep.Allowed) != ok.Load() || int64(rep.Refused) != over.Load() {
				t.Fatalf("%d decisions (%d allowed) behind %d answers (%d OK)", rep.Decisions, rep.Allowed, workers*perWorker, ok.Load())
			}
			t.Logf("%d decisions, %d allowed, %d refused; %d idle keys swept meanwhile", rep.Decisions, rep.Allowed, rep.Refused, nSwept)
		})
	}
}

// The same replay on real Redis and a real three-master Redis Cluster
// (scripts/redis-env.sh): every decision the service asked of the Redis
// group, at the instants Redis decided at, replays exactly through the
// reference. On the cluster every request carries a user descriptor, the
// service's cluster tag.
func TestParallelReplayRedis(t *testing.T) {
	addr, cluster := os.Getenv("SLIDEGATE_REDIS_ADDR"), os.Getenv("SLIDEGATE_REDIS_CLUSTER_ADDRS")
	if addr == "" || cluster == "" {
		t.Skip("SLIDEGATE_REDIS_ADDR / SLIDEGATE_REDIS_CLUSTER_ADDRS not set: run make test (scripts/redis-env.sh starts Redis)")
	}
	for _, c := range []struct{ name, url string }{{"standalone", "redis://" + addr + "/0"}, {"cluster", "redis-cluster://" + cluster}} {
		t.Run(c.name, func(t *testing.T) {
			defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(8))
			cfg, err := rls.ParseConfig("test.yaml", []byte(replayConfig))
			if err != nil {
				t.Fatal(err)
			}
			st, err := redisstore.Open(c.url, redisstore.WithKeyPrefix(fmt.Sprintf("rls-replay-%d:", time.Now().UnixNano())),
				redisstore.WithTimeout(5*time.Second))
			if err != nil {
				t.Fatal(err)
			}
			defer st.Close()
			ls, err := st.Limiters(cfg.Policies())
			if err != nil {
				t.Fatal(err)
			}
			g, err := redisstore.NewGroup(ls...)
			if err != nil {
				t.Fatal(err)
			}
			rec := &recorder{GroupBackend: g}
			var opts []rls.Option
			if g.NeedsTag() {
				opts = append(opts, rls.WithClusterTag("user"))
			}
			e := start(t, replayConfig, envOpts{backend: rec, opts: opts})
			const workers, perWorker = 12, 100
			var wg sync.WaitGroup
			errs := make(chan error, workers)
			for w := range workers {
				wg.Add(1)
				go func() {
					defer wg.Done()
					r := rand.New(rand.NewPCG(uint64(w), 77))
					for range perWorker {
						ds := []*ratelimitv3.RateLimitDescriptor{desc("user", fmt.Sprint("u", r.IntN(2)))}
						switch r.IntN(3) {
						case 0:
							ds = append(ds, desc("ip", fmt.Sprint("i", r.IntN(2))))
						case 1:
							ds = append(ds, desc("ip", fmt.Sprint("i", r.IntN(2)), "path", "/p"))
						}
						if r.IntN(2) == 0 {
							ds = append(ds, desc("tenant", "t0"))
						}
						if _, err := e.client.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{
							Domain: "r", Descriptors: ds, HitsAddend: uint32(r.IntN(3))}); err != nil {
							errs <- err
							return
						}
					}
				}()
			}
			wg.Wait()
			close(errs)
			for err := range errs {
				t.Fatal(err)
			}
			if len(rec.recs) != workers*perWorker {
				t.Fatalf("%d decisions recorded for %d requests", len(rec.recs), workers*perWorker)
			}
			backendtest.VerifyGroupAt(t, cfg.Policies(), rec.recs, time.Microsecond)
		})
	}
}
