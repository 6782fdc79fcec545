package topk

import (
	"encoding/binary"
	"math/bits"
	"runtime"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"
)

// Bounds of the batches that Record fills.
const (
	// batchLen is the number of entries a batch holds: keys, with the
	// refusals of each.
	batchLen = 128
	// arenaLen is the room for their keys' bytes in a batch.
	arenaLen = 4096
	// maxBatchedKey is the longest key a batch copies. A longer key goes
	// to the summaries at once, so that one key cannot fill a batch.
	maxBatchedKey = arenaLen / 4
	// maxShelves bounds the shelves: two per CPU, at most 64.
	maxShelves = 64
	// seenLen is the size of a batch's table of its keys: at least
	// 2*batchLen, and 256, so that a uint8 indexes it with no check.
	seenLen = 256
)

// batches is the part of a Tracker between Record and the summaries.
//
// When the summaries' stripe of a key is busy, Record adds the refusal
// to the batch of a shelf instead: one uncontended lock and no clock
// read or allocation. A key already in the batch adds to its entry,
// found through a small table by hash, so a hot key costs a compare and
// an increment. A new key's bytes are copied with its hash, so that the
// batch is not hashed again. The epoch is the one the background
// goroutine last read from the clock (each tick, at most a second
// apart). A full batch goes to that goroutine, and the shelf takes its
// spare. When the spare is still out, the filler adds its batch to the
// summaries itself, so that memory stays bounded and no refusal is
// dropped.
type batches struct {
	shelves  []shelf
	mask     uint32
	tick     time.Duration
	epochNow atomic.Int64 // the epoch Record stamps, read each tick
	live     atomic.Bool  // the goroutine runs: Record batches

	drainMu sync.Mutex // held while a taken queue is added
	qmu     sync.Mutex // guards the fields below
	queue   []*batch   // full batches for the goroutine
	started bool
	closed  bool
	wake    chan struct{}
	quit    chan struct{}
	done    chan struct{}
}

// shelf is one stripe of the batches being filled.
type shelf struct {
	mu    sync.Mutex
	cur   *batch
	spare *batch // nil while it is out to be added
	// The pad keeps two shelves' locks off one cache line.
	_ [40]byte
}

// batch is refusals waiting for the summaries, their keys copied into
// one arena.
type batch struct {
	epoch int64
	ents  []ent
	arena []byte
	home  *shelf
	// seen finds a key's entry by the key's hash: the entry's index
	// plus one, or 0 for an empty place. It has twice the places of
	// the entries, so that a key has one entry per batch.
	seen [seenLen]uint8
}

type ent struct {
	name     string
	h        uint64 // the key's hash
	n        uint64
	off, end uint32 // the key's bytes in arena
}

// key is a view of en's key in b's arena.
func (b *batch) key(en *ent) string {
	if en.end == en.off {
		return ""
	}
	return unsafe.String(&b.arena[en.off], en.end-en.off)
}

func (t *Tracker) initBatches() {
	n := 1 << bits.Len(uint(2*runtime.GOMAXPROCS(0)-1))
	n = min(max(n, 4), maxShelves)
	t.shelves = make([]shelf, n)
	t.mask = uint32(n - 1)
	for i := range t.shelves {
		sh := &t.shelves[i]
		sh.cur, sh.spare = newBatch(sh), newBatch(sh)
	}
	t.tick = min(time.Second, max(time.Duration(t.epoch)/16, time.Millisecond))
	t.queue = make([]*batch, 0, n)
	t.wake = make(chan struct{}, 1)
	t.quit = make(chan struct{})
	t.done = make(chan struct{})
}

func newBatch(home *shelf) *batch {
	return &batch{ents: make([]ent, 0, batchLen), arena: make([]byte, 0, arenaLen), home: home}
}

// Record counts n refusals of key under name: in the summaries at once
// when the key's stripe is free, else in a batch. key may be a view of a
// buffer the caller reuses: Record copies it. The first Record starts
// the Tracker's goroutine; after Close, Record adds to the summaries at
// once.
func (t *Tracker) Record(name, key string, n int) {
	if n < 1 || len(key) > maxBatchedKey || !t.live.Load() {
		t.recordRare(name, key, n)
		return
	}
	// keyHash, its common case inline: a key of 8 to 16 bytes.
	var kh uint64
	if l := len(key); l >= 8 && l <= 16 {
		b := unsafe.Slice(unsafe.StringData(key), l)
		kh = mix(mix(binary.LittleEndian.Uint64(b)^t.secret[0], binary.LittleEndian.Uint64(b[l-8:])^t.secret[1])^uint64(l), 0x8ebc6af09c88c6e3)
	} else {
		kh = t.keyHash(key)
	}
	e := t.epochNow.Load()
	// A free stripe takes the refusal at once: no copy into a batch and
	// no second pass. A held one sends it to the key's second stripe,
	// and when that one is held too, to the next free stripe
	// (lockOther), so that Record never waits for a stripe.
	s := &t.stripes[kh&(stripes-1)]
	took := 0 // the stripe: 0 the first, 1 the second, 2 another
	if t.busy.Load() != 0 || !s.mu.TryLock() {
		if s = &t.stripes[secondStripe(kh)]; t.busy.Load() < 2 && s.mu.TryLock() {
			took = 1
		} else if s, took = t.lockOther(kh), 2; s == nil {
			t.toBatch(e, kh, name, key, n) // every stripe is held
			return
		}
	}
	// The common case inline: the epoch's summary and the name are the
	// stripe's last ones, and a counted key is in the first place its
	// hash looks (summary.add's lookup, its first step).
	if sm := s.last; sm != nil && sm.epoch == e && len(name) == len(s.name) && unsafe.StringData(name) == unsafe.StringData(s.name) {
		h := kh ^ s.nh
		i := (h >> 32) & uint64(len(sm.idx)-1)
		if cl := sm.idx[i]; cl.h == h && cl.slot > 0 {
			if c := &sm.counters[cl.slot-1]; same(c.name, name) && sameKey(c.kb, key) {
				c.count += uint64(n)
			}
			// Else another pair with this hash, which summary.add
			// does not count either.
		} else {
			sm.addAt(i, h, name, key, uint64(n), t.perLock)
		}
	} else {
		s.add(e, kh, name, key, uint64(n), t.perLock)
	}
	if took != 0 {
		s.mark(e, took)
	}
	s.mu.Unlock()
}

// mark notes that epoch e's summary, if still in the window, holds
// refusals of a key whose first stripe (took 1) or both stripes (took 2)
// were busy. Precondition: s.mu is held.
func (s *stripe) mark(e int64, took int) {
	if sm := s.last; sm != nil && sm.epoch == e {
		if took == 1 {
			sm.second = true
		} else {
			sm.other = true
		}
	}
}

// lockOther locks the next free stripe for a key whose first and
// second stripes are busy, or returns nil when every stripe is held. kh
// is the key's hash.
func (t *Tracker) lockOther(kh uint64) *stripe {
	second := secondStripe(kh)
	for d := uint64(1); t.busy.Load() < 3 && d < stripes; d++ {
		i := (kh + d) & (stripes - 1)
		if i == second {
			continue
		}
		if s := &t.stripes[i]; s.mu.TryLock() {
			return s
		}
	}
	return nil
}

// recordRare is Record for a count below 1, a key too long for a batch,
// or a Tracker not started or closed.
func (t *Tracker) recordRare(name, key string, n int) {
	if n < 1 {
		return
	}
	if len(key) > maxBatchedKey || !t.start() {
		t.direct(name, key, n)
		return
	}
	t.Record(name, key, n) // started
}

// toBatch is Record when every stripe is held: a batch takes the refusal.
// kh is the key's hash and e the epoch to stamp.
func (t *Tracker) toBatch(e int64, kh uint64, name, key string, n int) {
	// The shelf: any will do, since the summaries stripe by hash when
	// the batch is added. A busy shelf passes to the next.
	i := uint32(kh >> 32)
	sh := &t.shelves[i&t.mask]
	if !sh.mu.TryLock() {
		sh = t.lockShelf(i + 1)
	}
	b := sh.cur
	if len(b.ents) > 0 && b.epoch != e {
		b = t.flush(sh)
	}
	// The table: linear probing, at most half full.
	si := uint8(kh >> 8)
	for j := b.seen[si]; j > 0; j = b.seen[si] {
		if en := &b.ents[j-1]; en.h == kh && same(en.name, name) && sameKey(b.arena[en.off:en.end], key) {
			en.n += uint64(n)
			sh.mu.Unlock()
			return
		}
		si++
	}
	if len(b.ents) == cap(b.ents) || len(b.arena)+len(key) > cap(b.arena) {
		b = t.flush(sh) // empty, and so is its table
		si = uint8(kh >> 8)
	}
	if len(b.ents) == 0 {
		b.epoch = e
	}
	// In place rather than by append: both have room, as checked.
	off, j := len(b.arena), len(b.ents)
	b.arena = b.arena[:off+len(key)]
	copy(b.arena[off:], key)
	b.ents = b.ents[:j+1]
	en := &b.ents[j]
	en.name, en.h, en.n, en.off, en.end = name, kh, uint64(n), uint32(off), uint32(off+len(key))
	b.seen[si] = uint8(j + 1) // batchLen fits
	sh.mu.Unlock()
}

// lockShelf locks the first free shelf from i on, or waits for shelf i.
func (t *Tracker) lockShelf(i uint32) *shelf {
	for j := range t.mask + 1 {
		if sh := &t.shelves[(i+j)&t.mask]; sh.mu.TryLock() {
			return sh
		}
	}
	sh := &t.shelves[i&t.mask]
	sh.mu.Lock()
	return sh
}

// flush empties sh's batch and returns the batch to fill: the spare, the
// full one going to the goroutine, or the same one, added by the caller.
// Precondition: sh.mu is held.
func (t *Tracker) flush(sh *shelf) *batch {
	b := sh.cur
	if sh.spare != nil && t.enqueue(b) {
		sh.cur, sh.spare = sh.spare, nil
		return sh.cur
	}
	t.addBatch(b)
	return b
}

// enqueue hands b to the goroutine, unless it is closed.
func (t *Tracker) enqueue(b *batch) bool {
	t.qmu.Lock()
	if t.closed {
		t.qmu.Unlock()
		return false
	}
	t.queue = append(t.queue, b)
	t.qmu.Unlock()
	select {
	case t.wake <- struct{}{}:
	default:
	}
	return true
}

// start starts the goroutine unless the Tracker is closed.
func (t *Tracker) start() bool {
	t.qmu.Lock()
	defer t.qmu.Unlock()
	if t.closed {
		return false
	}
	if !t.started {
		t.started = true
		t.advance()
		go t.run()
		t.live.Store(true)
	}
	return true
}

// run adds full batches to the summaries and reads the clock each tick
// until Close.
func (t *Tracker) run() {
	defer close(t.done)
	tk := time.NewTicker(t.tick)
	defer tk.Stop()
	for {
		select {
		case <-t.quit:
			t.drainQueue()
			return
		case <-tk.C:
			t.advance()
		case <-t.wake:
			t.drainQueue()
		}
	}
}

// advance moves the epoch Record stamps to the clock's.
func (t *Tracker) advance() {
	e := t.now() / t.epoch
	for {
		old := t.epochNow.Load()
		if e <= old || t.epochNow.CompareAndSwap(old, e) {
			return
		}
	}
}

// drainQueue adds the queued batches to the summaries and gives each
// back to its shelf as the spare.
func (t *Tracker) drainQueue() {
	t.drainMu.Lock()
	defer t.drainMu.Unlock()
	t.qmu.Lock()
	q := t.queue
	t.queue = make([]*batch, 0, len(t.shelves))
	t.qmu.Unlock()
	for _, b := range q {
		t.addBatch(b)
		sh := b.home
		sh.mu.Lock()
		sh.spare = b
		sh.mu.Unlock()
	}
}

// flushAll adds every refusal recorded so far to the summaries: the
// shelves' batches and the queue, waiting for a queue the goroutine is
// adding.
func (t *Tracker) flushAll() {
	t.advance()
	for i := range t.shelves {
		sh := &t.shelves[i]
		sh.mu.Lock()
		if len(sh.cur.ents) > 0 {
			t.addBatch(sh.cur)
		}
		sh.mu.Unlock()
	}
	t.drainQueue()
}

// addBatch adds b's refusals to the summaries of its epoch and empties
// it. It holds every stripe's lock, in order, for the whole batch.
func (t *Tracker) addBatch(b *batch) {
	var sms [stripes]*summary // nil: the epoch has left the window
	for i := range t.stripes {
		t.stripes[i].mu.Lock()
		sms[i] = t.stripes[i].summary(b.epoch, t.perLock)
	}
	var name string
	var nh uint64
	for i := range b.ents {
		en := &b.ents[i]
		if i == 0 || !same(en.name, name) {
			name, nh = en.name, nameHash(en.name)
		}
		if sm := sms[en.h&(stripes-1)]; sm != nil {
			sm.add(en.h^nh, en.name, b.key(en), en.n, t.perLock)
		}
	}
	for i := range t.stripes {
		t.stripes[i].mu.Unlock()
	}
	// The names stay until the batch is filled again: they are the
	// configuration's.
	b.ents = b.ents[:0]
	b.arena = b.arena[:0]
	clear(b.seen[:])
}

// Close stops the goroutine after it has added the queued batches.
// Refusals recorded after Close go to the summaries at once. Close is
// idempotent.
func (t *Tracker) Close() {
	t.qmu.Lock()
	if t.closed {
		t.qmu.Unlock()
		return
	}
	t.closed = true
	t.live.Store(false)
	started := t.started
	t.qmu.Unlock()
	if started {
		close(t.quit)
		<-t.done
	}
}
