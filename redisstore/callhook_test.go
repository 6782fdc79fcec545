package redisstore

import (
	"context"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/slidegate/slidegate/engine"
)

// hookCall is one call the call hook (WithCallHook) saw, with its outcome.
type hookCall struct {
	store, node, policy string
	allowed             bool
	err                 error
}

// TestCallHook: the hook sees every script call of a decision (a
// limiter's and a group's), with the store kind, the master the call went
// to and the policy, never the key, and then the outcome; a refusal the
// refusal cache answers makes no call.
func TestCallHook(t *testing.T) {
	for _, c := range []struct {
		name, url, kind string
		nodes           []string
	}{
		{"standalone", "redis://" + standaloneAddr(t), "redis", []string{standaloneAddr(t)}},
		{"cluster", "redis-cluster://" + strings.Join(clusterAddrs(t), ","), "redis-cluster", clusterAddrs(t)},
	} {
		t.Run(c.name, func(t *testing.T) {
			const key = "client-secret-42"
			var (
				mu    sync.Mutex
				calls []hookCall
			)
			hook := func(ctx context.Context, store, node, policy string) (context.Context, func(bool, error)) {
				return ctx, func(allowed bool, err error) {
					mu.Lock()
					defer mu.Unlock()
					calls = append(calls, hookCall{store, node, policy, allowed, err})
				}
			}
			st, lims, g := openGroup(t, c.url, groupPolicies, WithKeyPrefix(testPrefix(t)), WithCallHook(hook))
			defer st.Close()
			ctx := context.Background()
			want := []bool{true, true, true, false}
			for i := range 5 { // per_hour allows 3; the 5th is the cache's
				d, err := lims[1].Decide(ctx, key, 1)
				if err != nil || d.Allowed != (i < 3) {
					t.Fatalf("decision %d: %+v %v", i, d, err)
				}
			}
			refs := []engine.Ref{{Policy: 0, Key: key + "-g"}, {Policy: 1, Key: key + "-g"}}
			if gd, err := g.DecideGroup(ctx, nil, engine.GroupRequest{Refs: refs, N: 1, Tag: "t"}); err != nil || !gd.Allowed {
				t.Fatalf("group: %+v %v", gd, err)
			}
			mu.Lock()
			defer mu.Unlock()
			if len(calls) != 5 {
				t.Fatalf("hook saw %d calls, want 5 (4 decisions reaching Redis, 1 group): %+v", len(calls), calls)
			}
			for i, call := range calls {
				wantPolicy, wantAllowed := "per_hour", true
				if i < 4 {
					wantAllowed = want[i]
				} else {
					wantPolicy = "per_second,per_hour"
				}
				if call.store != c.kind || !slices.Contains(c.nodes, call.node) || call.policy != wantPolicy || call.allowed != wantAllowed || call.err != nil {
					t.Errorf("call %d: %+v, want store %s, a node of %v, policy %s, allowed %v", i, call, c.kind, c.nodes, wantPolicy, wantAllowed)
				}
				if strings.Contains(call.node+call.policy+call.store, key) {
					t.Errorf("call %d carries the key: %+v", i, call)
				}
			}
		})
	}
}
