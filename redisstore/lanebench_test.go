package redisstore

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/slidegate/slidegate/engine"
)

// BenchmarkLanePolicy compares the lanes' rule (ad: a decision goes at
// once only on an idle lane, a full queue goes beside; batch.go) with the
// fixed rules it replaced (dN: at once while fewer than N calls are in
// flight), on one standalone server, at 16 and 64 callers, for allowed
// single decisions, refused ones (a full key) and groups of three limits
// (as the Envoy service decides a request). Rounds run every rule in turn,
// in alternating order, on the same load; it logs per rule the medians
// over the rounds of Redis CPU per decision (INFO cpu, user and system),
// script calls per decision (the store's count), decisions/s and p99.
//
//	scripts/redis-env.sh go test -run '^$' -bench LanePolicy -benchtime 1x -v ./redisstore/
func BenchmarkLanePolicy(b *testing.B) {
	type rule struct {
		name  string
		fixed int
	}
	rules := []rule{{"d4", 4}, {"d1", 1}, {"d2", 2}, {"d3", 3}, {"ad", 0}}
	addr := standaloneAddr(b)
	ps := []engine.Policy{{Name: "lb_a", Limit: 1000000, Window: time.Minute}, {Name: "lb_b", Limit: 1000000, Window: time.Hour}, {Name: "lb_c", Limit: 1000000, Window: time.Minute}}
	refp := engine.Policy{Name: "lb_r", Limit: 1, Window: time.Hour}
	st, ls, g := openGroup(b, "redis://"+addr, ps, WithRefusalCache(0), WithTimeout(5*time.Second), WithKeyPrefix("bench:"))
	defer st.Close()
	lr, err := st.Limiter(refp)
	if err != nil {
		b.Fatal(err)
	}
	kinds := []struct {
		name   string
		decide func(ctx context.Context, key string) error
	}{
		{"allowed", func(ctx context.Context, key string) error { _, err := ls[0].Decide(ctx, key, 1); return err }},
		{"refused", func(ctx context.Context, key string) error { _, err := lr.Decide(ctx, key[len(key)-3:], 1); return err }},
		{"group3", func(ctx context.Context, key string) error {
			var dst [3]engine.Decision
			_, err := g.DecideGroup(ctx, dst[:0], engine.GroupRequest{Refs: []engine.Ref{{Policy: 0, Key: key}, {Policy: 1, Key: key}, {Policy: 2, Key: key[6:]}}, N: 1})
			return err
		}},
	}
	defer func() { laneFixed = 0 }()
	const rounds, perRound = 3, 8000
	for _, callers := range []int{16, 64} {
		for _, k := range kinds {
			b.Run(fmt.Sprintf("%s/%d", k.name, callers), func(b *testing.B) {
				runRequestsBy(b, callers, 2000, k.decide)
				type acc struct{ user, sys, calls, rate, p99 []float64 }
				res := make([]acc, len(rules))
				for b.Loop() {
					for r := range rounds {
						for j := range rules {
							i := j
							if r%2 == 1 {
								i = len(rules) - 1 - j
							}
							laneFixed = rules[i].fixed
							u0, s0 := serverCPUParts(b, addr)
							c0 := st.calls.Load()
							rate, _, p99 := runRequestsBy(b, callers, perRound, k.decide)
							u1, s1 := serverCPUParts(b, addr)
							c1 := st.calls.Load()
							a := &res[i]
							a.user = append(a.user, (u1-u0)/perRound)
							a.sys = append(a.sys, (s1-s0)/perRound)
							a.calls = append(a.calls, float64(c1-c0)/perRound)
							a.rate = append(a.rate, rate)
							a.p99 = append(a.p99, float64(p99.Microseconds()))
						}
					}
				}
				for i, r := range rules {
					a := res[i]
					b.ReportMetric(median(a.user)+median(a.sys), r.name+"-redis-µs")
					b.Logf("%s callers %d %s: redis µs/decision user %.1f sys %.1f, calls/decision %.3f, decisions/s %.0f, p99 %.0f µs", k.name, callers, r.name, median(a.user), median(a.sys), median(a.calls), median(a.rate), median(a.p99))
				}
			})
		}
	}
}
