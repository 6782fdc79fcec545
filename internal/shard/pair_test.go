package shard_test

import (
	"testing"

	"github.com/slidegate/slidegate/internal/shard"
)

// A block of PairWords words with a spare is half of an 80-byte pair:
// the first call makes a pair and keeps its second half, the next one
// gets that half, right after the first, and the third makes a new pair.
// Other sizes, and any size without a spare, get an allocation of their
// own, rounded up to its size class.
func TestAllocWordsPairs(t *testing.T) {
	var sp shard.Spare
	a, ca := shard.AllocWords(shard.PairWords, &sp)
	b, cb := shard.AllocWords(shard.PairWords, &sp)
	c, _ := shard.AllocWords(shard.PairWords, &sp)
	if ca != shard.PairWords || cb != shard.PairWords {
		t.Fatalf("halves have capacity %d and %d, want %d", ca, cb, shard.PairWords)
	}
	if b != a+8*shard.PairWords {
		t.Errorf("second half at %#x, want %#x, right after the first (%#x)", b, a+8*shard.PairWords, a)
	}
	if c == a || c == b {
		t.Errorf("third block at %#x is a half of the pair at %#x", c, a)
	}
	if _, cn := shard.AllocWords(shard.PairWords, nil); cn != 6 {
		t.Errorf("a block of %d words without a spare has capacity %d, want 6 (its 48-byte size class)", shard.PairWords, cn)
	}
	if _, c6 := shard.AllocWords(6, &sp); c6 != 6 {
		t.Errorf("a block of 6 words has capacity %d, want 6", c6)
	}
	if d, _ := shard.AllocWords(shard.PairWords, &sp); d != c+8*shard.PairWords {
		t.Errorf("a block of 6 words took the spare: the next half is at %#x, want %#x", d, c+8*shard.PairWords)
	}
}
