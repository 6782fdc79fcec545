package shard

// Internals exposed to the package's tests only.

var GrowCap = growCap

// NewBlockCap returns the capacity newBlock gives a ring.
func NewBlockCap(capacity, maxCapacity int, key string) int {
	_, c, k := newBlock(capacity, maxCapacity, key)
	if k != key {
		panic("newBlock lost the key")
	}
	return c
}

func ShardSize() uintptr { return shardSize }
