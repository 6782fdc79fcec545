package shard_test

import (
	"testing"

	"github.com/slidegate/slidegate/shard"
)

// Each shard header fills exactly one cache line, so two cores deciding
// keys of neighbouring shards never share a line.
func TestShardIsOneCacheLine(t *testing.T) {
	if got := shard.ShardSize(); got != shard.CacheLineSize {
		t.Fatalf("shard is %d bytes, want %d", got, shard.CacheLineSize)
	}
}

func TestRingCapacities(t *testing.T) {
	cases := []struct{ need, limit, want int }{
		{1, 100, 1},
		{2, 100, 5},
		{3, 100, 5},
		{6, 100, 13},
		{62, 100, 100}, // 125 capped at the limit
		{1, 1, 1},
		{3, 3, 3},
		{100, 100, 100},
	}
	for _, c := range cases {
		if got := shard.RingCap(c.need, c.limit); got != c.want {
			t.Errorf("ringCap(%d, %d) = %d, want %d", c.need, c.limit, got, c.want)
		}
	}
	// Header (3 words) plus ring fill a power-of-two size exactly.
	for c := 1; c < 1<<20; c = 2*c + 3 {
		if b := 8 * (3 + c); b&(b-1) != 0 {
			t.Errorf("capacity %d makes a %d-byte block", c, b)
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
