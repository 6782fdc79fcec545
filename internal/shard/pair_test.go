package shard_test

import (
	"cmp"
	"fmt"
	"runtime"
	"runtime/debug"
	"slices"
	"sync"
	"testing"

	"github.com/slidegate/slidegate/internal/shard"
)

// Blocks of PairWords words with a spare are carved one after another
// from one chunk until it is used up: then one new chunk serves the next
// ones. Other sizes, and any size without a spare, get an allocation of
// their own, rounded up to its size class, and leave the chunk alone.
func TestAllocWordsChunks(t *testing.T) {
	var sp shard.Spare
	a, ca := shard.AllocWords(shard.PairWords, &sp)
	if ca != shard.PairWords {
		t.Fatalf("a carved block has capacity %d, want %d", ca, shard.PairWords)
	}
	if _, cn := shard.AllocWords(shard.PairWords, nil); cn != 6 {
		t.Errorf("a block of %d words without a spare has capacity %d, want 6 (its 48-byte size class)", shard.PairWords, cn)
	}
	for _, n := range []int{3, 4, 6, 7} {
		want := map[int]int{3: 3, 4: 4, 6: 6, 7: 8}[n]
		if e, c := shard.AllocWords(n, &sp); c != want || e >= a && e < a+8*shard.ChunkWords {
			t.Errorf("a block of %d words at %#x has capacity %d, want %d (its size class), outside the chunk at %#x", n, e, c, want, a)
		}
	}
	// The chunk's last word counts its blocks: it holds
	// (ChunkWords-1)/PairWords of them, each right after the one before.
	blocks := (shard.ChunkWords - 1) / shard.PairWords
	if blocks < 8 {
		t.Fatalf("a chunk holds %d blocks, want at least 8", blocks)
	}
	for i := 1; i < blocks; i++ {
		b, cb := shard.AllocWords(shard.PairWords, &sp)
		if want := a + uintptr(8*shard.PairWords*i); b != want || cb != shard.PairWords {
			t.Fatalf("block %d at %#x with capacity %d, want %#x and %d", i, b, cb, want, shard.PairWords)
		}
	}
	g, _ := shard.AllocWords(shard.PairWords, &sp)
	if g >= a && g < a+8*shard.ChunkWords {
		t.Fatalf("block at %#x is inside the used-up chunk at %#x", g, a)
	}
	if h, _ := shard.AllocWords(shard.PairWords, &sp); h != g+8*shard.PairWords {
		t.Errorf("block at %#x, want %#x, right after the new chunk's first", h, g+8*shard.PairWords)
	}
}

// Goroutines carving blocks from one spare at once never get
// overlapping words: each word of a chunk goes to one block.
func TestAllocWordsChunksConcurrent(t *testing.T) {
	for _, procs := range []int{2, 8, 32} {
		t.Run(fmt.Sprintf("GOMAXPROCS=%d", procs), func(t *testing.T) {
			defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(procs))
			// AllocWords returns addresses, which keep no chunk alive: no
			// collection may free a chunk and hand its memory out again.
			defer debug.SetGCPercent(debug.SetGCPercent(-1))
			var sp shard.Spare
			const goroutines, perG = 16, 2000
			type span struct{ lo, hi uintptr }
			got := make([][]span, goroutines)
			var wg sync.WaitGroup
			for g := range goroutines {
				wg.Go(func() {
					for range perG {
						n := shard.PairWords
						a, c := shard.AllocWords(n, &sp)
						if c != n {
							t.Errorf("a block of %d words has capacity %d", n, c)
							return
						}
						got[g] = append(got[g], span{a, a + 8*uintptr(n)})
					}
				})
			}
			wg.Wait()
			var all []span
			for _, s := range got {
				all = append(all, s...)
			}
			slices.SortFunc(all, func(x, y span) int { return cmp.Compare(x.lo, y.lo) })
			for i := 1; i < len(all); i++ {
				if all[i].lo < all[i-1].hi {
					t.Fatalf("blocks [%#x, %#x) and [%#x, %#x) overlap", all[i-1].lo, all[i-1].hi, all[i].lo, all[i].hi)
				}
			}
		})
	}
}
