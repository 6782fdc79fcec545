package loadtest

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/slidegate/slidegate/engine"
	"github.com/slidegate/slidegate/redisstore"
)

// TestRedisPhase runs the redis phase small against the real Redis and
// Redis Cluster that scripts/redis-env.sh starts (make test), checking
// that every decision was verified with Redis's instants and that each
// figure was measured.
func TestRedisPhase(t *testing.T) {
	addr, cluster := os.Getenv("SLIDEGATE_REDIS_ADDR"), os.Getenv("SLIDEGATE_REDIS_CLUSTER_ADDRS")
	if addr == "" || cluster == "" {
		t.Skip("SLIDEGATE_REDIS_ADDR / SLIDEGATE_REDIS_CLUSTER_ADDRS unset: run under scripts/redis-env.sh (make test does)")
	}
	cfg := DefaultConfig()
	cfg.Modes = []string{ModeRedis}
	cfg.RedisAddr, cfg.RedisCluster = addr, cluster
	cfg.Clients, cfg.Limit, cfg.MaxCost = 500, 5, 2
	cfg.RedisRequests, cfg.RedisCallers, cfg.RedisMemClient = 3000, 8, 300
	cfg.RedisRate, cfg.RedisDuration = 200, 500*time.Millisecond
	cfg.Out, cfg.Progress = t.TempDir(), "off"
	var out bytes.Buffer
	rep, err := run(context.Background(), cfg, &out)
	if err != nil {
		t.Fatal(err)
	}
	if !rep.OK || rep.Redis == nil || len(rep.Redis.Deployments) != 2 {
		t.Fatalf("ok=%v %s\n%s", rep.OK, rep.Verdict, out.String())
	}
	for _, d := range rep.Redis.Deployments {
		e := d.Engine
		if e.Decisions != 3000 || e.Errors != 0 || !e.Verification.OK() || e.Verification.Records != 3000 || e.Allowed == 0 || e.Refused == 0 {
			t.Errorf("%s engine-style %+v", d.Name, e)
		}
		// The script calls are INFO commandstats' counts, server-wide:
		// redisstore's tests run their own calls on these servers at the
		// same time, so the count has no upper bound here (redisstore's
		// TestBatchExactUnderStress checks that queued decisions share
		// calls). It must show this phase's calls, with their time.
		if d.Script.Calls < 1 || d.Script.UsecPerCall <= 0 {
			t.Errorf("%s script %+v for %d decisions", d.Name, d.Script, e.Decisions)
		}
		// The figures themselves move with whatever else uses this
		// Redis (make test runs redisstore's tests beside these): check
		// that they were measured and put together right.
		if m := d.Memory; m.Clients != 300 || m.Keys == 0 || m.PerKey != float64(m.Bytes1)/300 || m.PerEntry != float64(m.BytesL)/3000 {
			t.Errorf("%s memory %+v", d.Name, d.Memory)
		}
		if b := d.Benchmark; b.Skip == "" && (b.RPS <= 0 || !strings.Contains(b.Command, "FCALL") && !strings.Contains(b.Command, "EVALSHA")) {
			t.Errorf("%s redis-benchmark %+v", d.Name, b)
		}
		// The target's rounds ran where redis-benchmark did: the store
		// and redis-benchmark in turn, Redis's CPU measured over each.
		if d.Benchmark.Skip == "" {
			if len(d.Rounds) < minJudgeRounds || len(d.Rounds) > 2*minJudgeRounds || d.RoundCalls != 750 {
				t.Errorf("%s rounds %+v (%d calls)", d.Name, d.Rounds, d.RoundCalls)
			}
			for _, rd := range d.Rounds {
				if !(rd.Slidegate > 0) || !(rd.Reference > 0) || rd.Errors != 0 {
					t.Errorf("%s round %+v", d.Name, rd)
				}
			}
			found := false
			for _, tg := range rep.Targets {
				found = found || strings.HasPrefix(tg.Name, "redis "+d.Name+":") && len(tg.Spread.Rounds) == len(d.Rounds)
			}
			if !found {
				t.Errorf("%s: no target judged on the rounds: %+v", d.Name, rep.Targets)
			}
		}
		h := d.HTTP
		if h == nil || h.Requests == 0 || h.Errors != 0 || h.Decisions != int(h.Requests) || !h.Verification.OK() {
			t.Errorf("%s http %+v", d.Name, h)
		}
	}
	wantMasters := map[string]int{"standalone": 1, "cluster": 3}
	for _, d := range rep.Redis.Deployments {
		if d.Masters != wantMasters[d.Name] {
			t.Errorf("%s: %d masters", d.Name, d.Masters)
		}
	}
}

// TestRedisEngineDuration checks that --redis-engine-duration cuts the
// engine-style phase short. The count bound (--redis-requests) is set far
// beyond what the time bound lets a few callers make on loopback, so the
// phase can only end on the duration: it must report that it stopped by
// time, with fewer decisions than asked, every one of them verified. A
// phase that ignored the bound would make them all and report
// stopped_by_time false.
func TestRedisEngineDuration(t *testing.T) {
	addr := os.Getenv("SLIDEGATE_REDIS_ADDR")
	if addr == "" {
		t.Skip("SLIDEGATE_REDIS_ADDR unset: run under scripts/redis-env.sh (make test does)")
	}
	cfg := DefaultConfig()
	cfg.Clients, cfg.Limit, cfg.MaxCost = 500, 5, 2
	cfg.RedisCallers = 4
	cfg.RedisRequests = 2_000_000
	cfg.RedisEngineMax = 200 * time.Millisecond
	st, err := redisstore.Open("redis://"+addr, storeOptions(fmt.Sprintf("sg-loadtest-duration-%d:", time.Now().UnixNano()), cfg.Timeout)...)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	pol := cfg.policy(0)
	lims, err := st.Limiters([]engine.Policy{pol})
	if err != nil {
		t.Fatal(err)
	}
	e, err := redisEngine(context.Background(), cfg, newUI("off", io.Discard), "standalone", lims[0], pol)
	if err != nil {
		t.Fatal(err)
	}
	if !e.Stopped || e.Decisions == 0 || e.Decisions+int64(e.Errors) >= cfg.RedisRequests {
		t.Fatalf("stopped by time %v after %d decisions and %d errors of %d: want stopped by the duration, short of the count",
			e.Stopped, e.Decisions, e.Errors, cfg.RedisRequests)
	}
	if e.Errors != 0 || !e.Verification.OK() || e.Verification.Records != int(e.Decisions) || e.Allowed+e.Refused != e.Decisions {
		t.Errorf("engine-style %+v", e)
	}
	var sb strings.Builder
	(&redisReport{Deployments: []redisDeployment{{Name: "standalone", Engine: e}}}).writeText(func(f string, a ...any) { fmt.Fprintf(&sb, f+"\n", a...) })
	if !strings.Contains(sb.String(), "(stopped by --redis-engine-duration)") {
		t.Errorf("summary does not say the duration stopped the phase:\n%s", sb.String())
	}
}

// TestBenchmarkArgs checks the command redis-benchmark replays: the probe's
// own key, bucket and field become random clients, keeping both keys in
// one slot in a cluster, and nothing else changes.
func TestBenchmarkArgs(t *testing.T) {
	const probe = "loadtest-probe"
	own := "slidegate:free:{abc}" + probe
	captured := []string{"EVALSHA", "sha1", "2", own, "slidegate:free:1{abc}", "1", "-1", "60000", "100", probe}
	cases := []struct {
		cluster bool
		want    []string
	}{
		{false, []string{"EVALSHA", "sha1", "2", "slidegate:free:{__rand_int__}", "slidegate:free:1{__rand_int__}", "1", "-1", "60000", "100", "__rand_int__"}},
		{true, []string{"EVALSHA", "sha1", "2", "slidegate:free:{tag}__rand_int__", "slidegate:free:1{tag}", "1", "-1", "60000", "100", "__rand_int__"}},
	}
	for _, c := range cases {
		got := benchmarkArgs(captured, own, probe, c.cluster)
		if !slices.Equal(got, c.want) {
			t.Errorf("cluster %v:\n got %q\nwant %q", c.cluster, got, c.want)
		}
	}
	// A one-key command (the counter, or a client kept in its own key)
	// has no bucket and no field argument to replace.
	one := []string{"EVALSHA", "sha1", "1", own, "1", "-1", "60000", "100"}
	got := benchmarkArgs(one, own, probe, false)
	want := []string{"EVALSHA", "sha1", "1", "slidegate:free:{__rand_int__}", "1", "-1", "60000", "100"}
	if !slices.Equal(got, want) {
		t.Errorf("one key:\n got %q\nwant %q", got, want)
	}
	if captured[3] != own {
		t.Error("benchmarkArgs changed its input")
	}
}
