package shard_test

import (
	"testing"

	"github.com/slidegate/slidegate/shard"
)

// Each shard is two whole cache lines (its header, its counters), so two
// cores deciding keys of neighbouring shards never share a line.
func TestShardIsTwoCacheLines(t *testing.T) {
	if got := shard.ShardSize(); got != 2*shard.CacheLineSize {
		t.Fatalf("shard is %d bytes, want %d", got, 2*shard.CacheLineSize)
	}
}

func TestRingCapacities(t *testing.T) {
	for _, c := range []struct{ c, need, limit, want int }{
		{1, 2, 100, 2},
		{5, 6, 100, 10},
		{5, 30, 100, 30},
		{64, 65, 100, 100}, // capped at the limit
		{3, 3, 3, 3},
	} {
		if got := shard.GrowCap(c.c, c.need, c.limit); got != c.want {
			t.Errorf("growCap(%d, %d, %d) = %d, want %d", c.c, c.need, c.limit, got, c.want)
		}
	}
	// The allocator's slack becomes slots, never beyond the limit; the key
	// survives the copy.
	for _, c := range []struct {
		capacity, max int
		key           string
		want          int
	}{
		{1, 100, "", 1},                      // 4 words: a 32-byte class
		{1, 100, "client-0000042", 1},        // 3 + 1 + 2 words: 48
		{1, 100, "client-00000042-x", 2},     // 3 + 1 + 3 words → 64 bytes: one free slot
		{100, 100, "k", 100},                 // rounded up, but capped at the limit
		{100, 1000, "k", 108},                // 104 words → the 896-byte class: 112 words
		{5, 5, string(make([]byte, 100)), 5}, // long key
		{1, 1, "\xff\x00 not utf-8", 1},
	} {
		if got := shard.NewBlockCap(c.capacity, c.max, c.key); got != c.want {
			t.Errorf("newBlock(%d, %d, %q) capacity %d, want %d", c.capacity, c.max, c.key, got, c.want)
		}
	}
	// Narrow (6-byte) slots: two in three uint32 words, the data rounded
	// up to a word.
	for _, c := range []struct {
		capacity, max int
		key           string
		want          int
	}{
		{1, 100, "", 1},               // 3 + 1 words: 32 bytes, one word of data
		{1, 100, "k", 2},              // 3 + 1 + 1 words → 48 bytes: 2 data words, 2 slots
		{1, 100, "client-0000042", 1}, // 3 + 2 + 1 words: 48
		{3, 1000, "k", 5},             // 3 + 1 + 3 words → 64 bytes: 4 data words, 5 slots
		{100, 100, "k", 100},          // 3 + 1 + 75 words → 640 bytes, capped at the limit
		{100, 1000, "k", 101},         // 640 bytes: 76 data words
	} {
		if got := shard.NewNarrowBlockCap(c.capacity, c.max, c.key); got != c.want {
			t.Errorf("narrow newBlock(%d, %d, %q) capacity %d, want %d", c.capacity, c.max, c.key, got, c.want)
		}
	}
}

func TestShardCountMustBePowerOfTwo(t *testing.T) {
	defer func() {
		if recover() == nil {
			t.Fatal("New accepted 3 shards")
		}
	}()
	shard.New(shard.Config{Limit: 1, Window: 1, Shards: 3})
}

func TestDecideAllocatesNothingOnAKnownKey(t *testing.T) {
	// A window of 50 ns at one request per ns: after warming up, the ring
	// stays at its size and half the decisions are refusals.
	s := shard.New(shard.Config{Limit: 25, Window: 50})
	var now int64
	var r shard.Result
	for range 200 {
		now++
		s.Decide("k", 1, now, true, &r)
	}
	allocs := testing.AllocsPerRun(1000, func() {
		now++
		s.Decide("k", 1, now, true, &r)
	})
	if allocs != 0 {
		t.Fatalf("%v allocations per decision", allocs)
	}
}
