package shard

import (
	"hash/maphash"
	"reflect"
	"sync"
	"sync/atomic"
	"unsafe"
)

// The index: each shard's map from a key of up to LongKeyBytes (in a store
// without HashedKeys) to its block. It is a chained hash table whose links
// live in the blocks themselves: a linked block has one pointer word after
// its header (next), and the shard keeps an array of chain heads. A key
// therefore costs its block and a share of one 8-byte head, about 4 to 8
// bytes at the load factors below, where a map entry of its own would cost
// 24 bytes and a share of a bucket.
//
// The key is hashed once, with a maphash seed secret to the store: the low
// bits pick the shard, the bits from 16 up the chain. A client cannot aim
// its keys at one chain, because it does not know the seed.
//
// Readers take no lock. Writers (a new key, a grown ring's new block, a
// drop) hold the shard's mutex. The protocol:
//
//   - a lookup loads the seqlock word seq (even when no resize runs), the
//     table, the chain's head, and follows next pointers, comparing each
//     block's key (its length is in ctl, see ctlKeyShift; its bytes never
//     change). A hit is returned as it is: it is a block the key had,
//     and Decide's ctl checks send the caller back here if it is retired.
//     A miss counts only if seq has not changed since the start; else
//     (a resize relinked the chains under the reader) the lookup runs
//     again under the mutex;
//   - an insert links the new block at the chain's head: a lookup that
//     loaded the head before misses it, and is ordered before the insert;
//   - a replacement (ring growth) links the new block in the old one's
//     place, its next the old one's next; a drop unlinks the block. Neither
//     changes a retired block's next, so a reader standing on one still
//     reaches every block after it, and finds the retired block dead (ctl)
//     when it is the one it looks for;
//   - a resize makes seq odd, moves every block to the doubled table's
//     chains (rewriting next pointers), stores the table, and makes seq
//     even again. A reader that raced it may walk a rewritten chain: every
//     32 steps it checks seq, so it never walks for long, and it trusts
//     only hits (a block whose key equals the key looked for is that key's
//     block, whichever chain led to it).
//
// Chains stay short: the table doubles when a shard holds more than
// maxLoad keys per head, so a lookup that hits compares about 1 + load/2
// keys, each in the block whose header the decision reads next.
type index struct {
	mu   sync.Mutex
	seq  atomic.Uint64 // odd while a resize relinks the chains
	tab  atomic.Pointer[table]
	n    atomic.Int64 // keys linked; written under mu
	seed maphash.Seed
}

// table is an array of chain heads; its length is a power of two.
type table struct {
	heads []atomic.Pointer[block]
	mask  uint64
}

const (
	// maxLoad is the keys per chain head above which a table doubles: the
	// load stays between maxLoad/2 and maxLoad, 4 to 8 bytes of heads per
	// key.
	maxLoad = 2
	// minHeads is the smallest table.
	minHeads = 16
	// chainShift: the chain is picked by the hash's bits from chainShift
	// up, above the shard's (at most MaxShards, 16 bits).
	chainShift = 16
)

func newTable(heads int) *table {
	return &table{heads: make([]atomic.Pointer[block], heads), mask: uint64(heads - 1)}
}

// init sizes the index for about keys keys.
func (ix *index) init(seed maphash.Seed, keys int) {
	ix.seed = seed
	n := minHeads
	for n*maxLoad < keys {
		n *= 2
	}
	ix.tab.Store(newTable(n))
}

// next returns b's link word. Only linked blocks have one (see newBlock).
func (b *block) next() *atomic.Pointer[block] {
	return (*atomic.Pointer[block])(unsafe.Add(unsafe.Pointer(b), headerWords*8))
}

// linkedKey returns a linked block's key, sharing its bytes. v is a load
// of b's ctl (the key length bits never change).
func (b *block) linkedKey(v uint64) string {
	n := int(v >> ctlKeyShift & ctlKeyMask)
	return unsafe.String((*byte)(unsafe.Add(unsafe.Pointer(b), (headerWords+1)*8)), n)
}

// is reports whether linked block b holds key.
func (b *block) is(key string) bool {
	v := b.ctl.Load()
	return int(v>>ctlKeyShift&ctlKeyMask) == len(key) && b.linkedKey(v) == key
}

// load returns key's block, or false. h is key's hash under ix.seed.
func (ix *index) load(key string, h uint64) (*block, bool) {
	s1 := ix.seq.Load()
	if s1&1 == 0 {
		t := ix.tab.Load()
		b := t.heads[h>>chainShift&t.mask].Load()
		for steps := 1; b != nil; steps++ {
			if b.is(key) {
				return b, true
			}
			if steps%32 == 0 && ix.seq.Load() != s1 {
				break
			}
			b = b.next().Load()
		}
		if b == nil && ix.seq.Load() == s1 {
			return nil, false
		}
	}
	ix.mu.Lock()
	b, _ := ix.find(key, h)
	ix.mu.Unlock()
	return b, b != nil
}

// find returns key's block and the link that points at it (a head or a
// block's next), or nil and the chain's head. Precondition: ix.mu is held.
func (ix *index) find(key string, h uint64) (*block, *atomic.Pointer[block]) {
	t := ix.tab.Load()
	head := &t.heads[h>>chainShift&t.mask]
	for link := head; ; {
		b := link.Load()
		if b == nil {
			return nil, head
		}
		if b.is(key) {
			return b, link
		}
		link = b.next()
	}
}

// loadOrStore returns key's block if it has one, and true; otherwise it
// links nb, whose key is key, and returns nb and false.
func (ix *index) loadOrStore(key string, h uint64, nb *block) (*block, bool) {
	ix.mu.Lock()
	defer ix.mu.Unlock()
	if b, _ := ix.find(key, h); b != nil {
		return b, true
	}
	ix.link(key, h, nb)
	return nb, false
}

// link inserts nb at its chain's head and grows the table when it is
// full. Precondition: ix.mu is held and key has no block.
func (ix *index) link(key string, h uint64, nb *block) {
	t := ix.tab.Load()
	head := &t.heads[h>>chainShift&t.mask]
	nb.next().Store(head.Load())
	head.Store(nb)
	if n := ix.n.Add(1); n > int64(maxLoad*len(t.heads)) {
		ix.resize(t)
	}
}

// replace links nb, key's new block, in place of its current one (or at
// the chain's head if it has none).
func (ix *index) replace(key string, h uint64, nb *block) {
	ix.mu.Lock()
	defer ix.mu.Unlock()
	b, link := ix.find(key, h)
	if b == nil {
		ix.link(key, h, nb)
		return
	}
	nb.next().Store(b.next().Load())
	link.Store(nb)
}

// remove unlinks key's block. b's own next is left as it is, for readers
// standing on b.
func (ix *index) remove(key string, h uint64) {
	ix.mu.Lock()
	defer ix.mu.Unlock()
	if b, link := ix.find(key, h); b != nil {
		link.Store(b.next().Load())
		ix.n.Add(-1)
	}
}

// resize moves every block of t to a table twice its size. Precondition:
// ix.mu is held and t is the current table.
func (ix *index) resize(t *table) {
	nt := newTable(2 * len(t.heads))
	ix.seq.Add(1)
	for i := range t.heads {
		for b := t.heads[i].Load(); b != nil; {
			next := b.next().Load()
			head := &nt.heads[maphash.String(ix.seed, b.linkedKey(b.ctl.Load()))>>chainShift&nt.mask]
			b.next().Store(head.Load())
			head.Store(b)
			b = next
		}
	}
	ix.tab.Store(nt)
	ix.seq.Add(1)
}

// rangeKeys calls f with every linked key and its block until f returns
// false. It takes no lock: it walks each chain as a lookup does, so that a
// sweep never holds the mutex that decisions creating, growing or
// dropping keys take (a sweep preempted while holding it would stall
// them), and f may replace or remove keys. A block is unlinked or replaced
// without changing its own next, so a walk standing on one still reaches
// the blocks after it. Keys linked during the walk may be missed, and a
// resize during the walk may make it see a key twice or not at all (it
// leaves a chain once it notices one, as a lookup does); the sweep's next
// pass sees what this one missed. f may be handed a block that is dead by
// then, as with any copy of a chain; SweepShard checks.
func (ix *index) rangeKeys(f func(key string, b *block) bool) bool {
	for i := 0; ; i++ {
		s1 := ix.seq.Load()
		t := ix.tab.Load()
		if i >= len(t.heads) {
			return true
		}
		b := t.heads[i].Load()
		for steps := 1; b != nil; steps++ {
			next := b.next().Load()
			if !f(b.linkedKey(b.ctl.Load()), b) {
				return false
			}
			if steps%32 == 0 && ix.seq.Load() != s1 {
				break
			}
			b = next
		}
	}
}

// headBytes is the heap the index's heads take.
func (ix *index) headBytes() int64 {
	return int64(len(ix.tab.Load().heads)) * int64(unsafe.Sizeof(atomic.Pointer[block]{}))
}

// Linked blocks hold a pointer (next), so the garbage collector must see
// it: they are allocated with a type whose word headerWords is a pointer
// and whose other words are not (so the collector reads that word alone),
// one type per size class, made once.

// sizeClasses are the runtime's small object sizes (the allocator rounds
// every request up to one of them); larger objects take whole 8 KiB pages.
var sizeClasses = [...]int{8, 16, 24, 32, 48, 64, 80, 96, 112, 128, 144, 160, 176, 192, 208, 224, 240, 256, 288, 320, 352, 384, 416, 448, 480, 512, 576, 640, 704, 768, 896, 1024, 1152, 1280, 1408, 1536, 1792, 2048, 2304, 2688, 3072, 3200, 3456, 4096, 4864, 5376, 6144, 6528, 6784, 6912, 8192, 9472, 9728, 10240, 10880, 12288, 13568, 14336, 16384, 18432, 19072, 20480, 21760, 24576, 27264, 28672, 32768}

const (
	pageBytes = 8192
	// mallocHeaderMin: an object with pointers larger than this carries
	// an 8-byte type header inside its size class.
	mallocHeaderMin = 512
)

// linkedWords returns the words a linked block of at least w words gets:
// its allocation's size, less the runtime's header if it has one.
func linkedWords(w int) int {
	b := 8 * w
	if b > mallocHeaderMin {
		b += 8
	}
	r := (b + pageBytes - 1) / pageBytes * pageBytes
	for _, c := range sizeClasses {
		if c >= b {
			r = c
			break
		}
	}
	if r > mallocHeaderMin {
		r -= 8
	}
	return r / 8
}

// linkedType is one linked block type.
type linkedType struct{ t reflect.Type }

var (
	smallLinked [smallLinkedWords + 1]atomic.Pointer[linkedType] // by words
	largeLinked sync.Map                                         // [words, ext] → *linkedType
)

// smallLinkedWords: types of blocks up to 1 KiB are found by index, so a
// new key's block costs no map lookup.
const smallLinkedWords = 128

// newLinked allocates a zeroed linked block of w words (w from
// linkedWords); ext > 0 makes word headerWords+ext a pointer too (the data
// words of a ctlExt block).
func newLinked(w, ext int) *block {
	var lt *linkedType
	if w <= smallLinkedWords && ext == 0 {
		if lt = smallLinked[w].Load(); lt == nil {
			smallLinked[w].CompareAndSwap(nil, &linkedType{linkedTypeOf(w, 0)})
			lt = smallLinked[w].Load()
		}
	} else {
		k := [2]int{w, ext}
		v, ok := largeLinked.Load(k)
		if !ok {
			v, _ = largeLinked.LoadOrStore(k, &linkedType{linkedTypeOf(w, ext)})
		}
		lt = v.(*linkedType)
	}
	return (*block)(reflect.New(lt.t).UnsafePointer())
}

// linkedTypeOf is the type of a linked block of w words: the header, the
// link (padded to a word where pointers are 4 bytes), and w−4 plain words;
// with ext > 0, words headerWords+1 to headerWords+ext−1 are plain, word
// headerWords+ext a pointer, and the rest plain.
func linkedTypeOf(w, ext int) reflect.Type {
	pad := reflect.ArrayOf(int(8-unsafe.Sizeof(uintptr(0))), reflect.TypeFor[byte]())
	words := func(n int) reflect.Type { return reflect.ArrayOf(n, reflect.TypeFor[uint64]()) }
	fs := []reflect.StructField{
		{Name: "Header", Type: reflect.TypeFor[[headerWords]uint64]()},
		{Name: "Next", Type: reflect.TypeFor[unsafe.Pointer]()},
		{Name: "Pad", Type: pad},
	}
	if ext > 0 {
		fs = append(fs,
			reflect.StructField{Name: "Key", Type: words(ext - 1)},
			reflect.StructField{Name: "Ext", Type: reflect.TypeFor[unsafe.Pointer]()},
			reflect.StructField{Name: "Pad2", Type: pad},
		)
		w -= ext
	}
	return reflect.StructOf(append(fs, reflect.StructField{Name: "Words", Type: words(w - headerWords - 1)}))
}
