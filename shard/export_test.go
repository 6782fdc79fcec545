package shard

// Internals exposed to the package's tests only.

var GrowCap = growCap

// NewBlockCap returns the capacity newBlock gives a ring.
func NewBlockCap(capacity, maxCapacity int, key string) int {
	return newBlockCap(capacity, maxCapacity, key, false)
}

// NewNarrowBlockCap is NewBlockCap for a ring of 6-byte slots.
func NewNarrowBlockCap(capacity, maxCapacity int, key string) int {
	return newBlockCap(capacity, maxCapacity, key, true)
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
// key's hash, so that distinct keys collide as often as the test wants.
// Call it before the first decision.
func (s *Store) SetHashMask(mask uint64) { s.hashMask = mask }

// HashOf returns the map key a HashedKeys store uses for key.
func (s *Store) HashOf(key string) uint64 {
	k, _ := s.keyOf(key)
	return k.h
}
