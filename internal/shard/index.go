package shard

import (
	"math/bits"
	"sync"
	"sync/atomic"
	"unsafe"
)

// The index: each shard's map from a key of up to LongKeyBytes (in a store
// without HashedKeys) to its block. It is an open-addressed table of
// 64-byte buckets, one cache line each: a word of tag bytes and seven block
// pointers. A full slot's tag is a byte of the key's hash (tagOf), so a
// lookup loads its bucket's line, compares the key's tag with the seven
// tags at once, and loads only the blocks whose tag matches: a hit touches
// the bucket and its own block, which the decision reads next anyway. The
// block holds the key's bytes (see newBlock), so the table holds nothing
// else.
//
// The key is hashed once (hash.go), with words secret to the store: the low
// bits pick the shard, bits 16 to 22 the tag, and the top 32 bits the home
// bucket (by a multiply, so the table may have any number of buckets and
// grow by a quarter). A client cannot aim its keys at one bucket, because
// it does not know the seed.
//
// Readers take no lock. Writers (a new key, a grown ring's new block, a
// drop) hold the shard's mutex. The protocol:
//
//   - a lookup loads the table, then probes buckets from the key's home
//     bucket on: in each it loads the tag word, then the slots whose tag
//     matches, comparing each block's key (its length is in ctl, see
//     ctlKeyShift; its bytes never change; a key of up to shortKeyBytes
//     is compared as two words, see holdsShort). A hit is returned as it is:
//     it is a block the key had, and Decide's ctl checks send the caller
//     back here if it is retired. The probe ends at the first bucket with
//     an empty slot: a miss;
//   - an insert stores the block in the first free slot of the key's
//     probe (empty or deleted), then its tag in the tag word. A lookup
//     that loads the tag word before that misses the block and is ordered
//     before the insert. Slots never move within a table, and a slot once
//     used is never empty again (a drop leaves a deleted mark), so a
//     probe that started before an insert never stops short of a key
//     present for its whole run;
//   - a replacement (ring growth) stores the new block in the old one's
//     slot; the tag is the key's, unchanged. A drop marks the slot deleted
//     in the tag word, then clears its pointer;
//   - a resize builds a new table from the current one, under the mutex,
//     and publishes it; it never writes the old table. A lookup that loaded
//     the old table probes a table frozen at the resize, which held every
//     key present then: it finds them (a hit on a block retired since is
//     sent back by ctl, as above), and a key inserted later is inserted
//     after the lookup began. So lookups need no seqlock and misses no
//     second look under the mutex.
//
// The table holds at most maxLoadNum/maxLoadDen of its slots used (full or
// deleted); past that it is rebuilt, a quarter larger when at least
// growNum/growDen of the slots are live keys, at the same size otherwise
// (dropping the deleted marks). It never shrinks.
type index struct {
	mu  sync.Mutex
	tab atomic.Pointer[table]
	n   atomic.Int64 // keys held; written under mu
	kh  *keyHasher   // the store's hash of its keys (hash.go)
}

// bucketSlots is the slots of a bucket: seven pointers and the tag word
// fill one 64-byte line.
const bucketSlots = 7

// bucket is one cache line of the table. Byte i of tags (i < bucketSlots)
// is slot i's state: tagEmpty, tagDeleted, or the full slot's tag (high
// bit set). The top byte is always 0 and ignored.
type bucket struct {
	tags  atomic.Uint64
	slots [bucketSlots]atomic.Pointer[block]
}

// table is an array of buckets; used counts its slots full or deleted
// (written under the index's mutex).
type table struct {
	buckets []bucket
	used    int
}

const (
	tagEmpty   = 0
	tagDeleted = 1
	tagFull    = 0x80
	// tagShift: a full slot's tag is tagFull | the hash's bits tagShift to
	// tagShift+6, above the shard's (at most MaxShards, 16 bits) and below
	// the home bucket's (the top 32).
	tagShift = 16

	// The table is rebuilt past maxLoadNum/maxLoadDen of its slots used.
	maxLoadNum, maxLoadDen = 7, 8
	// A rebuild grows the table by a quarter when at least growNum/growDen
	// of its slots hold keys: after it, 70 % of the slots are full.
	growNum, growDen = 1, 2
	// minBuckets is the smallest table: 14 slots, 128 bytes.
	minBuckets = 2

	lowBytes = 0x0001010101010101 // one in each slot's byte
	highBits = 0x0080808080808080 // the high bit of each slot's byte
)

// tagOf is key's tag under hash h.
func tagOf(h uint64) uint64 { return tagFull | h>>tagShift&0x7f }

// home is the bucket h's probe starts at.
func (t *table) home(h uint64) int {
	return int((h >> 32) * uint64(len(t.buckets)) >> 32)
}

// matches has the high bit of each slot byte of the tag word w that may
// equal tag set: every equal byte, and, rarely, a byte above an equal one
// (the subtraction's borrow); the caller compares keys anyway.
func matches(w, tag uint64) uint64 {
	x := w ^ tag*lowBytes
	return (x - lowBytes) &^ x & highBits
}

// hasEmpty reports whether the tag word w has an empty slot. An empty byte
// is 0, and no full or deleted byte is, so the subtraction's borrow only
// runs above an empty byte.
func hasEmpty(w uint64) bool { return (w-lowBytes)&^w&highBits != 0 }

// slotsOf is the slots of a table of n buckets.
func slotsOf(n int) int { return n * bucketSlots }

// maxUsed is the used slots past which a table of n buckets is rebuilt.
func maxUsed(n int) int { return slotsOf(n) * maxLoadNum / maxLoadDen }

func newTable(n int) *table {
	return &table{buckets: make([]bucket, n)}
}

// init sizes the index for about keys keys hashed by kh.
func (ix *index) init(kh *keyHasher, keys int) {
	ix.kh = kh
	ix.tab.Store(newTable(bucketsFor(keys)))
}

// bucketsFor is the number of buckets that holds keys keys 70 % full.
func bucketsFor(keys int) int {
	return max(minBuckets, (keys*10/7+bucketSlots-1)/bucketSlots)
}

// linkedKey returns a linked block's key, sharing its bytes. v is a load
// of b's ctl (the key length bits never change). The empty key's block
// may be the header alone, so no pointer is formed past it.
func (b *block) linkedKey(v uint64) string {
	n := int(v >> ctlKeyShift & ctlKeyMask)
	if n == 0 {
		return ""
	}
	return unsafe.String((*byte)(unsafe.Add(unsafe.Pointer(b), headerWords*8)), n)
}

// is reports whether linked block b holds key.
func (b *block) is(key string) bool {
	v := b.ctl.Load()
	return int(v>>ctlKeyShift&ctlKeyMask) == len(key) && b.linkedKey(v) == key
}

// holdsTail reports whether linked block b, which holds a key of
// len(key) > shortKeyBytes bytes whose first two words are key's, holds
// key: it compares key's words from its last down to the one that
// overlaps the first two.
func (b *block) holdsTail(key string) bool {
	p, q := unsafe.Add(unsafe.Pointer(b), headerWords*8), unsafe.Pointer(unsafe.StringData(key))
	for off := len(key) - 8; off > 8; off -= 8 {
		if le64(p, off) != le64(q, off) {
			return false
		}
	}
	return true
}

// holdsShort reports whether linked block b holds the key of n bytes (n
// ≤ shortKeyBytes) whose words (shortWords) are w0 and w1. The key's
// words in b are zero past its end, as w0 and w1 are; a key of up to 8
// bytes has no second word in b, and the empty key none at all.
func (b *block) holdsShort(n int, w0, w1 uint64) bool {
	if int(b.ctl.Load()>>ctlKeyShift&ctlKeyMask) != n {
		return false
	}
	if n == 0 {
		return true // no pointer is formed past a header-only block
	}
	p := unsafe.Add(unsafe.Pointer(b), headerWords*8)
	return le64(p, 0) == w0 && (n <= 8 || le64(p, 8) == w1)
}

// load returns key's block, or false. h is key's hash (ix.kh).
func (ix *index) load(key string, h uint64) (*block, bool) {
	w0, w1 := probeWords(key)
	return ix.probe(key, h, w0, w1)
}

// probe is load for a key whose words (probeWords) are w0 and w1. A
// candidate's length and words are compared first, and a key longer than
// shortKeyBytes then by the rest of its bytes, all inline: a call would
// cost every lookup a frame and the registers it spills.
func (ix *index) probe(key string, h, w0, w1 uint64) (*block, bool) {
	n := len(key)
	t := ix.tab.Load()
	tag := tagOf(h)
	i := t.home(h)
	for range t.buckets {
		bk := &t.buckets[i]
		w := bk.tags.Load()
		for m := matches(w, tag); m != 0; m &= m - 1 {
			b := bk.slots[bits.TrailingZeros64(m)>>3].Load()
			if b != nil && b.holdsShort(n, w0, w1) && (n <= shortKeyBytes || b.holdsTail(key)) {
				return b, true
			}
		}
		if hasEmpty(w) {
			break
		}
		if i++; i == len(t.buckets) {
			i = 0
		}
	}
	return nil, false
}

// find returns the bucket and slot that hold key's block and true, or
// the first free slot of key's probe (empty or deleted) to insert it in
// and false. Precondition: ix.mu is held and t is the current table,
// which always has an empty slot (a rebuild keeps one).
func (ix *index) find(t *table, key string, h uint64) (*bucket, int, bool) {
	tag := tagOf(h)
	i := t.home(h)
	var free *bucket
	slot := 0
	for range t.buckets {
		bk := &t.buckets[i]
		w := bk.tags.Load()
		for m := matches(w, tag); m != 0; m &= m - 1 {
			s := bits.TrailingZeros64(m) >> 3
			if b := bk.slots[s].Load(); b != nil && b.is(key) {
				return bk, s, true
			}
		}
		if free == nil {
			if s, ok := freeSlot(w); ok {
				free, slot = bk, s
			}
		}
		if hasEmpty(w) {
			break
		}
		if i++; i == len(t.buckets) {
			i = 0
		}
	}
	return free, slot, false
}

// freeSlot returns the first slot of tag word w that is empty or deleted.
func freeSlot(w uint64) (int, bool) {
	for s := range bucketSlots {
		if w>>(8*s)&tagFull == 0 {
			return s, true
		}
	}
	return 0, false
}

// loadOrStore returns key's block if it has one, and true; otherwise it
// links nb, whose key is key, and returns nb and false.
func (ix *index) loadOrStore(key string, h uint64, nb *block) (*block, bool) {
	ix.mu.Lock()
	defer ix.mu.Unlock()
	t := ix.tab.Load()
	bk, s, ok := ix.find(t, key, h)
	if ok {
		return bk.slots[s].Load(), true
	}
	ix.link(t, bk, s, h, nb)
	return nb, false
}

// link stores nb in free slot s of bucket bk of the current table t, then
// its tag, and rebuilds the table when too many of its slots are used.
// Precondition: ix.mu is held and nb's key has no block.
func (ix *index) link(t *table, bk *bucket, s int, h uint64, nb *block) {
	w := bk.tags.Load()
	if w>>(8*s)&0xff == tagEmpty {
		t.used++
	}
	bk.slots[s].Store(nb)
	bk.tags.Store(w&^(0xff<<(8*s)) | tagOf(h)<<(8*s))
	if n := ix.n.Add(1); t.used > maxUsed(len(t.buckets)) {
		ix.resize(t, int(n))
	}
}

// replace links nb, key's new block, in place of its current one (or in a
// free slot if it has none).
func (ix *index) replace(key string, h uint64, nb *block) {
	ix.mu.Lock()
	defer ix.mu.Unlock()
	t := ix.tab.Load()
	bk, s, ok := ix.find(t, key, h)
	if !ok {
		ix.link(t, bk, s, h, nb)
		return
	}
	bk.slots[s].Store(nb)
}

// remove unlinks key's block: its slot is marked deleted, then cleared.
func (ix *index) remove(key string, h uint64) {
	ix.mu.Lock()
	defer ix.mu.Unlock()
	t := ix.tab.Load()
	bk, s, ok := ix.find(t, key, h)
	if !ok {
		return
	}
	w := bk.tags.Load()
	bk.tags.Store(w&^(0xff<<(8*s)) | tagDeleted<<(8*s))
	bk.slots[s].Store(nil)
	ix.n.Add(-1)
}

// resize publishes a rebuilt copy of t holding its n keys: a quarter
// larger when they fill at least growNum/growDen of its slots, the same
// size otherwise. t itself is left as it is, for lookups still probing
// it. Precondition: ix.mu is held and t is the current table.
func (ix *index) resize(t *table, n int) {
	size := len(t.buckets)
	if n*growDen >= slotsOf(size)*growNum {
		size = max(size+1, size*5/4)
	}
	nt := newTable(size)
	t.each(func(key string, b *block) bool {
		nt.put(ix.kh.hash(key), b)
		return true
	})
	ix.tab.Store(nt)
}

// each calls f with the key and block of every full slot of t until f
// returns false. A slot whose pointer a drop has cleared since its tag
// was loaded is passed over.
func (t *table) each(f func(key string, b *block) bool) bool {
	for i := range t.buckets {
		bk := &t.buckets[i]
		w := bk.tags.Load()
		for s := range bucketSlots {
			if w>>(8*s)&tagFull == 0 {
				continue
			}
			if b := bk.slots[s].Load(); b != nil && !f(b.linkedKey(b.ctl.Load()), b) {
				return false
			}
		}
	}
	return true
}

// put stores b, whose key hashes to h, in the first empty slot of its
// probe, in a table no reader can reach yet, which has no deleted slot
// and does not hold b's key.
func (t *table) put(h uint64, b *block) {
	for i := t.home(h); ; {
		bk := &t.buckets[i]
		if w := bk.tags.Load(); hasEmpty(w) {
			s, _ := freeSlot(w)
			bk.slots[s].Store(b)
			bk.tags.Store(w | tagOf(h)<<(8*s))
			t.used++
			return
		}
		if i++; i == len(t.buckets) {
			i = 0
		}
	}
}

// rangeKeys calls f with every linked key and its block until f returns
// false. It takes no lock: it walks the table as a lookup does, so that a
// sweep never holds the mutex that decisions creating, growing or
// dropping keys take (a sweep preempted while holding it would stall
// them), and f may replace or remove keys. Keys linked during the walk
// may be missed, and a resize during the walk leaves the walk on the old
// table, whose blocks may be retired since; the sweep's next pass sees
// what this one missed. f may be handed a block that is dead by then, as
// with any copy of a table; SweepShard checks.
func (ix *index) rangeKeys(f func(key string, b *block) bool) bool {
	return ix.tab.Load().each(f)
}

// headBytes is the heap the index's table takes.
func (ix *index) headBytes() int64 {
	return int64(len(ix.tab.Load().buckets)) * int64(unsafe.Sizeof(bucket{}))
}
