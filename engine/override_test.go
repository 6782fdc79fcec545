package engine_test

import (
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/slidegate/slidegate/engine"
	"github.com/slidegate/slidegate/internal/reference"
)

// keyModels is the reference log with one model per key, so that each key
// can have its own limit: a key's model keeps its instants when its limit
// changes, as SetOverrides promises.
type keyModels struct {
	window int64
	models map[string]*reference.Log
}

func (m *keyModels) of(key string, limit int) *reference.Log {
	lm, ok := m.models[key]
	if !ok {
		lm = reference.NewLog(limit, m.window)
		m.models[key] = lm
	}
	lm.Limit = limit
	return lm
}

// clamp is a model result as the engine reports it: Remaining is 0, not
// negative, for a key holding more than a lowered limit.
func clamp(r reference.Result) reference.Result {
	r.Remaining = max(r.Remaining, 0)
	return r
}

func resultOf(d engine.Decision) reference.Result {
	return reference.Result{Allowed: d.Allowed, Remaining: d.Remaining, RetryAfter: int64(d.RetryAfter), Reset: int64(d.Reset)}
}

// Random traces over two limiters, with each one's overrides replaced now
// and then and sweeps in between, decided one key at a time and in
// groups over both: every decision matches the reference log of its
// key's limit in every field, and applies that limit (Decision.Limit).
func TestOverridesMatchReference(t *testing.T) {
	for seed := range uint64(40) {
		t.Run(fmt.Sprintf("seed=%d", seed), func(t *testing.T) { overridesTrace(t, seed) })
	}
}

func overridesTrace(t *testing.T, seed uint64) {
	r := rand.New(rand.NewPCG(seed, 43))
	const window = 40
	clk := engine.NewManualClock()
	keys := []string{"a", "b", "", "c", string(make([]byte, 2*engine.LongKeyBytes))}
	var lims [2]*engine.Limiter
	var models [2]*keyModels
	var overrides [2]map[string]int
	for i := range lims {
		l, err := engine.New(engine.Policy{Name: fmt.Sprint(i), Limit: 2 + r.IntN(4), Window: window},
			engine.WithSweepInterval(0), engine.WithShards(2), engine.WithClock(clk))
		if err != nil {
			t.Fatal(err)
		}
		defer l.Close()
		lims[i], models[i] = l, &keyModels{window: window, models: map[string]*reference.Log{}}
	}
	g, err := engine.NewGroupOf(lims[0], lims[1])
	if err != nil {
		t.Fatal(err)
	}
	limitOf := func(i int, key string) int {
		if l, ok := overrides[i][key]; ok {
			return l
		}
		return lims[i].Policy().Limit
	}
	var now int64
	changes := 0
	for step := range 3000 {
		switch x := r.IntN(100); {
		case x < 4:
			i := r.IntN(2)
			o := map[string]int{}
			for _, k := range keys {
				if r.IntN(2) == 0 {
					o[k] = 1 + r.IntN(9)
				}
			}
			clk.Set(time.Duration(now)) // decisions after it are made no earlier
			if err := lims[i].SetOverrides(o); err != nil {
				t.Fatalf("step %d: SetOverrides(%v): %v", step, o, err)
			}
			if got := lims[i].Overrides(); !maps.Equal(got, o) {
				t.Fatalf("step %d: Overrides() = %v, set %v", step, got, o)
			}
			overrides[i] = o
			changes++
			continue
		case x < 7:
			lims[r.IntN(2)].SweepAt(now)
			continue
		}
		now += int64(r.IntN(6))
		key := keys[r.IntN(len(keys))]
		if r.IntN(4) > 0 {
			i := r.IntN(2)
			limit := limitOf(i, key)
			n := 1 + r.IntN(limit)
			d, err := lims[i].AllowNAt(key, n, now)
			if err != nil {
				t.Fatalf("step %d: limiter %d key %q cost %d (limit %d): %v", step, i, key, n, limit, err)
			}
			want := clamp(models[i].of(key, limit).Decide(key, n, d.At))
			if d.At != now || d.Limit != limit || resultOf(d) != want {
				t.Fatalf("step %d: limiter %d key %q cost %d at %d: got %+v (At %d, Limit %d), want %+v (limit %d)",
					step, i, key, n, now, resultOf(d), d.At, d.Limit, want, limit)
			}
			continue
		}
		key2 := keys[r.IntN(len(keys))]
		l0, l1 := limitOf(0, key), limitOf(1, key2)
		n := 1 + r.IntN(min(l0, l1, lims[0].Policy().Limit, lims[1].Policy().Limit))
		gd, err := g.AllowNAt([]string{key, key2}, n, now)
		if err != nil {
			t.Fatalf("step %d: group %q %q cost %d: %v", step, key, key2, n, err)
		}
		m0, m1 := models[0].of(key, l0), models[1].of(key2, l1)
		p0, p1 := m0.Peek(key, n, now), m1.Peek(key2, n, now)
		want := [2]reference.Result{clamp(p0), clamp(p1)}
		if p0.Allowed && p1.Allowed {
			want = [2]reference.Result{clamp(m0.Decide(key, n, now)), clamp(m1.Decide(key2, n, now))}
		}
		for i, d := range gd.Limits {
			if d.At != now || d.Limit != []int{l0, l1}[i] || resultOf(d) != want[i] {
				t.Fatalf("step %d: group %q %q cost %d at %d, limit %d: got %+v (At %d, Limit %d), want %+v",
					step, key, key2, n, now, i, resultOf(d), d.At, d.Limit, want[i])
			}
		}
		if gd.Allowed != (p0.Allowed && p1.Allowed) {
			t.Fatalf("step %d: group allowed %v", step, gd.Allowed)
		}
	}
	if changes < 20 {
		t.Fatalf("only %d changes of overrides", changes)
	}
}

// A key at its override's limit stays refused when another key's
// override changes; one whose override rises gets exactly the extra
// room; a cost above the policy's limit fits a key whose override allows
// it, and a limit out of range is refused without a change.
func TestOverridesKeepTheLog(t *testing.T) {
	clk := engine.NewManualClock()
	lim, err := engine.New(engine.Policy{Name: "p", Limit: 3, Window: time.Minute}, engine.WithClock(clk))
	if err != nil {
		t.Fatal(err)
	}
	defer lim.Close()
	must := func(o map[string]int) {
		t.Helper()
		if err := lim.SetOverrides(o); err != nil {
			t.Fatal(err)
		}
	}
	allow := func(key string, n int, allowed bool, limit int) {
		t.Helper()
		d, err := lim.AllowN(key, n)
		if err != nil || d.Allowed != allowed || d.Limit != limit {
			t.Fatalf("%q cost %d: %+v, %v; want allowed %v at limit %d", key, n, d, err, allowed, limit)
		}
	}
	must(map[string]int{"a": 5, "b": 2})
	allow("a", 5, true, 5)
	allow("a", 1, false, 5)
	allow("b", 2, true, 2)
	allow("z", 3, true, 3)
	must(map[string]int{"a": 5, "b": 4}) // b's changes
	allow("a", 1, false, 5)
	allow("z", 1, false, 3)
	allow("b", 2, true, 4)
	allow("b", 1, false, 4)
	must(map[string]int{"a": 7, "b": 4})
	allow("a", 2, true, 7)
	allow("a", 1, false, 7)
	if _, err := lim.AllowN("b", 5); !errors.Is(err, engine.ErrInvalidCost) || !strings.Contains(err.Error(), "1..4") {
		t.Fatalf("cost 5 over b's override 4: %v", err)
	}
	if _, err := lim.ReserveN("b", 5); !errors.Is(err, engine.ErrInvalidCost) || !strings.Contains(err.Error(), "1..4") {
		t.Fatalf("a reservation of 5 over b's override 4: %v", err)
	}
	for _, bad := range []int{0, -1, engine.MaxLogLimit + 1} {
		if err := lim.SetOverrides(map[string]int{"a": bad}); err == nil {
			t.Fatalf("override %d accepted", bad)
		}
	}
	if got := lim.Overrides(); got["a"] != 7 || got["b"] != 4 || len(got) != 2 {
		t.Fatalf("a refused change changed the overrides: %v", got)
	}
	clk.Advance(time.Minute)
	// A reservation of a cost above the policy's limit fits a key whose
	// override allows it, at once on an empty window.
	r, err := lim.ReserveN("a", 6)
	if err != nil || r.Delay() != 0 {
		t.Fatalf("a reservation of 6 for a (override 7): %v, %v", r, err)
	}
	allow("a", 1, true, 7)
	allow("a", 1, false, 7)
}

// The trace of docs/semantics.md, "Per-key limits (overrides)": L = 2,
// W = 60 s.
func TestOverridesTrace(t *testing.T) {
	clk := engine.NewManualClock()
	lim, err := engine.New(engine.Policy{Name: "p", Limit: 2, Window: time.Minute}, engine.WithClock(clk))
	if err != nil {
		t.Fatal(err)
	}
	defer lim.Close()
	for i, s := range []struct {
		at        int // seconds
		overrides map[string]int
		allowed   bool
		limit     int
	}{
		{0, nil, true, 2},
		{1, nil, true, 2},
		{2, nil, false, 2},
		{5, map[string]int{"a": 3}, true, 3}, // the two of 0 and 1 still count
		{6, nil, false, 3},
		{7, map[string]int{"a": 1}, false, 1},
		{61, nil, false, 1}, // the entry of 5 still fills the limit
		{65, nil, true, 1},
	} {
		clk.Set(time.Duration(s.at) * time.Second)
		if s.overrides != nil {
			if err := lim.SetOverrides(s.overrides); err != nil {
				t.Fatal(err)
			}
		}
		if d := lim.Allow("a"); d.Allowed != s.allowed || d.Limit != s.limit {
			t.Fatalf("step %d at %d s: allowed %v at limit %d, want %v at %d", i, s.at, d.Allowed, d.Limit, s.allowed, s.limit)
		}
	}
}
