package engine_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/slidegate/slidegate/engine"
	"github.com/slidegate/slidegate/internal/backendtest"
	"github.com/slidegate/slidegate/internal/reference"
)

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
			recs = append(recs, backendtest.GroupRecord(refsOf(keys), n, gd))
			if r.IntN(50) == 0 {
				g.SweepAt(now)
			}
		}
		g.Close()
		t.Run(fmt.Sprint(trial), func(t *testing.T) { backendtest.VerifyGroup(t, ps, recs) })
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
				stop := backendtest.Loop(func() { g.Sweep() })
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
							recs[w] = append(recs[w], backendtest.GroupRecord(refsOf(keys), n, gd))
						}
					}()
				}
				wg.Wait()
				stop()
				g.Close()
				all := slices.Concat(recs...)
				backendtest.VerifyGroup(t, ps, all)
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
		gd, _ := g.AllowN([]string{"api-key-1", "api-key-1"}, 1)
		d := gd.Decision() // the binding limit
		fmt.Println(gd.Allowed, g.Policies()[gd.Binding].Name, d.Remaining, d.RetryAfter)
	}
	// Output:
	// true per_second 1 0s
	// true per_second 0 0s
	// false per_second 0 1s
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
			stop := backendtest.Loop(func() { g.Sweep() })
			recs := make([][]reference.GroupRecord, 12)
			var wg sync.WaitGroup
			for w := range recs {
				wg.Add(1)
				go func() {
					defer wg.Done()
					r := rand.New(rand.NewPCG(uint64(w), uint64(procs)+100))
					dst := make([]engine.Decision, 4)
					for range perG {
						refs := backendtest.RandomRefs(r, len(ps), stressKeys[:3])
						n := 1 + r.IntN(backendtest.MinLimit(ps, refs))
						gd, err := g.DecideGroup(context.Background(), dst, engine.GroupRequest{Refs: refs, N: n})
						if err != nil {
							t.Errorf("DecideGroup: %v", err)
							return
						}
						recs[w] = append(recs[w], backendtest.GroupRecord(refs, n, gd))
					}
				}()
			}
			wg.Wait()
			stop()
			g.Close()
			all := slices.Concat(recs...)
			backendtest.VerifyGroup(t, ps, all)
		})
	}
}

// refsOf returns the refs of a request that counts keys[i] against
// policy i.
func refsOf(keys []string) []engine.Ref {
	refs := make([]engine.Ref, len(keys))
	for i, k := range keys {
		refs[i] = engine.Ref{Policy: i, Key: k}
	}
	return refs
}

// Hashed keys may share one state, which a group's lock order cannot
// allow: both constructors refuse them with ErrInvalidOption.
func TestGroupRefusesHashedKeys(t *testing.T) {
	p := engine.Policy{Limit: 5, Window: time.Second}
	if _, err := engine.NewGroup([]engine.Policy{p, p}, engine.WithHashedKeys()); !errors.Is(err, engine.ErrInvalidOption) {
		t.Fatalf("NewGroup with hashed keys: %v, want ErrInvalidOption", err)
	}
	plain, err := engine.New(p, engine.WithSweepInterval(0))
	if err != nil {
		t.Fatal(err)
	}
	hashed, err := engine.New(p, engine.WithSweepInterval(0), engine.WithHashedKeys())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := engine.NewGroupOf(plain, hashed); !errors.Is(err, engine.ErrInvalidOption) {
		t.Fatalf("NewGroupOf with a hashed limiter: %v, want ErrInvalidOption", err)
	}
}
