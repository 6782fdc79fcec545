package shard_test

import (
	"cmp"
	"errors"
	"fmt"
	"math/rand/v2"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/slidegate/slidegate/internal/backendtest"
	"github.com/slidegate/slidegate/internal/shard"
)

// TestOverridesStress: the overrides change every few decisions while
// many goroutines decide, singly and in groups over two stores, and
// sweeps run in a tight loop, on windows of microseconds. Ordered by At
// and replayed through the log with each decision's own limit, every
// decision matches in every field; keys never overridden always apply the
// store's limit.
func TestOverridesStress(t *testing.T) {
	goroutines, perG := 12, 1500
	if raceEnabled {
		perG = 500
	}
	for _, procs := range []int{2, 8, 32} {
		t.Run(fmt.Sprintf("GOMAXPROCS=%d", procs), func(t *testing.T) {
			defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(procs))
			r := rand.New(rand.NewPCG(uint64(procs), 43))
			for trial := range 4 {
				window := int64(5+r.IntN(50)) * int64(time.Microsecond)
				overridesStress(t, window, goroutines, perG, uint64(trial))
			}
		})
	}
}

func overridesStress(t *testing.T, window int64, goroutines, perG int, seed uint64) {
	t.Helper()
	const base = 3
	overridden := []string{"a", "abcdefghi", strings.Repeat("k", 1000)} // short, linked and long keys
	plain := []string{"", "b"}
	keys := slices.Concat(overridden, plain)
	s := newStore(t, shard.Config{Algorithm: shard.Log, Limit: base, Window: window, Shards: 2})
	other := newStore(t, shard.Config{Algorithm: shard.Log, Limit: shard.MaxLogLimit, Window: window, Shards: 2})
	epoch := time.Now()
	now := func() int64 { return int64(time.Since(epoch)) }
	stopSweeps := backendtest.Loop(func() { s.Sweep(now()) })
	var setMu sync.Mutex // SetOverrides calls must not race each other
	changes := 0
	recs := make([][]setRecord, goroutines)
	var wg sync.WaitGroup
	for g := range goroutines {
		wg.Go(func() {
			r := rand.New(rand.NewPCG(seed, uint64(g)))
			out := make([]setRecord, 0, perG)
			for range perG {
				if r.IntN(20) == 0 {
					setMu.Lock()
					limits := map[string]int{}
					for _, k := range overridden {
						if r.IntN(3) > 0 {
							limits[k] = 1 + r.IntN(6)
						}
					}
					if err := s.SetOverrides(limits, now); err != nil {
						t.Error(err)
					}
					changes++
					setMu.Unlock()
				}
				k := keys[r.IntN(len(keys))]
				n := 1 + r.IntN(3)
				var res shard.Result
				if r.IntN(4) == 0 {
					// A group with a key of the other store, whose limit
					// leaves room for every request of the run: s
					// decides alone, and the group logs what s allows.
					stores, gkeys := []*shard.Store{s, other}, []string{k, "g"}
					if other.ID() < s.ID() {
						stores, gkeys = []*shard.Store{other, s}, []string{"g", k}
					}
					rs := make([]shard.Result, 2)
					allowed, err := shard.DecideGroup(stores, gkeys, n, now(), r.IntN(2) == 0, rs)
					if err != nil {
						if !errors.Is(err, shard.ErrInvalid) {
							t.Errorf("DecideGroup: %v", err)
						}
						continue
					}
					res = rs[slices.Index(stores, s)]
					if res.Allowed != allowed {
						t.Errorf("group allowed %v, its store s %v", allowed, res.Allowed)
					}
				} else if err := s.Decide(k, n, now(), r.IntN(2) == 0, &res); err != nil {
					if !errors.Is(err, shard.ErrInvalid) {
						t.Errorf("Decide: %v", err)
					}
					continue // a cost above the key's limit in force
				}
				if slices.Contains(plain, k) && res.Limit != base {
					t.Errorf("key %q has no override but applied limit %d", k, res.Limit)
				}
				out = append(out, setRecord{key: k, n: n, limit: res.Limit, window: window, allowed: res.Allowed, res: res})
			}
			recs[g] = out
		})
	}
	wg.Wait()
	stopSweeps()
	all := slices.Concat(recs...)
	slices.SortFunc(all, func(a, b setRecord) int {
		return cmp.Or(cmp.Compare(a.key, b.key), cmp.Compare(a.res.At, b.res.At),
			cmp.Compare(a.liveBefore(), b.liveBefore()), cmp.Compare(boolInt(a.allowed), boolInt(b.allowed)))
	})
	m := &acceptLog{keys: map[string][]int64{}}
	limits := map[int]bool{}
	allowed, refused, mismatches := 0, 0, 0
	var examples []string
	for _, rec := range all {
		limits[rec.limit] = true
		if rec.allowed {
			allowed++
		} else {
			refused++
		}
	}
	for lo := 0; lo < len(all); {
		hi := lo + 1
		for hi < len(all) && all[hi].key == all[lo].key && all[hi].res.At == all[lo].res.At {
			hi++
		}
		if group := all[lo:hi]; !m.replayTies(group) {
			mismatches += len(group)
			for _, rec := range group {
				want := m.decide(rec.key, rec.n, rec.res.At, rec.limit, rec.window)
				if len(examples) < 5 {
					examples = append(examples, fmt.Sprintf("key %.10q cost %d at %d, limit %d: got %+v, want %+v", rec.key, rec.n, rec.res.At, rec.limit, rec.result(), want))
				}
			}
		}
		lo = hi
	}
	if mismatches > 0 {
		t.Fatalf("window %d: %d of %d decisions mismatch; e.g.\n%s", window, mismatches, len(all), strings.Join(examples, "\n"))
	}
	if allowed == 0 || refused == 0 || len(limits) < 4 || changes < 10 {
		t.Fatalf("the run did not exercise the overrides: %d allowed, %d refused, limits %v, %d changes", allowed, refused, limits, changes)
	}
}

// TestOverridesKeepState: a key's log stays when its override is added,
// raised, lowered and removed, and keys without one are untouched.
func TestOverridesKeepState(t *testing.T) {
	s := newStore(t, shard.Config{Algorithm: shard.Log, Limit: 2, Window: 100, Shards: 2})
	at := int64(10)
	now := func() int64 { return at }
	decide := func(key string, n int) shard.Result {
		t.Helper()
		var r shard.Result
		if err := s.Decide(key, n, at, false, &r); err != nil {
			t.Fatalf("Decide(%q, %d) at %d: %v", key, n, at, err)
		}
		return r
	}
	step := func(what, key string, n int, allowed bool, limit, remaining int) {
		t.Helper()
		r := decide(key, n)
		if r.Allowed != allowed || r.Limit != limit || r.Remaining != remaining {
			t.Fatalf("%s: %q cost %d at %d: got allowed %v limit %d remaining %d, want %v %d %d", what, key, n, at, r.Allowed, r.Limit, r.Remaining, allowed, limit, remaining)
		}
	}
	step("fill a", "a", 2, true, 2, 0)
	step("fill b", "b", 2, true, 2, 0)
	step("a full", "a", 1, false, 2, 0)
	if err := s.SetOverrides(map[string]int{"a": 5}, now); err != nil {
		t.Fatal(err)
	}
	step("a raised: exactly 3 more", "a", 3, true, 5, 0)
	step("a raised, full", "a", 1, false, 5, 0)
	step("b untouched", "b", 1, false, 2, 0)
	if err := s.SetOverrides(map[string]int{"a": 1, "b": 3}, now); err != nil {
		t.Fatal(err)
	}
	step("a lowered below what it holds", "a", 1, false, 1, -4)
	step("b raised", "b", 1, true, 3, 0)
	if got := s.Overrides(); len(got) != 2 || got["a"] != 1 || got["b"] != 3 {
		t.Fatalf("Overrides() = %v", got)
	}
	if err := s.SetOverrides(nil, now); err != nil {
		t.Fatal(err)
	}
	step("a back to the store's limit, still full", "a", 1, false, 2, -3)
	at = 110 // a's and b's entries made at 10 expire
	step("a after the window", "a", 2, true, 2, 0)
	if s.Overrides() != nil {
		t.Fatalf("Overrides() after removing all = %v", s.Overrides())
	}
	// A cost above the store's limit fits a raised override, and one
	// above a lowered override does not.
	if err := s.SetOverrides(map[string]int{"c": 4, "d": 1}, now); err != nil {
		t.Fatal(err)
	}
	step("c's cost above the store's limit", "c", 4, true, 4, 0)
	var r shard.Result
	if err := s.Decide("d", 2, at, false, &r); !errors.Is(err, shard.ErrInvalid) {
		t.Fatalf("cost 2 for d (override 1): %v", err)
	}
	if err := s.SetOverrides(map[string]int{"x": 0}, now); !errors.Is(err, shard.ErrInvalid) {
		t.Fatalf("override 0: %v", err)
	}
	if err := s.SetOverrides(map[string]int{"x": shard.MaxLogLimit + 1}, now); !errors.Is(err, shard.ErrInvalid) {
		t.Fatalf("override above MaxLogLimit: %v", err)
	}
}

// BenchmarkDecideOverrides is BenchmarkDecideHotKeyAllowed on a store
// with 1000 overrides: for a key without one (the map lookup that misses)
// and for a key with one.
func BenchmarkDecideOverrides(b *testing.B) {
	limits := map[string]int{}
	for i := range 1000 {
		limits[fmt.Sprintf("tenant-%d", i)] = 1 << 19
	}
	for _, key := range []string{"client-42", "tenant-7"} {
		b.Run(key, func(b *testing.B) {
			s := newStore(b, shard.Config{Limit: 1 << 20, Window: int64(time.Nanosecond) * 1000})
			if err := s.SetOverrides(limits, func() int64 { return 0 }); err != nil {
				b.Fatal(err)
			}
			var now int64
			var r shard.Result
			b.ReportAllocs()
			for b.Loop() {
				now++
				s.Decide(key, 1, now, true, &r)
			}
		})
	}
}
