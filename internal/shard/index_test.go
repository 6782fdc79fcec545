package shard_test

import (
	"fmt"
	"math/rand/v2"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/slidegate/slidegate/internal/backendtest"
	"github.com/slidegate/slidegate/internal/reference"
	"github.com/slidegate/slidegate/internal/shard"
)

// The index (index.go) keeps keys in buckets and rebuilds its table while
// readers probe it. Here one shard starts at the smallest table and grows
// through many resizes while goroutines decide a key space that grows with
// the run (so lookups of known keys race inserts and resizes), rings grow
// (a block replaced in its slot), and sweeps in a tight loop drop idle
// keys (slots marked deleted, reused by later keys) on windows of
// microseconds. Every key reaches the store as a string built for the
// request. Every decision, replayed per key through the reference model,
// must match, and afterwards every block sits in a slot its probe
// reaches, once.
func TestIndexResizeStress(t *testing.T) {
	goroutines, perG, trials := 8, 3000, 3
	if raceEnabled {
		perG, trials = 1500, 2
	}
	if testing.Short() {
		trials = 1
	}
	for _, procs := range []int{2, 8, 32} {
		t.Run(fmt.Sprintf("GOMAXPROCS=%d", procs), func(t *testing.T) {
			defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(procs))
			r := rand.New(rand.NewPCG(uint64(procs), 38))
			for trial := range trials {
				limit := 1 + r.IntN(12)
				window := int64(1+r.IntN(40)) * int64(time.Microsecond)
				indexStress(t, limit, window, goroutines, perG, uint64(trial))
			}
		})
	}
}

// indexStress runs indexStressOnce until a run both allows and refuses
// (bothOutcomes).
func indexStress(t *testing.T, limit int, window int64, goroutines, perG int, seed uint64) {
	t.Helper()
	bothOutcomes(t, window, func(w int64) reference.Report {
		return indexStressOnce(t, limit, w, goroutines, perG, seed)
	})
}

func indexStressOnce(t *testing.T, limit int, window int64, goroutines, perG int, seed uint64) reference.Report {
	t.Helper()
	s := newStore(t, shard.Config{Limit: limit, Window: window, Shards: 1})
	heads := s.Heads(0)
	epoch := time.Now()
	now := func() int64 { return int64(time.Since(epoch)) }
	stopSweeps := backendtest.Loop(func() { s.Sweep(now()) })
	recs := make([][]reference.Record, goroutines)
	var wg sync.WaitGroup
	for g := range goroutines {
		wg.Go(func() {
			r := rand.New(rand.NewPCG(seed, uint64(g)))
			out := make([]reference.Record, 0, perG)
			buf := make([]byte, 0, 32)
			for i := range perG {
				// Keys 0..i·goroutines/4: new keys keep coming while old
				// ones return; a few are long (digests, the xsync map).
				// Others are 17 to 30 bytes (compared byte by byte, not
				// as two words), or the key before them with a zero
				// byte after it (the same words as that key, a byte
				// longer).
				id := r.IntN(1 + i*goroutines/4)
				switch {
				case id%97 == 0:
					buf = strconv.AppendInt(append(buf[:0], "key-"...), int64(id), 10)
					buf = append(buf, strings.Repeat("L", shard.LongKeyBytes)...)
				case id%4 == 1:
					buf = strconv.AppendInt(append(buf[:0], "key-"...), int64(id-1), 10)
					buf = append(buf, 0)
				case id%4 == 2:
					buf = strconv.AppendInt(append(buf[:0], "key-"...), int64(id), 10)
					buf = append(buf, strings.Repeat("m", 12+id%12)...)
				default:
					buf = strconv.AppendInt(append(buf[:0], "key-"...), int64(id), 10)
				}
				k := string(buf)
				n := 1 + r.IntN(limit)
				var res shard.Result
				if err := s.Decide(k, n, now(), r.IntN(2) == 0, &res); err != nil {
					t.Error(err)
					return
				}
				out = append(out, logRecord(k, n, res))
			}
			recs[g] = out
		})
	}
	wg.Wait()
	stopSweeps()
	if err := s.CheckIndex(); err != nil {
		t.Fatal(err)
	}
	if got := s.Heads(0); got < 8*heads {
		t.Fatalf("the index grew from %d to %d heads; the test needs several resizes", heads, got)
	}
	return verifyLog(t, limit, window, recs, goroutines*perG)
}

// A sweep walks the index without its mutex: a sweep that finds nothing
// to drop completes while another goroutine holds the mutex (as a
// decision creating or growing a key does), so a sweep never stalls
// them by holding it, even while it is preempted.
func TestSweepTakesNoIndexLock(t *testing.T) {
	s := newStore(t, shard.Config{Limit: 10, Window: int64(time.Hour), Shards: 1})
	var r shard.Result
	const keys = 1000
	for i := range keys {
		if err := s.Decide("key-"+strconv.Itoa(i), 1, int64(i), true, &r); err != nil {
			t.Fatal(err)
		}
	}
	unlock := s.LockIndex(0)
	done := make(chan int)
	go func() {
		n, _ := s.SweepShard(0, keys) // every key is live: nothing to drop
		done <- n
	}()
	select {
	case n := <-done:
		unlock()
		if n != 0 {
			t.Fatalf("the sweep dropped %d live keys", n)
		}
	case <-time.After(30 * time.Second): // a hang bound, not a timing
		unlock()
		<-done
		t.Fatal("the sweep waited for the index's mutex")
	}
	// And a sweep after every key went idle still finds all of them.
	if n, err := s.SweepShard(0, int64(time.Hour)+keys); err != nil || n != keys {
		t.Fatalf("the sweep of idle keys dropped %d of %d (%v)", n, keys, err)
	}
	if err := s.CheckIndex(); err != nil {
		t.Fatal(err)
	}
}

// The empty key is a key like any other. Its block is the 24-byte header
// alone (its one instant in meta), so the index must not form its key's
// address, which would point past the block: checkptr, on under -race,
// fails such a lookup. Its decisions replay through the reference model.
func TestEmptyKeyBlock(t *testing.T) {
	s := newStore(t, shard.Config{Limit: 3, Window: 100, Shards: 1})
	var recs []reference.Record
	for i := range 20 {
		var r shard.Result
		if err := s.Decide(string([]byte{}), 1, int64(10*i), true, &r); err != nil {
			t.Fatal(err)
		}
		recs = append(recs, reference.Record{Key: "", Cost: 1, At: r.At, Allowed: r.Allowed,
			Remaining: r.Remaining, RetryAfter: r.RetryAfter, Reset: r.Reset})
	}
	if rep := reference.VerifyLog(3, 100, recs); !rep.OK() || rep.Refused == 0 {
		t.Fatalf("%+v", rep)
	}
	if err := s.CheckIndex(); err != nil {
		t.Fatal(err)
	}
}

// A shard whose keys come and go (each generation swept before the next
// arrives) leaves deleted slots behind; the table is rebuilt at the same
// size when most of its used slots are deleted, so it stays bounded by
// the keys live at once, not by the keys ever seen. Every decision is
// replayed through the reference model, and the index stays well formed.
func TestIndexReusesDeletedSlots(t *testing.T) {
	const keys, generations, window = 100, 200, 10
	s := newStore(t, shard.Config{Limit: 2, Window: window, Shards: 1})
	var recs []reference.Record
	now := int64(0)
	for g := range generations {
		for i := range keys {
			k := "g" + strconv.Itoa(g) + "-" + strconv.Itoa(i)
			for range 3 {
				var r shard.Result
				if err := s.Decide(k, 1, now, true, &r); err != nil {
					t.Fatal(err)
				}
				recs = append(recs, reference.Record{Key: k, Cost: 1, At: r.At, Allowed: r.Allowed,
					Remaining: r.Remaining, RetryAfter: r.RetryAfter, Reset: r.Reset})
			}
		}
		now += 2 * window
		if n, err := s.SweepShard(0, now); err != nil || n != keys {
			t.Fatalf("generation %d: the sweep dropped %d of %d keys (%v)", g, n, keys, err)
		}
		if err := s.CheckIndex(); err != nil {
			t.Fatalf("generation %d: %v", g, err)
		}
	}
	// A rebuild grows the table only when half its slots hold keys, so it
	// stays under 2·keys slots and a bucket's rounding (plus one growth).
	if got, most := s.Heads(0), 2*keys*5/4+14; got > most {
		t.Fatalf("%d slots after %d generations of %d keys, want at most %d", got, generations, keys, most)
	}
	rep := reference.VerifyLog(2, window, recs)
	if !rep.OK() || rep.Refused == 0 {
		t.Fatalf("%+v", rep)
	}
}
