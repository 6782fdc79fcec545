package topk

import (
	"encoding/binary"
	"math"
	"sync/atomic"
	"unsafe"

	"github.com/slidegate/slidegate/internal/tick"
)

// Bounds of the rings that take refusals while a stripe is held.
const (
	// ringLen is the number of refusals a stripe's ring holds.
	ringLen = 256
	// ringKey is the longest key a ring's slot copies. A longer key
	// waits for its stripe's lock.
	ringKey = 80
)

// slot is one refusal waiting in a stripe's ring: 128 bytes, two cache
// lines.
type slot struct {
	// seq is the slot's position in the ring when it is free for that
	// position, and the position plus one once a refusal fills it.
	seq  atomic.Uint64
	h    uint64 // the key's hash
	e    int64  // the epoch
	name string
	n    uint32
	klen uint32
	key  [ringKey]byte
}

// Record counts n refusals of key under name. key may be a view of a
// buffer the caller reuses: Record copies it. The first Record starts
// the Tracker's goroutine; after Close, Record reads the clock itself.
//
// When the key's stripe is free, Record adds the refusal to its summary
// and first adds the refusals waiting in the stripe's ring. When another
// request holds the stripe, Record puts the refusal in the ring: one
// atomic compare-and-swap and a few stores, no lock. Only when the ring
// is full, or the key is longer than a slot's room, does Record wait for
// the stripe.
func (t *Tracker) Record(name, key string, n int) {
	// One compare for n < 1 and n > MaxUint32, which a slot cannot hold.
	if uint64(n)-1 >= math.MaxUint32 || !t.live.Load() {
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
	s := &t.stripes[kh&(stripes-1)]
	if busy := t.busy.Load(); busy != 0 || !s.mu.TryLock() {
		if busy < 2 && len(key) <= ringKey {
			// push's first try, inline: the slot at the tail is free
			// and no other request claims it first.
			pos := s.tail.Load()
			if sl := &s.slots[pos&(ringLen-1)]; sl.seq.Load() == pos && s.tail.CompareAndSwap(pos, pos+1) {
				sl.fill(e, kh, name, key, n)
				sl.seq.Store(pos + 1)
				return
			}
			if s.push(e, kh, name, key, n) {
				return
			}
		}
		s.mu.Lock() // the ring is full, or the key too long for it
	}
	// The common case inline: the epoch's summary and the name are the
	// stripe's last ones, and a counted key is in the first place its
	// hash looks (summary.add's lookup, its first step).
	if sm := s.last; sm != nil && sm.epoch == e && len(name) == len(s.name) && unsafe.StringData(name) == unsafe.StringData(s.name) {
		h := kh ^ s.nh
		if sm.kept == 0 || n != 1 || !sm.doorKeeps(h) {
			i := (h >> 32) & uint64(len(sm.idx)-1)
			if cl := sm.idx[i]; cl.h == h && cl.slot > 0 {
				if c := &sm.counters[cl.slot-1]; same(c.name, name) && sameKey(c.kb, key) {
					c.count += uint64(n)
				}
				// Else another pair with this hash, which
				// summary.add does not count either.
			} else {
				sm.addAt(i, h, name, key, uint64(n), t.perLock)
			}
		}
	} else {
		s.add(e, kh, name, key, uint64(n), t.perLock)
	}
	// s.unlock, inline.
	if s.tail.Load() != s.head {
		s.drain(t.perLock)
	}
	s.mu.Unlock()
}

// push puts a refusal in s's ring without its lock, or reports false
// when the ring is full. kh is the key's hash and e its epoch; key fits
// a slot and n a uint32.
func (s *stripe) push(e int64, kh uint64, name, key string, n int) bool {
	pos := s.tail.Load()
	for {
		sl := &s.slots[pos&(ringLen-1)]
		seq := sl.seq.Load()
		switch {
		case seq == pos: // free: claim it
			if !s.tail.CompareAndSwap(pos, pos+1) {
				pos = s.tail.Load()
				continue
			}
			sl.fill(e, kh, name, key, n)
			sl.seq.Store(pos + 1) // filled: the holder of the lock may add it
			return true
		case seq < pos: // still filled from the last lap: full
			return false
		default: // another request claimed pos
			pos = s.tail.Load()
		}
	}
}

// fill stores a refusal in sl, claimed.
func (sl *slot) fill(e int64, kh uint64, name, key string, n int) {
	sl.h, sl.e, sl.name, sl.n, sl.klen = kh, e, name, uint32(n), uint32(len(key))
	if l := len(key); l >= 8 && l <= 16 {
		// The common case: two stores of 8 bytes and no call.
		b := unsafe.Slice(unsafe.StringData(key), l)
		*(*uint64)(unsafe.Pointer(&sl.key[0])) = binary.LittleEndian.Uint64(b)
		*(*uint64)(unsafe.Add(unsafe.Pointer(&sl.key[0]), l-8)) = binary.LittleEndian.Uint64(b[l-8:])
	} else {
		copy(sl.key[:], key)
	}
}

// unlock adds the refusals waiting in s's ring to the summaries, then
// releases s's lock. A refusal put in the ring after the check waits for
// the next holder of the lock, or for Top. k is the counters per stripe.
func (s *stripe) unlock(k int) {
	if s.tail.Load() != s.head {
		s.drain(k)
	}
	s.mu.Unlock()
}

// drain adds the filled slots of s's ring, in order, to the summaries,
// up to the first slot claimed but not yet filled. Precondition: s.mu is
// held.
func (s *stripe) drain(k int) {
	slots, head := s.slots, s.head
	// The stripe's last summary and name, as Record checks them.
	last, lastName, nh := s.last, s.name, s.nh
	for {
		sl := &slots[head&(ringLen-1)]
		if sl.seq.Load() != head+1 {
			break
		}
		name, n := sl.name, uint64(sl.n)
		// Record's common case, inline as there.
		if sm := last; sm != nil && sm.epoch == sl.e && unsafe.StringData(name) == unsafe.StringData(lastName) && len(name) == len(lastName) {
			h := sl.h ^ nh
			if sm.kept == 0 || n != 1 || !sm.doorKeeps(h) {
				key := unsafe.String(&sl.key[0], sl.klen)
				i := (h >> 32) & uint64(len(sm.idx)-1)
				if cl := sm.idx[i]; cl.h == h && cl.slot > 0 {
					if c := &sm.counters[cl.slot-1]; same(c.name, name) && sameKey(c.kb, key) {
						c.count += n
					}
				} else {
					sm.addAt(i, h, name, key, n, k)
				}
			}
		} else {
			s.add(sl.e, sl.h, name, unsafe.String(&sl.key[0], sl.klen), n, k)
			last, lastName, nh = s.last, s.name, s.nh
		}
		sl.seq.Store(head + ringLen) // free for the next lap
		head++
	}
	s.head = head
}

// recordRare is Record for a count below 1 or above MaxUint32, or a
// Tracker not started or closed.
func (t *Tracker) recordRare(name, key string, n int) {
	if n < 1 {
		return
	}
	if uint64(n) > math.MaxUint32 || !t.start() {
		t.direct(name, key, n)
		return
	}
	t.Record(name, key, n) // started
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

// run reads the clock each tick until Close.
func (t *Tracker) run() {
	defer close(t.done)
	tick.Every(t.quit, t.tick, t.advance)
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

// flushAll adds every refusal waiting in a ring to the summaries.
func (t *Tracker) flushAll() {
	t.advance()
	for i := range t.stripes {
		s := &t.stripes[i]
		s.mu.Lock()
		s.unlock(t.perLock)
	}
}

// Close stops the goroutine. Refusals recorded after Close read the
// clock themselves. Close is idempotent.
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
