package shard_test

import (
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

// With HashedKeys, keys whose hashes collide share one state. The test
// narrows the hash to two bits, so that the keys below fall into at most
// four classes, and decides them from many goroutines while sweeps run in
// a tight loop, on windows of microseconds. Replayed per class through the
// reference model, every decision must match and no window may hold more
// than the limit: a collision only ever makes keys share one limit.
func TestHashedKeysCollisionsShareOneLimit(t *testing.T) {
	keys := []string{"", "a", "abcdefg", "abcdefgh", "abcdefghi", strings.Repeat("k", 1024), "b", "c", "other"}
	goroutines, perG := 12, 1500
	for _, procs := range []int{2, 8, 32} {
		for _, alg := range []shard.Algorithm{shard.Log, shard.Counter} {
			t.Run(fmt.Sprintf("GOMAXPROCS=%d/alg=%d", procs, alg), func(t *testing.T) {
				defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(procs))
				r := rand.New(rand.NewPCG(uint64(procs), uint64(alg)))
				for trial := range 4 {
					limit := 1 + r.IntN(5)
					window := int64(1+r.IntN(50)) * int64(time.Microsecond)
					collideOnce(t, alg, limit, window, keys, goroutines, perG, uint64(trial))
				}
			})
		}
	}
}

// Without HashedKeys, a key longer than LongKeyBytes is kept as a digest.
// Narrowed to two bits per half, the digests of the long keys below
// collide; the keys of up to LongKeyBytes (one of exactly that length)
// must stay exact, each its own state, and the long ones share a limit
// per digest, under the same concurrent sweeps and replay.
func TestLongKeysCollisionsShareOneLimit(t *testing.T) {
	keys := []string{"", "a", strings.Repeat("s", shard.LongKeyBytes), strings.Repeat("l", shard.LongKeyBytes+1)}
	for i := range 6 {
		keys = append(keys, strings.Repeat("k", 1000)+fmt.Sprint(i), fmt.Sprint(i)+strings.Repeat("k", 100))
	}
	goroutines, perG, trials := 12, 1500, 4
	if raceEnabled {
		perG, trials = 500, 2
	}
	for _, procs := range []int{2, 8, 32} {
		for _, alg := range []shard.Algorithm{shard.Log, shard.Counter} {
			t.Run(fmt.Sprintf("GOMAXPROCS=%d/alg=%d", procs, alg), func(t *testing.T) {
				defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(procs))
				r := rand.New(rand.NewPCG(uint64(procs), uint64(alg)))
				for trial := range trials {
					limit := 1 + r.IntN(5)
					window := int64(1+r.IntN(50)) * int64(time.Microsecond)
					collide(t, false, alg, limit, window, keys, goroutines, perG, uint64(trial))
				}
			})
		}
	}
}

func collideOnce(t *testing.T, alg shard.Algorithm, limit int, window int64, keys []string, goroutines, perG int, seed uint64) {
	t.Helper()
	collide(t, true, alg, limit, window, keys, goroutines, perG, seed)
}

// collide runs collideRun until a run both allows and refuses
// (bothOutcomes).
func collide(t *testing.T, hashed bool, alg shard.Algorithm, limit int, window int64, keys []string, goroutines, perG int, seed uint64) {
	t.Helper()
	bothOutcomes(t, window, func(w int64) reference.Report {
		return collideRun(t, hashed, alg, limit, w, keys, goroutines, perG, seed)
	})
}

func collideRun(t *testing.T, hashed bool, alg shard.Algorithm, limit int, window int64, keys []string, goroutines, perG int, seed uint64) reference.Report {
	t.Helper()
	s := newStore(t, shard.Config{Algorithm: alg, Limit: limit, Window: window, Shards: 2, HashedKeys: hashed})
	s.SetHashMask(3)
	class := map[string]string{}
	classes := map[string]bool{}
	for _, k := range keys {
		c := s.ClassOf(k)
		class[k] = c
		classes[c] = true
		if !hashed && len(k) <= shard.LongKeyBytes && c != "key:"+k {
			t.Fatalf("a key of %d bytes is kept as %q", len(k), c)
		}
	}
	if len(classes) == len(keys) {
		t.Fatalf("no two of %d keys collide under the narrowed hash", len(keys))
	}
	epoch := time.Now()
	now := func() int64 { return int64(time.Since(epoch)) }
	stopSweeps := backendtest.Loop(func() { s.Sweep(now()) })
	recs := make([][]reference.Record, goroutines)
	var wg sync.WaitGroup
	for g := range goroutines {
		wg.Go(func() {
			r := rand.New(rand.NewPCG(seed, uint64(g)))
			out := make([]reference.Record, 0, perG)
			for range perG {
				k := keys[r.IntN(len(keys))]
				n := 1 + r.IntN(limit)
				var res shard.Result
				// The monotonic clock read after the call began, as the
				// engine's Allow does; every other decision raises the
				// watermark as AllowNAt's do.
				s.Decide(k, n, now(), r.IntN(2) == 0, &res)
				out = append(out, reference.Record{
					Key: class[k], Cost: n, At: res.At, Allowed: res.Allowed,
					Remaining: res.Remaining, RetryAfter: res.RetryAfter, Reset: res.Reset,
				})
			}
			recs[g] = out
		})
	}
	wg.Wait()
	stopSweeps()
	all := slices.Concat(recs...)
	var rep reference.Report
	if alg == shard.Log {
		rep = reference.VerifyLog(limit, window, all)
	} else {
		rep = reference.VerifyCounter(limit, window, all)
	}
	if rep.Decisions != goroutines*perG || !rep.OK() {
		t.Fatalf("limit %d window %d: %d decisions, %d mismatches, %d over-admissions, %d under-admissions; e.g.\n%s",
			limit, window, rep.Decisions, rep.Mismatches, rep.OverAdmissions, rep.UnderAdmissions, strings.Join(rep.Examples, "\n"))
	}
	return rep
}
