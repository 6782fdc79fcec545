// Package slotmap builds a Redis Cluster's slot table from the ranges of
// CLUSTER SLOTS, for redisstore's own client and the adapters of a
// caller's client (goredisstore).
package slotmap

import "errors"

// NumSlots is the number of Redis Cluster hash slots.
const NumSlots = 16384

// ErrMalformed is returned for a range outside the slots or reversed.
var ErrMalformed = errors.New("CLUSTER SLOTS: malformed range")

// Map is a slot table under construction: the address of every master
// in the order first seen, and the index among them of each slot's
// master (-1 for a slot no range names).
type Map struct {
	Addrs []string
	Owner []int
	index map[string]int
}

// New returns a map with no master and every slot unowned.
func New() *Map {
	owner := make([]int, NumSlots)
	for i := range owner {
		owner[i] = -1
	}
	return &Map{Owner: owner, index: map[string]int{}}
}

// Add gives the slots lo to hi (inclusive) to the master at addr.
func (m *Map) Add(lo, hi int64, addr string) error {
	if lo < 0 || hi >= NumSlots || lo > hi {
		return ErrMalformed
	}
	k, ok := m.index[addr]
	if !ok {
		k = len(m.Addrs)
		m.index[addr] = k
		m.Addrs = append(m.Addrs, addr)
	}
	for s := lo; s <= hi; s++ {
		m.Owner[s] = k
	}
	return nil
}
