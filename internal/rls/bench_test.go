package rls_test

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/slidegate/slidegate/engine"
	"github.com/slidegate/slidegate/internal/rls"
	"github.com/slidegate/slidegate/internal/topk"
)

// The benchmark configuration: a per-user limit and a per-route limit,
// both on every request, as an Envoy route with two actions sends them.
const benchConfig = `
domain: bench
descriptors:
  - key: user
    rate_limit: {unit: second, requests_per_unit: 100}
  - key: route
    rate_limit: {unit: second, requests_per_unit: 1000000}
`

const benchUsers = 10_000

func benchRequests() []*rlsv3.RateLimitRequest {
	reqs := make([]*rlsv3.RateLimitRequest, benchUsers)
	for i := range reqs {
		reqs[i] = &rlsv3.RateLimitRequest{Domain: "bench", Descriptors: []*ratelimitv3.RateLimitDescriptor{
			desc("user", "u"+strconv.Itoa(i)), desc("route", "/api"),
		}}
	}
	return reqs
}

// The service called in process: matching, validation, the group decision
// and the response, without gRPC.
func BenchmarkShouldRateLimitInProcess(b *testing.B) {
	cfg, err := rls.ParseConfig("bench.yaml", []byte(benchConfig))
	if err != nil {
		b.Fatal(err)
	}
	g, err := cfg.NewGroup()
	if err != nil {
		b.Fatal(err)
	}
	defer g.Close()
	svc, err := rls.New(cfg, g)
	if err != nil {
		b.Fatal(err)
	}
	reqs := benchRequests()
	var next atomic.Int64
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		i := int(next.Add(7919))
		for pb.Next() {
			i++
			if _, err := svc.ShouldRateLimit(context.Background(), reqs[i%benchUsers]); err != nil {
				b.Error(err)
				return
			}
		}
	})
}

// The engine decision alone, the same two refs per request: the floor of
// the in-process row.
func BenchmarkGroupFloor(b *testing.B) {
	cfg, err := rls.ParseConfig("bench.yaml", []byte(benchConfig))
	if err != nil {
		b.Fatal(err)
	}
	g, err := cfg.NewGroup()
	if err != nil {
		b.Fatal(err)
	}
	defer g.Close()
	keys := make([]string, benchUsers)
	for i := range keys {
		keys[i] = "u" + strconv.Itoa(i)
	}
	var next atomic.Int64
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		i := int(next.Add(7919))
		var dst [2]engine.Decision
		for pb.Next() {
			i++
			_, _ = g.DecideGroup(context.Background(), dst[:0], engine.GroupRequest{Refs: []engine.Ref{{Policy: 0, Key: keys[i%benchUsers]}, {Policy: 1, Key: "/api"}}, N: 1})
		}
	})
}

// Through a real gRPC connection on loopback, as Envoy calls it.
func BenchmarkShouldRateLimitGRPC(b *testing.B) {
	e := start(b, benchConfig, envOpts{real: true})
	reqs := benchRequests()
	var next atomic.Int64
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		i := int(next.Add(7919))
		for pb.Next() {
			i++
			if _, err := e.client.ShouldRateLimit(context.Background(), reqs[i%benchUsers]); err != nil {
				b.Error(err)
				return
			}
		}
	})
}

// A health check over the same kind of connection: the floor of the gRPC
// row (what a call costs that decides nothing).
func BenchmarkGRPCFloor(b *testing.B) {
	e := start(b, benchConfig, envOpts{real: true})
	hc := healthpb.NewHealthClient(e.conn)
	req := &healthpb.HealthCheckRequest{}
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if _, err := hc.Check(context.Background(), req); err != nil {
				b.Error(err)
				return
			}
		}
	})
}

// The envoybench configuration (make bench-envoy): a limit per user, per
// IP and per route, the three on every request.
const benchEnvoyConfig = `
domain: bench
descriptors:
  - key: user
    rate_limit: {unit: minute, requests_per_unit: %d}
  - key: ip
    rate_limit: {unit: minute, requests_per_unit: %d}
  - key: route
    rate_limit: {unit: minute, requests_per_unit: 500000}
`

// The service called in process on Redis (scripts/redis-env.sh), as
// slidegate envoy serve decides on it: the service's share of a decision
// (matching, the script call's arguments, its reply, the response) beside
// Redis's. Mostly allowed (20,000 users, limits of 100,000 per minute) and
// mostly refused (50 users, 5 per minute), 3 descriptors per request.
func BenchmarkShouldRateLimitRedis(b *testing.B) {
	addr := os.Getenv("SLIDEGATE_REDIS_ADDR")
	if addr == "" {
		b.Skip("SLIDEGATE_REDIS_ADDR not set: run through scripts/redis-env.sh")
	}
	for _, v := range []struct {
		name         string
		limit, users int
	}{{"allowed", 100000, 20000}, {"refused", 5, 50}} {
		b.Run(v.name, func(b *testing.B) {
			cfg, err := rls.ParseConfig("bench.yaml", []byte(fmt.Sprintf(benchEnvoyConfig, v.limit, v.limit)))
			if err != nil {
				b.Fatal(err)
			}
			g, release, err := redisFactory("redis://"+addr, fmt.Sprintf("rls-bench-%d:", time.Now().UnixNano()))(cfg)
			if err != nil {
				b.Fatal(err)
			}
			defer release()
			svc, err := rls.New(cfg, g)
			if err != nil {
				b.Fatal(err)
			}
			reqs := make([]*rlsv3.RateLimitRequest, v.users*4)
			for i := range reqs {
				u := strconv.Itoa(i % v.users)
				reqs[i] = &rlsv3.RateLimitRequest{Domain: "bench", Descriptors: []*ratelimitv3.RateLimitDescriptor{
					desc("user", u), desc("ip", "10.0."+u), desc("route", "/r"+strconv.Itoa(i/v.users)),
				}}
			}
			var next atomic.Int64
			b.ReportAllocs()
			b.SetParallelism(4) // 4 × GOMAXPROCS callers, as envoybench's 16 on 2 cores
			cpu0, red0 := selfCPU(), redisCPU(b, addr)
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				i := int(next.Add(7919))
				for pb.Next() {
					i += 7
					if _, err := svc.ShouldRateLimit(context.Background(), reqs[i%len(reqs)]); err != nil {
						b.Error(err)
						return
					}
				}
			})
			b.StopTimer()
			if cpu0 >= 0 {
				b.ReportMetric(float64((selfCPU()-cpu0).Microseconds())/float64(b.N), "cpu-µs/op")
			}
			b.ReportMetric(float64((redisCPU(b, addr)-red0).Microseconds())/float64(b.N), "redis-cpu-µs/op")
		})
	}
}

// selfCPU is this process's user and system CPU time (Linux /proc; -1
// elsewhere).
func selfCPU() time.Duration {
	bs, err := os.ReadFile("/proc/self/stat")
	if err != nil {
		return -1
	}
	st := string(bs)
	f := strings.Fields(st[strings.LastIndexByte(st, ')')+2:])
	ut, _ := strconv.ParseInt(f[11], 10, 64)
	sy, _ := strconv.ParseInt(f[12], 10, 64)
	return time.Duration(ut+sy) * time.Second / 100 // USER_HZ
}

// redisCPU is the Redis server's user and system CPU time (INFO cpu).
func redisCPU(b *testing.B, addr string) time.Duration {
	c, err := net.DialTimeout("tcp", addr, 10*time.Second)
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := c.Write([]byte("INFO cpu\r\n")); err != nil {
		b.Fatal(err)
	}
	r := bufio.NewReader(c)
	head, err := r.ReadString('\n')
	if err != nil || !strings.HasPrefix(head, "$") {
		b.Fatalf("INFO cpu: %q %v", head, err)
	}
	n, _ := strconv.Atoi(strings.TrimSpace(head[1:]))
	body := make([]byte, n)
	if _, err := io.ReadFull(r, body); err != nil {
		b.Fatal(err)
	}
	var total float64
	for _, l := range strings.Split(string(body), "\n") {
		k, v, ok := strings.Cut(strings.TrimSpace(l), ":")
		if ok && (k == "used_cpu_user" || k == "used_cpu_sys") {
			f, _ := strconv.ParseFloat(v, 64)
			total += f
		}
	}
	return time.Duration(total * float64(time.Second))
}

// BenchmarkShouldRateLimitRefused is the in-process service on OVER_LIMIT
// answers only, with and without the view of the keys refused most that
// envoy serve feeds through WithRefusals: hot, 64 users refused again and
// again; flood, 65,536 users in turn, far more than the counters. The
// ratio of top to notop in one run is what the view costs a refusal.
// ring and wait are top with contention forced (topk's SetBusy): each
// key's stripe of counters taken as busy (the refusal waits in the
// stripe's ring for the lock's next holder), or its ring taken as full
// too (the request waits for the lock).
//
//	go test -run '^$' -bench ShouldRateLimitRefused -benchmem -count 10 ./internal/rls
func BenchmarkShouldRateLimitRefused(b *testing.B) {
	const refusedConfig = "domain: bench\ndescriptors:\n  - key: user\n    rate_limit: {unit: hour, requests_per_unit: 1}\n"
	for _, c := range []struct {
		name string
		keys int
	}{{"hot", 64}, {"flood", 1 << 16}} {
		for busy, mode := range []string{"top", "ring", "wait", "notop"} {
			top := mode != "notop"
			b.Run(c.name+"/"+mode, func(b *testing.B) {
				cfg, err := rls.ParseConfig("bench.yaml", []byte(refusedConfig))
				if err != nil {
					b.Fatal(err)
				}
				g, err := cfg.NewGroup()
				if err != nil {
					b.Fatal(err)
				}
				defer g.Close()
				var opts []rls.Option
				if top {
					// One epoch throughout: under callgrind a run
					// spans minutes, and a new epoch's summaries
					// would take its keys again.
					tr := topk.New(topk.DefaultCounters, topk.DefaultEpoch, topk.DefaultEpochs, func() int64 { return 0 })
					defer tr.Close()
					tr.SetBusy(busy)
					opts = append(opts, rls.WithRefusals(tr))
				}
				svc, err := rls.New(cfg, g, opts...)
				if err != nil {
					b.Fatal(err)
				}
				reqs := make([]*rlsv3.RateLimitRequest, c.keys)
				for i := range reqs {
					reqs[i] = &rlsv3.RateLimitRequest{Domain: "bench", Descriptors: []*ratelimitv3.RateLimitDescriptor{desc("user", "u"+strconv.Itoa(i))}}
					if _, err := svc.ShouldRateLimit(context.Background(), reqs[i]); err != nil { // spends the key
						b.Fatal(err)
					}
				}
				b.ReportAllocs()
				i := 0
				for b.Loop() {
					resp, err := svc.ShouldRateLimit(context.Background(), reqs[i%c.keys])
					if err != nil || resp.OverallCode != rlsv3.RateLimitResponse_OVER_LIMIT {
						b.Fatalf("%v %v, want OVER_LIMIT", resp.GetOverallCode(), err)
					}
					i++
				}
			})
		}
	}
}
