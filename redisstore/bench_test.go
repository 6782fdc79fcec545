package redisstore

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net"
	"os/exec"
	"regexp"
	"runtime"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/slidegate/slidegate/engine"
)

// Benchmarks need a real server: run them through scripts/redis-env.sh
// (make bench-redis) or with redis-server installed.
//
//	scripts/redis-env.sh go test -run '^$' -bench . -benchtime 1x ./redisstore/

const (
	benchCallers = 64     // concurrent callers, as the issue asks
	benchKeys    = 100000 // key space
	benchOps     = 100000 // decisions per run of the redis-benchmark comparison
)

var benchPolicy = engine.Policy{Name: "bench", Limit: 100, Window: time.Second}

// runCallers makes ops decisions from benchCallers goroutines on random
// keys and returns the throughput and the latency quantiles.
func runCallers(tb testing.TB, l *Limiter, ops int) (perSec float64, p50, p99 time.Duration) {
	var next atomic.Int64
	lat := make([][]time.Duration, benchCallers)
	keys := make([]string, benchKeys)
	for i := range keys {
		keys[i] = fmt.Sprintf("%012d", i)
	}
	var wg sync.WaitGroup
	start := time.Now()
	for g := range benchCallers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := rand.New(rand.NewPCG(uint64(g), 9))
			mine := make([]time.Duration, 0, ops/benchCallers+1)
			ctx := context.Background()
			for next.Add(1) <= int64(ops) {
				t0 := time.Now()
				if _, err := l.Decide(ctx, keys[r.IntN(benchKeys)], 1); err != nil {
					tb.Error(err)
					return
				}
				mine = append(mine, time.Since(t0))
			}
			lat[g] = mine
		}()
	}
	wg.Wait()
	el := time.Since(start)
	all := slices.Concat(lat...)
	slices.Sort(all)
	if len(all) == 0 {
		return 0, 0, 0
	}
	return float64(len(all)) / el.Seconds(), all[len(all)/2], all[len(all)*99/100]
}

func benchLimiter(b *testing.B, opts ...Option) *Limiter {
	opts = append([]Option{WithRefusalCache(0), WithTimeout(5 * time.Second), WithKeyPrefix("bench:")}, opts...)
	l, err := New("redis://"+standaloneAddr(b), benchPolicy, opts...)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { l.Close() })
	return l
}

// BenchmarkClients compares the two candidate clients behind the package's
// conn interface at 64 concurrent callers: decisions/s and p99.
func BenchmarkClients(b *testing.B) {
	addr := standaloneAddr(b)
	clients := []struct {
		name string
		opt  func() Option
	}{
		{"rueidis", func() Option { return nil }},
		{"go-redis", func() Option {
			return withConn(&goredisConn{c: redis.NewClient(&redis.Options{Addr: addr, PoolSize: benchCallers, MaxRetries: -1})})
		}},
	}
	for _, c := range clients {
		b.Run(c.name, func(b *testing.B) {
			l := benchLimiter(b, c.opt())
			runCallers(b, l, 2000) // warm up connections and the script
			b.ResetTimer()
			var ps float64
			var p50, p99 time.Duration
			for b.Loop() {
				ps, p50, p99 = runCallers(b, l, benchOps)
			}
			b.ReportMetric(ps, "decisions/s")
			b.ReportMetric(float64(p50.Microseconds()), "p50-µs")
			b.ReportMetric(float64(p99.Microseconds()), "p99-µs")
		})
	}
}

var rpsLine = regexp.MustCompile(`([0-9.]+) requests per second`)

// BenchmarkVsRedisBenchmark runs redis-benchmark on the same script with
// the same arguments and 64 connections, then the package with 64
// callers, in one run, and reports both rates and their ratio.
func BenchmarkVsRedisBenchmark(b *testing.B) {
	addr := standaloneAddr(b)
	if _, err := exec.LookPath("redis-benchmark"); err != nil {
		b.Skip("redis-benchmark not installed")
	}
	l := benchLimiter(b)
	runCallers(b, l, 2000) // loads the script
	host, port, _ := net.SplitHostPort(addr)
	var rb, ours, ratio float64
	var p99 time.Duration
	for b.Loop() {
		args := []string{"-h", host, "-p", port, "-c", strconv.Itoa(benchCallers), "-n", strconv.Itoa(benchOps),
			"-r", strconv.Itoa(benchKeys), "-q", "EVALSHA", logScript.sha, "1", "bench:bench:{__rand_int__}"}
		args = append(args, l.args[0], l.args[1], "1", "-1", l.args[4], l.args[5])
		out, err := exec.Command("redis-benchmark", args...).CombinedOutput()
		if err != nil {
			b.Fatalf("redis-benchmark: %v\n%s", err, out)
		}
		m := rpsLine.FindAllSubmatch(out, -1)
		if m == nil {
			b.Fatalf("redis-benchmark output: %s", out)
		}
		rb, _ = strconv.ParseFloat(string(m[len(m)-1][1]), 64)
		ours, _, p99 = runCallers(b, l, benchOps)
		ratio = ours / rb
	}
	b.ReportMetric(rb, "redis-benchmark-rps")
	b.ReportMetric(ours, "decisions/s")
	b.ReportMetric(ratio, "ratio")
	b.ReportMetric(float64(p99.Microseconds()), "p99-µs")
	b.Logf("GOMAXPROCS %d: redis-benchmark %.0f/s, redisstore %.0f/s (%.0f%%), p99 %v", runtime.GOMAXPROCS(0), rb, ours, 100*ratio, p99)
}

// BenchmarkRefusalCacheHit: a refusal answered by the local cache.
func BenchmarkRefusalCacheHit(b *testing.B) {
	clk := engine.NewManualClock()
	l := benchLimiter(b, WithClock(clk), WithRefusalCache(DefaultRefusalCacheSize),
		WithKeyPrefix(fmt.Sprintf("bench-cache-%d:", time.Now().UnixNano())))
	ctx := context.Background()
	for range benchPolicy.Limit + 1 {
		l.Decide(ctx, "abuser", 1)
	}
	b.ReportAllocs()
	for b.Loop() {
		if d, _ := l.Decide(ctx, "abuser", 1); d.Allowed {
			b.Fatal("allowed")
		}
	}
}

// BenchmarkMemoryPerEntry reports Redis memory per stored entry for each
// layout (see TestMemoryPerEntry).
func BenchmarkMemoryPerEntry(b *testing.B) {
	addr := standaloneAddr(b)
	for _, l := range []int{100, 1000, 10000} {
		b.Run(fmt.Sprintf("L=%d", l), func(b *testing.B) {
			var m layoutBytes
			for b.Loop() {
				m = measureLayouts(b, addr, l)
			}
			b.ReportMetric(m.zset, "zset-B/entry")
			b.ReportMetric(m.list, "list-B/entry")
			b.ReportMetric(m.ring8, "ring8-B/entry")
			b.ReportMetric(m.ring4, "ring4-B/entry")
			b.ReportMetric(m.script, "redisstore-B/entry")
		})
	}
}
