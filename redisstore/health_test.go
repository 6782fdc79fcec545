package redisstore

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/rueidis"
	"github.com/slidegate/slidegate/engine"
)

// overfill writes 20,000 junk keys with TTLs (about 3 MB), then sets
// maxmemory 1 MB below the memory in use: every later write finds the
// server over its limit.
func overfill(t *testing.T, c rueidis.Client) {
	t.Helper()
	ctx := context.Background()
	for i := range 20 {
		cmds := make(rueidis.Commands, 1000)
		for j := range cmds {
			cmds[j] = c.B().Set().Key(fmt.Sprintf("junk:%d:%d", i, j)).Value(strings.Repeat("x", 100)).Ex(time.Hour).Build()
		}
		for _, r := range c.DoMulti(ctx, cmds...) {
			if err := r.Error(); err != nil {
				t.Fatal(err)
			}
		}
	}
	used, _ := strconv.Atoi(infoField(t, c, "used_memory"))
	if err := c.Do(ctx, c.B().ConfigSet().ParameterValue().ParameterValue("maxmemory", strconv.Itoa(used-1<<20)).Build()).Error(); err != nil {
		t.Fatal(err)
	}
}

func infoField(t *testing.T, c rueidis.Client, field string) string {
	t.Helper()
	s, err := c.Do(context.Background(), c.B().Info().Build()).ToString()
	if err != nil {
		t.Fatal(err)
	}
	return infoFields(s)[field]
}

// TestEvictionPolicy: a server that may evict limiter keys is refused at
// Open (every key has a TTL, so volatile-* evicts them too), unless
// eviction is accepted explicitly: then Open warns and the evictions seen
// are counted. A noeviction server at its memory limit fails loudly: the
// script is refused with OOM and the failure policy decides.
func TestEvictionPolicy(t *testing.T) {
	p := engine.Policy{Name: "evict", Limit: 3, Window: time.Minute}
	for _, policy := range []string{"allkeys-lru", "volatile-ttl"} {
		srv := ownRedis(t, "--maxmemory-policy", policy)
		_, err := New("redis://"+srv.addr, p)
		if !errors.Is(err, ErrEvictionPolicy) || !strings.Contains(err.Error(), policy) {
			t.Fatalf("%s: %v, want ErrEvictionPolicy naming it", policy, err)
		}
		t.Logf("%s: %v", policy, err)
	}

	srv := ownRedis(t, "--maxmemory-policy", "allkeys-lru")
	var logs syncBuffer
	l := newTestLimiter(t, "redis://"+srv.addr, p, WithEvictionAllowed(), WithHealthInterval(50*time.Millisecond),
		WithLogger(slog.New(slog.NewTextHandler(&logs, nil))))
	if !strings.Contains(logs.String(), "may evict limiter keys") {
		t.Errorf("no warning at Open; log:\n%s", logs.String())
	}
	raw := rawClient(t, srv.addr)
	ctx := context.Background()
	for i := range 100 {
		if _, err := l.Decide(ctx, fmt.Sprintf("client-%d", i), 1); err != nil {
			t.Fatal(err)
		}
	}
	overfill(t, raw)
	raw.Do(ctx, raw.B().Set().Key("trigger").Value("x").Build()) // evicts
	if infoField(t, raw, "evicted_keys") == "0" {
		t.Fatal("the server evicted nothing")
	}
	waitFor(t, "the evictions to be counted", func() bool {
		return metricValue(l.st.m.evictions.WithLabelValues(srv.addr)) > 0
	})
	t.Logf("evictions counted: %v", metricValue(l.st.m.evictions.WithLabelValues(srv.addr)))

	// noeviction at the limit: the script is refused, not silently lost.
	full := ownRedis(t)
	lc := newTestLimiter(t, "redis://"+full.addr, p, WithFailurePolicy(FailClosed), WithBreaker(0, 0))
	overfill(t, rawClient(t, full.addr))
	_, err := lc.Decide(ctx, "newcomer", 1)
	if !errors.Is(err, ErrUnavailable) || !strings.Contains(err.Error(), "OOM") {
		t.Fatalf("decision on a full noeviction server: %v, want ErrUnavailable caused by OOM", err)
	}
	if got := metricValue(lc.st.m.errors.WithLabelValues("redis")); got != 1 {
		t.Errorf("redis errors counted %v, want 1", got)
	}
}

// TestRestartDetected: a server restarted without persistence comes back
// empty; the store sees its run id change, logs the keys it held before
// and after, and counts the restart.
func TestRestartDetected(t *testing.T) {
	srv := ownRedis(t)
	var logs syncBuffer
	p := engine.Policy{Name: "restarted", Limit: 3, Window: time.Minute}
	l := newTestLimiter(t, "redis://"+srv.addr, p, WithHealthInterval(50*time.Millisecond),
		WithLogger(slog.New(slog.NewTextHandler(&logs, nil))), WithDialTimeout(500*time.Millisecond))
	ctx := context.Background()
	for i := range 300 {
		if _, err := l.Decide(ctx, fmt.Sprintf("warm-%d", i), 1); err != nil {
			t.Fatal(err)
		}
	}
	if got := metricValue(l.st.m.restarts.WithLabelValues(srv.addr)); got != 0 {
		t.Fatalf("restarts %v before any restart", got)
	}
	time.Sleep(120 * time.Millisecond) // let a health check see the keys
	// 300 one-request clients are fields of their buckets: as many Redis
	// keys as distinct buckets.
	out, err := cli(srv.addr, "dbsize")
	if err != nil {
		t.Fatal(err)
	}
	before := strings.TrimSpace(out)
	if n, err := strconv.Atoi(before); err != nil || n < 250 || n > 300 {
		t.Fatalf("DBSIZE %q after 300 clients in 16,384 buckets", out)
	}
	srv.kill()
	if err := srv.start(); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the restart to be counted", func() bool {
		return metricValue(l.st.m.restarts.WithLabelValues(srv.addr)) == 1
	})
	out = logs.String()
	if !strings.Contains(out, "redis node restarted") || !strings.Contains(out, "keys_before="+before) || !strings.Contains(out, "keys_now=0") {
		t.Errorf("restart log line missing or without the key counts:\n%s", out)
	}
}

// TestMetricsAtStart: every series whose labels are known exists from
// Open at zero, so that rate() and alerts see it before its first event.
func TestMetricsAtStart(t *testing.T) {
	for _, url := range []string{standaloneURL(t), clusterURL(t)} {
		st, err := Open(url, WithFailurePolicy(FailClosed), WithKeyPrefix(testPrefix(t)))
		if err != nil {
			t.Fatal(err)
		}
		reg := prometheus.NewRegistry()
		if err := reg.Register(st.Collector()); err != nil {
			t.Fatal(err)
		}
		fams, err := reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		series := map[string]bool{}
		for _, f := range fams {
			for _, m := range f.GetMetric() {
				var labels []string
				for _, lp := range m.GetLabel() {
					labels = append(labels, lp.GetName()+"="+lp.GetValue())
				}
				series[f.GetName()+"{"+strings.Join(labels, ",")+"}"] = true
			}
		}
		want := []string{
			"slidegate_redis_errors_total{kind=timeout}",
			"slidegate_redis_errors_total{kind=connection}",
			"slidegate_redis_errors_total{kind=redis}",
			"slidegate_redis_fallback_decisions_total{failure_policy=closed}",
			"slidegate_redis_unknown_outcomes_total{}",
		}
		addrs := []string{strings.TrimPrefix(url, "redis://")}
		if strings.HasPrefix(url, "redis-cluster://") {
			addrs = clusterAddrs(t)
		}
		for _, a := range addrs {
			want = append(want,
				"slidegate_redis_breaker_state{node="+a+"}",
				"slidegate_redis_breaker_transitions_total{node="+a+",to=open}",
				"slidegate_redis_node_restarts_total{node="+a+"}",
				"slidegate_redis_evicted_keys_total{node="+a+"}")
		}
		for _, w := range want {
			if !series[w] {
				t.Errorf("%s: no series %s at start-up", url, w)
			}
		}
		st.Close()
	}
}
