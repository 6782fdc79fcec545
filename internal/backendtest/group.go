package backendtest

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/slidegate/slidegate/engine"
	"github.com/slidegate/slidegate/internal/reference"
)

// GroupFactory returns a fresh all-or-nothing backend over policies that
// reads clk. The test closes it.
type GroupFactory func(t *testing.T, policies []engine.Policy, clk engine.Clock) engine.GroupBackend

// RunGroup runs the multi-limit suite against backends from f: step tables
// (per second plus per hour on one key; per user plus per IP), random
// traces over any subset of the policies against one reference model per
// policy, and bad input.
func RunGroup(t *testing.T, f GroupFactory, sizes Sizes) {
	sizes = sizes.withDefaults()
	t.Run("PerSecondAndPerHour", func(t *testing.T) { perSecondAndPerHour(t, f) })
	t.Run("PerUserAndPerIP", func(t *testing.T) { perUserAndPerIP(t, f) })
	t.Run("Traces", func(t *testing.T) { groupTraces(t, f, sizes) })
	t.Run("BadInput", func(t *testing.T) { groupBadInput(t, f) })
	t.Run("Costs", func(t *testing.T) { groupCosts(t, f, sizes.SharedCost) })
}

// gstep is one row of a group step table.
type gstep struct {
	at      time.Duration
	keys    []string // keys[i] counts against policy i
	n       int
	allowed bool
	rem     []int
	retry   []time.Duration
	binding int
	why     string
}

func (s gstep) instant() time.Duration { return s.at }

func runGroupSteps(t *testing.T, f GroupFactory, ps []engine.Policy, rows []gstep) {
	t.Helper()
	stepThrough(func(clk engine.Clock) engine.GroupBackend { return f(t, ps, clk) }, rows, func(b engine.GroupBackend, i int, s gstep) {
		refs := make([]engine.Ref, len(s.keys))
		for j, k := range s.keys {
			refs[j] = engine.Ref{Policy: j, Key: k}
		}
		gd, err := b.DecideGroup(context.Background(), nil, engine.GroupRequest{Refs: refs, N: s.n})
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
	})
}

// 2 per second and 3 per hour on one key (docs/semantics.md, worked trace
// 3): the hourly limit binds after the third request, and requests either
// refuses are charged to neither.
func perSecondAndPerHour(t *testing.T, f GroupFactory) {
	ps := []engine.Policy{{Name: "per_second", Limit: 2, Window: time.Second}, {Name: "per_hour", Limit: 3, Window: time.Hour}}
	u := []string{"u1", "u1"}
	const s, ms = time.Second, time.Millisecond
	runGroupSteps(t, f, ps, []gstep{
		{0, u, 1, true, []int{1, 2}, []time.Duration{0, 0}, 0, "first"},
		{100 * ms, u, 1, true, []int{0, 1}, []time.Duration{0, 0}, 0, "second: the per-second limit has the least room"},
		{200 * ms, u, 1, false, []int{0, 1}, []time.Duration{800 * ms, 0}, 0, "per-second full; per-hour had room and is not charged"},
		{s, u, 1, true, []int{0, 0}, []time.Duration{0, 0}, 0, "0 expired; per-hour now full (ties bind the first)"},
		{3 * s, u, 1, false, []int{2, 0}, []time.Duration{0, time.Hour - 3*s}, 1, "per-hour refuses; per-second had room"},
		{4 * s, u, 1, false, []int{2, 0}, []time.Duration{0, time.Hour - 4*s}, 1, "still refused, and still not charged to per-second"},
		{time.Hour, u, 1, true, []int{1, 0}, []time.Duration{0, 0}, 1, "the hour's first entry expired"},
	})
}

// A per-user and a per-IP limit: either one refusing leaves both untouched.
func perUserAndPerIP(t *testing.T, f GroupFactory) {
	ps := []engine.Policy{{Name: "user", Limit: 2, Window: time.Minute}, {Name: "ip", Limit: 3, Window: time.Minute}}
	const s = time.Second
	runGroupSteps(t, f, ps, []gstep{
		{0, []string{"alice", "10.0.0.1"}, 1, true, []int{1, 2}, []time.Duration{0, 0}, 0, "alice from .1"},
		{s, []string{"bob", "10.0.0.1"}, 1, true, []int{1, 1}, []time.Duration{0, 0}, 0, "bob from .1 (tie binds the first)"},
		{2 * s, []string{"bob", "10.0.0.1"}, 2, false, []int{1, 1}, []time.Duration{59 * s, 58 * s}, 0, "cost 2: both refuse; bob waits longest"},
		{3 * s, []string{"carol", "10.0.0.1"}, 1, true, []int{1, 0}, []time.Duration{0, 0}, 1, "the IP's third: cost 2 above changed nothing"},
		{4 * s, []string{"alice", "10.0.0.2"}, 1, true, []int{0, 2}, []time.Duration{0, 0}, 0, "alice's second, from another IP"},
		{5 * s, []string{"alice", "10.0.0.3"}, 1, false, []int{0, 3}, []time.Duration{55 * s, 0}, 0, "the user refuses; the new IP holds nothing after"},
		{6 * s, []string{"dave", "10.0.0.3"}, 2, true, []int{0, 1}, []time.Duration{0, 0}, 0, "the refused request above left .3 empty"},
	})
}

// RandomRefs returns 1 to 4 refs over policies 0..np-1 and keys drawn from
// keys: any subset, a policy with two keys, and now and then an exact
// repeat.
func RandomRefs(r *rand.Rand, np int, keys []string) []engine.Ref {
	refs := make([]engine.Ref, 1+r.IntN(4))
	for i := range refs {
		refs[i] = engine.Ref{Policy: r.IntN(np), Key: keys[r.IntN(len(keys))]}
	}
	if len(refs) > 1 && r.IntN(5) == 0 {
		refs[len(refs)-1] = refs[0]
	}
	return refs
}

// MinLimit returns the smallest limit among the policies refs name.
func MinLimit(ps []engine.Policy, refs []engine.Ref) int {
	m := ps[refs[0].Policy].Limit
	for _, ref := range refs {
		m = min(m, ps[ref.Policy].Limit)
	}
	return m
}

// GroupRecord turns a group decision into a reference record.
func GroupRecord(refs []engine.Ref, n int, gd engine.GroupDecision) reference.GroupRecord {
	rec := reference.GroupRecord{Cost: n, At: gd.Limits[0].At, Allowed: gd.Allowed}
	for i, ref := range refs {
		d := gd.Limits[i]
		rec.Keys = append(rec.Keys, ref.Key)
		rec.Policies = append(rec.Policies, ref.Policy)
		rec.Limits = append(rec.Limits, reference.Result{Allowed: d.Allowed, Remaining: d.Remaining,
			RetryAfter: int64(d.RetryAfter), Reset: int64(d.Reset)})
	}
	return rec
}

// RequestRecord is GroupRecord for a request decided with DecideGroup:
// at req.N, or at each ref's own cost when req.Costs is not nil.
func RequestRecord(req engine.GroupRequest, gd engine.GroupDecision) reference.GroupRecord {
	rec := GroupRecord(req.Refs, req.N, gd)
	if req.Costs != nil {
		rec.Cost, rec.Costs = 0, append([]int(nil), req.Costs...)
	}
	return rec
}

// SingleRecord is the group record of one limiter's decision: a request
// of one limit, policy p of the group it is checked with.
func SingleRecord(p int, key string, n int, d engine.Decision) reference.GroupRecord {
	return GroupRecord([]engine.Ref{{Policy: p, Key: key}}, n, engine.GroupDecision{Allowed: d.Allowed, Limits: []engine.Decision{d}})
}

// VerifyGroup replays recs through one fresh reference model per policy
// and fails on any mismatch or over-admission, or when the records did not
// exercise both outcomes. It returns the report, for counts a caller
// checks on its own.
func VerifyGroup(t *testing.T, ps []engine.Policy, recs []reference.GroupRecord) reference.Report {
	t.Helper()
	return VerifyGroupAt(t, ps, recs, time.Nanosecond)
}

// VerifyGroupAt is VerifyGroup for a backend of instant resolution res
// (see Sizes.Resolution).
func VerifyGroupAt(t *testing.T, ps []engine.Policy, recs []reference.GroupRecord, res time.Duration) reference.Report {
	t.Helper()
	var (
		models  []reference.Model
		limits  []int
		windows []int64
		exact   []bool
	)
	for _, p := range ps {
		models = append(models, model(p, res))
		limits = append(limits, p.Limit)
		windows = append(windows, int64(p.Window))
		exact = append(exact, p.Algorithm == engine.SlidingLog)
	}
	rep := reference.VerifyGroup(models, limits, windows, exact, recs)
	if !rep.OK() {
		t.Fatalf("%d mismatches, %d over-admissions, %d under-admissions; e.g.\n%s",
			rep.Mismatches, rep.OverAdmissions, rep.UnderAdmissions, strings.Join(rep.Examples, "\n"))
	}
	if rep.Allowed == 0 || rep.Refused == 0 {
		t.Fatalf("the run did not exercise both outcomes: %+v", rep)
	}
	return rep
}

// groupTraces: requests over random subsets of three policies (a log, a
// log or counter, a log), clock moving in whole milliseconds and now and
// then back, against the reference.
func groupTraces(t *testing.T, f GroupFactory, sizes Sizes) {
	r := rand.New(rand.NewPCG(31, 32))
	keys := []string{"", "a", "abcdefgh", "abcdefghi"}
	const ms = int64(time.Millisecond)
	for trial := range sizes.Traces {
		ps := []engine.Policy{
			{Name: "a", Limit: 1 + r.IntN(4), Window: time.Duration(10+r.IntN(100)) * time.Millisecond},
			{Name: "b", Limit: 2 + r.IntN(6), Window: time.Duration(50+r.IntN(500)) * time.Millisecond, Algorithm: engine.Algorithm(r.IntN(2))},
			{Name: "c", Limit: 3 + r.IntN(10), Window: time.Duration(100+r.IntN(1000)) * time.Millisecond},
		}
		t.Run(fmt.Sprint(trial), func(t *testing.T) {
			clk := engine.NewManualClock()
			clk.Set(time.Second)
			b := f(t, ps, clk)
			defer b.Close()
			var recs []reference.GroupRecord
			dst := make([]engine.Decision, 0, 2) // sometimes too small: the backend allocates
			for range sizes.TraceSteps {
				if r.IntN(30) == 0 {
					clk.Advance(-time.Duration(r.Int64N(50) * ms))
				} else {
					clk.Advance(time.Duration(r.Int64N(8) * ms))
				}
				refs := RandomRefs(r, len(ps), keys)
				n := 1 + r.IntN(MinLimit(ps, refs))
				gd, err := b.DecideGroup(context.Background(), dst, engine.GroupRequest{Refs: refs, N: n})
				if err != nil {
					t.Fatal(err)
				}
				for _, d := range gd.Limits {
					if d.At != gd.Limits[0].At {
						t.Fatalf("limits decided at different instants: %+v", gd.Limits)
					}
				}
				recs = append(recs, GroupRecord(refs, n, gd))
			}
			VerifyGroupAt(t, ps, recs, sizes.Resolution)
		})
	}
}

func groupBadInput(t *testing.T, f GroupFactory) {
	ps := []engine.Policy{{Limit: 5, Window: time.Second}, {Limit: 2, Window: time.Hour}}
	b := f(t, ps, engine.NewManualClock())
	defer b.Close()
	ctx := context.Background()
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
		{[]engine.Ref{{Policy: 0, Key: "a"}, {Policy: 1, Key: "a"}}, -7, engine.ErrInvalidCost},
	} {
		if _, err := b.DecideGroup(ctx, nil, engine.GroupRequest{Refs: c.refs, N: c.n}); !errors.Is(err, c.want) {
			t.Errorf("DecideGroup(%v, %d): %v, want %v", c.refs, c.n, err, c.want)
		}
	}
	// Nothing above was charged; cost 3 fits policy 0 alone (its limit is 5).
	gd, err := b.DecideGroup(ctx, nil, engine.GroupRequest{Refs: []engine.Ref{{Policy: 0, Key: "a"}}, N: 3})
	if err != nil || !gd.Allowed || gd.Limits[0].Remaining != 2 {
		t.Fatalf("policy 0 alone: %+v, %v", gd, err)
	}
	gd, err = b.DecideGroup(ctx, nil, engine.GroupRequest{Refs: []engine.Ref{{Policy: 0, Key: "a"}, {Policy: 1, Key: "a"}}, N: 2})
	if err != nil || !gd.Allowed || gd.Limits[1].Remaining != 0 || gd.Binding != 0 {
		t.Fatalf("both: %+v, %v", gd, err)
	}
}

// groupCosts checks requests with a cost per ref (GroupRequest.Costs): all
// or nothing, each ref at its own cost (at the largest when shared), a
// ref repeated exactly once at the largest of its costs, and bad costs
// refused without charging.
func groupCosts(t *testing.T, f GroupFactory, shared bool) {
	ps := []engine.Policy{{Name: "s", Limit: 5, Window: time.Second}, {Name: "h", Limit: 4, Window: time.Hour}}
	clk := engine.NewManualClock()
	clk.Set(time.Hour)
	b := f(t, ps, clk)
	defer b.Close()
	ctx := context.Background()
	for _, c := range []struct {
		refs  []engine.Ref
		costs []int
		want  error
	}{
		{[]engine.Ref{{Policy: 0, Key: "a"}, {Policy: 1, Key: "a"}}, []int{1}, engine.ErrInvalidKeys},
		{[]engine.Ref{{Policy: 0, Key: "a"}}, []int{1, 1}, engine.ErrInvalidKeys},
		{[]engine.Ref{{Policy: 0, Key: "a"}, {Policy: 1, Key: "a"}}, []int{1, 0}, engine.ErrInvalidCost},
		{[]engine.Ref{{Policy: 0, Key: "a"}, {Policy: 1, Key: "a"}}, []int{6, 1}, engine.ErrInvalidCost},
		{[]engine.Ref{{Policy: 0, Key: "a"}, {Policy: 1, Key: "a"}}, []int{1, 5}, engine.ErrInvalidCost},
	} {
		if _, err := b.DecideGroup(ctx, nil, engine.GroupRequest{Refs: c.refs, Costs: c.costs}); !errors.Is(err, c.want) {
			t.Errorf("costs %v over %v: %v, want %v", c.costs, c.refs, err, c.want)
		}
	}
	refs := []engine.Ref{{Policy: 0, Key: "a"}, {Policy: 1, Key: "a"}}
	type want struct {
		allowed bool
		rem     [2]int
	}
	steps := []struct {
		costs         []int
		exact, shared want
	}{
		// Nothing above was charged: each limit has its whole room.
		{[]int{3, 1}, want{true, [2]int{2, 3}}, want{true, [2]int{2, 1}}},
		// Policy 0 has room for 2 only: refused, nothing charged.
		{[]int{3, 1}, want{false, [2]int{2, 3}}, want{false, [2]int{2, 1}}},
		{[]int{1, 3}, want{true, [2]int{1, 0}}, want{false, [2]int{2, 1}}},
	}
	for i, s := range steps {
		w := s.exact
		if shared {
			w = s.shared
		}
		gd, err := b.DecideGroup(ctx, nil, engine.GroupRequest{Refs: refs, Costs: s.costs})
		if err != nil {
			t.Fatalf("step %d, costs %v: %v", i, s.costs, err)
		}
		if gd.Allowed != w.allowed || gd.Limits[0].Remaining != w.rem[0] || gd.Limits[1].Remaining != w.rem[1] {
			t.Errorf("step %d, costs %v: allowed %v, remaining %d and %d; want %v, %v", i, s.costs, gd.Allowed, gd.Limits[0].Remaining, gd.Limits[1].Remaining, w.allowed, w.rem)
		}
	}
	// A ref repeated exactly is decided once, at the largest of its costs.
	gd, err := b.DecideGroup(ctx, nil, engine.GroupRequest{Refs: []engine.Ref{{Policy: 0, Key: "b"}, {Policy: 0, Key: "b"}}, Costs: []int{1, 3}})
	if err != nil || !gd.Allowed || gd.Limits[0].Remaining != 2 || gd.Limits[1].Remaining != 2 {
		t.Errorf("a ref repeated at costs 1 and 3: %+v, %v; want allowed, 2 remaining for both", gd, err)
	}
}
