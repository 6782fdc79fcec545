package engine_test

import (
	"fmt"
	"math/rand/v2"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/slidegate/slidegate/engine"
	"github.com/slidegate/slidegate/internal/backendtest"
	"github.com/slidegate/slidegate/internal/reference"
)

// Rings of windows up to 2^47 ns keep the low 48 bits of each instant and
// decode them against the key's watermark (shard/block.go). These tests
// aim at what that could get wrong: instants on both sides of a multiple
// of 2^48, a key silent for exactly 2^48 ns (its old entries then have the
// same 48 bits as the new instant), silences of 2^48 ± 1, the watermark
// raised far ahead of a ring by refusals and by groups refused by another
// limit, and windows on both sides of the 2^47 ns threshold.

const era = int64(1) << 48

// eraStep draws a clock step for the era tests: mostly small, sometimes
// exactly W or a multiple of 2^48, one nanosecond around them, or zero.
func eraStep(r *rand.Rand, window int64) int64 {
	switch r.IntN(16) {
	case 0:
		return era
	case 1:
		return era - 1
	case 2:
		return era + 1
	case 3:
		return 2 * era
	case 4:
		return era - window
	case 5:
		return window
	case 6:
		return window - 1
	case 7, 8:
		return 0
	default:
		return r.Int64N(window/2 + 2)
	}
}

// eraPolicies are windows from nanoseconds to the threshold and just past
// it (the latter keeps 8-byte slots), limits from 1 to 100.
var eraPolicies = []engine.Policy{
	{Limit: 1, Window: 10},
	{Limit: 3, Window: 1000},
	{Limit: 7, Window: time.Duration(era / 4)},
	{Limit: 4, Window: time.Duration(era/2 - 1)},
	{Limit: 4, Window: time.Duration(era / 2)},     // 2^47: the last narrow window
	{Limit: 4, Window: time.Duration(era/2 + 1)},   // wide slots
	{Limit: 100, Window: time.Duration(era/2 - 3)}, // rings that grow
}

// TestErasMatchReference: random traces at caller-given instants that
// start just below 2^48 and jump by multiples of it, every decision
// compared field by field with the reference log, with keys and with
// hashed keys (whose first ring lives in the block's header), with sweeps.
func TestErasMatchReference(t *testing.T) {
	r := rand.New(rand.NewPCG(48, 47))
	for _, p := range eraPolicies {
		for _, hashed := range []bool{false, true} {
			for trial := range 8 {
				t.Run(fmt.Sprintf("L%d_W%d_hashed=%v_%d", p.Limit, p.Window, hashed, trial), func(t *testing.T) {
					opts := []engine.Option{engine.WithSweepInterval(0), engine.WithShards(2)}
					if hashed {
						opts = append(opts, engine.WithHashedKeys())
					}
					lim, err := engine.New(p, opts...)
					if err != nil {
						t.Fatal(err)
					}
					defer lim.Close()
					model := reference.NewLog(p.Limit, int64(p.Window))
					now := era - int64(p.Window)/2 - int64(r.IntN(3))
					for i := range 3000 {
						now += eraStep(r, int64(p.Window))
						key := fmt.Sprint("k", r.IntN(6))
						n := 1
						if r.IntN(3) == 0 {
							n = 1 + r.IntN(p.Limit)
						}
						if r.IntN(60) == 0 {
							lim.SweepAt(now)
						}
						d, err := lim.AllowNAt(key, n, now)
						if err != nil {
							t.Fatal(err)
						}
						want := model.Decide(key, n, now)
						got := reference.Result{Allowed: d.Allowed, Remaining: d.Remaining, RetryAfter: int64(d.RetryAfter), Reset: int64(d.Reset)}
						if got != want || d.At != now {
							t.Fatalf("op %d (key %s, n %d, t %d = %d·2^48 + %d): engine %+v, reference %+v",
								i, key, n, now, now/era, now%era, d, want)
						}
					}
				})
			}
		}
	}
}

// TestGroupErasMatchReference: a group whose second limit refuses often
// raises the first limit's watermark over rings that may hold entries
// 2^48 ns old; the same traces, every decision replayed per limit.
func TestGroupErasMatchReference(t *testing.T) {
	r := rand.New(rand.NewPCG(49, 50))
	for _, p := range eraPolicies {
		for trial := range 6 {
			t.Run(fmt.Sprintf("L%d_W%d_%d", p.Limit, p.Window, trial), func(t *testing.T) {
				ps := []engine.Policy{p, {Name: "tight", Limit: 1, Window: p.Window}}
				ps[0].Name = "main"
				g, err := engine.NewGroup(ps, engine.WithSweepInterval(0), engine.WithShards(2))
				if err != nil {
					t.Fatal(err)
				}
				defer g.Close()
				var recs []reference.GroupRecord
				now := era - int64(p.Window)/2
				for range 2000 {
					now += eraStep(r, int64(p.Window))
					keys := []string{fmt.Sprint("u", r.IntN(3)), fmt.Sprint("ip", r.IntN(2))}
					if r.IntN(60) == 0 {
						g.SweepAt(now)
					}
					gd, err := g.AllowNAt(keys, 1, now)
					if err != nil {
						t.Fatal(err)
					}
					recs = append(recs, backendtest.GroupRecord(refsOf(keys), 1, gd))
				}
				backendtest.VerifyGroup(t, ps, recs)
			})
		}
	}
}

// TestErasStress: many goroutines on a few keys, sweeps in a tight loop,
// windows of microseconds, and a manual clock that another goroutine moves
// forwards in small steps, back now and then, and by 2^48 ± a little
// every few hundred steps, so that keys holding entries are decided (and
// raise their watermarks, refused at caller-given instants) an era later
// while other goroutines read them. Single keys (with and without hashed
// keys) and groups, every decision replayed through the reference.
func TestErasStress(t *testing.T) {
	goroutines, perG := 12, 1500
	if raceEnabled {
		perG = 500
	}
	for _, procs := range stressProcs {
		for _, mode := range []string{"keys", "hashed", "group"} {
			t.Run(fmt.Sprintf("GOMAXPROCS=%d/%s", procs, mode), func(t *testing.T) {
				defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(procs))
				r := rand.New(rand.NewPCG(uint64(procs), uint64(len(mode))))
				for trial := range 4 {
					p := engine.Policy{Limit: 1 + r.IntN(5), Window: time.Duration(1+r.IntN(50)) * time.Microsecond}
					erasStressOnce(t, p, mode, goroutines, perG, uint64(trial))
				}
			})
		}
	}
}

func erasStressOnce(t *testing.T, p engine.Policy, mode string, goroutines, perG int, seed uint64) {
	t.Helper()
	clk := engine.NewManualClock()
	clk.Set(time.Duration(era - int64(p.Window)))
	opts := []engine.Option{engine.WithShards(2), engine.WithSweepInterval(0), engine.WithClock(clk)}
	if mode == "hashed" {
		opts = append(opts, engine.WithHashedKeys())
	}
	var (
		lim   *engine.Limiter
		g     *engine.Group
		ps    = []engine.Policy{p, {Limit: 1 + int(seed%2), Window: p.Window / 2}}
		sweep func()
	)
	if mode == "group" {
		var err error
		if g, err = engine.NewGroup(ps, opts...); err != nil {
			t.Fatal(err)
		}
		sweep = func() { g.Sweep() }
	} else {
		var err error
		if lim, err = engine.New(p, opts...); err != nil {
			t.Fatal(err)
		}
		sweep = func() { lim.Sweep() }
	}
	stop := backendtest.Loop(sweep)
	var moving atomic.Bool
	moving.Store(true)
	clockDone := make(chan struct{})
	go func() {
		defer close(clockDone)
		r := rand.New(rand.NewPCG(seed, 11))
		for moving.Load() {
			switch r.IntN(300) {
			case 0:
				clk.Advance(time.Duration(era))
			case 1:
				clk.Advance(time.Duration(era - 1 - r.Int64N(int64(p.Window))))
			case 2:
				clk.Advance(time.Duration(era + r.Int64N(int64(p.Window))))
			case 3, 4, 5, 6:
				clk.Advance(-time.Duration(r.IntN(int(p.Window))))
			default:
				clk.Advance(time.Duration(r.IntN(400)))
			}
			runtime.Gosched()
		}
	}()
	recs := make([][]reference.Record, goroutines)
	grecs := make([][]reference.GroupRecord, goroutines)
	var wg sync.WaitGroup
	for w := range goroutines {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := rand.New(rand.NewPCG(seed, uint64(w)))
			for range perG {
				key := stressKeys[r.IntN(len(stressKeys))]
				now := clk.Now()
				if r.IntN(3) == 0 {
					now = max(0, now-int64(r.IntN(int(p.Window))))
				}
				if g != nil {
					keys := []string{key, stressKeys[r.IntN(3)]}
					gd, err := g.AllowNAt(keys, 1, now)
					if err != nil {
						t.Errorf("AllowNAt: %v", err)
						return
					}
					grecs[w] = append(grecs[w], backendtest.GroupRecord(refsOf(keys), 1, gd))
					continue
				}
				n := 1 + r.IntN(p.Limit)
				d, err := lim.AllowNAt(key, n, now)
				if err != nil {
					t.Errorf("AllowNAt: %v", err)
					return
				}
				recs[w] = append(recs[w], record(key, n, d))
			}
		}()
	}
	wg.Wait()
	moving.Store(false)
	<-clockDone
	stop()
	if g != nil {
		g.Close()
		all := slices.Concat(grecs...)
		backendtest.VerifyGroup(t, ps, all)
		return
	}
	lim.Close()
	all := slices.Concat(recs...)
	rep := reference.VerifyLog(p.Limit, int64(p.Window), all)
	if rep.Decisions != goroutines*perG {
		t.Fatalf("%+v: verified %d decisions, want %d", p, rep.Decisions, goroutines*perG)
	}
	if !rep.OK() {
		t.Fatalf("%+v %s: %d mismatches, %d over-admissions, %d under-admissions; e.g.\n%v",
			p, mode, rep.Mismatches, rep.OverAdmissions, rep.UnderAdmissions, strings.Join(rep.Examples, "\n"))
	}
}
