package rls_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/slidegate/slidegate/engine"
	"github.com/slidegate/slidegate/internal/rls"
	"github.com/slidegate/slidegate/redisstore"
)

// redisFactory is the BackendFactory of slidegate envoy serve on Redis:
// the configuration's limiters on one store, their group through
// rls.WithPeek.
func redisFactory(url, prefix string) rls.BackendFactory {
	return func(cfg *rls.Config) (engine.GroupBackend, func(), error) {
		st, err := redisstore.Open(url, redisstore.WithKeyPrefix(prefix), redisstore.WithTimeout(10*time.Second),
			redisstore.WithFailurePolicy(redisstore.FailClosed))
		if err != nil {
			return nil, nil, err
		}
		ls, err := st.Limiters(cfg.Policies())
		if err != nil {
			st.Close()
			return nil, nil, err
		}
		bs := make([]engine.Backend, len(ls))
		for i, l := range ls {
			bs[i] = l
		}
		g, err := redisstore.NewGroup(ls...)
		if err != nil {
			st.Close()
			return nil, nil, err
		}
		return rls.WithPeek(g, bs), func() { st.Close() }, nil
	}
}

// A descriptor's limit override is decided with its limit and unit, all
// or nothing with the configured limits, in one call, on the memory
// backends, on Redis and on a Redis Cluster: each descriptor charged its
// own cost, checks (cost 0) shown with the override's state, an override
// above the log's cap on the counter, its state apart from the configured
// rule's and per domain, and beyond DefaultMaxOverrides the configured
// rule.
func TestLimitOverride(t *testing.T) {
	type backend struct {
		name    string
		factory rls.BackendFactory
		opts    []rls.Option
		peeks   bool // a check shows the state
	}
	mb := rls.NewMemoryBackends()
	defer mb.Close()
	backends := []backend{{name: "memory", factory: mb.Factory, peeks: true}}
	addr, cluster := os.Getenv("SLIDEGATE_REDIS_ADDR"), os.Getenv("SLIDEGATE_REDIS_CLUSTER_ADDRS")
	if addr != "" && cluster != "" {
		prefix := fmt.Sprintf("rls-override-%d-", time.Now().UnixNano())
		backends = append(backends,
			backend{name: "redis", factory: redisFactory("redis://"+addr+"/0", prefix+"s:"), peeks: true},
			backend{name: "cluster", factory: redisFactory("redis-cluster://"+cluster, prefix+"c:"), opts: []rls.Option{rls.WithClusterTag("k")}})
	} else {
		t.Log("SLIDEGATE_REDIS_ADDR / SLIDEGATE_REDIS_CLUSTER_ADDRS not set: memory only (make test runs Redis)")
	}
	for _, b := range backends {
		t.Run(b.name, func(t *testing.T) {
			dir := t.TempDir()
			write(t, filepath.Join(dir, "a.yaml"), "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: minute, requests_per_unit: 1}\n  - key: j\n    rate_limit: {unit: minute, requests_per_unit: 5}\n")
			write(t, filepath.Join(dir, "b.yaml"), "domain: e\ndescriptors:\n  - key: k\n    rate_limit: {unit: minute, requests_per_unit: 1}\n")
			r, err := rls.NewReloader(dir, rls.LoadOptions{AllFiles: true}, b.factory, nil, nil, b.opts...)
			if err != nil {
				t.Fatal(err)
			}
			defer r.Close()
			over := func(n uint32, v string) *ratelimitv3.RateLimitDescriptor {
				d := desc("k", v)
				d.Limit = &ratelimitv3.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: n, Unit: 3} // HOUR
				return d
			}
			ask := func(domain string, ds ...*ratelimitv3.RateLimitDescriptor) *rlsv3.RateLimitResponse {
				t.Helper()
				resp, err := r.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{Domain: domain, Descriptors: ds})
				if err != nil {
					t.Fatal(err)
				}
				return resp
			}
			ok, refused := rlsv3.RateLimitResponse_OK, rlsv3.RateLimitResponse_OVER_LIMIT
			for i := range 3 {
				resp := ask("d", over(3, "v"), desc("j", "v"))
				if resp.OverallCode != ok || resp.Statuses[0].CurrentLimit.GetRequestsPerUnit() != 3 ||
					resp.Statuses[0].CurrentLimit.GetUnit() != rlsv3.RateLimitResponse_RateLimit_HOUR || resp.Statuses[0].LimitRemaining != uint32(2-i) ||
					resp.Statuses[1].LimitRemaining != uint32(4-i) {
					t.Fatalf("override %d: %v", i, resp)
				}
			}
			resp := ask("d", over(3, "v"), desc("j", "v"))
			if resp.OverallCode != refused || resp.Statuses[0].Code != refused || resp.Statuses[1].Code != ok || resp.Statuses[1].LimitRemaining != 2 {
				t.Fatalf("over the override, j not charged: %v", resp)
			}
			// The configured rule of the same descriptor keeps its own
			// state; the same override in another domain too.
			if resp := ask("d", desc("k", "v")); resp.OverallCode != ok || resp.Statuses[0].CurrentLimit.GetRequestsPerUnit() != 1 {
				t.Fatalf("the configured rule after its descriptor's override: %v", resp)
			}
			if resp := ask("e", over(3, "v")); resp.OverallCode != ok || resp.Statuses[0].LimitRemaining != 2 {
				t.Fatalf("the override in another domain: %v", resp)
			}
			if resp := ask("d", over(0, "v")); resp.OverallCode != refused {
				t.Fatalf("override of 0: %v", resp)
			}
			// Each descriptor its own cost, all or nothing: 2 on the
			// override and 1 on j fit; then 2 more do not, and j is not
			// charged.
			costly := over(4, "w")
			costly.HitsAddend = wrapperspb.UInt64(2)
			resp = ask("d", costly, desc("j", "w"))
			if resp.OverallCode != ok || resp.Statuses[0].LimitRemaining != 2 || resp.Statuses[1].LimitRemaining != 4 {
				t.Fatalf("costs 2 and 1: %v", resp)
			}
			resp = ask("d", desc("j", "w"), costly, costly)
			if resp.OverallCode != ok || resp.Statuses[0].LimitRemaining != 3 || resp.Statuses[1].LimitRemaining != 0 {
				t.Fatalf("costs 1 and 2 (repeated, counted once): %v", resp)
			}
			resp = ask("d", costly, desc("j", "w"))
			if resp.OverallCode != refused || resp.Statuses[0].Code != refused || resp.Statuses[1].LimitRemaining != 3 {
				t.Fatalf("cost 2 beyond the override: %v", resp)
			}
			// A check (hits_addend 0) shows the override's state.
			check := over(4, "w")
			check.HitsAddend = wrapperspb.UInt64(0)
			if resp := ask("d", check); resp.OverallCode != ok || b.peeks && resp.Statuses[0].LimitRemaining != 0 {
				t.Fatalf("check of the override: %v", resp)
			}
			// Above the log's cap: the counter, its remaining the
			// configured limit's.
			if resp := ask("d", over(1<<32-1, "big"), desc("j", "big")); resp.OverallCode != ok || resp.Statuses[0].LimitRemaining != 1<<32-2 {
				t.Fatalf("override of 2^32-1: %v", resp)
			}
			// Beyond DefaultMaxOverrides distinct overrides (three made
			// above), the configured rule.
			for n := range rls.DefaultMaxOverrides - 3 {
				if resp := ask("d", over(uint32(100+n), "x")); resp.Statuses[0].CurrentLimit.GetRequestsPerUnit() != uint32(100+n) {
					t.Fatalf("override %d of %d: %v", n+4, rls.DefaultMaxOverrides, resp)
				}
			}
			if resp := ask("d", over(7, "y")); resp.Statuses[0].CurrentLimit.GetRequestsPerUnit() != 1 {
				t.Fatalf("override beyond the bound: %v", resp)
			}
			if resp := ask("d", over(3, "z")); resp.OverallCode != ok || resp.Statuses[0].CurrentLimit.GetRequestsPerUnit() != 3 {
				t.Fatalf("an override made before the bound: %v", resp)
			}
		})
	}
}
