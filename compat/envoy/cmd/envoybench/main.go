// Command envoybench runs envoyproxy/ratelimit and slidegate envoy serve
// side by side on one Redis, under the same load, and prints one markdown
// table of ratios: decisions per second, p50 and p99 latency, and CPU per
// decision of each service and of Redis (make bench-envoy). Variants (1
// and 3 descriptors, mostly allowed or mostly refused, 16 and 64
// callers) run interleaved, peer then slidegate, for -rounds rounds.
// With -json it also writes the run for docs/results.md (make results).
package main

import (
	"cmp"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"maps"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/redis/go-redis/v9"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	ebdoc "github.com/slidegate/slidegate/internal/envoybenchdoc"
)

const config = `domain: bench
descriptors:
  - key: user
    rate_limit: {unit: minute, requests_per_unit: %d}
  - key: ip
    rate_limit: {unit: minute, requests_per_unit: %d}
  - key: route
    rate_limit: {unit: minute, requests_per_unit: 500000}
`

type variant struct {
	descs   int
	refused bool
	callers int
}

func (v variant) String() string {
	m := "allowed"
	if v.refused {
		m = "refused"
	}
	return fmt.Sprintf("%d desc, mostly %s, %d callers", v.descs, m, v.callers)
}

type result struct {
	decisions      int
	errors         int
	seconds        float64
	p50, p99       time.Duration
	svcCPU, redCPU time.Duration
	redSys         time.Duration // redCPU's system part
	over           int
	fallbacks      int              // slidegate's decisions made locally while Redis was slow
	cmds           map[string]int64 // Redis commands: calls
	cmdUs          map[string]int64 // Redis commands: µs inside each
}

func main() {
	dur := flag.Duration("duration", 3*time.Second, "load per variant and service")
	rounds := flag.Int("rounds", 1, "interleaved rounds")
	only := flag.String("variants", "", "comma-separated variant indexes (default all)")
	jsonOut := flag.String("json", "", "also write the run to this JSON `file` (make results reads it)")
	flag.Parse()
	bin, redisAddr := os.Getenv("SLIDEGATE_ENVOY_PEER_BIN"), os.Getenv("SLIDEGATE_REDIS_ADDR")
	if bin == "" || redisAddr == "" {
		fmt.Fprintln(os.Stderr, "envoybench: run through make bench-envoy (needs SLIDEGATE_ENVOY_PEER_BIN and SLIDEGATE_REDIS_ADDR)")
		os.Exit(2)
	}
	began, load0 := time.Now(), loadAverage()
	tmp, err := os.MkdirTemp("", "envoybench")
	check(err)
	defer os.RemoveAll(tmp)
	sg := filepath.Join(tmp, "slidegate")
	// Built in slidegate's own module (two levels up: make runs this from
	// compat/envoy), with slidegate's go.sum.
	build := exec.Command(cmp.Or(os.Getenv("GO"), "go"), "build", "-o", sg, "./cmd/slidegate")
	build.Dir = filepath.Join("..", "..")
	build.Stdout, build.Stderr = os.Stderr, os.Stderr
	check(build.Run())
	var variants []variant
	for _, d := range []int{1, 3} {
		for _, r := range []bool{false, true} {
			for _, c := range []int{16, 64} {
				variants = append(variants, variant{d, r, c})
			}
		}
	}
	if *only != "" {
		var sel []variant
		for _, s := range strings.Split(*only, ",") {
			i, err := strconv.Atoi(s)
			check(err)
			if i < 0 || i >= len(variants) {
				check(fmt.Errorf("-variants: no variant %d (0 to %d)", i, len(variants)-1))
			}
			sel = append(sel, variants[i])
		}
		variants = sel
	}
	rdb := redis.NewClient(&redis.Options{Addr: redisAddr})
	defer rdb.Close()
	b := &bench{tmp: tmp, peerBin: bin, sg: sg, redisAddr: redisAddr, rdb: rdb, dur: *dur}
	res := map[string][]result{}
	for range *rounds {
		for _, v := range variants {
			for _, who := range []string{"peer", "slidegate"} {
				r := b.runOne(who, v)
				res[v.String()+"/"+who] = append(res[v.String()+"/"+who], r)
				fmt.Fprintf(os.Stderr, "%-40s %-9s %8.0f decisions/s, p50 %v, p99 %v, %d over, %d errors, %d local fallbacks, service %.1f µs/decision, redis %.1f µs/decision\n",
					v, who, float64(r.decisions)/r.seconds, r.p50, r.p99, r.over, r.errors, r.fallbacks, us(r.svcCPU, r.decisions), us(r.redCPU, r.decisions))
			}
		}
	}
	run := ebdoc.Doc{
		Cores: runtime.NumCPU(), GoVersion: runtime.Version(), PeerVersion: os.Getenv("SLIDEGATE_ENVOY_PEER_VERSION"),
		Redis: redisVersion(rdb), LoadBefore: load0, RunNs: int64(*dur), Rounds: *rounds,
	}
	for _, v := range variants {
		pr, sr := res[v.String()+"/peer"], res[v.String()+"/slidegate"]
		dv := ebdoc.Variant{Name: v.String(), Descriptors: v.descs, Refused: v.refused, Callers: v.callers,
			Peer: figures(pr), Slidegate: figures(sr)}
		for i := range pr {
			dv.RateRatios = append(dv.RateRatios, safeDiv(float64(sr[i].decisions)/sr[i].seconds, float64(pr[i].decisions)/pr[i].seconds))
			dv.RedisCPURatios = append(dv.RedisCPURatios, safeDiv(us(sr[i].redCPU, sr[i].decisions), us(pr[i].redCPU, pr[i].decisions)))
		}
		run.Variants = append(run.Variants, dv)
	}
	run.Table = table(run.Variants)
	fmt.Print(run.Table)
	if *jsonOut != "" {
		run.Started, run.DurationNs, run.LoadAfter = began.UTC(), int64(time.Since(began)), loadAverage()
		out, err := json.MarshalIndent(run, "", "  ")
		check(err)
		check(os.WriteFile(*jsonOut, out, 0o644))
	}
}

// table is the run's markdown table: one row per variant, the peer's
// figure then slidegate's, and slidegate's over the peer's.
func table(vs []ebdoc.Variant) string {
	var b strings.Builder
	b.WriteString("| variant | decisions/s peer / slidegate (ratio) | p50 ms peer / slidegate | p99 ms peer / slidegate | service CPU µs/decision peer / slidegate (ratio) | Redis CPU µs/decision peer / slidegate (ratio) | of which system peer / slidegate | Redis commands per decision peer / slidegate |\n")
	b.WriteString("|---|---|---|---|---|---|---|---|\n")
	for _, v := range vs {
		p, s := v.Peer, v.Slidegate
		fmt.Fprintf(&b, "| %s | %.0f / %.0f (%.2f) | %.1f / %.1f | %.1f / %.1f | %.1f / %.1f (%.2f) | %.1f / %.1f (%.2f) | %.1f / %.1f | %s / %s |\n",
			v.Name, p.PerSecond, s.PerSecond, safeDiv(s.PerSecond, p.PerSecond),
			ms(p.P50Ns), ms(s.P50Ns), ms(p.P99Ns), ms(s.P99Ns),
			p.ServiceCPUus, s.ServiceCPUus, safeDiv(s.ServiceCPUus, p.ServiceCPUus),
			p.RedisCPUus, s.RedisCPUus, safeDiv(s.RedisCPUus, p.RedisCPUus), p.RedisSysUs, s.RedisSysUs,
			perDecision(p.Commands), perDecision(s.Commands))
	}
	return b.String()
}

func ms(ns int64) float64 { return float64(ns) / 1e6 }

func safeDiv(a, b float64) float64 {
	if b == 0 {
		return 0
	}
	return a / b
}

// perDecision lists commands per decision by name, alphabetically,
// leaving out those of fewer than 0.05 per decision.
func perDecision(m map[string]float64) string {
	var parts []string
	for _, c := range slices.Sorted(maps.Keys(m)) {
		if m[c] >= 0.05 {
			parts = append(parts, fmt.Sprintf("%s %.1f", strings.ToUpper(c), m[c]))
		}
	}
	return strings.Join(parts, ", ")
}

// figures totals one service's rounds of a variant: counts and CPU
// summed, the percentiles the median of the rounds'.
func figures(rs []result) ebdoc.Figures {
	var f ebdoc.Figures
	var svc, red, sys time.Duration
	var p50, p99 []time.Duration
	cmds, cmdUs := map[string]int64{}, map[string]int64{}
	for _, r := range rs {
		f.Decisions += int64(r.decisions)
		f.Seconds += r.seconds
		f.Errors += int64(r.errors)
		f.OverLimit += int64(r.over)
		f.Fallbacks += int64(r.fallbacks)
		svc += r.svcCPU
		red += r.redCPU
		sys += r.redSys
		p50, p99 = append(p50, r.p50), append(p99, r.p99)
		for c, n := range r.cmds {
			cmds[c] += n
		}
		for c, n := range r.cmdUs {
			cmdUs[c] += n
		}
	}
	n := int(f.Decisions)
	f.PerSecond = safeDiv(float64(f.Decisions), f.Seconds)
	f.ServiceCPUus, f.RedisCPUus, f.RedisSysUs = us(svc, n), us(red, n), us(sys, n)
	f.P50Ns, f.P99Ns = int64(median(p50)), int64(median(p99))
	f.Commands, f.CommandUs = map[string]float64{}, map[string]float64{}
	for c, k := range cmds {
		f.Commands[c] = float64(k) / float64(max(n, 1))
	}
	for c, k := range cmdUs {
		f.CommandUs[c] = float64(k) / float64(max(n, 1))
	}
	return f
}

func median(ds []time.Duration) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	ds = slices.Clone(ds)
	slices.Sort(ds)
	return ds[len(ds)/2]
}

func us(d time.Duration, n int) float64 { return float64(d.Nanoseconds()) / 1e3 / float64(max(n, 1)) }

// loadAverage is the machine's 1-minute load average (Linux), 0 elsewhere.
func loadAverage() float64 {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return 0
	}
	f, _ := strconv.ParseFloat(strings.Fields(string(b))[0], 64)
	return f
}

func redisVersion(rdb *redis.Client) string {
	info, err := rdb.Info(context.Background(), "server").Result()
	check(err)
	for _, l := range strings.Split(info, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(l), "redis_version:"); ok {
			return v
		}
	}
	return ""
}

func check(err error) {
	if err != nil {
		fmt.Fprintln(os.Stderr, "envoybench:", err)
		os.Exit(1)
	}
}

func freePort() int {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	check(err)
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// bench is what every run shares: the scratch directory, the two
// services' binaries, the Redis they use and how long each run lasts.
type bench struct {
	tmp, peerBin, sg, redisAddr string
	rdb                         *redis.Client
	dur                         time.Duration
}

// runOne starts one service (who: peer or slidegate) on a fresh runtime
// directory, loads it with v for b.dur, and stops it.
func (b *bench) runOne(who string, v variant) result {
	tmp, peerBin, sg, redisAddr, rdb, d := b.tmp, b.peerBin, b.sg, b.redisAddr, b.rdb, b.dur
	ctx := context.Background()
	check(rdb.FlushAll(ctx).Err())
	root := filepath.Join(tmp, "runtime-"+who)
	dir := filepath.Join(root, "ratelimit", "config")
	check(os.MkdirAll(dir, 0o755))
	userLimit, ipLimit := 100000, 100000
	if v.refused {
		userLimit, ipLimit = 5, 5
	}
	check(os.WriteFile(filepath.Join(dir, "bench.yaml"), []byte(fmt.Sprintf(config, userLimit, ipLimit)), 0o644))
	port, httpPort := freePort(), freePort()
	env := append(os.Environ(), "RUNTIME_ROOT="+root, "RUNTIME_SUBDIRECTORY=ratelimit", "RUNTIME_WATCH_ROOT=false",
		"REDIS_SOCKET_TYPE=tcp", "REDIS_URL="+redisAddr, "USE_STATSD=false", "DISABLE_STATS=true", "LOG_LEVEL=error",
		"GRPC_HOST=127.0.0.1", "GRPC_PORT="+strconv.Itoa(port), "HOST=127.0.0.1", "PORT="+strconv.Itoa(httpPort),
		"EXPIRATION_JITTER_MAX_SECONDS=0",
		// The peer's default, for both: slidegate's shorter one would let a
		// loaded machine's slow calls fall back to local decisions.
		"REDIS_TIMEOUT=10s")
	var cmd *exec.Cmd
	if who == "peer" {
		cmd = exec.Command(filepath.Join(peerBin, "service_cmd"))
		// The peer's debug listener; slidegate refuses the variables.
		env = append(env, "DEBUG_HOST=127.0.0.1", "DEBUG_PORT="+strconv.Itoa(freePort()))
	} else {
		cmd = exec.Command(sg, "envoy", "serve")
	}
	cmd.Env, cmd.Stderr = env, os.Stderr
	check(cmd.Start())
	defer func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }()
	conns := make([]*grpc.ClientConn, 4)
	for i := range conns {
		c, err := grpc.NewClient(fmt.Sprintf("127.0.0.1:%d", port), grpc.WithTransportCredentials(insecure.NewCredentials()))
		check(err)
		defer c.Close()
		conns[i] = c
	}
	probe := rlsv3.NewRateLimitServiceClient(conns[0])
	deadline := time.Now().Add(60 * time.Second)
	for {
		_, err := probe.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "probe", Descriptors: []*ratelimitv3.RateLimitDescriptor{{Entries: []*ratelimitv3.RateLimitDescriptor_Entry{{Key: "k", Value: "v"}}}}})
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			check(fmt.Errorf("%s did not start: %v", who, err))
		}
		time.Sleep(50 * time.Millisecond)
	}
	check(rdb.ConfigResetStat(ctx).Err())
	users := 20000
	if v.refused {
		users = 50
	}
	cpu0 := procCPU(cmd.Process.Pid)
	user0, sys0 := redisCPU(rdb)
	var stop atomic.Bool
	var wg sync.WaitGroup
	lat := make([][]time.Duration, v.callers)
	over, errs := make([]int, v.callers), make([]int, v.callers)
	start := time.Now()
	for c := range v.callers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			client := rlsv3.NewRateLimitServiceClient(conns[c%len(conns)])
			rng := rand.New(rand.NewPCG(uint64(c), 6))
			for !stop.Load() {
				u := strconv.Itoa(rng.IntN(users))
				req := &rlsv3.RateLimitRequest{Domain: "bench", Descriptors: []*ratelimitv3.RateLimitDescriptor{
					{Entries: []*ratelimitv3.RateLimitDescriptor_Entry{{Key: "user", Value: u}}}}}
				if v.descs == 3 {
					req.Descriptors = append(req.Descriptors,
						&ratelimitv3.RateLimitDescriptor{Entries: []*ratelimitv3.RateLimitDescriptor_Entry{{Key: "ip", Value: "10.0." + u}}},
						&ratelimitv3.RateLimitDescriptor{Entries: []*ratelimitv3.RateLimitDescriptor_Entry{{Key: "route", Value: "/r" + strconv.Itoa(rng.IntN(4))}}})
				}
				t0 := time.Now()
				r, err := client.ShouldRateLimit(ctx, req)
				lat[c] = append(lat[c], time.Since(t0))
				if err != nil {
					errs[c]++
				} else if r.OverallCode == rlsv3.RateLimitResponse_OVER_LIMIT {
					over[c]++
				}
			}
		}()
	}
	time.Sleep(d)
	stop.Store(true)
	wg.Wait()
	secs := time.Since(start).Seconds()
	user1, sys1 := redisCPU(rdb)
	res := result{seconds: secs, svcCPU: procCPU(cmd.Process.Pid) - cpu0, redCPU: user1 + sys1 - user0 - sys0, redSys: sys1 - sys0,
		cmds: map[string]int64{}, cmdUs: map[string]int64{}}
	var all []time.Duration
	for c := range v.callers {
		all = append(all, lat[c]...)
		res.over += over[c]
		res.errors += errs[c]
	}
	res.decisions = len(all)
	slices.Sort(all)
	if len(all) > 0 {
		res.p50, res.p99 = all[len(all)/2], all[len(all)*99/100]
	}
	if who == "slidegate" {
		res.fallbacks = fallbacks(httpPort)
	}
	info, err := rdb.Info(ctx, "commandstats").Result()
	check(err)
	for _, l := range strings.Split(info, "\n") {
		name, rest, ok := strings.Cut(strings.TrimSpace(l), ":")
		if !ok || !strings.HasPrefix(name, "cmdstat_") {
			continue
		}
		for _, f := range strings.Split(rest, ",") {
			k, val, _ := strings.Cut(f, "=")
			n, _ := strconv.ParseInt(val, 10, 64)
			c := strings.TrimPrefix(name, "cmdstat_")
			if strings.HasPrefix(c, "config") || c == "info" || c == "hello" || c == "ping" || n == 0 {
				continue
			}
			switch k {
			case "calls":
				res.cmds[c] = n
			case "usec":
				res.cmdUs[c] = n
			}
		}
	}
	return res
}

// fallbacks reads slidegate's count of decisions made without Redis.
func fallbacks(port int) int {
	resp, err := http.Get(fmt.Sprintf("http://127.0.0.1:%d/metrics", port))
	if err != nil {
		return -1
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	n := 0.0
	for _, l := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(l, "slidegate_redis_fallback_decisions_total") {
			f := strings.Fields(l)
			v, _ := strconv.ParseFloat(f[len(f)-1], 64)
			n += v
		}
	}
	return int(n)
}

// procCPU is a process's user and system CPU time (Linux /proc).
func procCPU(pid int) time.Duration {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0
	}
	s := string(b)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+2:])
	ut, _ := strconv.ParseInt(f[11], 10, 64)
	st, _ := strconv.ParseInt(f[12], 10, 64)
	return time.Duration(ut+st) * time.Second / 100 // USER_HZ
}

// redisCPU is Redis's user and system CPU time (INFO cpu).
func redisCPU(rdb *redis.Client) (user, sys time.Duration) {
	info, err := rdb.Info(context.Background(), "cpu").Result()
	check(err)
	for _, l := range strings.Split(info, "\n") {
		k, v, ok := strings.Cut(strings.TrimSpace(l), ":")
		if !ok {
			continue
		}
		f, _ := strconv.ParseFloat(v, 64)
		switch k {
		case "used_cpu_user":
			user = time.Duration(f * float64(time.Second))
		case "used_cpu_sys":
			sys = time.Duration(f * float64(time.Second))
		}
	}
	return user, sys
}
