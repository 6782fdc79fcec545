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
	"github.com/slidegate/slidegate/shard"
)

// setRecord is one decision of the SetPolicy stress, with the limit it
// applied.
type setRecord struct {
	key     string
	n       int
	limit   int
	allowed bool
	res     shard.Result
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
	s := newStore(t, shard.Config{Algorithm: shard.Log, Limit: 3, Window: window, Shards: 2})
	epoch := time.Now()
	now := func() int64 { return int64(time.Since(epoch)) }
	stopSweeps := backendtest.Loop(func() { s.Sweep(now()) })
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
					if err := s.SetPolicy(1+r.IntN(6), window, now); err != nil {
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
				out = append(out, setRecord{key: k, n: n, limit: res.Limit, allowed: res.Allowed, res: res})
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
	m := reference.NewLog(1, window)
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
		m.Limit = rec.limit
		want := m.Decide(rec.key, rec.n, rec.res.At)
		got := reference.Result{Allowed: rec.res.Allowed, Remaining: rec.res.Remaining, RetryAfter: rec.res.RetryAfter, Reset: rec.res.Reset}
		if got != want {
			mismatches++
			if len(examples) < 5 {
				examples = append(examples, fmt.Sprintf("key %.10q cost %d at %d, limit %d: got %+v, want %+v", rec.key, rec.n, rec.res.At, rec.limit, got, want))
			}
		}
	}
	if mismatches > 0 {
		t.Fatalf("window %d: %d of %d decisions mismatch; e.g.\n%s", window, mismatches, len(all), strings.Join(examples, "\n"))
	}
	if allowed == 0 || refused == 0 || len(limits) < 3 || changes < 10 {
		t.Fatalf("the run did not exercise the change: %d allowed, %d refused, limits %v, %d changes", allowed, refused, limits, changes)
	}
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}
