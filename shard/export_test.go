package shard

// Internals exposed to the package's tests only.

var RingCap = ringCap

func ShardSize() uintptr { return shardSize }
