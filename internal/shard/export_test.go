package shard

import "fmt"

// Internals exposed to the package's tests only.

var GrowCap = growCap

// NewBlockCap returns the capacity newBlock gives a ring.
func NewBlockCap(capacity, maxCapacity int, key string) int {
	return newBlockCap(capacity, maxCapacity, key, false)
}

// NewNarrowLogBlockCap returns the capacity newLogBlock gives a ring of
// 6-byte slots (a small ring's slot 0 in meta included), and whether the
// ring is small.
func NewNarrowLogBlockCap(capacity, maxCapacity int, key string) (int, bool) {
	b, c, k := newLogBlock(capacity, maxCapacity, key, true)
	if k != key {
		panic("newLogBlock lost the key")
	}
	return c, b.meta.Load()&metaSmall != 0
}

func newBlockCap(capacity, maxCapacity int, key string, narrow bool) int {
	_, c, k := newBlock(capacity, maxCapacity, key, narrow)
	if k != key {
		panic("newBlock lost the key")
	}
	return c
}

func ShardSize() uintptr { return shardSize }

// SetHashMask makes a HashedKeys store keep only the bits of mask of every
// key's hash (and any store, of each half of a long key's digest), so that
// distinct keys collide as often as the test wants.
// Call it before the first decision.
func (s *Store) SetHashMask(mask uint64) { s.hashMask = mask }

// ClassOf names the state key decides on: keys with one class share a
// state (a HashedKeys hash, a long key's digest), others do not.
func (s *Store) ClassOf(key string) string {
	k, _ := s.keyOf(key)
	if k.h == 0 && k.h2 == 0 && !s.hashed {
		return "key:" + k.s
	}
	return fmt.Sprintf("digest:%x:%x", k.h, k.h2)
}

// HashOf returns the map key a HashedKeys store uses for key.
func (s *Store) HashOf(key string) uint64 {
	k, _ := s.keyOf(key)
	return k.h
}

// CheckReserved returns an error unless the side table of reserved keys
// (Store.resv) holds exactly the keys whose block has ctlReserved set.
// Call it while no decision runs.
func (s *Store) CheckReserved() error {
	inMap := map[mkey]bool{}
	for i := range s.shards {
		var err error
		s.shards[i].rangeKeys(func(k mkey, b *block) bool {
			v := b.ctl.Load()
			_, ok := s.resv.Load(k)
			inMap[k] = true
			switch {
			case v&(ctlBusy|ctlDead) != 0:
				err = fmt.Errorf("key %q: ctl %#x is busy or dead at rest", k.s, v)
			case (v&ctlReserved != 0) != ok:
				err = fmt.Errorf("key %q: reserved bit %v, side table entry %v", k.s, v&ctlReserved != 0, ok)
			}
			return err == nil
		})
		if err != nil {
			return err
		}
	}
	var err error
	s.resv.Range(func(k, _ any) bool {
		if !inMap[k.(mkey)] {
			err = fmt.Errorf("key %q: in the side table, not in the map", k.(mkey).s)
		}
		return err == nil
	})
	return err
}
