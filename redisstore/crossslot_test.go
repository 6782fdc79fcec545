package redisstore

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/slidegate/slidegate/engine"
	"github.com/slidegate/slidegate/internal/reference"
)

// TestCrossSlotAllOrNothing runs untagged group requests whose keys live
// in different slots of the real three-master cluster (a user's two limits
// on one slot, an IP's on another), from 12 goroutines, until most are
// refused. Each request is decided across its slots. The test checks what
// decideAcross claims:
//   - no over-admission: every limit's admitted requests, replayed at
//     their slot's instant through internal/reference, never exceed L;
//   - all or nothing: afterwards each key holds exactly the costs of the
//     admitted requests that named it (InspectKey), so a refused request
//     left nothing on the slots that had room (given back);
//   - refused requests whose other slots had room occurred, and their
//     entries were given back (the metric).
func TestCrossSlotAllOrNothing(t *testing.T) {
	ps := []engine.Policy{
		{Name: "user", Limit: 30, Window: time.Hour},
		{Name: "ip", Limit: 20, Window: time.Hour},
		{Name: "userctr", Limit: 25, Window: time.Hour, Algorithm: engine.SlidingCounter},
	}
	users := []string{"u0", "u1", "u2", "u3"}
	ips := []string{"ip0", "ip1", "ip2"}
	for _, u := range users {
		for _, ip := range ips {
			if slotOf(u) == slotOf(ip) {
				t.Fatalf("%s and %s share a slot: the requests would not cross slots", u, ip)
			}
		}
	}
	clk := engine.NewManualClock()
	clk.Set(time.Hour)
	st, ls, g := openGroup(t, clusterURL(t), ps, suiteOptions(t, clk)...)
	defer st.Close()
	type result struct {
		refs []engine.Ref
		cost int
		gd   engine.GroupDecision
	}
	var mu sync.Mutex
	var results []result
	var wg sync.WaitGroup
	for w := range 12 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx := context.Background()
			for i := range 60 {
				u, ip := users[(w+i)%len(users)], ips[(w*7+i)%len(ips)]
				refs := []engine.Ref{{Policy: 0, Key: u}, {Policy: 1, Key: ip}, {Policy: 2, Key: u}}
				if i%2 == 1 {
					// The IP's slot first: a refusal by the user's slot
					// then gives back the IP's entries.
					refs[0], refs[1] = refs[1], refs[0]
				}
				cost := 1 + i%2
				gd, err := g.DecideGroup(ctx, nil, engine.GroupRequest{Refs: refs, N: cost})
				if err != nil {
					t.Errorf("untagged request across slots: %v", err)
					return
				}
				gd.Limits = append([]engine.Decision(nil), gd.Limits...)
				mu.Lock()
				results = append(results, result{refs, cost, gd})
				mu.Unlock()
				if i%10 == 9 {
					clk.Advance(time.Millisecond)
				}
			}
		}()
	}
	wg.Wait()
	// Per limit, the requests' records at their slot's instant; admitted
	// costs per (policy, key).
	recs := make([][]reference.Record, len(ps))
	used := map[engine.Ref]int{}
	allowed, partial := 0, 0
	for _, r := range results {
		if r.gd.Allowed {
			allowed++
		} else {
			for _, d := range r.gd.Limits {
				if d.Allowed {
					partial++
					break
				}
			}
		}
		for j, ref := range r.refs {
			d := r.gd.Limits[j]
			if d.At != r.gd.Limits[0].At && ref.Key == r.refs[0].Key {
				t.Fatalf("two limits of one slot decided at different instants: %+v", r.gd)
			}
			recs[ref.Policy] = append(recs[ref.Policy], reference.Record{Key: ref.Key, Cost: r.cost, At: d.At, Allowed: r.gd.Allowed})
			if r.gd.Allowed {
				used[ref] += r.cost
			}
		}
	}
	for i, p := range ps {
		if p.Algorithm != engine.SlidingLog {
			continue
		}
		rep := reference.VerifyLog(p.Limit, int64(p.Window), recs[i])
		if rep.OverAdmissions != 0 {
			t.Errorf("policy %s: %d over-admissions: %v", p.Name, rep.OverAdmissions, rep.Examples)
		}
	}
	ctx := context.Background()
	for i, p := range ps {
		keys := users
		if i == 1 {
			keys = ips
		}
		for _, k := range keys {
			s, _, err := ls[i].InspectKey(ctx, k)
			if err != nil {
				t.Fatal(err)
			}
			if want := used[engine.Ref{Policy: i, Key: k}]; s.Used != want {
				t.Errorf("policy %s key %s holds %d, want %d: the admitted requests' costs alone", p.Name, k, s.Used, want)
			}
		}
	}
	ok := metricValue(st.m.givebacks.WithLabelValues("ok"))
	failed := metricValue(st.m.givebacks.WithLabelValues("failed"))
	t.Logf("%d requests across slots: %d allowed, %d refused with room on another slot; give-backs: %v ok, %v failed",
		len(results), allowed, partial, ok, failed)
	if allowed == 0 || partial == 0 || ok == 0 {
		t.Errorf("the run did not exercise both outcomes and the give-back (%d allowed, %d partial, %v given back)", allowed, partial, ok)
	}
	if failed != 0 {
		t.Errorf("%v give-backs failed on a healthy cluster", failed)
	}
}
