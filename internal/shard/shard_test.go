package shard_test

import (
	"errors"
	"fmt"
	"math"
	"testing"

	"github.com/slidegate/slidegate/internal/shard"
)

// Each shard is two whole cache lines (its header, its counters), so two
// cores deciding keys of neighbouring shards never share a line.
func TestShardIsTwoCacheLines(t *testing.T) {
	if got := shard.ShardSize(); got != 2*shard.CacheLineSize {
		t.Fatalf("shard is %d bytes, want %d", got, 2*shard.CacheLineSize)
	}
}

func TestRingCapacities(t *testing.T) {
	for _, c := range []struct {
		c, need, limit int
		fast           bool
		want           int
	}{
		{1, 2, 100, false, 2},
		{5, 6, 100, false, 10},
		{5, 30, 100, false, 30},
		{64, 65, 100, false, 100}, // capped at the limit
		{3, 3, 3, false, 3},
		{8, 9, 100, true, 32}, // a fast key grows four-fold
		{2, 3, 100, true, 4},  // a small ring doubles even when fast
		{3, 4, 100, true, 12},
		{5, 30, 100, true, 30},   // at least what it needs
		{32, 33, 100, true, 100}, // capped at the limit
		{20, 21, 100, true, 100}, // 80 of 100: the limit at once
		{12, 13, 100, true, 48},
	} {
		if got := shard.GrowCap(c.c, c.need, c.limit, c.fast); got != c.want {
			t.Errorf("growCap(%d, %d, %d, %v) = %d, want %d", c.c, c.need, c.limit, c.fast, got, c.want)
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
		{1, 100, "client-0000042", 1},        // 3 + 2 + 1 words: 48 bytes
		{1, 100, "client-00000042-x", 2},     // 3 + 3 + 1 words → 64 bytes: one free slot
		{100, 100, "k", 100},                 // rounded up, but capped at the limit
		{100, 1000, "k", 108},                // 3 + 1 + 100 words → the 896-byte class
		{5, 5, string(make([]byte, 100)), 5}, // long key
		{1, 1, "\xff\x00 not utf-8", 1},
	} {
		if got := shard.NewBlockCap(c.capacity, c.max, c.key); got != c.want {
			t.Errorf("newBlock(%d, %d, %q) capacity %d, want %d", c.capacity, c.max, c.key, got, c.want)
		}
	}
	// Narrow (6-byte) slots: two in three uint32 words, the data rounded
	// up to a word. A ring of at most 7 instants is small: its slot 0 lives
	// in meta, one instant more than the data words hold.
	for _, c := range []struct {
		capacity, max int
		key           string
		want          int
		small         bool
	}{
		{0, 100, "", 1, true},                 // 3 words: 24 bytes, the header alone, meta's slot only
		{1, 100, "", 2, true},                 // 3 + 1 words: 32 bytes, one word of data, 1 slot + meta's
		{0, 100, "k", 1, true},                // 3 + 1 words: 32 bytes, meta's slot only
		{0, 100, "0123456789abcdef", 2, true}, // 3 + 2 words → 48 bytes: 1 data word, 1 slot + meta's
		{1, 100, "k", 3, true},                // 3 + 1 + 1 words → 48 bytes: 2 data words, 2 slots + meta's
		{1, 100, "client-0000042", 2, true},   // 3 + 2 + 1 words: 48 bytes, 1 slot + meta's
		{1, 3, "k", 3, true},                  // 2 slots + meta's, under the limit
		{1, 2, "k", 2, false},                 // 2 slots fill the limit: no slot in meta
		{3, 1000, "k", 6, true},               // 3 + 1 + 3 words → 64 bytes: 4 data words, 5 slots + meta's
		{6, 1000, "k", 8, false},              // 3 + 1 + 5 words → 80 bytes: 6 data words, 8 slots, past a small ring's 7
		{100, 100, "k", 100, false},           // capped at the limit
		{100, 1000, "k", 101, false},          // 3 + 1 + 75 words → the 640-byte class: 76 data words
	} {
		got, small := shard.NewNarrowLogBlockCap(c.capacity, c.max, c.key)
		if got != c.want || small != c.small {
			t.Errorf("narrow newLogBlock(%d, %d, %q): capacity %d, small %v; want %d, %v",
				c.capacity, c.max, c.key, got, small, c.want, c.small)
		}
	}
}

// A key's first block keeps its one instant in its meta word, so a key of
// up to 8 bytes costs a 32-byte block (header and key) after one request,
// and its second instant in the watermark (block.go, "The entry in wm"),
// so the second request allocates nothing. The third grows the ring, which
// costs the new block alone (the index stores it in the old one's slot: no
// map entry; the race detector may add one more). The new block (48 bytes)
// holds three and one in wm, so the fourth request allocates nothing; the
// fifth grows the ring four-fold, and the sixth allocates nothing.
func TestFirstBlockGrowths(t *testing.T) {
	s := newStore(t, shard.Config{Limit: 100, Window: 60e9})
	keys := make([]string, 101) // AllocsPerRun calls f runs+1 times
	for i := range keys {
		keys[i] = fmt.Sprintf("k%d", i)
	}
	now := int64(0)
	var r shard.Result
	for req, want := range []struct{ lo, hi float64 }{{1, 3}, {0, 0}, {1, 2}, {0, 0}, {1, 2}, {0, 0}} {
		i := 0
		got := testing.AllocsPerRun(len(keys)-1, func() {
			now++
			if err := s.Decide(keys[i], 1, now, true, &r); err != nil || !r.Allowed {
				t.Fatalf("request %d of %q: %+v, %v", req+1, keys[i], r, err)
			}
			i++
		})
		if got < want.lo || got > want.hi {
			t.Errorf("request %d of each key: %.2f allocations, want %v to %v", req+1, got, want.lo, want.hi)
		}
	}
}

// newStore is shard.New for a configuration the test knows is valid.
func newStore(t testing.TB, cfg shard.Config) *shard.Store {
	t.Helper()
	s, err := shard.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// TestNewRejectsInvalidConfig: every field outside its documented range is
// an error wrapping ErrInvalid, never a panic or a store.
func TestNewRejectsInvalidConfig(t *testing.T) {
	ok := shard.Config{Limit: 10, Window: 1000}
	for name, mod := range map[string]func(*shard.Config){
		"algorithm":          func(c *shard.Config) { c.Algorithm = 7 },
		"limit 0":            func(c *shard.Config) { c.Limit = 0 },
		"limit -1":           func(c *shard.Config) { c.Limit = -1 },
		"log limit":          func(c *shard.Config) { c.Limit = shard.MaxLogLimit + 1 },
		"counter limit":      func(c *shard.Config) { c.Algorithm, c.Limit = shard.Counter, shard.MaxCounterLimit+1 },
		"window 0":           func(c *shard.Config) { c.Window = 0 },
		"window -1":          func(c *shard.Config) { c.Window = -1 },
		"window too long":    func(c *shard.Config) { c.Window = shard.MaxWindow + 1 },
		"3 shards":           func(c *shard.Config) { c.Shards = 3 },
		"negative shards":    func(c *shard.Config) { c.Shards = -4 },
		"too many shards":    func(c *shard.Config) { c.Shards = 2 * shard.MaxShards },
		"negative presize":   func(c *shard.Config) { c.Presize = -1 },
		"presize too large":  func(c *shard.Config) { c.Presize = shard.MaxPresize + 1 },
		"negative max keys":  func(c *shard.Config) { c.MaxKeys = -1 },
		"min int shards":     func(c *shard.Config) { c.Shards = math.MinInt },
		"max int limit":      func(c *shard.Config) { c.Limit = math.MaxInt },
		"min int64 window":   func(c *shard.Config) { c.Window = math.MinInt64 },
		"counter, log limit": func(c *shard.Config) { c.Algorithm, c.Limit = shard.Counter, 0 },
	} {
		c := ok
		mod(&c)
		s, err := shard.New(c)
		if !errors.Is(err, shard.ErrInvalid) || s != nil {
			t.Errorf("%s: New(%+v) = %v, %v; want nil and an error wrapping ErrInvalid", name, c, s, err)
		}
	}
	for _, c := range []shard.Config{ok, {Algorithm: shard.Counter, Limit: shard.MaxCounterLimit, Window: shard.MaxWindow},
		{Limit: shard.MaxLogLimit, Window: 1, Shards: shard.MaxShards}, {Limit: 1, Window: 1, Shards: 1}} {
		if _, err := shard.New(c); err != nil {
			t.Errorf("New(%+v): %v", c, err)
		}
	}
}

// TestBadArgumentsChangeNothing: a decision, group, inspection, drop or
// sweep with an argument outside its range returns an error wrapping
// ErrInvalid and leaves every key as it was.
func TestBadArgumentsChangeNothing(t *testing.T) {
	for _, alg := range []shard.Algorithm{shard.Log, shard.Counter} {
		s := newStore(t, shard.Config{Algorithm: alg, Limit: 3, Window: 1000, Shards: 4})
		s2 := newStore(t, shard.Config{Algorithm: alg, Limit: 3, Window: 1000, Shards: 4})
		h := newStore(t, shard.Config{Algorithm: alg, Limit: 3, Window: 1000, HashedKeys: true})
		var r shard.Result
		if err := s.Decide("a", 2, 10, false, &r); err != nil || !r.Allowed {
			t.Fatalf("setup: %+v %v", r, err)
		}
		before := s.Stats()
		bad := func(what string, err error) {
			t.Helper()
			if !errors.Is(err, shard.ErrInvalid) {
				t.Errorf("%v %s: %v, want an error wrapping ErrInvalid", alg, what, err)
			}
		}
		for _, n := range []int{0, -1, 4, math.MaxInt, math.MinInt} {
			bad(fmt.Sprintf("Decide cost %d", n), s.Decide("a", n, 20, false, &r))
			bad(fmt.Sprintf("DecideGroup cost %d", n), second(shard.DecideGroup([]*shard.Store{s}, []string{"a"}, n, 20, false, make([]shard.Result, 1))))
		}
		bad("Decide instant -1", s.Decide("a", 1, -1, false, &r))
		bad("Decide nil result", s.Decide("a", 1, 20, false, nil))
		rs := make([]shard.Result, 2)
		for what, args := range map[string]struct {
			stores []*shard.Store
			keys   []string
			rs     []shard.Result
			now    int64
		}{
			"no stores":       {nil, nil, nil, 20},
			"fewer keys":      {[]*shard.Store{s, s2}, []string{"a"}, rs, 20},
			"fewer results":   {[]*shard.Store{s, s2}, []string{"a", "b"}, rs[:1], 20},
			"nil store":       {[]*shard.Store{s, nil}, []string{"a", "b"}, rs, 20},
			"unsorted stores": {[]*shard.Store{s2, s}, []string{"a", "b"}, rs, 20},
			"unsorted keys":   {[]*shard.Store{s, s}, []string{"b", "a"}, rs, 20},
			"duplicate pair":  {[]*shard.Store{s, s}, []string{"a", "a"}, rs, 20},
			"hashed store":    {[]*shard.Store{s, h}, []string{"a", "b"}, rs, 20},
			"instant -1":      {[]*shard.Store{s, s2}, []string{"a", "b"}, rs, -1},
		} {
			bad("DecideGroup "+what, second(shard.DecideGroup(args.stores, args.keys, 1, args.now, false, args.rs)))
		}
		_, _, err := s.Peek("a", -1, &r)
		bad("Peek instant -1", err)
		_, _, err = s.Peek("a", 20, nil)
		bad("Peek nil result", err)
		_, err = s.Drop("a", -1)
		bad("Drop instant -1", err)
		for _, i := range []int{-1, 4, math.MaxInt} {
			_, err = s.SweepShard(i, 1<<40)
			bad(fmt.Sprintf("SweepShard %d", i), err)
		}
		if after := s.Stats(); after != before {
			t.Errorf("%v: stats moved from %+v to %+v", alg, before, after)
		}
		if s2.Stats().Keys != 0 {
			t.Errorf("%v: a refused group created keys in its second store", alg)
		}
		// Key a still holds its two entries: one more fits, then none.
		for i, want := range []bool{true, false} {
			if err := s.Decide("a", 1, 30, false, &r); err != nil || r.Allowed != want {
				t.Fatalf("%v: decision %d after the bad calls: %+v %v, want allowed %v", alg, i, r, err, want)
			}
		}
	}
}

func second[T any](_ T, err error) error { return err }

func TestDecideAllocatesNothingOnAKnownKey(t *testing.T) {
	// A window of 50 ns at one request per ns: after warming up, the ring
	// stays at its size and half the decisions are refusals.
	s := newStore(t, shard.Config{Limit: 25, Window: 50})
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
