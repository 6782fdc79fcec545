package engine_test

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/slidegate/slidegate/engine"
	"github.com/slidegate/slidegate/internal/reference"
)

// gstep is one row of a group step table: a request at an instant, and
// what every limit must say.
type gstep struct {
	at      time.Duration
	keys    []string
	n       int
	allowed bool
	// rem and retry per limit; binding is the index of the binding limit.
	rem     []int
	retry   []time.Duration
	binding int
	why     string
}

func runGroup(t *testing.T, ps []engine.Policy, steps []gstep) {
	t.Helper()
	g, err := engine.NewGroup(ps, engine.WithSweepInterval(0))
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	for i, s := range steps {
		gd, err := g.AllowNAt(s.keys, s.n, int64(s.at))
		if err != nil {
			t.Fatalf("step %d (%s): %v", i, s.why, err)
		}
		if gd.Allowed != s.allowed || gd.Binding != s.binding {
			t.Fatalf("step %d (%s): allowed=%v binding=%d, want %v, %d; %+v", i, s.why, gd.Allowed, gd.Binding, s.allowed, s.binding, gd.Limits)
		}
		for j, d := range gd.Limits {
			if d.Remaining != s.rem[j] || d.RetryAfter != s.retry[j] || d.At != int64(s.at) || d.Limit != ps[j].Limit {
				t.Fatalf("step %d (%s): limit %d: %+v, want remaining %d, retry %v at %v", i, s.why, j, d, s.rem[j], s.retry[j], s.at)
			}
		}
	}
}

// 2 per second and 3 per hour on one key: the hourly limit binds after the
// third request, and requests it refuses are charged to neither.
func TestGroupPerSecondAndPerHour(t *testing.T) {
	ps := []engine.Policy{{Name: "per_second", Limit: 2, Window: time.Second}, {Name: "per_hour", Limit: 3, Window: time.Hour}}
	u := []string{"u1", "u1"}
	s := time.Second
	runGroup(t, ps, []gstep{
		{0, u, 1, true, []int{1, 2}, []time.Duration{0, 0}, 0, "first"},
		{100 * time.Millisecond, u, 1, true, []int{0, 1}, []time.Duration{0, 0}, 0, "second: the per-second limit has the least room"},
		{200 * time.Millisecond, u, 1, false, []int{0, 1}, []time.Duration{800 * time.Millisecond, 0}, 0, "per-second full; per-hour had room and is not charged"},
		{s, u, 1, true, []int{0, 0}, []time.Duration{0, 0}, 0, "0 expired; per-hour now full (ties bind the first)"},
		{3 * s, u, 1, false, []int{2, 0}, []time.Duration{0, time.Hour - 3*s}, 1, "per-hour refuses; per-second had room"},
		{4 * s, u, 1, false, []int{2, 0}, []time.Duration{0, time.Hour - 4*s}, 1, "still refused, and still not charged to per-second"},
		{time.Hour, u, 1, true, []int{1, 0}, []time.Duration{0, 0}, 1, "the hour's first entry expired"},
	})
}

// A per-user and a per-IP limit: either one refusing leaves both untouched.
func TestGroupPerUserAndPerIP(t *testing.T) {
	ps := []engine.Policy{{Name: "user", Limit: 2, Window: time.Minute}, {Name: "ip", Limit: 3, Window: time.Minute}}
	s := time.Second
	runGroup(t, ps, []gstep{
		{0, []string{"alice", "10.0.0.1"}, 1, true, []int{1, 2}, []time.Duration{0, 0}, 0, "alice from .1"},
		{s, []string{"bob", "10.0.0.1"}, 1, true, []int{1, 1}, []time.Duration{0, 0}, 0, "bob from .1 (tie binds the first)"},
		{2 * s, []string{"bob", "10.0.0.1"}, 2, false, []int{1, 1}, []time.Duration{59 * s, 58 * s}, 0, "cost 2: both refuse; bob waits longest"},
		{3 * s, []string{"carol", "10.0.0.1"}, 1, true, []int{1, 0}, []time.Duration{0, 0}, 1, "the IP's third: cost 2 above changed nothing"},
		{4 * s, []string{"alice", "10.0.0.2"}, 1, true, []int{0, 2}, []time.Duration{0, 0}, 0, "alice's second, from another IP"},
		{5 * s, []string{"alice", "10.0.0.3"}, 1, false, []int{0, 3}, []time.Duration{55 * s, 0}, 0, "the user refuses; the new IP holds nothing after"},
		{6 * s, []string{"dave", "10.0.0.3"}, 2, true, []int{0, 1}, []time.Duration{0, 0}, 0, "the refused request above left .3 empty"},
	})
}

// The same key under two policies is two logs; a group of one policy
// decides exactly as a Limiter.
func TestGroupOfOneIsALimiter(t *testing.T) {
	r := rand.New(rand.NewPCG(11, 12))
	for _, alg := range []engine.Algorithm{engine.SlidingLog, engine.SlidingCounter} {
		p := engine.Policy{Limit: 3, Window: 100, Algorithm: alg}
		lim, _ := engine.New(p, engine.WithSweepInterval(0))
		g, _ := engine.NewGroup([]engine.Policy{p}, engine.WithSweepInterval(0))
		var now int64
		for i := range 3000 {
			now += int64(r.IntN(20))
			key := fmt.Sprint(r.IntN(10))
			n := 1 + r.IntN(3)
			d, _ := lim.AllowNAt(key, n, now)
			gd, err := g.AllowNAt([]string{key}, n, now)
			if err != nil || gd.Allowed != d.Allowed || gd.Limits[0] != d || gd.Binding != 0 {
				t.Fatalf("%v step %d: group %+v (%v), limiter %+v", alg, i, gd, err, d)
			}
		}
		lim.Close()
		g.Close()
	}
}

func TestGroupBadInput(t *testing.T) {
	if _, err := engine.NewGroup(nil); !errors.Is(err, engine.ErrInvalidPolicy) {
		t.Errorf("no policies: %v", err)
	}
	_, err := engine.NewGroup([]engine.Policy{{Limit: 1, Window: time.Second}, {Name: "hourly", Limit: 0, Window: time.Hour}})
	if !errors.Is(err, engine.ErrInvalidPolicy) || !strings.Contains(err.Error(), `policy 1 ("hourly")`) {
		t.Errorf("bad second policy: %v", err)
	}
	if _, err := engine.NewGroup([]engine.Policy{{Limit: 1, Window: time.Second}}, engine.WithShards(3)); !errors.Is(err, engine.ErrInvalidOption) {
		t.Errorf("bad option: %v", err)
	}
	g, err := engine.NewGroup([]engine.Policy{{Limit: 5, Window: time.Second}, {Limit: 2, Window: time.Hour}})
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	for _, c := range []struct {
		keys []string
		n    int
		want error
	}{
		{[]string{"a"}, 1, engine.ErrInvalidKeys},
		{[]string{"a", "b", "c"}, 1, engine.ErrInvalidKeys},
		{nil, 1, engine.ErrInvalidKeys},
		{[]string{"a", "a"}, 0, engine.ErrInvalidCost},
		{[]string{"a", "a"}, 3, engine.ErrInvalidCost}, // above the smallest limit
	} {
		if _, err := g.AllowN(c.keys, c.n); !errors.Is(err, c.want) {
			t.Errorf("AllowN(%q, %d): %v, want %v", c.keys, c.n, err, c.want)
		}
	}
	if _, err := g.AllowNAt([]string{"a", "a"}, 1, -1); !errors.Is(err, engine.ErrInvalidInstant) {
		t.Errorf("negative instant: %v", err)
	}
	// Nothing above was charged.
	gd, _ := g.AllowN([]string{"a", "a"}, 2)
	if !gd.Allowed || gd.Limits[0].Remaining != 3 || gd.Limits[1].Remaining != 0 {
		t.Fatalf("after bad input: %+v", gd)
	}
}

// groupModels returns fresh reference models for ps.
func groupModels(ps []engine.Policy) (models []reference.Model, limits []int, windows []int64, exact []bool) {
	for _, p := range ps {
		if p.Algorithm == engine.SlidingLog {
			models = append(models, reference.NewLog(p.Limit, int64(p.Window)))
		} else {
			models = append(models, reference.NewCounter(p.Limit, int64(p.Window)))
		}
		limits = append(limits, p.Limit)
		windows = append(windows, int64(p.Window))
		exact = append(exact, p.Algorithm == engine.SlidingLog)
	}
	return
}

func groupRecord(keys []string, n int, gd engine.GroupDecision) reference.GroupRecord {
	r := reference.GroupRecord{Keys: append([]string(nil), keys...), Cost: n, At: gd.Limits[0].At, Allowed: gd.Allowed}
	for _, d := range gd.Limits {
		r.Limits = append(r.Limits, reference.Result{Allowed: d.Allowed, Remaining: d.Remaining,
			RetryAfter: int64(d.RetryAfter), Reset: int64(d.Reset)})
	}
	return r
}

func verifyGroup(t *testing.T, ps []engine.Policy, recs []reference.GroupRecord) {
	t.Helper()
	models, limits, windows, exact := groupModels(ps)
	rep := reference.VerifyGroup(models, limits, windows, exact, recs)
	if !rep.OK() {
		t.Fatalf("%d mismatches, %d over-admissions; e.g.\n%s", rep.Mismatches, rep.OverAdmissions, strings.Join(rep.Examples, "\n"))
	}
	if rep.Allowed == 0 || rep.Refused == 0 {
		t.Fatalf("the run did not exercise both outcomes: %+v", rep)
	}
}

// Random traces of three limits (log and counter mixed, keys overlapping
// across limits) against the multi-limit reference, with sweeps between.
func TestGroupMatchesReference(t *testing.T) {
	r := rand.New(rand.NewPCG(21, 22))
	for trial := range 30 {
		ps := []engine.Policy{
			{Name: "a", Limit: 1 + r.IntN(4), Window: time.Duration(10 + r.IntN(100))},
			{Name: "b", Limit: 2 + r.IntN(6), Window: time.Duration(50 + r.IntN(500)), Algorithm: engine.Algorithm(r.IntN(2))},
			{Name: "c", Limit: 3 + r.IntN(10), Window: time.Duration(100 + r.IntN(1000))},
		}
		g, err := engine.NewGroup(ps, engine.WithSweepInterval(0), engine.WithShards(2))
		if err != nil {
			t.Fatal(err)
		}
		minLimit := min(ps[0].Limit, ps[1].Limit, ps[2].Limit)
		var recs []reference.GroupRecord
		var now int64
		for range 3000 {
			now += int64(r.IntN(8))
			keys := []string{fmt.Sprint("u", r.IntN(4)), fmt.Sprint("u", r.IntN(4)), fmt.Sprint("ip", r.IntN(2))}
			n := 1 + r.IntN(minLimit)
			gd, err := g.AllowNAt(keys, n, now)
			if err != nil {
				t.Fatal(err)
			}
			recs = append(recs, groupRecord(keys, n, gd))
			if r.IntN(50) == 0 {
				g.SweepAt(now)
			}
		}
		g.Close()
		t.Run(fmt.Sprint(trial), func(t *testing.T) { verifyGroup(t, ps, recs) })
	}
}

// Parallel replay over overlapping groups: many goroutines, few keys, on
// the monotonic clock, sweeps in a tight loop; every decision replays
// exactly through the multi-limit reference.
func TestGroupParallelReplay(t *testing.T) {
	perG := 2000
	if raceEnabled {
		perG = 600
	}
	for _, procs := range []int{1, 2, 8, 32} {
		for _, alg := range []engine.Algorithm{engine.SlidingLog, engine.SlidingCounter} {
			t.Run(fmt.Sprintf("GOMAXPROCS=%d/%v", procs, alg), func(t *testing.T) {
				defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(procs))
				ps := []engine.Policy{
					{Name: "short", Limit: 3, Window: 30 * time.Microsecond, Algorithm: alg},
					{Name: "long", Limit: 8, Window: 200 * time.Microsecond},
				}
				g, err := engine.NewGroup(ps, engine.WithShards(2), engine.WithSweepInterval(0))
				if err != nil {
					t.Fatal(err)
				}
				stop := sweepLoop(func() { g.Sweep() })
				recs := make([][]reference.GroupRecord, 12)
				var wg sync.WaitGroup
				for w := range recs {
					wg.Add(1)
					go func() {
						defer wg.Done()
						r := rand.New(rand.NewPCG(uint64(w), uint64(procs)))
						for range perG {
							keys := []string{stressKeys[r.IntN(3)], stressKeys[3+r.IntN(3)]}
							if r.IntN(4) == 0 {
								keys[1] = keys[0] // equal keys under two policies are two logs
							}
							n := 1 + r.IntN(3)
							gd, err := g.AllowN(keys, n)
							if err != nil {
								t.Errorf("AllowN: %v", err)
								return
							}
							recs[w] = append(recs[w], groupRecord(keys, n, gd))
						}
					}()
				}
				wg.Wait()
				stop()
				g.Close()
				var all []reference.GroupRecord
				for _, rs := range recs {
					all = append(all, rs...)
				}
				verifyGroup(t, ps, all)
			})
		}
	}
}

// Two groups' worth of goroutines take the same keys in opposite roles
// (key x under policy 0 and key y under 1, and the reverse): the write
// bits are taken in policy order, so this cannot deadlock.
func TestGroupNoDeadlock(t *testing.T) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(8))
	g, err := engine.NewGroup([]engine.Policy{{Limit: 1000, Window: time.Hour}, {Limit: 1000, Window: time.Hour}})
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	var wg sync.WaitGroup
	for w := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			keys := []string{"x", "y"}
			if w%2 == 1 {
				keys = []string{"y", "x"}
			}
			for range 2000 {
				if _, err := g.AllowN(keys, 1); err != nil {
					t.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
}

func ExampleGroup() {
	clk := engine.NewManualClock()
	g, err := engine.NewGroup([]engine.Policy{
		{Name: "per_second", Limit: 2, Window: time.Second},
		{Name: "per_hour", Limit: 1000, Window: time.Hour},
	}, engine.WithClock(clk))
	if err != nil {
		panic(err)
	}
	defer g.Close()
	for range 3 {
		gd, _ := g.Allow([]string{"api-key-1", "api-key-1"})
		d := gd.Decision() // the binding limit
		fmt.Println(gd.Allowed, g.Policies()[gd.Binding].Name, d.Remaining, d.RetryAfter)
	}
	// Output:
	// true per_second 1 0s
	// true per_second 0 0s
	// false per_second 0 1s
}

// randomRefs returns 1 to 4 refs over policies 0..np-1 and keys k0..k{nk-1}:
// any subset, a policy with two keys, and now and then an exact repeat.
func randomRefs(r *rand.Rand, np, nk int) []engine.Ref {
	refs := make([]engine.Ref, 1+r.IntN(4))
	for i := range refs {
		refs[i] = engine.Ref{Policy: r.IntN(np), Key: stressKeys[r.IntN(nk)]}
	}
	if len(refs) > 1 && r.IntN(5) == 0 {
		refs[len(refs)-1] = refs[0]
	}
	return refs
}

func refsRecord(refs []engine.Ref, n int, gd engine.GroupDecision) reference.GroupRecord {
	keys := make([]string, len(refs))
	pols := make([]int, len(refs))
	for i, ref := range refs {
		keys[i], pols[i] = ref.Key, ref.Policy
	}
	rec := groupRecord(keys, n, gd)
	rec.Policies = pols
	return rec
}

func minRefLimit(ps []engine.Policy, refs []engine.Ref) int {
	m := ps[refs[0].Policy].Limit
	for _, ref := range refs {
		m = min(m, ps[ref.Policy].Limit)
	}
	return m
}

// Requests over any subset of the group's policies (a server's routes
// sharing policies, an Envoy request's descriptors) against the reference.
func TestGroupRefsMatchesReference(t *testing.T) {
	r := rand.New(rand.NewPCG(31, 32))
	for trial := range 20 {
		ps := []engine.Policy{
			{Limit: 1 + r.IntN(4), Window: time.Duration(10 + r.IntN(100))},
			{Limit: 2 + r.IntN(6), Window: time.Duration(50 + r.IntN(500)), Algorithm: engine.Algorithm(r.IntN(2))},
			{Limit: 3 + r.IntN(10), Window: time.Duration(100 + r.IntN(1000))},
		}
		g, err := engine.NewGroup(ps, engine.WithSweepInterval(0), engine.WithShards(2))
		if err != nil {
			t.Fatal(err)
		}
		var recs []reference.GroupRecord
		var now int64
		dst := make([]engine.Decision, 0, 2) // sometimes too small: AllowRefsN allocates
		for range 3000 {
			now += int64(r.IntN(8))
			refs := randomRefs(r, len(ps), 4)
			n := 1 + r.IntN(minRefLimit(ps, refs))
			gd, err := g.AllowRefsNAt(dst, refs, n, now)
			if err != nil {
				t.Fatal(err)
			}
			recs = append(recs, refsRecord(refs, n, gd))
			if r.IntN(50) == 0 {
				g.SweepAt(now)
			}
		}
		g.Close()
		t.Run(fmt.Sprint(trial), func(t *testing.T) { verifyGroup(t, ps, recs) })
	}
}

func TestGroupRefsParallelReplay(t *testing.T) {
	perG := 2000
	if raceEnabled {
		perG = 600
	}
	for _, procs := range []int{2, 8, 32} {
		t.Run(fmt.Sprintf("GOMAXPROCS=%d", procs), func(t *testing.T) {
			defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(procs))
			ps := []engine.Policy{
				{Limit: 2, Window: 20 * time.Microsecond},
				{Limit: 4, Window: 50 * time.Microsecond, Algorithm: engine.SlidingCounter},
				{Limit: 6, Window: 100 * time.Microsecond},
			}
			g, err := engine.NewGroup(ps, engine.WithShards(2), engine.WithSweepInterval(0))
			if err != nil {
				t.Fatal(err)
			}
			stop := sweepLoop(func() { g.Sweep() })
			recs := make([][]reference.GroupRecord, 12)
			var wg sync.WaitGroup
			for w := range recs {
				wg.Add(1)
				go func() {
					defer wg.Done()
					r := rand.New(rand.NewPCG(uint64(w), uint64(procs)+100))
					dst := make([]engine.Decision, 4)
					for range perG {
						refs := randomRefs(r, len(ps), 3)
						n := 1 + r.IntN(minRefLimit(ps, refs))
						gd, err := g.AllowRefsN(dst, refs, n)
						if err != nil {
							t.Errorf("AllowRefsN: %v", err)
							return
						}
						recs[w] = append(recs[w], refsRecord(refs, n, gd))
					}
				}()
			}
			wg.Wait()
			stop()
			g.Close()
			var all []reference.GroupRecord
			for _, rs := range recs {
				all = append(all, rs...)
			}
			verifyGroup(t, ps, all)
		})
	}
}

func TestGroupRefsBadInput(t *testing.T) {
	g, err := engine.NewGroup([]engine.Policy{{Limit: 5, Window: time.Second}, {Limit: 2, Window: time.Hour}})
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	for _, c := range []struct {
		refs []engine.Ref
		n    int
		want error
	}{
		{nil, 1, engine.ErrInvalidKeys},
		{[]engine.Ref{{Policy: 2, Key: "a"}}, 1, engine.ErrInvalidKeys},
		{[]engine.Ref{{Policy: -1, Key: "a"}}, 1, engine.ErrInvalidKeys},
		{[]engine.Ref{{Policy: 0, Key: "a"}}, 0, engine.ErrInvalidCost},
		{[]engine.Ref{{Policy: 0, Key: "a"}, {Policy: 1, Key: "a"}}, 3, engine.ErrInvalidCost},
	} {
		if _, err := g.AllowRefsN(nil, c.refs, c.n); !errors.Is(err, c.want) {
			t.Errorf("AllowRefsN(%v, %d): %v, want %v", c.refs, c.n, err, c.want)
		}
	}
	// Cost 3 fits policy 0 alone (its limit is 5).
	gd, err := g.AllowRefsN(nil, []engine.Ref{{Policy: 0, Key: "a"}}, 3)
	if err != nil || !gd.Allowed || gd.Limits[0].Remaining != 2 {
		t.Fatalf("policy 0 alone: %+v, %v", gd, err)
	}
}
