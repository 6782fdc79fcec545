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
	"github.com/slidegate/slidegate/internal/reference"
	"github.com/slidegate/slidegate/internal/shard"
)

// setRecord is one decision of the SetPolicy stress, with the limit it
// applied.
type setRecord struct {
	key     string
	n       int
	limit   int
	window  int64
	allowed bool
	res     shard.Result
}

func (r setRecord) result() reference.Result {
	return reference.Result{Allowed: r.res.Allowed, Remaining: r.res.Remaining, RetryAfter: r.res.RetryAfter, Reset: r.res.Reset}
}

// same reports whether r and o are the same decision of one key and
// instant: replayed in either order, they give the same.
func (r setRecord) same(o setRecord) bool {
	return r.n == o.n && r.limit == o.limit && r.window == o.window && r.res == o.res
}

// liveBefore is the number of live entries the decision saw: at one
// instant a key's live entries only grow, so it orders decisions of equal
// At whatever their limits.
func (r setRecord) liveBefore() int {
	if r.allowed {
		return r.limit - r.res.Remaining - r.n
	}
	return r.limit - r.res.Remaining
}

// TestSetPolicyStress: the limit changes every few decisions while many
// goroutines decide (on the monotonic clock's shortcut and off it) and
// sweeps run in a tight loop, on windows of microseconds. Ordered by At
// and replayed through the reference log with each decision's own limit,
// every decision must match in every field.
func TestSetPolicyStress(t *testing.T) {
	keys := []string{"", "a", "abcdefgh", "abcdefghi", strings.Repeat("k", 100), strings.Repeat("k", 1000)}
	goroutines, perG := 12, 1500
	if raceEnabled {
		perG = 500
	}
	for _, procs := range []int{2, 8, 32} {
		t.Run(fmt.Sprintf("GOMAXPROCS=%d", procs), func(t *testing.T) {
			defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(procs))
			r := rand.New(rand.NewPCG(uint64(procs), 28))
			for trial := range 4 {
				window := int64(5+r.IntN(50)) * int64(time.Microsecond)
				setPolicyStress(t, window, keys, goroutines, perG, uint64(trial))
			}
		})
	}
}

func setPolicyStress(t *testing.T, window int64, keys []string, goroutines, perG int, seed uint64) {
	t.Helper()
	policyStress(t, []int64{window}, keys, goroutines, perG, seed)
}

// TestSetPolicyWindowStress: the window changes too, between a short one
// (limits 1 to 3) and a long one (4 to 6), every few decisions. Without sweeps (a sweep may drop a key
// whose entries all expired under the short window, which the long one
// would still count: documented, but not replayable), every decision
// replays exactly through a log that drops entries only at accepts,
// under the accept's own window, as the ring does.
func TestSetPolicyWindowStress(t *testing.T) {
	keys := []string{"", "a", "abcdefghi", strings.Repeat("k", 1000)}
	goroutines, perG := 12, 1500
	if raceEnabled {
		perG = 500
	}
	for _, procs := range []int{2, 8, 32} {
		t.Run(fmt.Sprintf("GOMAXPROCS=%d", procs), func(t *testing.T) {
			defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(procs))
			r := rand.New(rand.NewPCG(uint64(procs), 29))
			for trial := range 4 {
				short := int64(2+r.IntN(10)) * int64(time.Microsecond)
				policyStress(t, []int64{short, 5 * short}, keys, goroutines, perG, uint64(trial))
			}
		})
	}
}

func policyStress(t *testing.T, windows []int64, keys []string, goroutines, perG int, seed uint64) {
	t.Helper()
	// The limit names the policy, and so the window a decision applied:
	// limits 1 to 3 go with the first window, 4 to 6 with the last.
	windowOf := func(limit int) int64 {
		if limit <= 3 {
			return windows[0]
		}
		return windows[len(windows)-1]
	}
	window := windows[0]
	s := newStore(t, shard.Config{Algorithm: shard.Log, Limit: 3, Window: window, Shards: 2})
	epoch := time.Now()
	now := func() int64 { return int64(time.Since(epoch)) }
	stopSweeps := func() {}
	if len(windows) == 1 {
		stopSweeps = backendtest.Loop(func() { s.Sweep(now()) })
	}
	// The deciders change the policy themselves now and then, so that the
	// changes interleave with decisions however few the cores; the mutex
	// keeps SetPolicy calls from racing each other, as the engine's does.
	var setMu sync.Mutex
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
					limit := 1 + r.IntN(6)
					if err := s.SetPolicy(limit, windowOf(limit), now); err != nil {
						t.Error(err)
					}
					changes++
					setMu.Unlock()
				}
				k := keys[r.IntN(len(keys))]
				n := 1 + r.IntN(3)
				var res shard.Result
				if err := s.Decide(k, n, now(), r.IntN(2) == 0, &res); err != nil {
					if !errors.Is(err, shard.ErrInvalid) {
						t.Errorf("Decide: %v", err)
					}
					continue // a cost above the limit in force
				}
				out = append(out, setRecord{key: k, n: n, limit: res.Limit, window: windowOf(res.Limit), allowed: res.Allowed, res: res})
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
	seenWindows := map[int64]bool{}
	allowed, refused, mismatches := 0, 0, 0
	var examples []string
	for _, rec := range all {
		limits[rec.limit] = true
		seenWindows[rec.window] = true
		if rec.allowed {
			allowed++
		} else {
			refused++
		}
	}
	// Decisions of one key at one instant may have taken effect in any
	// order: find one that replays, trying the live-count order first.
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
					examples = append(examples, fmt.Sprintf("key %.10q cost %d at %d, limit %d window %d: got %+v, want %+v", rec.key, rec.n, rec.res.At, rec.limit, rec.window, rec.result(), want))
				}
			}
		}
		lo = hi
	}
	if mismatches > 0 {
		t.Fatalf("window %d: %d of %d decisions mismatch; e.g.\n%s", window, mismatches, len(all), strings.Join(examples, "\n"))
	}
	if allowed == 0 || refused == 0 || len(limits) < 3 || len(seenWindows) != len(slices.Compact(windows)) || changes < 10 {
		t.Fatalf("the run did not exercise the change: %d allowed, %d refused, limits %v, windows %v, %d changes", allowed, refused, limits, seenWindows, changes)
	}
}

// acceptLog is the log with the policy changing between decisions as the
// store keeps it: a decision counts the entries live under its own
// window; an accept drops the entries expired under it, then appends.
// With a fixed window it decides as reference.Log does.
type acceptLog struct{ keys map[string][]int64 }

// replayTies replays group, decisions of one key at one instant, in some
// order in which every one matches, and reports whether there is one; it
// leaves group in that order, or the model as it found it.
func (m *acceptLog) replayTies(group []setRecord) bool {
	if len(group) == 0 {
		return true
	}
	key := group[0].key
	saved := slices.Clone(m.keys[key])
	for i := range group {
		if slices.ContainsFunc(group[:i], func(o setRecord) bool { return o.same(group[i]) }) {
			continue // interchangeable with one tried already
		}
		rec := group[i]
		if m.decide(key, rec.n, rec.res.At, rec.limit, rec.window) == rec.result() {
			group[0], group[i] = group[i], group[0]
			if m.replayTies(group[1:]) {
				return true
			}
			group[0], group[i] = group[i], group[0]
		}
		m.keys[key] = slices.Clone(saved)
	}
	return false
}

func (m *acceptLog) decide(key string, n int, t int64, limit int, w int64) reference.Result {
	q := m.keys[key]
	j := 0
	for j < len(q) && q[j] <= t-w {
		j++
	}
	live := q[j:]
	var r reference.Result
	if len(live)+n <= limit {
		r.Allowed = true
		live = append(live[:len(live):len(live)], slices.Repeat([]int64{t}, n)...)
		m.keys[key] = live
		r.Remaining = limit - len(live)
	} else {
		r.RetryAfter = live[len(live)+n-limit-1] + w - t
		r.Remaining = limit - len(live)
	}
	if len(live) > 0 {
		r.Reset = live[0] + w - t
	}
	return r
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}

// TestNewKeyDecidesUnderPolicyInForce: a decision loads the policy (3 per
// 100 ns); SetPolicy then shortens the window to 30 ns, a sweep drops the
// key as idle under it, and the decision finds no block and creates one.
// Under the policy it loaded the dropped entry still counts, so it must
// decide under the one in force, no earlier than that policy's instant, as
// an accept does when the policy changed before its ctl CAS.
func TestNewKeyDecidesUnderPolicyInForce(t *testing.T) {
	for _, tc := range []struct {
		limit   int
		allowed bool
	}{{5, true}, {2, false}} {
		t.Run(fmt.Sprint("limit ", tc.limit), func(t *testing.T) {
			s, err := shard.New(shard.Config{Algorithm: shard.Log, Limit: 3, Window: 100, Shards: 1})
			if err != nil {
				t.Fatal(err)
			}
			var r shard.Result
			if err := s.Decide("k", 1, 10, true, &r); err != nil || !r.Allowed {
				t.Fatalf("Decide at 10: %+v, %v", r, err)
			}
			loaded := s.PolicyOf("k")
			if err := s.SetPolicy(tc.limit, 30, func() int64 { return 50 }); err != nil {
				t.Fatal(err)
			}
			if n, err := s.SweepShard(0, 50); n != 1 || err != nil {
				t.Fatalf("SweepShard at 50: %d, %v; want the key dropped", n, err)
			}
			err = s.DecideNewUnder(loaded, "k", 3, 20, &r)
			if !tc.allowed {
				// A cost of 3 is above the new limit: the error the
				// caller gets from Decide, and the key's fresh block
				// holds nothing.
				if !errors.Is(err, shard.ErrInvalid) {
					t.Fatalf("a cost of 3 under a limit of 2: %+v, %v; want ErrInvalid", r, err)
				}
				if err := s.Decide("k", 2, 60, true, &r); err != nil || !r.Allowed || r.Remaining != 0 {
					t.Errorf("Decide(k, 2) at 60 after the refused cost: %+v, %v; want allowed, none left", r, err)
				}
				return
			}
			if err != nil || !r.Allowed || r.Limit != tc.limit || r.At < 50 {
				t.Errorf("the first request of the re-created key: %+v, %v; want allowed under the limit in force (%d) at 50 or later", r, err, tc.limit)
			}
		})
	}
}

// TestRefusedNewKeyKeepsHorizon: a key's first request refused with the
// cost error (SetPolicy lowered the limit below its cost after it loaded
// the policy) leaves its fresh block empty in the map. The next request
// decides on that block as an existing one, so the block must carry the
// shard's horizon: the key's dropped incarnation held an entry at 40, live
// until 70 under a window of 30, and a cost of 2 under a limit of 2 fits
// only from 70 on.
func TestRefusedNewKeyKeepsHorizon(t *testing.T) {
	s, err := shard.New(shard.Config{Algorithm: shard.Log, Limit: 3, Window: 100, Shards: 1})
	if err != nil {
		t.Fatal(err)
	}
	loaded := s.PolicyOf("k")
	if err := s.SetPolicy(2, 30, func() int64 { return 15 }); err != nil {
		t.Fatal(err)
	}
	var r shard.Result
	if err := s.Decide("k", 1, 40, false, &r); err != nil || !r.Allowed || r.At != 40 {
		t.Fatalf("Decide at 40: %+v, %v", r, err)
	}
	if n, err := s.SweepShard(0, 70); n != 1 || err != nil {
		t.Fatalf("SweepShard at 70: %d, %v; want the key dropped", n, err)
	}
	if err := s.DecideNewUnder(loaded, "k", 3, 20, &r); !errors.Is(err, shard.ErrInvalid) {
		t.Fatalf("a cost of 3 under a limit of 2: %+v, %v; want ErrInvalid", r, err)
	}
	if err := s.Decide("k", 2, 50, false, &r); err != nil || r.Allowed && r.At < 70 {
		t.Errorf("Decide(k, 2) at 50 after the refused first request: %+v, %v; want no admission before 70", r, err)
	}
}
