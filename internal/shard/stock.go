package shard

import (
	"sync/atomic"
	"unsafe"
)

// The stock: blocks allocated ahead of the decisions that need them.
//
// A decision that creates a key or grows its ring allocates a block. Most
// allocations are quick, but the one that finds its size class's span
// full refills it, and the first write to a page the heap has not
// touched yet (a growing heap's, or one the runtime gave back to the OS)
// faults it in: waits many times as long as the decision's own work, on
// its path. The floor a decision is judged against allocates nothing, so
// those allocations set the engine's slowest decisions (docs/design.md,
// "The stock").
//
// So a store keeps, per size class, a batch of fresh blocks that Restock
// allocated and touched (a word written in each of their pages, which
// faults the page in) on the caller's goroutine: the engine's background
// sweeper calls it on every tick. allocWords takes the next block
// of the batch with one atomic add, and allocates as before when the
// batch is used up (which it sees without writing) or the size is not
// stocked; it then counts the miss, by sampling one in stockSample
// (see missed). Each block of a batch goes to at most one taker
// (the add's result is unique), and a batch holds only blocks no key has
// used, so a block's memory is still never another key's and the per-key
// protocol is unchanged. A block comes zeroed, as a new allocation does:
// allocWords' callers write its header and key as they would then.
//
// Restock sizes a class's next batch at three times what the last one
// handed out, plus the allocations it missed, bounded by stockBytes; it
// remakes a batch once half of it is used or a taker missed, and drops a
// batch nothing was taken from for stockIdle restocks in a row. The
// blocks not yet handed out are the stock's cost in memory: a few
// restocks' demand, at most stockBytes per class in use.

// stockClasses are the allocator's size classes, in words, up to the
// largest block the default limits make (a full ring of 100 narrow slots
// with a key of up to 16 bytes: 80 words). Larger blocks are allocated
// when needed.
var stockClasses = [...]int{1, 2, 3, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30, 32, 36, 40, 44, 48, 52, 56, 60, 64, 72, 80}

// stockBytes bounds the blocks one class's batch holds: the memory a
// stock may hold idle, per class in use. With the engine's sweeper
// restocking every tick (a 64th of a pass of at least a second), it lets
// a class of 80-byte pairs keep up with hundreds of thousands of new keys
// a second.
const stockBytes = 256 << 10

// stockIdle is how many restocks in a row may find a class's batch
// untouched before it is dropped: one pass of the engine's sweeper, so
// that a pause in the traffic does not leave the next burst without a
// stock.
const stockIdle = 64

// stockPage is a page size no platform Go runs on goes below: a page
// holding a block's first word is touched once per batch, and a larger
// page is then touched more often than it needs.
const stockPage = 4096

// stockMin is the smallest batch Restock makes for a class that was
// asked for.
const stockMin = 4

// stockClass returns the index in stockClasses of the size class of a
// block of n words, or -1 when it is not stocked.
func stockClass(n int) int {
	if uint(n) >= uint(len(stockClassOf)) {
		return -1
	}
	return int(stockClassOf[n])
}

// stockClassOf is stockClass for every n up to the largest class, as a
// table: a decision that allocates looks its class up once.
var stockClassOf = func() (t [81]int8) {
	c := 0
	for n := range t {
		for stockClasses[c] < n {
			c++
		}
		t[n] = int8(c)
	}
	return t
}()

// stockBatch is one class's batch: blocks[i] goes to the caller whose
// add on next returned i + 1.
type stockBatch struct {
	blocks [][]uint64
	next   atomic.Int64
}

// stockClassSlot is one class's batch and the allocations of that class
// it could not serve since Restock last looked, each class on cache lines
// of its own. The miss count has a line to itself: the takes and misses
// of every core read the batch's pointer, and a line a miss writes would
// pass from core to core with it.
type stockClassSlot struct {
	batch atomic.Pointer[stockBatch]
	// seen is the batch's next at the last restock, and idle counts the
	// restocks since then that found nothing taken: only restock
	// writes them.
	seen atomic.Int64
	idle atomic.Int64
	_    [CacheLineSize - 24]byte
	miss atomic.Int64
	_    [CacheLineSize - 8]byte
}

// stock is a store's blocks allocated ahead (see above).
type stock struct {
	classes [len(stockClasses)]stockClassSlot
}

// take returns a fresh block of n words, whose capacity is n's size
// class, from the stock; nil when that class's batch is used up or n is
// not stocked. A nil stock never has one. A used-up batch is seen with a
// load and no write: under a demand far above what a restock stocks,
// most allocations find it so, and an add on its counter would pass that
// line between the cores on each of them. The caller that gets nil
// allocates the block and reports it with missed.
func (st *stock) take(n int) []uint64 {
	if st == nil {
		return nil
	}
	c := stockClass(n)
	if c < 0 {
		return nil
	}
	if b := st.classes[c].batch.Load(); b != nil && b.next.Load() < int64(len(b.blocks)) {
		if i := b.next.Add(1) - 1; i < int64(len(b.blocks)) {
			return b.blocks[i]
		}
	}
	return nil
}

// stockSample is how many misses one add of the miss counter stands for
// (see missed).
const stockSample = 8

// missed counts an allocation of n words that take did not serve; w is
// the block the caller allocated instead. One miss in stockSample adds
// stockSample, chosen by a hash of w's address: a fresh block's address
// is a source of spread bits that costs no shared write, and the blocks a
// goroutine allocates in a row have consecutive addresses, which the hash
// spreads evenly. The count is then the misses give or take a few
// samples, which is all restock's sizing needs, and its line is written
// on one miss in stockSample. A class with no batch counts its first miss
// as it is, so that the next restock stocks it; one with a batch needs
// no such miss, since a batch that misses is used up, which restock sees.
func (st *stock) missed(n int, w []uint64) {
	if st == nil {
		return
	}
	c := stockClass(n)
	if c < 0 {
		return
	}
	sc := &st.classes[c]
	if sc.batch.Load() == nil && sc.miss.Load() == 0 {
		sc.miss.Add(1)
		return
	}
	// A multiply alone would leave the hashes of addresses a size class
	// apart in step with each other: mix as murmur3's finalizer does.
	h := uint64(uintptr(unsafe.Pointer(unsafe.SliceData(w))))
	h ^= h >> 33
	h *= 0xff51afd7ed558ccd
	h ^= h >> 33
	if h%stockSample == 0 {
		sc.miss.Add(stockSample)
	}
}

// restock remakes the batches of the classes that need it (see above). It
// may run concurrently with takes and with itself: it closes a batch with
// one add, which leaves the blocks no taker got to it alone, and carries
// them into the new batch.
func (st *stock) restock() {
	for c := range st.classes {
		sc := &st.classes[c]
		b := sc.batch.Load()
		miss := sc.miss.Load()
		if b == nil && miss == 0 {
			continue // never asked for
		}
		var used int64
		var left [][]uint64
		if b != nil {
			n := int64(len(b.blocks))
			next := b.next.Load()
			used = min(next, n)
			if next == sc.seen.Swap(next) && miss == 0 {
				if sc.idle.Add(1) >= stockIdle {
					// Nothing asked for this class for a while: give
					// its blocks back to the heap.
					sc.batch.CompareAndSwap(b, nil)
				}
				continue
			}
			sc.idle.Store(0)
			if 2*used < n && miss == 0 {
				continue
			}
			// Close the batch: every later take gets an index past its
			// end. The blocks from p on were handed to nobody.
			const closed = 1 << 40
			if p := b.next.Add(closed) - closed; p < n {
				left, used = b.blocks[p:], p
			}
		}
		words := stockClasses[c]
		size := min(max(3*(used+miss), stockMin), int64(stockBytes/(8*words)))
		fresh := max(int(size)-len(left), 0)
		nb := &stockBatch{blocks: make([][]uint64, 0, len(left)+fresh)}
		nb.blocks = append(nb.blocks, left...)
		var page uintptr
		for range fresh {
			// As allocWords allocates: append rounds the capacity up to
			// the size class, which is words.
			w := append([]uint64(nil), make([]uint64, words)...)
			// Fault the block's page in here, not on a decision's
			// path: one write per page, since the blocks of a batch
			// mostly follow each other in the heap.
			if p := uintptr(unsafe.Pointer(&w[0])) / stockPage; p != page {
				w[0], page = 0, p
			}
			nb.blocks = append(nb.blocks, w)
		}
		sc.miss.Add(-miss)
		sc.seen.Store(0)
		sc.idle.Store(0)
		sc.batch.Store(nb)
	}
}

// Restock allocates blocks ahead for the size classes decisions have
// been allocating (see stock.go), so that a decision creating a key or
// growing its ring takes a block allocated and touched beforehand. The
// engine's background sweeper calls it on every tick. It is safe to call
// concurrently with decisions and with itself.
func (s *Store) Restock() { s.stock.restock() }
