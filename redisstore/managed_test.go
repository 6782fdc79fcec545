package redisstore

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/slidegate/slidegate/engine"
)

// TestManagedRestrictions: servers configured as managed services are
// (CONFIG renamed away, as ElastiCache and MemoryDB do; INFO denied too,
// as some proxies do). The store starts, logs what it could not check and
// exports it (slidegate_redis_unchecked), and decides; with CONFIG alone
// gone, INFO still shows an evicting maxmemory-policy and Open refuses it.
func TestManagedRestrictions(t *testing.T) {
	p := engine.Policy{Name: "managed", Limit: 2, Window: time.Minute}
	open := func(t *testing.T, url string) (*Store, *syncBuffer, error) {
		var logs syncBuffer
		st, err := Open(url, WithKeyPrefix(testPrefix(t)), WithLogger(slog.New(slog.NewTextHandler(&logs, nil))))
		return st, &logs, err
	}
	decide := func(t *testing.T, st *Store) {
		l, err := st.Limiter(p)
		if err != nil {
			t.Fatal(err)
		}
		if d, err := l.Decide(context.Background(), "k", 1); err != nil || !d.Allowed || d.Remaining != 1 {
			t.Errorf("decision: %+v %v", d, err)
		}
	}

	t.Run("NoConfigNoInfo", func(t *testing.T) {
		srv := ownRedis(t, "--rename-command", "CONFIG", "", "--rename-command", "INFO", "")
		if out, _ := cli(srv.addr, "config", "get", "maxmemory-policy"); !strings.Contains(out, "unknown command") {
			t.Fatalf("CONFIG still answers: %q", out)
		}
		st, logs, err := open(t, "redis://"+srv.addr)
		if err != nil {
			t.Fatal(err)
		}
		defer st.Close()
		decide(t, st)
		for _, c := range []string{"maxmemory_policy", "version", "restarts"} {
			if got := metricValue(st.m.unchecked.WithLabelValues(srv.addr, c)); got != 1 {
				t.Errorf("unchecked %s: %v, want 1", c, got)
			}
		}
		if !strings.Contains(logs.String(), "could not check") || !strings.Contains(logs.String(), "noeviction") {
			t.Errorf("no warning naming noeviction: %s", logs)
		}
		t.Logf("warning: %s", strings.TrimSpace(logs.String()))
	})

	t.Run("NoConfigEvicting", func(t *testing.T) {
		srv := ownRedis(t, "--rename-command", "CONFIG", "", "--maxmemory-policy", "allkeys-lru")
		_, _, err := open(t, "redis://"+srv.addr)
		if !errors.Is(err, ErrEvictionPolicy) {
			t.Fatalf("evicting server without CONFIG: %v, want ErrEvictionPolicy", err)
		}
	})

	t.Run("ClusterWithConfig", func(t *testing.T) {
		// The shared cluster answers CONFIG GET (a map under RESP3): the
		// warning appears exactly when a master says yes, and every check
		// was made.
		addrs := clusterAddrs(t)
		out, err := cli(addrs[0], "config", "get", "cluster-require-full-coverage")
		if err != nil {
			t.Fatal(err)
		}
		yes := strings.Contains(out, "yes")
		st, logs, err := open(t, clusterURL(t))
		if err != nil {
			t.Fatal(err)
		}
		defer st.Close()
		if strings.Contains(logs.String(), "cluster-require-full-coverage is yes") != yes || strings.Contains(logs.String(), "could not check") {
			t.Errorf("logs on a cluster whose CONFIG GET says %q: %s", strings.Fields(out), logs)
		}
		for _, a := range addrs {
			if got := metricValue(st.m.unchecked.WithLabelValues(a, "cluster_require_full_coverage")); got != 0 {
				t.Errorf("%s: unchecked cluster_require_full_coverage %v, want 0", a, got)
			}
		}
	})

	t.Run("ClusterCoverageYes", func(t *testing.T) {
		nodes := createCluster(t, 3, 0)
		var addrs []string
		for _, n := range nodes {
			addrs = append(addrs, n.addr)
		}
		st, logs, err := open(t, "redis-cluster://"+strings.Join(addrs, ","))
		if err != nil {
			t.Fatal(err)
		}
		defer st.Close()
		if !strings.Contains(logs.String(), "cluster-require-full-coverage is yes") {
			t.Errorf("no warning on a cluster with cluster-require-full-coverage yes: %s", logs)
		}
	})

	t.Run("ClusterNoConfig", func(t *testing.T) {
		nodes := createCluster(t, 3, 0, "--rename-command", "CONFIG", "")
		var addrs []string
		for _, n := range nodes {
			addrs = append(addrs, n.addr)
		}
		st, logs, err := open(t, "redis-cluster://"+strings.Join(addrs, ","))
		if err != nil {
			t.Fatal(err)
		}
		defer st.Close()
		decide(t, st)
		for _, a := range addrs {
			if got := metricValue(st.m.unchecked.WithLabelValues(a, "cluster_require_full_coverage")); got != 1 {
				t.Errorf("%s: unchecked cluster_require_full_coverage %v, want 1", a, got)
			}
			if got := metricValue(st.m.unchecked.WithLabelValues(a, "maxmemory_policy")); got != 0 {
				t.Errorf("%s: unchecked maxmemory_policy %v, want 0 (INFO answers)", a, got)
			}
		}
		if !strings.Contains(logs.String(), "cluster-require-full-coverage is no") {
			t.Errorf("no warning about cluster-require-full-coverage: %s", logs)
		}
	})
}
