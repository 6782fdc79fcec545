package shard

import (
	"sync/atomic"
	"unsafe"
)

// A block is the whole state of one key: a few header words, a copy of the
// key's bytes, and the ring of accepted instants (or, for the counter, one
// data word). It is allocated as one []uint64, so it holds no pointers and
// the garbage collector never scans it: the index's slot (or the xsync
// map's entry) that points at it is the only GC-visible word a key costs.
//
// Layout (each word 8 bytes, every access atomic):
//
//	word 0  ctl   version<<11 | key length<<3 | reserved<<2 | dead<<1 | busy
//	word 1  wm    watermark: the latest decision instant used on this key;
//	              with its top bit (wmEntry) set, also the ring's newest
//	              entry (see "The entry in wm" below)
//	word 2  meta  log: cap<<42 | head<<21 | count (a small ring packs
//	              its geometry and slot 0 here instead: see "Slots"
//	              below);                             counter: window index
//	then    key   linked blocks only: the key's bytes, ⌈len/8⌉ words,
//	              immutable (see newBlock)
//	then    data  log: the ring's slots, 6 or 8 bytes each (see "Slots");
//	              counter: prev<<32 | cur
//
// A key of up to LongKeyBytes in a store without HashedKeys has a linked
// block: the index (index.go) compares its key, whose length is in ctl
// (the bits never change). Other blocks (HashedKeys, long keys' digests)
// are found through an xsync map and hold no key. The key sits right
// after the header so that the index's key comparison, the header loads
// and, for small rings, the slots share a cache line. Every caller knows
// the key, so the data's offset is not stored.
//
// # Protocol (a seqlock with a CAS-acquired write bit)
//
// Writers (an accepted request, a ring growth, a group request, a sweep,
// a drop) first CAS ctl from an even, not-dead value v to v|busy. While
// busy is set they are the only writer of meta and the slots. They raise
// wm, never lower it; so may a refusal that validated its read just before
// the bit was taken, whose CAS on wm can land while busy is set (a writer
// that changes the block bumps the version, so that refusal then retries;
// see group.go, "Watermarks"). They publish by
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
	// The key's words and the data words follow in the same allocation
	// (see words); the 24-byte block of a hashed key's first request has
	// neither.
}

const (
	headerWords = 3

	ctlBusy = 1
	ctlDead = 2
	// ctlReserved: the ring holds a reservation after the key's latest
	// decision instant (reserve.go); every decision then takes the busy
	// bit. Writers keep it as they publish v+ctlVersion.
	ctlReserved = 4
	// ctl's bits 3 to 9 hold a linked block's key length (0 to
	// LongKeyBytes), set before the block is published and never changed.
	ctlKeyShift = 3
	ctlKeyMask  = 1<<7 - 1
	// Bit 10 is unused.
	ctlVersion = 1 << 11

	// ring geometry packed in meta: 21 bits each, so a ring holds at most
	// 2^20 instants (MaxLogLimit).
	metaBits = 21
	metaMask = 1<<metaBits - 1

	// MaxLogLimit is the largest limit the exact log supports: a full ring
	// of it costs 8 MiB for one key. Larger limits belong to the counter.
	MaxLogLimit = 1 << 20
)

// Slots. A log's ring holds its instants in one of three layouts, fixed
// for the block's life:
//
//   - wide: one int64 word per instant, for stores whose window exceeds
//     maxNarrowWindow;
//   - narrow: the low 48 bits of each instant, two instants in three
//     uint32 words (see storeNarrow), 6 bytes each;
//   - small: narrow, with physical slot 0 in meta's low 48 bits and the
//     ring's geometry in meta's top 16 (metaSmall set; see packSmall), so
//     the block holds one instant more than its data words: slot p ≥ 1 is
//     narrow data slot p−1. A narrow ring of at most smallMaxCap instants
//     is small (newLogBlock), so a key's first block usually is: for keys
//     of up to 8 bytes the 48-byte block holds 3 instants instead of 2,
//     and the keyless block of a HashedKeys store whose first request has
//     cost 1 is the three header words alone (24 B instead of 32 B),
//     holding its one instant in meta. meta is written on every change of
//     the ring anyway, so slot 0 costs no extra store.
//
// A narrow slot stores no base: an instant is decoded against the block's
// watermark, as the one value ≤ wm whose low 48 bits match (see decode).
// That is exact as long as every instant in the ring is less than 2^48 ns
// (78 h) older than the watermark, and the store keeps that invariant:
//
//	for every instant e in a live block's ring, 0 ≤ wm − e < 2·W ≤ 2^48
//
// Every instant is ≤ wm (an accept raises wm to its instant before it
// appends). An accept at t drops the entries ≤ t − W before it appends,
// so after it every entry is > t − W and wm = t. A refusal raises wm to t
// only after validating its read (see Store.Decide), and a refusal at t
// means the ring's newest entry a is > t − W, while its oldest is > a − W
// (dropped at a's accept): wm − e < 2W. A group request refused by another
// limit raises wm under the busy bit, and drops the entries ≤ t − W first
// (see DecideGroup). Stores whose window is longer than maxNarrowWindow
// use wide slots.
const (
	narrowBits = 48
	narrowMask = 1<<narrowBits - 1

	// maxNarrowWindow is the longest window whose store uses narrow slots:
	// 2^47 ns, about 39 hours.
	maxNarrowWindow = 1 << (narrowBits - 1)

	// meta of a small ring: metaSmall | capacity<<smallCapShift |
	// head<<smallHeadShift | count<<smallCountShift | slot 0's low 48 bits.
	// A normal meta (packMeta) never has bit 63 set: its capacity is at
	// most 2^20.
	metaSmall       = 1 << 63
	smallBits       = 3
	smallMask       = 1<<smallBits - 1
	smallCountShift = narrowBits
	smallHeadShift  = smallCountShift + smallBits
	smallCapShift   = smallHeadShift + smallBits
	// smallMaxCap is the largest capacity of a small ring (it needs
	// smallBits bits).
	smallMaxCap = smallMask
)

// The entry in wm. An accept at t leaves wm = t, its newest entry, so a
// log's full ring can hold one entry more without growing: the accept
// that would overflow it by one stores t|wmEntry in wm instead of growing
// the block (logAppend). The ring then holds its capacity plus one
// entries, the last of them wm's; a first block of one instant (in meta)
// holds two, so a key that sends two requests never grows. Instants are
// ≥ 0, so the bit is free, and a ring with the bit set is always full:
// logAppend sets it only when the ring's slots are all taken, and the
// next accept moves the entry into a slot (or into a grown block) before
// it appends.
//
// While the bit is set, wm changes only under the busy bit. A refusal
// raises wm with a CAS from the value it read: from a value with the bit
// set it must not (the entry would move), so a refusal that needs to raise
// such a wm takes the busy bit and moves the entry into a grown block
// first (unflag), then decides again; one that read a value without the
// bit fails its CAS if a writer set the bit since, as the word changed.
// The writers that are not accepts on Decide's path (group requests,
// reservations) move the entry out the same way as they take the bit
// (acquire), so they see a plain ring. Readers strip the bit (wmTime)
// and count the entry (wmExtra): ringOf and geomOf do both, and slotAt
// returns the watermark for the logical slot past the ring's capacity.
const wmEntry = -1 << 63

// wmTime is the instant a watermark word w holds, without wmEntry.
func wmTime(w int64) int64 { return w &^ wmEntry }

// wmExtra is 1 when the watermark word w is also its ring's newest entry.
func wmExtra(w int64) int { return int(uint64(w) >> 63) }

// decode returns the instant ≤ ref whose low 48 bits are s. ref is the
// block's watermark as loaded with the ring (see the invariant above).
func decode(s uint64, ref int64) int64 {
	return ref - int64((uint64(ref)-s)&narrowMask)
}

// newBlock allocates a block with a copy of key's bytes and room for at
// least capacity slots after them (wide or narrow). The allocator rounds
// every allocation up to a size class; the slack becomes extra slots (up
// to maxCapacity) instead of waste. A block that is half of a pair has no
// slack (allocWords). It returns the block, its capacity,
// and a string that shares the block's copy of the key. The key bytes and
// their length in ctl are written once, here, before the block is
// published, and never change. The rest of the key's last word stays
// zero: the index compares a short key as words (holdsShort).
//
// sp is the shard's spare half (see allocWords), or nil to allocate the
// block on its own; st is the store's stock (stock.go), or nil.
func newBlock(capacity, maxCapacity int, key string, narrow bool, sp *spare, st *stock) (*block, int, string) {
	kw := keyWords(len(key))
	words := allocWords(headerWords+kw+dataWords(capacity, narrow), sp, st)
	b := (*block)(unsafe.Pointer(&words[0]))
	capacity = max(capacity, min(slotsIn(cap(words)-headerWords-kw, narrow), maxCapacity))
	b.ctl.Store(uint64(len(key)) << ctlKeyShift)
	if len(key) == 0 {
		return b, capacity, ""
	}
	p := (*byte)(unsafe.Add(unsafe.Pointer(b), 8*headerWords))
	copy(unsafe.Slice(p, len(key)), key)
	return b, capacity, unsafe.String(p, len(key))
}

// newLogBlock is newBlock for a log's ring, whose empty meta it stores: a
// narrow ring of at most smallMaxCap instants is small (its slot 0 in
// meta), so it gets one more instant than its data words hold, up to
// maxCapacity. The capacity it returns counts that slot. A capacity of 0
// asks for no data words: a keyless block is then the three header words
// alone (24 bytes), a small ring of one instant.
func newLogBlock(capacity, maxCapacity int, key string, narrow bool, sp *spare, st *stock) (*block, int, string) {
	b, c, ks := newBlock(capacity, maxCapacity, key, narrow, sp, st)
	if narrow && c < min(maxCapacity, smallMaxCap) {
		c++
		b.meta.Store(packSmall(c, 0, 0, 0))
	} else {
		b.meta.Store(packMeta(c, 0, 0))
	}
	return b, c, ks
}

// pairWords is the size of a block allocated in pairs: 40 bytes, which
// the allocator would round up to its 48-byte size class, so two of them
// share one 80-byte allocation instead. It is mostly the first block of
// a key of 9 to 16 bytes on the exact log after a request of cost 1 (the
// header, the key and no data words: the one instant is in meta); also
// the first block of a key of up to 8 bytes on the counter, on the log at
// cost 2, or on the log of 8-byte slots at cost 1. The 8 bytes saved are
// a seventh of what such a key costs: the block is most of it, and the
// index slot that points at it (index.go) is the rest.
const pairWords = 5

// spare is a shard's unused half of the last pair it allocated.
type spare = atomic.Pointer[[pairWords]uint64]

// allocWords returns n zeroed words for a block. Its capacity is the
// allocator's size class, whose slack newBlock turns into slots. With a
// spare sp, a block of pairWords words is half of a pair: sp's half if it
// has one, or else the first half of a new pair, whose second half goes to
// sp. A half is handed out once and never reused, so a block's memory is
// never another key's; the pair is freed once neither half is referenced.
// Two goroutines may race for sp: one of them then gets a new pair, and a
// half that finds sp taken is left unused (it costs what the size class
// would have). A block or pair comes from the stock st when it has one
// (stock.go), and is allocated here otherwise.
func allocWords(n int, sp *spare, st *stock) []uint64 {
	if n != pairWords || sp == nil {
		if w := st.take(n); w != nil {
			return w
		}
		// append rounds the capacity up to the size class in one
		// allocation.
		w := append([]uint64(nil), make([]uint64, n)...)
		st.missed(n, w)
		return w
	}
	if h := sp.Load(); h != nil && sp.CompareAndSwap(h, nil) {
		return h[:]
	}
	var p *[2 * pairWords]uint64
	if w := st.take(2 * pairWords); w != nil {
		p = (*[2 * pairWords]uint64)(w)
	} else {
		p = new([2 * pairWords]uint64)
		st.missed(2*pairWords, p[:])
	}
	sp.CompareAndSwap(nil, (*[pairWords]uint64)(p[pairWords:]))
	return p[:pairWords:pairWords]
}

// keyWords is how many words a block's key takes.
func keyWords(keyLen int) int { return (keyLen + 7) / 8 }

// dataWords is how many words capacity slots take.
func dataWords(capacity int, narrow bool) int {
	if narrow {
		return (3*capacity + 3) / 4 // 6 bytes each, rounded up to a word
	}
	return capacity
}

// slotsIn is how many slots fit in w data words.
func slotsIn(w int, narrow bool) int {
	if narrow {
		return 4 * w / 3
	}
	return w
}

// blockBytes is the heap size of a block of capacity data slots whose key
// takes kw words (keyWords), before size-class rounding. (A small ring's
// capacity is one more than its data slots.)
func blockBytes(capacity, kw int, narrow bool) int64 {
	return int64(8 * (headerWords + dataWords(capacity, narrow) + kw))
}

// data is a view of a block's data words: the block and the data's byte
// offset in it. The address is formed only when a slot is accessed, so a
// block without data words never yields a pointer past its end.
type data struct {
	b   unsafe.Pointer
	off uintptr
}

// words returns the data words of b, whose key takes kw words (keyWords):
// right after the key.
func (b *block) words(kw int) data {
	return data{unsafe.Pointer(b), uintptr(headerWords+kw) * 8}
}

// slot returns data word i. The caller guarantees i < the block's capacity.
func (d data) slot(i int) *atomic.Int64 {
	return (*atomic.Int64)(unsafe.Add(d.b, d.off+uintptr(i)*8))
}

func (d data) u32(i int) *atomic.Uint32 {
	return (*atomic.Uint32)(unsafe.Add(d.b, d.off+uintptr(i)*4))
}

// storeNarrow sets narrow slot i to the low 48 bits of e. Slots 2k and
// 2k+1 share the uint32 words 3k, 3k+1 and 3k+2: slot 2k is word 3k and
// the low half of word 3k+1, slot 2k+1 the high half of word 3k+1 and
// word 3k+2 (ring.at reads them). A reader's two loads are separate
// atomic loads, so it may combine halves of two writes, which the
// seqlock's version check rejects like any torn read. Precondition: the
// caller holds the block's busy bit, so it is the only writer of the word
// slot i shares with its neighbour.
func (d data) storeNarrow(i int, e int64) {
	s := uint64(e) & narrowMask
	q := 3 * (i >> 1)
	if i&1 == 0 {
		d.u32(q).Store(uint32(s))
		w := d.u32(q + 1)
		w.Store(w.Load()&0xffff0000 | uint32(s>>32))
		return
	}
	w := d.u32(q + 1)
	w.Store(w.Load()&0xffff | uint32(s)<<16)
	d.u32(q + 2).Store(uint32(s >> 16))
}

// fillNarrow is storeNarrow for a block no other goroutine can reach yet
// (just allocated by a growth, not yet in the map): plain loads and
// stores on the same words, no atomic exchange. The map's atomic store
// that publishes the block orders them before any reader's loads.
func (d data) fillNarrow(i int, e int64) {
	s := uint64(e) & narrowMask
	q := 3 * (i >> 1)
	if i&1 == 0 {
		*d.w32(q) = uint32(s)
		w := d.w32(q + 1)
		*w = *w&0xffff0000 | uint32(s>>32)
		return
	}
	w := d.w32(q + 1)
	*w = *w&0xffff | uint32(s)<<16
	*d.w32(q + 2) = uint32(s >> 16)
}

// w32 is u32 for the plain accesses of fillNarrow.
func (d data) w32(i int) *uint32 { return (*uint32)(unsafe.Pointer(d.u32(i))) }

func packMeta(capacity, head, count int) uint64 {
	return uint64(capacity)<<(2*metaBits) | uint64(head)<<metaBits | uint64(count)
}

// packSmall is a small ring's meta: its geometry and its slot 0 (an
// instant's low 48 bits).
func packSmall(capacity, head, count int, slot0 uint64) uint64 {
	return metaSmall | uint64(capacity)<<smallCapShift | uint64(head)<<smallHeadShift |
		uint64(count)<<smallCountShift | slot0&narrowMask
}

func unpackMeta(m uint64) (capacity, head, count int) {
	if m&metaSmall != 0 {
		return int(m >> smallCapShift & smallMask), int(m >> smallHeadShift & smallMask), int(m >> smallCountShift & smallMask)
	}
	return int(m >> (2 * metaBits)), int(m >> metaBits & metaMask), int(m & metaMask)
}

// repack returns meta m, in its own layout, with the geometry (capacity,
// head, count); a small ring keeps its slot 0.
func repack(m uint64, capacity, head, count int) uint64 {
	if m&metaSmall != 0 {
		return packSmall(capacity, head, count, m)
	}
	return packMeta(capacity, head, count)
}
