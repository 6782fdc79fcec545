package shard

import (
	"sync/atomic"
	"unsafe"
)

// A block is the whole state of one key: a few header words, a copy of the
// key's bytes, and the ring of accepted instants (or, for the counter, one
// data word). It is allocated as one []uint64, so it holds no pointers and
// the garbage collector never scans it; the map entry that points at it
// (and at its key bytes) is the only GC-visible object a key costs.
//
// Layout (each word 8 bytes, every access atomic):
//
//	word 0  ctl   version<<2 | dead<<1 | busy
//	word 1  wm    watermark: the latest decision instant used on this key
//	word 2  meta  log: cap<<42 | head<<21 | count;   counter: window index
//	word 3… key   the key's bytes, ⌈len/8⌉ words, immutable (see newBlock);
//	              none with Config.HashedKeys, whose map holds only a hash
//	then    data  log: ring slots, cap of them;      counter: prev<<32 | cur
//
// The key sits right after the header so that the map's key comparison on
// a lookup, the header loads and, for small rings, the slots share a cache
// line. Every caller knows the key, so the data's offset is not stored.
//
// # Protocol (a seqlock with a CAS-acquired write bit)
//
// Writers (an accepted request, a ring growth, a sweep) first CAS ctl from
// an even, not-dead value v to v|busy. While busy is set they are the only
// writer of wm (raised, never lowered), meta and the slots. They publish by
// storing ctl = v+4 (version bumped, busy cleared), or v+4|dead when the
// block is retired (grown into a new block, or swept). dead is never cleared.
//
// Readers (a refusal, a sweep's idle check) load ctl, then wm, meta and the
// slots, compute, and load ctl again: if it differs from the first load, a
// writer ran in between and what they read may be torn, so they retry. A
// reader never writes meta or the slots. The one word a reader may write is
// wm, by CAS, and only upward (see Store.Decide for when and why).
//
// What a concurrent reader may see: any mix of old and new slot values while
// busy is set; the version check rejects all of them. Outside a write the
// words are consistent, and a dead block's words are final but stale: dead
// sends the reader back to the map for the block that replaced it.
//
// A writer holds busy for a few dozen nanoseconds (a binary search and n
// stores), or for one small allocation when the ring grows. Other writers on
// the same key spin briefly and then yield; readers are never blocked by
// other readers. Keys do not share blocks, so there is no contention between
// keys at all.
type block struct {
	ctl  atomic.Uint64
	wm   atomic.Int64
	meta atomic.Uint64
	rest [1]uint64 // the key's words, then the data words; see words
}

const (
	headerWords = 3

	ctlBusy    = 1
	ctlDead    = 2
	ctlVersion = 4

	// ring geometry packed in meta: 21 bits each, so a ring holds at most
	// 2^20 instants (MaxLogLimit).
	metaBits = 21
	metaMask = 1<<metaBits - 1

	// MaxLogLimit is the largest limit the exact log supports: a full ring
	// of it costs 8 MiB for one key. Larger limits belong to the counter.
	MaxLogLimit = 1 << 20
)

// newBlock allocates a block with a copy of key's bytes and room for at
// least capacity data words after them. The allocator rounds every allocation
// up to a size class; the slack becomes extra data words (up to
// maxCapacity) instead of waste. It returns the block, its capacity, and a
// string that shares the block's copy of the key: the map stores that
// string as the key, so a key costs no allocation of its own, and the map's
// key comparison on a lookup touches the block's memory, which the decision
// reads next anyway, instead of a separate string elsewhere in the heap.
// The key bytes are written once, here, before the block is published, and
// never change.
func newBlock(capacity, maxCapacity int, key string) (*block, int, string) {
	kw := keyWords(len(key))
	// append rounds the capacity up to the size class in one allocation.
	words := append([]uint64(nil), make([]uint64, headerWords+kw+capacity)...)
	capacity = max(capacity, min(cap(words)-headerWords-kw, maxCapacity))
	b := (*block)(unsafe.Pointer(&words[0]))
	if len(key) == 0 {
		return b, capacity, ""
	}
	p := (*byte)(unsafe.Pointer(&words[headerWords]))
	copy(unsafe.Slice(p, len(key)), key)
	return b, capacity, unsafe.String(p, len(key))
}

func keyWords(keyLen int) int { return (keyLen + 7) / 8 }

// blockBytes is the heap size of a block of capacity data words for a key
// of keyLen bytes, before size-class rounding.
func blockBytes(capacity, keyLen int) int64 {
	return int64(8 * (headerWords + capacity + keyWords(keyLen)))
}

// data is a view of a block's data words.
type data struct{ p unsafe.Pointer }

// words returns the data words of b, whose key is keyLen bytes long.
func (b *block) words(keyLen int) data {
	return data{unsafe.Add(unsafe.Pointer(&b.rest[0]), keyWords(keyLen)*8)}
}

// slot returns data word i. The caller guarantees i < the block's capacity.
func (d data) slot(i int) *atomic.Int64 {
	return (*atomic.Int64)(unsafe.Add(d.p, uintptr(i)*8))
}

func packMeta(capacity, head, count int) uint64 {
	return uint64(capacity)<<(2*metaBits) | uint64(head)<<metaBits | uint64(count)
}

func unpackMeta(m uint64) (capacity, head, count int) {
	return int(m >> (2 * metaBits)), int(m >> metaBits & metaMask), int(m & metaMask)
}
