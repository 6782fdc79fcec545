package engine_test

import (
	"fmt"
	"math/rand/v2"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/slidegate/slidegate/engine"
	"github.com/slidegate/slidegate/internal/backendtest"
	"github.com/slidegate/slidegate/internal/reference"
)

// A key of 9 to 16 bytes costs at most 56 heap bytes after one request on
// the exact log, and so does a key of up to 8 bytes on the counter: their
// first block is 40 bytes, half of an 80-byte pair, instead of a 48-byte
// size class of its own.
func TestShortKeyBytes(t *testing.T) {
	const keys = 50000
	for _, c := range []struct {
		alg    engine.Algorithm
		keyLen int
	}{{engine.SlidingLog, 9}, {engine.SlidingLog, 12}, {engine.SlidingLog, 16}, {engine.SlidingCounter, 8}} {
		p := engine.Policy{Limit: 100, Window: time.Hour, Algorithm: c.alg}
		heap, stats := heapPerKey(t, p, c.keyLen, keys)
		t.Logf("%v, key of %d bytes: %.1f heap B/key, Stats %.1f B/key", c.alg, c.keyLen, heap, stats)
		if heap > 56 {
			t.Errorf("%v: a key of %d bytes costs %.1f heap bytes, want at most 56", c.alg, c.keyLen, heap)
		}
	}
}

// A key of up to 16 bytes that sends a second request keeps its first
// block: the second instant goes into the watermark word (see
// internal/shard/block.go, "The entry in wm"), so it costs what a
// one-request key does, at most 56 B (it grew into a 48-byte block
// before). A third request moves a key of 9 to 16 bytes into a 48-byte
// block holding three, not into the 64-byte class.
func TestShortKeyBytesTwoRequests(t *testing.T) {
	p := engine.Policy{Limit: 100, Window: time.Hour}
	for _, c := range []struct{ keyLen, reqs, want int }{{8, 2, 56}, {9, 2, 56}, {16, 2, 56}, {9, 3, 61}, {16, 3, 61}} {
		heap, stats := heapPerKeyN(t, p, c.keyLen, 50000, c.reqs)
		t.Logf("key of %d bytes, %d requests: %.1f heap B/key, Stats %.1f B/key", c.keyLen, c.reqs, heap, stats)
		if heap > float64(c.want) {
			t.Errorf("a key of %d bytes with %d requests costs %.1f heap bytes, want at most %d", c.keyLen, c.reqs, heap, c.want)
		}
	}
}

// pairKeys are keys whose first block is half of a pair: 9 to 16 bytes
// for the log at cost 1, 1 to 8 bytes for the counter and for the log at
// cost 2. There are more than two of each, so that pairs form between
// different keys of one shard.
var pairKeys = func() []string {
	var ks []string
	for n := 1; n <= 16; n++ {
		for i := range 3 {
			ks = append(ks, fmt.Sprintf("%d%s", i, strings.Repeat("p", n-1)))
		}
	}
	return ks
}()

// TestPairedBlocksStress: keys whose first blocks are halves of pairs are
// created, decided on, grown and swept by many goroutines at once, with
// sweeps in a tight loop so that keys are dropped and created again, and
// a half is swept while its pair's other half holds a live key. Every
// decision replays exactly through the reference.
func TestPairedBlocksStress(t *testing.T) {
	goroutines, perG := 12, 1500
	if raceEnabled {
		perG = 500
	}
	for _, procs := range stressProcs {
		for _, alg := range []engine.Algorithm{engine.SlidingLog, engine.SlidingCounter} {
			t.Run(fmt.Sprintf("GOMAXPROCS=%d/%v", procs, alg), func(t *testing.T) {
				defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(procs))
				r := rand.New(rand.NewPCG(uint64(procs), uint64(alg)))
				for trial := range 4 {
					p := engine.Policy{Limit: 2 + r.IntN(4), Window: time.Duration(1+r.IntN(50)) * time.Microsecond, Algorithm: alg}
					pairStressOnce(t, p, goroutines, perG, uint64(trial))
				}
			})
		}
	}
}

// pairStressOnce runs one stress with policy p and, on a machine too
// busy to fill its window (every decision allowed), again with a window
// ten times longer, up to four times; every run must replay exactly.
func pairStressOnce(t *testing.T, p engine.Policy, goroutines, perG int, seed uint64) {
	t.Helper()
	for range 4 {
		rep := pairStressRun(t, p, goroutines, perG, seed)
		if rep.Allowed > 0 && rep.Refused > 0 {
			return
		}
		t.Logf("%+v: the run did not exercise both outcomes (%d allowed, %d refused); again with a longer window", p, rep.Allowed, rep.Refused)
		p.Window *= 10
	}
	t.Fatalf("%+v: no window exercised both outcomes", p)
}

// pairStressRun is one run of pairStressOnce.
func pairStressRun(t *testing.T, p engine.Policy, goroutines, perG int, seed uint64) reference.Report {
	t.Helper()
	lim, err := engine.New(p, engine.WithShards(2), engine.WithSweepInterval(0))
	if err != nil {
		t.Fatal(err)
	}
	stop := backendtest.Loop(func() { lim.Sweep() })
	recs := make([][]reference.Record, goroutines)
	var wg sync.WaitGroup
	for g := range goroutines {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := rand.New(rand.NewPCG(seed, uint64(g)))
			out := make([]reference.Record, 0, perG)
			for range perG {
				key := pairKeys[r.IntN(len(pairKeys))]
				// Mostly cost 1 and 2, the first costs whose block is
				// paired; now and then a cost that grows the ring.
				n := 1 + r.IntN(2)
				if r.IntN(8) == 0 {
					n = 1 + r.IntN(p.Limit)
				}
				d, err := lim.AllowN(key, n)
				if err != nil {
					t.Errorf("AllowN: %v", err)
					return
				}
				out = append(out, record(key, n, d))
			}
			recs[g] = out
		}()
	}
	wg.Wait()
	stop()
	lim.Close()
	return replayAll(t, fmt.Sprintf("%+v", p), p, recs, goroutines*perG)
}

// Keys of 9 to 16 bytes in a store of 8-byte slots (a window over 2⁴⁷ ns)
// grow from their first block, which holds one instant and has no slot
// in meta, to blocks that hold every accepted instant: each key's
// requests are decided exactly as the reference decides them.
func TestWideShortKeysGrow(t *testing.T) {
	p := engine.Policy{Limit: 6, Window: 48 * time.Hour}
	lim, err := engine.New(p, engine.WithSweepInterval(0))
	if err != nil {
		t.Fatal(err)
	}
	defer lim.Close()
	var recs []reference.Record
	buf := make([]byte, 0, 32)
	for _, n := range []int{9, 12, 16} {
		for i := range 200 {
			key := keyOfLen(buf, i, n)
			for r := range 8 {
				d, err := lim.AllowNAt(key, 1, int64(i*10+r))
				if err != nil {
					t.Fatal(err)
				}
				recs = append(recs, record(key, 1, d))
			}
		}
	}
	rep := reference.VerifyLog(p.Limit, int64(p.Window), recs)
	if !rep.OK() || rep.Decisions != len(recs) || rep.Refused == 0 {
		t.Fatalf("%d of %d decisions verified: %d mismatches, %d over-admissions, %d under-admissions, %d refused; e.g.\n%v",
			rep.Decisions, len(recs), rep.Mismatches, rep.OverAdmissions, rep.UnderAdmissions, rep.Refused, strings.Join(rep.Examples, "\n"))
	}
}
