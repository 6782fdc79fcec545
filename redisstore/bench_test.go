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
	return runRequests(tb, ops, func(ctx context.Context, key string) error {
		_, err := l.Decide(ctx, key, 1)
		return err
	})
}

// runRequests is runCallers for any request: decide is called once per
// request with a random key.
func runRequests(tb testing.TB, ops int, decide func(ctx context.Context, key string) error) (perSec float64, p50, p99 time.Duration) {
	return runRequestsBy(tb, benchCallers, ops, decide)
}

// runRequestsBy is runRequests from callers goroutines.
func runRequestsBy(tb testing.TB, callers, ops int, decide func(ctx context.Context, key string) error) (perSec float64, p50, p99 time.Duration) {
	var next atomic.Int64
	lat := make([][]time.Duration, callers)
	keys := make([]string, benchKeys)
	for i := range keys {
		keys[i] = fmt.Sprintf("%012d", i)
	}
	var wg sync.WaitGroup
	start := time.Now()
	for g := range callers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := rand.New(rand.NewPCG(uint64(g), 9))
			mine := make([]time.Duration, 0, ops/callers+1)
			ctx := context.Background()
			for next.Add(1) <= int64(ops) {
				t0 := time.Now()
				if err := decide(ctx, keys[r.IntN(benchKeys)]); err != nil {
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
	// The store's own call: FCALL where Functions are loaded.
	call := []string{"EVALSHA", logScript.sha}
	if l.st.conn.(functionConn).functions() {
		call = []string{"FCALL", logScript.fnName()}
	}
	host, port, _ := net.SplitHostPort(addr)
	var rb, ours, ratio float64
	var p99 time.Duration
	for b.Loop() {
		args := []string{"-h", host, "-p", port, "-c", strconv.Itoa(benchCallers), "-n", strconv.Itoa(benchOps),
			"-r", strconv.Itoa(benchKeys), "-q", call[0], call[1], "2", "bench:bench:{__rand_int__}", "bench:bench:1{__rand_int__}"}
		// The client's own key, its bucket and its field, as Decide sends.
		args = append(args, l.args[0], l.args[1], "1", "-1", l.args[4], l.args[5], "__rand_int__")
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

// BenchmarkGroupOfTwo: requests that count against two limits (100 per
// second and 1,000 per hour on one client key), 64 callers, on the
// standalone server and on the cluster: one Group call per request beside
// two Limiter calls (which is not all or nothing: the second limit can
// refuse after the first has counted), and one Limiter call for scale.
// The three alternate in rounds of 20,000 requests, so that the machine's
// other load falls on each alike; reported per request: the median rate of
// each over the rounds, and the median of the rounds' group/two-calls
// ratios.
func BenchmarkGroupOfTwo(b *testing.B) {
	ps := []engine.Policy{{Name: "bench_s", Limit: 100, Window: time.Second}, {Name: "bench_h", Limit: 1000, Window: time.Hour}}
	const rounds, perRound = 5, 20000
	for _, srv := range []struct {
		name string
		url  func(testing.TB) string
	}{{"standalone", standaloneURL}, {"cluster", clusterURL}} {
		b.Run(srv.name, func(b *testing.B) {
			st, ls, g := openGroup(b, srv.url(b), ps, WithRefusalCache(0), WithTimeout(5*time.Second), WithKeyPrefix("bench:"))
			defer st.Close()
			ways := []struct {
				name   string
				decide func(ctx context.Context, key string) error
			}{
				{"group", func(ctx context.Context, key string) error {
					var dst [2]engine.Decision
					_, err := g.DecideGroup(ctx, dst[:0], engine.GroupRequest{Refs: []engine.Ref{{Policy: 0, Key: key}, {Policy: 1, Key: key}}, N: 1})
					return err
				}},
				{"two-calls", func(ctx context.Context, key string) error {
					if _, err := ls[0].Decide(ctx, key, 1); err != nil {
						return err
					}
					_, err := ls[1].Decide(ctx, key, 1)
					return err
				}},
				{"one-limit", func(ctx context.Context, key string) error {
					_, err := ls[0].Decide(ctx, key, 1)
					return err
				}},
			}
			for _, w := range ways {
				runRequests(b, 2000, w.decide) // warm up connections and the scripts
			}
			b.ResetTimer()
			for b.Loop() {
				rates := make([][]float64, len(ways))
				p99s := make([][]float64, len(ways))
				var ratios []float64
				for range rounds {
					for i, w := range ways {
						rps, _, p99 := runRequests(b, perRound, w.decide)
						rates[i] = append(rates[i], rps)
						p99s[i] = append(p99s[i], float64(p99.Microseconds()))
					}
					ratios = append(ratios, rates[0][len(rates[0])-1]/rates[1][len(rates[1])-1])
				}
				for i, w := range ways {
					b.ReportMetric(median(rates[i]), w.name+"-req/s")
					b.ReportMetric(median(p99s[i]), w.name+"-p99-µs")
				}
				b.ReportMetric(median(ratios), "group/two-calls")
			}
		})
	}
}

func median(xs []float64) float64 {
	s := slices.Clone(xs)
	slices.Sort(s)
	return s[len(s)/2]
}
