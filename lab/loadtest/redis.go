package loadtest

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/rueidis"
	vegeta "github.com/tsenart/vegeta/v12/lib"

	"github.com/slidegate/slidegate/engine"
	"github.com/slidegate/slidegate/internal/server"
	"github.com/slidegate/slidegate/internal/server/redisfactory"
	"github.com/slidegate/slidegate/lab/internal/keydist"
	"github.com/slidegate/slidegate/lab/internal/latency"
	"github.com/slidegate/slidegate/redisstore"
)

// The redis phase: for each deployment given (a standalone Redis with
// --redis-addr, a Redis Cluster with --redis-cluster; `make
// loadtest-redis` starts both on loopback), through redisstore's public
// API:
//
//   - engine-style: RedisCallers goroutines call Limiter.Decide at full
//     speed, every decision timed (a round trip is microseconds, far above
//     the clock's cost) and recorded with the instant Redis decided at
//     (Decision.At, from Redis TIME), then replayed through the reference
//     model;
//   - http: slidegate's server on the Redis store (the harness's store
//     factory wraps each redisstore.Limiter to record), attacked by vegeta
//     at RedisRate, verified the same way;
//   - memory, first: RedisMemClient clients populated with one request each, then
//     redisMemPerClient each, under a one-hour window; Redis's used_memory
//     (INFO memory, summed over the masters) per key and per stored entry;
//   - script time: INFO commandstats' FCALL and EVALSHA calls and microseconds over
//     the engine-style phase, summed over the masters;
//   - redis-benchmark running the very command the limiter sends
//     (captured with MONITOR from one decision) with -c RedisCallers and
//     random keys over the same number of clients, in the same run.
//
// The store runs with the refusal cache off and FailClosed, so that every
// decision is Redis's and a failure is an error, not a local decision, and
// with --http-timeout as its timeout.

// redisMemPerClient is the requests per client of the memory measure's
// second population.
const redisMemPerClient = 10

// redisEngineReport is the engine-style phase against one deployment.
type redisEngineReport struct {
	Callers int `json:"callers"`
	// Stopped is set when --redis-engine-duration ended the phase before
	// RedisRequests decisions.
	Stopped    bool    `json:"stopped_by_time"`
	Decisions  int64   `json:"decisions"`
	Allowed    int64   `json:"allowed"`
	Refused    int64   `json:"refused"`
	Errors     int     `json:"errors"`
	DurationNs int64   `json:"duration_ns"`
	Throughput float64 `json:"decisions_per_sec"`
	// Latency is over every decision (Decide's round trip).
	Latency      latency.Summary `json:"latency"`
	Verification verification    `json:"verification"`
}

// redisMemoryReport is Redis's memory for a populated key space.
type redisMemoryReport struct {
	Clients   int `json:"clients"`
	PerClient int `json:"per_client"`
	// Bytes1 and BytesL are used_memory's growth after one request per
	// client and after PerClient.
	Bytes1 int64 `json:"bytes_1"`
	BytesL int64 `json:"bytes_L"`
	// Keys is DBSIZE's growth after one request per client: the log keeps
	// a one-request client as a field of its slot's bucket (a hash shared by
	// the policy's clients in that slot), so it counts buckets, up to
	// 16,384 per policy; the counter makes one key per client.
	Keys int64 `json:"keys"`
	// PerKey is Bytes1 / Clients: a client holding one entry. PerEntry is
	// BytesL over the entries stored (Clients × PerClient), the key's
	// share included; Added is the growth from 1 to PerClient entries per
	// key, per added entry (Redis strings grow by preallocation, so it
	// can be small).
	PerKey   float64 `json:"per_key"`
	PerEntry float64 `json:"per_entry"`
	Added    float64 `json:"added_per_entry"`
}

// redisScriptReport is INFO commandstats' FCALL and EVALSHA figures over the engine-style
// phase, summed over the masters.
type redisScriptReport struct {
	Calls       int64   `json:"calls"`
	Usec        int64   `json:"usec"`
	UsecPerCall float64 `json:"usec_per_call"`
	// Share is the script's server time over the phase's wall time and
	// masters: how busy Redis was running it.
	Share float64 `json:"share"`
}

// redisBenchmarkReport is redis-benchmark on the limiter's own command.
type redisBenchmarkReport struct {
	Command  string  `json:"command"`
	Clients  int     `json:"clients"`
	Requests int64   `json:"requests"`
	RPS      float64 `json:"rps"`
	P50Ms    float64 `json:"p50_ms,omitempty"`
	// Ratio is the engine-style phase's decisions per second over
	// redis-benchmark's requests per second.
	Ratio float64  `json:"ratio"`
	Skip  string   `json:"skipped,omitempty"` // why it did not run
	args  []string // redis-benchmark's arguments, less -n
}

// redisDeployment is the redis phase against one deployment.
type redisDeployment struct {
	Name      string               `json:"name"` // "standalone" or "cluster"
	URL       string               `json:"url"`
	Masters   int                  `json:"masters"`
	Engine    redisEngineReport    `json:"engine"`
	Script    redisScriptReport    `json:"script"`
	Memory    redisMemoryReport    `json:"memory"`
	Benchmark redisBenchmarkReport `json:"benchmark"`
	HTTP      *httpReport          `json:"http,omitempty"`
	// Rounds are the target's rounds (redisrounds.go), RoundCalls the
	// calls of each pass; none when redis-benchmark did not run.
	Rounds     []turnRound `json:"rounds,omitempty"`
	RoundCalls int64       `json:"round_calls,omitempty"`
}

// redisReport is the redis phase's outcome.
type redisReport struct {
	Policy      policyReport      `json:"policy"`
	TimeoutNs   int64             `json:"timeout_ns"` // the stores' timeout
	Deployments []redisDeployment `json:"deployments"`
}

func redisTargets(cfg Config) string {
	var s []string
	if cfg.RedisAddr != "" {
		s = append(s, "Redis "+cfg.RedisAddr)
	}
	if cfg.RedisCluster != "" {
		s = append(s, "Redis Cluster "+cfg.RedisCluster)
	}
	return strings.Join(s, " and ")
}

// runRedis runs the redis phase against each deployment cfg names.
func runRedis(ctx context.Context, cfg Config, u *ui, prof *profiler) (*redisReport, error) {
	rep := &redisReport{Policy: policyInfo(cfg.policy(0)), TimeoutNs: int64(cfg.Timeout)}
	type dep struct{ name, url string }
	var deps []dep
	if cfg.RedisAddr != "" {
		deps = append(deps, dep{"standalone", "redis://" + cfg.RedisAddr})
	}
	if cfg.RedisCluster != "" {
		deps = append(deps, dep{"cluster", "redis-cluster://" + strings.ReplaceAll(cfg.RedisCluster, " ", "")})
	}
	for _, d := range deps {
		rd, err := runRedisDeployment(ctx, cfg, u, d.name, d.url)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", d.name, err)
		}
		rep.Deployments = append(rep.Deployments, *rd)
	}
	prof.heap(ModeRedis)
	return rep, nil
}

// storeOptions are the redisstore options of every store the phase opens.
// The timeout is --http-timeout (5 s), not redisstore's 50 ms default: on
// a loaded machine a slow answer should show as latency, not as a failure
// that a fail-closed store turns into an error.
func storeOptions(prefix string, timeout time.Duration) []redisstore.Option {
	return []redisstore.Option{
		redisstore.WithKeyPrefix(prefix),
		redisstore.WithTimeout(timeout),
		redisstore.WithRefusalCache(0),
		redisstore.WithFailurePolicy(redisstore.FailClosed),
	}
}

func runRedisDeployment(ctx context.Context, cfg Config, u *ui, name, url string) (*redisDeployment, error) {
	rd := &redisDeployment{Name: name, URL: url}
	addrs := strings.Split(strings.TrimPrefix(strings.TrimPrefix(url, "redis-cluster://"), "redis://"), ",")
	admin, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: addrs, DisableCache: true, ForceSingleClient: name == "standalone"})
	if err != nil {
		return nil, fmt.Errorf("admin connection: %w", err)
	}
	defer admin.Close()
	rd.Masters = len(admin.Nodes())
	// Keys of this run only: a prefix no other run uses.
	prefix := fmt.Sprintf("sg-loadtest-%d:", time.Now().UnixNano())
	st, err := redisstore.Open(url, storeOptions(prefix, cfg.Timeout)...)
	if err != nil {
		return nil, err
	}
	defer st.Close() // the store owns the limiters it makes
	pol := cfg.policy(0)
	lims, err := st.Limiters([]engine.Policy{pol, memPolicy(cfg)})
	if err != nil {
		return nil, err
	}
	lim, memLim := lims[0], lims[1]

	// Memory first, on a quiet key space: the later phases' keys expire
	// (TTL W + 1 ms) for a while after them, which would move used_memory
	// under the measure.
	rd.Memory, err = redisMemory(ctx, cfg, u, name, admin, memLim)
	if err != nil {
		return nil, err
	}
	script, err := scriptDuring(ctx, admin, func() (err error) {
		rd.Engine, err = redisEngine(ctx, cfg, u, name, lim, pol)
		return err
	})
	if err != nil {
		return nil, err
	}
	rd.Script.Calls, rd.Script.Usec = script.calls, script.usec
	if rd.Script.Calls > 0 {
		rd.Script.UsecPerCall = float64(rd.Script.Usec) / float64(rd.Script.Calls)
	}
	if rd.Engine.DurationNs > 0 && rd.Masters > 0 {
		rd.Script.Share = float64(rd.Script.Usec) * 1e3 / float64(rd.Engine.DurationNs) / float64(rd.Masters)
	}

	rd.Benchmark = redisBenchmark(ctx, cfg, name, addrs, lim, rd.Engine.Throughput)
	if rd.Benchmark.Skip == "" && rd.Benchmark.args != nil {
		rd.RoundCalls = max(1, cfg.RedisRequests/4)
		if rd.Rounds, err = runRedisRounds(ctx, cfg, admin, lim, rd.Benchmark.args, rd.RoundCalls); err != nil {
			return nil, err
		}
	}

	rd.HTTP, err = redisHTTP(ctx, cfg, u, name, url, prefix+"http:")
	if err != nil {
		return nil, err
	}
	return rd, nil
}

// redisEngine is the engine-style phase: cfg.RedisRequests decisions from
// cfg.RedisCallers goroutines over cfg.Clients keys.
func redisEngine(ctx context.Context, cfg Config, u *ui, name string, lim *redisstore.Limiter, pol engine.Policy) (redisEngineReport, error) {
	r := redisEngineReport{Callers: cfg.RedisCallers}
	per := splitCount(cfg.RedisRequests, cfg.RedisCallers)
	seqs := make([][]uint32, cfg.RedisCallers)
	costs := make([][]uint32, cfg.RedisCallers)
	for w := range cfg.RedisCallers {
		ch, _ := keydist.NewChooser(cfg.Dist, cfg.Clients, cfg.ZipfS, cfg.Seed, uint64(w))
		seqs[w], costs[w] = make([]uint32, per[w]), make([]uint32, per[w])
		for i := range seqs[w] {
			seqs[w][i], costs[w][i] = uint32(ch.Next()), uint32(ch.Cost(cfg.MaxCost))
		}
	}
	keys := map[uint32]string{}
	for _, s := range seqs {
		for _, k := range s {
			if _, ok := keys[k]; !ok {
				keys[k] = clientKey(int(k))
			}
		}
	}
	// The time bound stops the callers between decisions; a decision in
	// flight runs on the run's context, so that the bound cuts none.
	tctx, cancel := context.WithTimeout(ctx, cfg.RedisEngineMax)
	defer cancel()
	recs := make([][]record, cfg.RedisCallers)
	hists := make([]latency.Histogram, cfg.RedisCallers)
	errs := make([]int, cfg.RedisCallers)
	var firstErr atomic.Value
	var done atomic.Int64
	bar := u.bar(cfg.RedisRequests, "redis "+name+": decisions", &done)
	var wg sync.WaitGroup
	start := time.Now()
	for w := range cfg.RedisCallers {
		wg.Go(func() {
			rs := make([]record, 0, len(seqs[w]))
			h := &hists[w]
			for i, k := range seqs[w] {
				if i&63 == 0 && tctx.Err() != nil {
					break
				}
				cost := int(costs[w][i])
				t0 := time.Now()
				d, err := lim.Decide(ctx, keys[k], cost)
				h.Record(int64(time.Since(t0)))
				if err != nil {
					errs[w]++
					firstErr.CompareAndSwap(nil, err.Error())
					continue
				}
				rs = append(rs, makeRecord(0, k, cost, d))
				done.Add(1)
			}
			recs[w] = rs
		})
	}
	wg.Wait()
	el := time.Since(start)
	bar.finish()
	if err := ctx.Err(); err != nil {
		return r, err
	}
	var all []record
	var h latency.Histogram
	for w := range cfg.RedisCallers {
		all = append(all, recs[w]...)
		h.Merge(&hists[w])
		r.Errors += errs[w]
	}
	for i := range all {
		if all[i].Allowed {
			r.Allowed++
		}
	}
	r.Decisions = int64(len(all))
	r.Refused = r.Decisions - r.Allowed
	r.Stopped = r.Decisions+int64(r.Errors) < cfg.RedisRequests
	r.DurationNs = int64(el)
	r.Throughput = float64(r.Decisions) / el.Seconds()
	r.Latency = h.Summary()
	if !cfg.Verify {
		r.Verification = verification{Reason: "--verify=false"}
		return r, nil
	}
	var groups atomic.Int64
	vbar := u.bar(verifyBuckets, "redis "+name+": verify", &groups)
	r.Verification = verifyProgress([]engine.Policy{pol}, all, func(i uint32) string { return clientKey(int(i)) }, &groups)
	vbar.finish()
	if e, ok := firstErr.Load().(string); ok && r.Errors > 0 {
		r.Verification.Examples = append(r.Verification.Examples, "first error: "+e)
	}
	return r, nil
}

type cmdStat struct{ calls, usec int64 }

// cmdstatLine matches the script calls' line: FCALL where the store runs
// Redis Functions, EVALSHA where it does not.
var cmdstatLine = regexp.MustCompile(`(?m)^cmdstat_(?:evalsha|fcall):calls=(\d+),usec=(\d+),`)

// scriptDuring runs phase and returns the script calls' calls and
// microseconds over the masters while it ran (commandStats before and
// after it).
func scriptDuring(ctx context.Context, c rueidis.Client, phase func() error) (cmdStat, error) {
	before, err := commandStats(ctx, c)
	if err == nil {
		err = phase()
	}
	if err != nil {
		return cmdStat{}, err
	}
	after, err := commandStats(ctx, c)
	return cmdStat{after.calls - before.calls, after.usec - before.usec}, err
}

// commandStats sums the script calls' calls and microseconds over the
// masters.
func commandStats(ctx context.Context, c rueidis.Client) (cmdStat, error) {
	var s cmdStat
	for addr, n := range c.Nodes() {
		info, err := n.Do(ctx, n.B().Info().Section("commandstats").Build()).ToString()
		if err != nil {
			return s, fmt.Errorf("INFO commandstats on %s: %w", addr, err)
		}
		for _, m := range cmdstatLine.FindAllStringSubmatch(info, -1) {
			calls, _ := strconv.ParseInt(m[1], 10, 64)
			usec, _ := strconv.ParseInt(m[2], 10, 64)
			s.calls += calls
			s.usec += usec
		}
	}
	return s, nil
}

var usedMemoryLine = regexp.MustCompile(`(?m)^used_memory:(\d+)`)

// usedMemory sums used_memory and DBSIZE over the masters.
func usedMemory(ctx context.Context, c rueidis.Client) (bytes, keys int64, err error) {
	for addr, n := range c.Nodes() {
		info, err := n.Do(ctx, n.B().Info().Section("memory").Build()).ToString()
		if err != nil {
			return 0, 0, fmt.Errorf("INFO memory on %s: %w", addr, err)
		}
		m := usedMemoryLine.FindStringSubmatch(info)
		if m == nil {
			return 0, 0, fmt.Errorf("INFO memory on %s: no used_memory", addr)
		}
		b, _ := strconv.ParseInt(m[1], 10, 64)
		k, err := n.Do(ctx, n.B().Dbsize().Build()).AsInt64()
		if err != nil {
			return 0, 0, fmt.Errorf("DBSIZE on %s: %w", addr, err)
		}
		bytes += b
		keys += k
	}
	return bytes, keys, nil
}

// memPolicy is the memory measure's policy: a one-hour window, so that
// nothing expires while it is measured.
func memPolicy(cfg Config) engine.Policy {
	return engine.Policy{Name: "mem", Limit: max(cfg.Limit, redisMemPerClient), Window: time.Hour}
}

// redisMemory populates cfg.RedisMemClient clients through lim (of
// memPolicy), measures, and deletes their keys.
func redisMemory(ctx context.Context, cfg Config, u *ui, name string, admin rueidis.Client, lim *redisstore.Limiter) (redisMemoryReport, error) {
	m := redisMemoryReport{Clients: cfg.RedisMemClient, PerClient: redisMemPerClient}
	b0, k0, err := usedMemory(ctx, admin)
	if err != nil {
		return m, err
	}
	defer func() {
		// Delete what was populated, in pipelined batches.
		for lo := 0; lo < m.Clients; lo += 1000 {
			var cmds rueidis.Commands
			for i := lo; i < min(lo+1000, m.Clients); i++ {
				cmds = append(cmds, admin.B().Del().Key(lim.Key(clientKey(i))).Build())
			}
			admin.DoMulti(context.Background(), cmds...)
		}
	}()
	tctx, cancel := context.WithTimeout(ctx, cfg.RedisEngineMax)
	defer cancel()
	populate := func(n int, desc string) error {
		var done atomic.Int64
		bar := u.bar(int64(m.Clients*n), desc, &done)
		defer bar.finish()
		var wg sync.WaitGroup
		var failed atomic.Int64
		var first atomic.Value
		for w := range cfg.RedisCallers {
			wg.Go(func() {
				for c := w; c < m.Clients && tctx.Err() == nil; c += cfg.RedisCallers {
					k := clientKey(c)
					for range n {
						if _, err := lim.Decide(ctx, k, 1); err != nil {
							failed.Add(1)
							first.CompareAndSwap(nil, err)
						}
					}
					done.Add(int64(n))
				}
			})
		}
		wg.Wait()
		if failed.Load() > 0 {
			return fmt.Errorf("populating: %d decisions failed, first: %w", failed.Load(), first.Load().(error))
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		if tctx.Err() != nil {
			return fmt.Errorf("populating %d clients took more than --redis-engine-duration %v", m.Clients, cfg.RedisEngineMax)
		}
		return nil
	}
	if err := populate(1, "redis "+name+": memory, 1 request"); err != nil {
		return m, err
	}
	b1, k1, err := usedMemory(ctx, admin)
	if err != nil {
		return m, err
	}
	if err := populate(redisMemPerClient-1, fmt.Sprintf("redis %s: memory, %d requests", name, redisMemPerClient)); err != nil {
		return m, err
	}
	bL, _, err := usedMemory(ctx, admin)
	if err != nil {
		return m, err
	}
	m.Bytes1, m.BytesL, m.Keys = b1-b0, bL-b0, k1-k0
	m.PerKey = float64(m.Bytes1) / float64(m.Clients)
	m.PerEntry = float64(m.BytesL) / float64(m.Clients*redisMemPerClient)
	m.Added = float64(bL-b1) / float64(m.Clients*(redisMemPerClient-1))
	return m, nil
}

// redisHTTP attacks slidegate's server on the Redis store.
func redisHTTP(ctx context.Context, cfg Config, u *ui, name, url, prefix string) (*httpReport, error) {
	policies := cfg.policies()
	rep := &httpReport{StatusCodes: map[string]int{}, InProcess: true}
	for _, p := range policies {
		rep.Policies = append(rep.Policies, policyInfo(p))
	}
	var rec *recorder
	if cfg.Verify {
		rec = newRecorder(cfg.Tiers, cfg.Clients, int(cfg.MaxRecords))
	}
	open := redisfactory.New(storeOptions(prefix, cfg.Timeout)...)
	factory := func(ctx context.Context, spec server.StoreSpec) (server.Store, error) {
		st, err := open(ctx, spec)
		if err != nil {
			return server.Store{}, err
		}
		// Every decision goes through a recording backend: no group over
		// the limiters underneath.
		st.Backends, st.Group = wrapRecording(st.Backends, rec), nil
		return st, nil
	}
	scheme := strings.SplitN(url, "://", 2)[0]
	tg, err := startSlidegate(policies, url, map[string]server.StoreFactory{scheme: factory})
	if err != nil {
		return nil, err
	}
	defer tg.close()
	rep.Target = tg.base + " (store " + url + ")"
	rep.Pacing = fmt.Sprintf("constant %d/s", cfg.RedisRate)
	rep.TargetRate = float64(cfg.RedisRate)
	rep.Results = filepath.Join(cfg.Out, "redis-"+name+"-http-results.bin")
	maxHits := uint64(float64(cfg.RedisRate)*cfg.RedisDuration.Seconds()) + 1
	a := attack{base: tg.base, policies: policies, pacer: vegeta.ConstantPacer{Freq: cfg.RedisRate, Per: time.Second},
		dur: cfg.RedisDuration, maxHits: maxHits, name: "redis " + name + " http"}
	res, err := attackToFile(ctx, cfg, a, rep.Results, u)
	if err != nil {
		return nil, err
	}
	res.fill(rep)
	rep.Verification, rep.Decisions, rep.Disagreement = verifyServer(u, "redis "+name+" http", policies, rec, res, cfg)
	return rep, nil
}

// redisBenchmark runs redis-benchmark on the command the limiter sends,
// captured with MONITOR, at the same concurrency and key count.
func redisBenchmark(ctx context.Context, cfg Config, name string, addrs []string, lim *redisstore.Limiter, ours float64) redisBenchmarkReport {
	b := redisBenchmarkReport{Clients: cfg.RedisCallers, Requests: cfg.RedisRequests}
	if _, err := exec.LookPath("redis-benchmark"); err != nil {
		b.Skip = "redis-benchmark is not installed (apt-get install redis-tools)"
		return b
	}
	const probe = "loadtest-probe"
	args, host, err := captureCommand(ctx, addrs, func() error {
		_, err := lim.Decide(ctx, probe, 1)
		return err
	}, lim.Key(probe))
	if err != nil {
		b.Skip = "capturing the limiter's command: " + err.Error()
		return b
	}
	args = benchmarkArgs(args, lim.Key(probe), probe, name == "cluster")
	h, p, _ := net.SplitHostPort(host)
	cmd := []string{"-h", h, "-p", p, "-c", strconv.Itoa(cfg.RedisCallers), "-r", strconv.Itoa(cfg.Clients), "-q"}
	if name == "cluster" {
		cmd = append(cmd, "--cluster")
	}
	cmd = append(cmd, args...)
	b.args = cmd
	cmd = append([]string{"-n", strconv.FormatInt(cfg.RedisRequests, 10)}, cmd...)
	b.Command = "redis-benchmark " + strings.Join(cmd, " ")
	bctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	out, err := exec.CommandContext(bctx, "redis-benchmark", cmd...).CombinedOutput()
	if err != nil {
		b.Skip = fmt.Sprintf("redis-benchmark: %v: %s", err, lastLine(string(out)))
		return b
	}
	m := rpsLine.FindAllStringSubmatch(string(out), -1)
	if m == nil {
		b.Skip = "redis-benchmark printed no rate: " + lastLine(string(out))
		return b
	}
	last := m[len(m)-1]
	b.RPS, _ = strconv.ParseFloat(last[1], 64)
	if last[2] != "" {
		b.P50Ms, _ = strconv.ParseFloat(last[2], 64)
	}
	if b.RPS > 0 {
		b.Ratio = ours / b.RPS
	}
	return b
}

// benchmarkArgs turns the script call (FCALL or EVALSHA, which take their
// keys alike) captured for the probe client into
// redis-benchmark's arguments: the client's own key (prefix{T}probe), its
// bucket (bucket prefix{T}, when the command names one) and the client key
// itself (the last argument) become random over the run's clients. In a
// cluster redis-benchmark replaces {tag} with a tag of the node it sends to,
// so both keys of one command stay in one slot; there every client of a
// node shares that node's one bucket (which then fills, and clients beyond
// its bound keep their own keys), where the limiter spreads them over a
// bucket per slot. redis-benchmark draws each __rand_int__ on its own, so a
// command's key and field are not the same client: the script's work per
// call is what is compared, not one client's history.
func benchmarkArgs(args []string, ownKey, probe string, cluster bool) []string {
	withTag := strings.TrimSuffix(ownKey, probe) // prefix{T}
	i := strings.LastIndexByte(withTag, '{')
	if i < 0 {
		return args
	}
	prefix, tag := withTag[:i], withTag[i:] // prefix, {T}
	own, bucketTag := prefix+"{__rand_int__}", "{__rand_int__}"
	if cluster {
		own, bucketTag = prefix+"{tag}__rand_int__", "{tag}"
	}
	out := append([]string(nil), args...)
	keys := 0
	if len(out) > 2 {
		keys, _ = strconv.Atoi(out[2])
	}
	for j := 3; j < len(out) && j < 3+keys; j++ {
		switch {
		case out[j] == ownKey:
			out[j] = own
		case strings.HasSuffix(out[j], tag):
			out[j] = strings.TrimSuffix(out[j], tag) + bucketTag
		}
	}
	if keys == 2 && out[len(out)-1] == probe {
		out[len(out)-1] = "__rand_int__"
	}
	return out
}

var rpsLine = regexp.MustCompile(`([0-9.]+) requests per second(?:, p50=([0-9.]+) msec)?`)

func lastLine(s string) string {
	s = strings.TrimSpace(strings.ReplaceAll(s, "\r", "\n"))
	if i := strings.LastIndexByte(s, '\n'); i >= 0 {
		s = s[i+1:]
	}
	return s
}

// captureCommand runs do while MONITOR watches each address, and returns
// the arguments of the first script call (FCALL or EVALSHA) naming key and
// the address that
// served it.
func captureCommand(ctx context.Context, addrs []string, do func() error, key string) ([]string, string, error) {
	type found struct {
		args []string
		addr string
	}
	ch := make(chan found, len(addrs))
	var conns []net.Conn
	var wg sync.WaitGroup
	// Closing the connections ends the readers' ReadString; then wait
	// for them.
	defer func() {
		for _, c := range conns {
			_ = c.Close()
		}
		wg.Wait()
	}()
	for _, a := range addrs {
		c, err := (&net.Dialer{Timeout: 3 * time.Second}).DialContext(ctx, "tcp", a)
		if err != nil {
			return nil, "", err
		}
		conns = append(conns, c)
		_ = c.SetDeadline(time.Now().Add(5 * time.Second))
		if _, err := c.Write([]byte("MONITOR\r\n")); err != nil {
			return nil, "", err
		}
		r := bufio.NewReader(c)
		if l, err := r.ReadString('\n'); err != nil || !strings.HasPrefix(l, "+OK") {
			return nil, "", fmt.Errorf("MONITOR on %s: %q %v", a, l, err)
		}
		wg.Go(func() {
			for {
				l, err := r.ReadString('\n')
				if err != nil {
					return
				}
				args := monitorArgs(l)
				if len(args) > 3 && (strings.EqualFold(args[0], "EVALSHA") || strings.EqualFold(args[0], "FCALL")) && args[3] == key {
					ch <- found{args, a}
					return
				}
			}
		})
	}
	if err := do(); err != nil {
		return nil, "", err
	}
	select {
	case f := <-ch:
		return f.args, f.addr, nil
	case <-time.After(5 * time.Second):
		return nil, "", errors.New("MONITOR saw no script call for the probe key")
	}
}

// monitorArgs parses a MONITOR line: `+1700000000.000000 [0 addr] "A" "B"`.
func monitorArgs(line string) []string {
	i := strings.IndexByte(line, ']')
	if i < 0 {
		return nil
	}
	var out []string
	s := line[i+1:]
	for {
		j := strings.IndexByte(s, '"')
		if j < 0 {
			return out
		}
		s = s[j+1:]
		var b strings.Builder
		k := 0
		for ; k < len(s) && s[k] != '"'; k++ {
			if s[k] == '\\' && k+1 < len(s) {
				k++
				switch s[k] {
				case 'n':
					b.WriteByte('\n')
				case 'r':
					b.WriteByte('\r')
				case 't':
					b.WriteByte('\t')
				case 'x':
					if k+2 < len(s) {
						v, _ := strconv.ParseUint(s[k+1:k+3], 16, 8)
						b.WriteByte(byte(v))
						k += 2
					}
				default:
					b.WriteByte(s[k])
				}
				continue
			}
			b.WriteByte(s[k])
		}
		out = append(out, b.String())
		if k >= len(s) {
			return out
		}
		s = s[k+1:]
	}
}

// writeText writes the redis section of the summary.
func (r *redisReport) writeText(p func(string, ...any)) {
	for _, d := range r.Deployments {
		e := d.Engine
		p("")
		p("redis     %s (%s, %d master(s)); policy %s %d per %v (%s); refusal cache off, fail closed, timeout %v",
			d.Name, d.URL, d.Masters, r.Policy.Name, r.Policy.Limit, time.Duration(r.Policy.WindowNs), r.Policy.Algorithm, time.Duration(r.TimeoutNs))
		stop := ""
		if e.Stopped {
			stop = " (stopped by --redis-engine-duration)"
		}
		p("  engine-style: %s decisions from %d callers in %.2f s = %s decisions/s; allowed %s, refused %s, errors %d%s",
			commas(e.Decisions), e.Callers, time.Duration(e.DurationNs).Seconds(), si(e.Throughput), commas(e.Allowed), commas(e.Refused), e.Errors, stop)
		p("    latency (every decision): %s", fmtLatency(e.Latency))
		p("    script on the server (INFO commandstats, FCALL or EVALSHA): %s calls for %s decisions (decisions queued behind a call share one), %.2f µs per call, %.0f%% of the phase's time per master",
			commas(d.Script.Calls), commas(e.Decisions), d.Script.UsecPerCall, 100*d.Script.Share)
		p("    verify (instants from Redis TIME): %s", fmtVerification(e.Verification))
		if b := d.Benchmark; b.Skip != "" {
			p("  redis-benchmark: skipped: %s", b.Skip)
		} else {
			p("  redis-benchmark, same command, -c %d: %s requests/s (p50 %.3f ms); the limiter made %.2f× that", b.Clients, si(b.RPS), b.P50Ms, b.Ratio)
			p("    %s", b.Command)
		}
		writeRedisRounds(p, d)
		m := d.Memory
		p("  memory (INFO memory, used_memory over the masters, %s clients, DBSIZE +%s): %.1f B per client holding 1 entry; %.1f B per entry at %d per key (key included); %.1f B per entry added from 1 to %d",
			commas(int64(m.Clients)), commas(m.Keys), m.PerKey, m.PerEntry, m.PerClient, m.Added, m.PerClient)
		if h := d.HTTP; h != nil {
			p("  http: %s, %s for %v: %s requests at %.1f/s; allowed %s, refused %s, errors %d",
				h.Target, h.Pacing, time.Duration(h.DurationNs).Round(time.Millisecond), commas(int64(h.Requests)), h.Rate,
				commas(h.Allowed), commas(h.Refused), h.Errors)
			p("    latency (vegeta): %s", fmtVegetaLatency(h.Latency))
			p("    results: %s", h.Results)
			p("    verify (%s decisions recorded at the backends): %s", commas(int64(h.Decisions)), fmtVerification(h.Verification))
			if h.Disagreement != "" {
				p("    DISAGREEMENT: %s", h.Disagreement)
			}
		}
	}
}
