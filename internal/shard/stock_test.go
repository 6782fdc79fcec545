package shard_test

import (
	"fmt"
	"runtime"
	"sync"
	"testing"
	"unsafe"

	"github.com/slidegate/slidegate/internal/backendtest"
	"github.com/slidegate/slidegate/internal/shard"
)

// TestStockServesAllocations: once Restock has seen the stock miss, the
// decisions that create keys (a pair of 12-byte keys' first blocks) and
// grow their rings (the third request's 48-byte block) take their blocks
// from it and allocate nothing themselves, so that a span refill or a
// page fault lands on the restocking goroutine and not on a decision.
//
// The allocations counted are those the memory profile records under
// Store.Decide: the process's count of all allocations also takes in the
// runtime's own (a collection ending, a thread started for the test's
// goroutine), which came in about one run in five hundred.
func TestStockServesAllocations(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector allocates on its own")
	}
	defer func(rate int) { runtime.MemProfileRate = rate }(runtime.MemProfileRate)
	runtime.MemProfileRate = 1
	s := newStore(t, shard.Config{Limit: 100, Window: 60e9, Presize: 1 << 12})
	const n = 200
	warm, keys := make([]string, n), make([]string, n)
	for i := range warm {
		warm[i] = fmt.Sprintf("client-%05d", i)
	}
	for i := range keys {
		keys[i] = fmt.Sprintf("client-%05d", n+i)
	}
	now := int64(0)
	var r shard.Result
	decide := func(key string) {
		now++
		if err := s.Decide(key, 1, now, true, &r); err != nil || !r.Allowed {
			t.Fatalf("%q: %+v, %v", key, r, err)
		}
	}
	// Each request of the warm keys allocates what the same request of
	// the measured keys will need; Restock then stocks three times its
	// count of that.
	for req := range 3 {
		for _, k := range warm {
			decide(k)
		}
		s.Restock()
		before := decideAllocs(t)
		for _, k := range keys {
			decide(k)
		}
		if got := decideAllocs(t) - before; got != 0 {
			t.Errorf("request %d of each of %d keys: %d allocations under Decide, want 0 (every block from the stock)", req+1, n, got)
		}
	}
}

// decideAllocs returns the objects the memory profile records as
// allocated under Store.Decide so far. The profile is published by
// collections: two complete the cycle that recorded the last allocations.
func decideAllocs(t *testing.T) int64 {
	t.Helper()
	runtime.GC()
	runtime.GC()
	var recs []runtime.MemProfileRecord
	for n := 64; ; n *= 2 {
		recs = make([]runtime.MemProfileRecord, n)
		if got, ok := runtime.MemProfile(recs, true); ok {
			recs = recs[:got]
			break
		}
	}
	const decideFunc = "github.com/slidegate/slidegate/internal/shard.(*Store).Decide"
	var objects int64
	for _, rec := range recs {
		frames := runtime.CallersFrames(rec.Stack())
		for {
			f, more := frames.Next()
			if f.Function == decideFunc {
				objects += rec.AllocObjects
				break
			}
			if !more {
				break
			}
		}
	}
	if objects == 0 {
		t.Fatal("the memory profile records no allocation under Decide: the warm keys' must be there")
	}
	return objects
}

// TestStockHandsOutOnce: goroutines take blocks of several sizes from a
// store's stock while another restocks it in a tight loop; no block goes
// to two takers, and each has its size class's capacity. The taken blocks
// stay referenced, so two equal addresses can only be one block given
// twice.
func TestStockHandsOutOnce(t *testing.T) {
	for _, procs := range []int{2, 32} {
		t.Run(fmt.Sprintf("GOMAXPROCS=%d", procs), func(t *testing.T) {
			defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(procs))
			s := newStore(t, shard.Config{Limit: 100, Window: 60e9})
			sizes := []int{5, 6, 10, 16, 80}
			classes := map[int]int{5: 6, 6: 6, 10: 10, 16: 16, 80: 80}
			// One miss per size, so that the first restock stocks
			// them all before the takers start.
			for _, n := range sizes {
				s.StockTake(n)
			}
			s.Restock()
			stop := backendtest.Loop(s.Restock)
			// Each goroutine takes until the stock has served it per
			// blocks; a miss is counted by the next restock, which
			// stocks that class again.
			goroutines, per := 8, 5000
			if raceEnabled {
				per = 1000
			}
			got := make([][][]uint64, goroutines)
			var wg sync.WaitGroup
			for g := range goroutines {
				wg.Go(func() {
					for i := 0; len(got[g]) < per; i++ {
						if i > 1000*per {
							t.Errorf("goroutine %d: %d of %d attempts served", g, len(got[g]), i)
							return
						}
						if w := s.StockTake(sizes[(g+i)%len(sizes)]); w != nil {
							got[g] = append(got[g], w)
						} else {
							runtime.Gosched() // let the restocking goroutine run
						}
					}
				})
			}
			wg.Wait()
			stop()
			seen := make(map[uintptr]bool)
			taken := 0
			for _, ws := range got {
				for _, w := range ws {
					if cap(w) != len(w) || classes[len(w)] != len(w) {
						t.Fatalf("a block of len %d, cap %d: not a stocked size class", len(w), cap(w))
					}
					a := uintptr(unsafe.Pointer(&w[0]))
					if seen[a] {
						t.Fatalf("the block at %#x went to two takers", a)
					}
					seen[a] = true
					taken++
				}
			}
			if taken != goroutines*per {
				t.Errorf("%d blocks taken, want %d", taken, goroutines*per)
			}
		})
	}
}

// TestStockCountsMisses: the misses of a class whose batch is used up are
// counted one in a few (stock.go, missed), and Restock still sizes the
// next batch at about three times the demand it saw.
func TestStockCountsMisses(t *testing.T) {
	s := newStore(t, shard.Config{Limit: 100, Window: 60e9})
	s.StockTake(6)
	s.Restock()
	used := 0
	for s.StockTake(6) != nil {
		used++
	}
	const misses = 1000
	for range misses - 1 { // the loop above missed once
		if s.StockTake(6) != nil {
			t.Fatal("a block from a used-up batch")
		}
	}
	s.Restock()
	served := 0
	for s.StockTake(6) != nil {
		served++
	}
	if lo, hi := 3*(used+misses/2), 3*(used+3*misses/2); served < lo || served > hi {
		t.Errorf("%d used and %d missed: the next batch holds %d, want %d to %d (three times the demand, give or take the sampling)", used, misses, served, lo, hi)
	}
}
