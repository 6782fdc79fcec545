package redisstore

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"runtime"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/slidegate/slidegate/engine"
	"github.com/slidegate/slidegate/internal/backendtest"
	"github.com/slidegate/slidegate/internal/reference"
)

// costsRecord turns a decision with Costs into a reference record.
func costsRecord(refs []engine.Ref, costs []int, gd engine.GroupDecision) reference.GroupRecord {
	rec := backendtest.GroupRecord(refs, 0, gd)
	rec.Costs = append([]int(nil), costs...)
	return rec
}

// TestGroupCosts: refs of different costs are decided in one call, each
// charged its own cost, all or nothing, a cost above the smallest limit
// but within its own is accepted, and bad costs change nothing.
func TestGroupCosts(t *testing.T) {
	ps := []engine.Policy{
		{Name: "five", Limit: 5, Window: time.Minute},
		{Name: "three", Limit: 3, Window: time.Minute},
		{Name: "ctr", Limit: 6, Window: time.Minute, Algorithm: engine.SlidingCounter},
	}
	for _, c := range []struct {
		name string
		url  func(testing.TB) string
		tag  string
	}{{"Standalone", standaloneURL, ""}, {"ClusterTagged", clusterURL, "tenant"}, {"ClusterAcrossSlots", clusterURL, ""}} {
		t.Run(c.name, func(t *testing.T) {
			clk := engine.NewManualClock()
			clk.Set(time.Hour)
			st, ls, g := openGroup(t, c.url(t), ps, suiteOptions(t, clk)...)
			defer st.Close()
			ctx := context.Background()
			refs := []engine.Ref{{Policy: 0, Key: "a"}, {Policy: 1, Key: "b"}, {Policy: 2, Key: "a"}}
			if st.cluster && c.tag == "" && slotOf("a") == slotOf("b") {
				t.Fatal("a and b share a slot: the case would not cross slots")
			}
			gd, err := g.DecideGroup(ctx, nil, engine.GroupRequest{Refs: refs, Costs: []int{4, 2, 5}, Tag: c.tag})
			if err != nil || !gd.Allowed || gd.Limits[0].Remaining != 1 || gd.Limits[1].Remaining != 1 || gd.Limits[2].Remaining != 1 {
				t.Fatalf("first: %+v %v", gd, err)
			}
			// The second limit has no room for 2: nothing is charged, and
			// the others report their room for their own costs.
			clk.Advance(time.Millisecond)
			gd, err = g.DecideGroup(ctx, nil, engine.GroupRequest{Refs: refs, Costs: []int{1, 2, 1}, Tag: c.tag})
			if err != nil || gd.Allowed || !gd.Limits[0].Allowed || gd.Limits[1].Allowed || !gd.Limits[2].Allowed ||
				gd.Limits[0].Remaining != 1 || gd.Limits[1].RetryAfter <= 0 || gd.Binding != 1 {
				t.Fatalf("second: %+v %v", gd, err)
			}
			clk.Advance(time.Millisecond)
			gd, err = g.DecideGroup(ctx, nil, engine.GroupRequest{Refs: refs, Costs: []int{1, 1, 1}, Tag: c.tag})
			if err != nil || !gd.Allowed || gd.Limits[0].Remaining != 0 || gd.Limits[1].Remaining != 0 || gd.Limits[2].Remaining != 0 {
				t.Fatalf("third: %+v %v (the refused request was charged)", gd, err)
			}
			// A repeated ref is decided once, at the largest of its costs.
			fresh := []engine.Ref{{Policy: 0, Key: "r"}, {Policy: 0, Key: "r"}}
			gd, err = g.DecideGroup(ctx, nil, engine.GroupRequest{Refs: fresh, Costs: []int{2, 3}, Tag: c.tag})
			if err != nil || !gd.Allowed || gd.Limits[0] != gd.Limits[1] || gd.Limits[0].Remaining != 2 {
				t.Fatalf("repeated ref: %+v %v", gd, err)
			}
			for _, bad := range [][]int{{0, 1, 1}, {6, 1, 1}, {1, 4, 1}, {1, 1}} {
				if _, err := g.DecideGroup(ctx, nil, engine.GroupRequest{Refs: refs, Costs: bad, Tag: c.tag}); !errors.Is(err, engine.ErrInvalidCost) && !errors.Is(err, engine.ErrInvalidKeys) {
					t.Errorf("costs %v: %v, want an invalid cost or keys error", bad, err)
				}
			}
			// The limiters see what the group charged.
			if c.tag == "" {
				s, ok, err := ls[0].InspectKey(ctx, "r")
				if err != nil || !ok || s.Remaining != 2 {
					t.Fatalf("InspectKey r: %+v %v %v", s, ok, err)
				}
			}
			if c.tag == "" {
				return
			}
			// On a cluster, different keys without the tag are decided
			// across their own slots: a, b and c are fresh there.
			gd, err = g.DecideGroup(ctx, nil, engine.GroupRequest{Refs: refs, Costs: []int{1, 1, 1}})
			if err != nil || !gd.Allowed || gd.Limits[0].Remaining != 4 || gd.Limits[1].Remaining != 2 {
				t.Fatalf("untagged on a cluster: %+v %v, want decided across slots", gd, err)
			}
		})
	}
}

// TestGroupCostsFailLocal: when Redis is gone, the local group decides
// with each ref's own cost.
func TestGroupCostsFailLocal(t *testing.T) {
	srv := ownRedis(t)
	clk := engine.NewManualClock()
	st, _, g := openGroup(t, "redis://"+srv.addr, groupPolicies, WithClock(clk), WithKeyPrefix(testPrefix(t)),
		WithFailurePolicy(FailLocal), WithTimeout(2*time.Second), WithDialTimeout(200*time.Millisecond), WithBreaker(1, time.Hour))
	defer st.Close()
	srv.kill()
	refs := []engine.Ref{{Policy: 0, Key: "u"}, {Policy: 1, Key: "u"}}
	gd, err := g.DecideGroup(context.Background(), nil, engine.GroupRequest{Refs: refs, Costs: []int{1, 3}})
	if err != nil || !gd.Allowed || gd.Limits[0].Remaining != 1 || gd.Limits[1].Remaining != 0 {
		t.Fatalf("local: %+v %v", gd, err)
	}
	clk.Advance(time.Millisecond)
	gd, err = g.DecideGroup(context.Background(), nil, engine.GroupRequest{Refs: refs, Costs: []int{1, 1}})
	if err != nil || gd.Allowed || !gd.Limits[0].Allowed || gd.Limits[0].Remaining != 1 {
		t.Fatalf("local, second: %+v %v", gd, err)
	}
}

// TestGroupCostsParallelReplay: goroutines decide requests over
// overlapping subsets of three limits (two logs and a counter) and three
// keys, each ref at a random cost of its own (a repeated ref at
// different costs too), beside requests at one cost and single limiters'
// decisions, while the clock moves; every decision replays exactly
// through one internal/reference model per limit. On the cluster every
// request carries one tag; on the standalone server requests are
// untagged, sharing state with Limiter.Decide.
func TestGroupCostsParallelReplay(t *testing.T) {
	ps := []engine.Policy{
		{Name: "fast", Limit: 4, Window: 15 * time.Millisecond},
		{Name: "ctr", Limit: 7, Window: 40 * time.Millisecond, Algorithm: engine.SlidingCounter},
		{Name: "slow", Limit: 9, Window: 60 * time.Millisecond},
	}
	keys := []string{"u1", "u2", "ip-9"}
	for _, c := range []struct {
		name string
		url  func(testing.TB) string
		tag  string
	}{{"Standalone", standaloneURL, ""}, {"Cluster", clusterURL, "tenant"}} {
		for _, procs := range []int{2, 8} {
			t.Run(fmt.Sprintf("%s/GOMAXPROCS=%d", c.name, procs), func(t *testing.T) {
				defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(procs))
				clk := engine.NewManualClock()
				clk.Set(time.Second)
				st, ls, g := openGroup(t, c.url(t), ps, suiteOptions(t, clk)...)
				defer st.Close()
				stop := backendtest.Loop(func() {
					clk.Advance(time.Millisecond)
					time.Sleep(100 * time.Microsecond)
				})
				recs := make([][]reference.GroupRecord, 12)
				var wg sync.WaitGroup
				for w := range recs {
					wg.Add(1)
					go func() {
						defer wg.Done()
						r := rand.New(rand.NewPCG(uint64(w), uint64(procs)))
						ctx := context.Background()
						for range 200 {
							switch w % 4 {
							case 3: // one limiter on its own
								i, key, n := r.IntN(3), keys[r.IntN(3)], 1+r.IntN(2)
								var d engine.Decision
								var err error
								if c.tag != "" {
									d, err = ls[i].DecideTagged(ctx, c.tag, key, n)
								} else {
									d, err = ls[i].Decide(ctx, key, n)
								}
								if err != nil {
									t.Errorf("Decide: %v", err)
									return
								}
								recs[w] = append(recs[w], backendtest.SingleRecord(i, key, n, d))
							case 2: // one cost for every ref
								refs := backendtest.RandomRefs(r, 3, keys)
								n := 1 + r.IntN(backendtest.MinLimit(ps, refs))
								gd, err := g.DecideGroup(ctx, nil, engine.GroupRequest{Refs: refs, N: n, Tag: c.tag})
								if err != nil {
									t.Errorf("DecideGroup: %v", err)
									return
								}
								recs[w] = append(recs[w], backendtest.GroupRecord(refs, n, gd))
							default:
								refs := backendtest.RandomRefs(r, 3, keys)
								costs := make([]int, len(refs))
								for i, ref := range refs {
									costs[i] = 1 + r.IntN(ps[ref.Policy].Limit)
								}
								gd, err := g.DecideGroup(ctx, nil, engine.GroupRequest{Refs: refs, Costs: costs, Tag: c.tag})
								if err != nil {
									t.Errorf("DecideGroup with costs: %v", err)
									return
								}
								recs[w] = append(recs[w], costsRecord(refs, costs, gd))
							}
						}
					}()
				}
				wg.Wait()
				stop()
				rep := backendtest.VerifyGroupAt(t, ps, slices.Concat(recs...), time.Microsecond)
				t.Logf("%d decisions replayed: %d allowed, %d refused", rep.Decisions, rep.Allowed, rep.Refused)
			})
		}
	}
}
