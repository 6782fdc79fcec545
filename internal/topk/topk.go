// Package topk keeps, per policy or rule, the keys refused most in the
// last minutes, in bounded memory.
//
// Each epoch (one minute by default) has its own summary of k counters:
// the Frequent algorithm (Misra and Gries, "Finding repeated elements",
// 1982) with its decrements taken in batches, as in Agarwal et al.,
// "Mergeable Summaries", PODS 2012. A new key gets a counter. When 2k keys
// have counters, the (k+1)-th largest count v is taken from every counter
// and counters left at zero are dropped, so at most k remain. Each such
// step removes at least (k+1)v refusals, so with N refusals the total
// taken, D, is at most N/(k+1). A key's true count lies between its
// counter and its counter plus D: reported as count (counter plus D) and
// error (D), the count is never below the true count and above it by at
// most the error, and every key refused more than N/(k+1) times has a
// counter. With fewer than 2k keys nothing is taken and counts are exact.
// A refusal costs a hash lookup; the decrements cost O(k) each k new keys.
//
// Once a summary has taken counts, a door (doorKeeps) keeps a new key's
// first refusal of cost 1 out of it, as TinyLFU's doorkeeper does: a bit
// of 32k is set, and the key's next refusal gets a counter. After 4k
// bits are set, a new generation starts with none set. So a flood of
// keys refused once stops replacing counters, and a key loses at most
// one refusal a generation. With A refusals let in and K kept out, the
// generations number G <= 1 + K/(4k), so D + G <= A/(k+1) + K/(4k) + 1
// <= N/(k+1) + 1. Count is reported as counter plus D + G, and error as
// D + G, with the same guarantees as above.
//
// The summaries are striped by the key's hash: a key's refusals all go
// to its stripe's summaries. Record adds a refusal to the summary when
// the stripe's lock is free. When another request holds it, Record puts
// the refusal in the stripe's ring (ring.go) without a lock, and the next
// holder of the lock adds it. Top adds every waiting refusal first, so
// it misses none.
//
// Top sums a key's counters over the epochs still in the window. A key's
// error is the sum, over those epochs, of its stripe's D + G. So the
// error is at most the refusals of the key's stripe in the window over
// k+1, plus the number of epochs, busy or not.
package topk

import (
	"encoding/binary"
	"math/bits"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/cespare/xxhash/v2"
)

// Defaults of New.
const (
	// DefaultCounters is the number of counters per epoch, over all
	// stripes: 1,024 keys of every name at once.
	DefaultCounters = 1024
	// DefaultEpoch is one summary's span.
	DefaultEpoch = time.Minute
	// DefaultEpochs is how many summaries Top reads: the window is the
	// current epoch and the four before it.
	DefaultEpochs = 5
	// stripes is a power of two: each stripe keeps DefaultCounters/8
	// counters under its own lock.
	stripes = 8
	// keepRoom is the key room a counter keeps for the next key.
	keepRoom = 1024
	// smallCounts bounds the counts prune's histogram sorts.
	smallCounts = 64
)

// Entry is one key's refusals in the window.
type Entry struct {
	Name string `json:"name"` // the policy or rule
	Key  string `json:"key"`
	// Count is never below the key's true count of refused requests
	// (weighted by cost), and above it by at most Error.
	Count uint64 `json:"count"`
	// Error is the most by which Count may exceed the true count.
	Error uint64 `json:"error"`
}

// Tracker records refusals and answers the top keys. The zero value is
// not usable; use New, and Close to stop its goroutine. A Tracker is safe
// for concurrent use.
type Tracker struct {
	epoch   int64 // ns
	epochs  int
	perLock int
	now     func() int64
	secret  [2]uint64     // keyHash's
	busy    atomic.Uint32 // SetBusy's level
	stripes [stripes]stripe

	tick     time.Duration
	epochNow atomic.Int64 // the epoch Record stamps, read each tick
	live     atomic.Bool  // the goroutine runs
	qmu      sync.Mutex   // guards the fields below
	started  bool
	closed   bool
	quit     chan struct{}
	done     chan struct{}
}

type stripe struct {
	mu   sync.Mutex
	ring []summary // ring[e % len(ring)] holds epoch e, if ring[...].epoch == e
	// The last name added and its nameHash: names are few and repeat,
	// so most refusals skip hashing theirs.
	name string
	nh   uint64
	last *summary // the summary added to last, checked by its epoch
	// The refusals waiting for the lock (ring.go): tail is the next
	// position to claim, head the next to add (guarded by mu).
	tail  atomic.Uint64
	head  uint64
	slots *[ringLen]slot
	// The pad keeps two stripes' locks off one cache line.
	_ [40]byte
}

type pair struct{ name, key string }

type counter struct {
	name  string
	kb    []byte // the key's bytes, reused by the next key in this slot
	h     uint64 // the pair's hash
	count uint64 // refusals less the decrements since the key got it
}

// summary is one epoch's summary: at most 2k counters, and idx, which
// finds a counter's slot by the pair's hash (open addressing with linear
// probing, at most half full, so that a lookup reads one or two cache
// lines).
type summary struct {
	epoch int64
	dec   uint64 // D: the sum of the decrements, every count's error
	// The door: once the summary has pruned, a new key's first refusal
	// of cost 1 in a generation only sets the key's bit. kept is the
	// number of generations since (0: the door is shut), the most
	// refusals of one key the door kept out; it adds to every error.
	kept     uint64
	door     []uint64
	doorSet  int // the bits set in this generation
	idx      []cell
	counters []counter
	scratch  []uint64 // prune's copy of the counts
}

// cell is one place of the index: a hash and its slot plus one, or 0
// when empty, so that clear empties the index.
type cell struct {
	h    uint64
	slot int32
}

// find returns the index place of h: its cell, or the empty cell where
// it would go.
func (sm *summary) find(h uint64) int {
	// The high bits: the low ones pick the stripe, so in one stripe
	// they are the same for every key.
	mask := len(sm.idx) - 1
	i := int(h>>32) & mask
	for sm.idx[i].slot > 0 && sm.idx[i].h != h {
		i = (i + 1) & mask
	}
	return i
}

// New returns a Tracker with counters counters per epoch (rounded up to
// a multiple of the stripes), epochs summaries of span epoch each, and
// now as its clock in nanoseconds.
func New(counters int, epoch time.Duration, epochs int, now func() int64) *Tracker {
	if counters < stripes {
		counters = stripes
	}
	if epochs < 1 {
		epochs = 1
	}
	t := &Tracker{epoch: max(int64(epoch), 1), epochs: epochs, perLock: (counters + stripes - 1) / stripes, now: now}
	t.secret = [2]uint64{rand.Uint64(), rand.Uint64()}
	for i := range t.stripes {
		s := &t.stripes[i]
		s.ring = make([]summary, epochs)
		for j := range s.ring {
			s.ring[j].epoch = -1
		}
		s.slots = new([ringLen]slot)
		for j := range s.slots {
			s.slots[j].seq.Store(uint64(j))
		}
	}
	t.tick = min(time.Second, max(time.Duration(t.epoch)/16, time.Millisecond))
	t.quit = make(chan struct{})
	t.done = make(chan struct{})
	return t
}

// Counters returns the number of counters per epoch.
func (t *Tracker) Counters() int { return t.perLock * stripes }

// Window returns the span Top reads.
func (t *Tracker) Window() time.Duration { return time.Duration(t.epoch * int64(t.epochs)) }

// direct counts n refusals of key under name in the summaries,
// waiting for the stripe and reading the clock: Record's way for a count
// above MaxUint32, and once the Tracker is closed.
func (t *Tracker) direct(name, key string, n int) {
	e := t.now() / t.epoch
	kh := t.keyHash(key)
	s := &t.stripes[kh&(stripes-1)]
	s.mu.Lock()
	s.add(e, kh, name, key, uint64(n), t.perLock)
	s.unlock(t.perLock)
}

// keyHash is a key's hash. A key of 4 to 16 bytes, the common case,
// takes two loads and two multiplications (wyhash's mixing) under the
// Tracker's random secrets, so that a client cannot choose two keys with
// one hash; a longer or shorter one takes xxhash.
func (t *Tracker) keyHash(key string) uint64 {
	n := len(key)
	if n < 4 || n > 16 {
		return xxhash.Sum64String(key)
	}
	b := unsafe.Slice(unsafe.StringData(key), n)
	var lo, hi uint64
	if n >= 8 {
		lo, hi = binary.LittleEndian.Uint64(b), binary.LittleEndian.Uint64(b[n-8:])
	} else {
		lo, hi = uint64(binary.LittleEndian.Uint32(b)), uint64(binary.LittleEndian.Uint32(b[n-4:]))
	}
	return mix(mix(lo^t.secret[0], hi^t.secret[1])^uint64(n), 0x8ebc6af09c88c6e3)
}

// mix is wyhash's: the two halves of a 128-bit product, xored.
func mix(a, b uint64) uint64 {
	hi, lo := bits.Mul64(a, b)
	return hi ^ lo
}

// nameHash mixes a name into a key's hash, so that one key under two
// names has two hashes.
func nameHash(name string) uint64 {
	return bits.RotateLeft64(xxhash.Sum64String(name)*0x9e3779b97f4a7c15, 31)
}

// SetBusy makes Record take a key's stripe as held by another request:
// at level 1 the refusal goes to the stripe's ring, at level 2 the ring
// is taken as full too and Record waits for the lock, at level 0 neither.
// Benchmarks and tests use it to measure and check the paths that
// contention takes.
func (t *Tracker) SetBusy(level int) { t.busy.Store(uint32(level)) }

// add counts n refusals of key under name in epoch e; kh is the key's
// hash. It returns the summary added to, or nil when e has left the
// window. Precondition: s.mu is held.
func (s *stripe) add(e int64, kh uint64, name, key string, n uint64, k int) *summary {
	sm := s.last
	if sm == nil || sm.epoch != e {
		if sm = s.summary(e, k); sm == nil {
			return nil
		}
		s.last = sm
	}
	if len(name) != len(s.name) || unsafe.StringData(name) != unsafe.StringData(s.name) {
		s.name, s.nh = name, nameHash(name)
	}
	sm.add(kh^s.nh, name, key, n, k)
	return sm
}

// summary returns epoch e's summary, emptying the place of an older
// one, or nil when a newer epoch holds its place: e has then left the
// window and its refusals are dropped. Precondition: s.mu is held.
func (s *stripe) summary(e int64, k int) *summary {
	sm := &s.ring[int(e%int64(len(s.ring)))]
	if sm.epoch > e {
		return nil
	}
	if sm.epoch != e {
		sm.reset(e, k)
	}
	return sm
}

// same reports a == b, at once when both are one string.
func same(a, b string) bool {
	return len(a) == len(b) && (unsafe.StringData(a) == unsafe.StringData(b) || a == b)
}

// Top returns the keys of name (every name when name is "") refused most
// in the window, at most n, by count and then by key.
func (t *Tracker) Top(name string, n int) []Entry {
	t.advance()
	e := t.now() / t.epoch
	type sum struct {
		Entry
		stripe int // the key's stripe, the only one with its counters
	}
	sums := map[pair]*sum{}
	// Per stripe, the sum of the Ds of the epochs in the window: the
	// error of its keys.
	var dec [stripes]uint64
	for i := range t.stripes {
		s := &t.stripes[i]
		s.mu.Lock()
		s.drain(t.perLock)
		for j := range s.ring {
			sm := &s.ring[j]
			if sm.epoch < 0 || sm.epoch > e || e-sm.epoch >= int64(t.epochs) {
				continue
			}
			dec[i] += sm.dec + sm.kept
			for ci := range sm.counters {
				c := &sm.counters[ci]
				if name != "" && c.name != name {
					continue
				}
				ent := sums[pair{c.name, c.key()}]
				if ent == nil {
					// The counter's key bytes are reused after the lock.
					p := pair{c.name, string(c.kb)}
					ent = &sum{Entry: Entry{Name: p.name, Key: p.key}, stripe: i}
					sums[p] = ent
				}
				ent.Count += c.count
			}
		}
		s.unlock(t.perLock)
	}
	out := make([]Entry, 0, len(sums))
	for _, ent := range sums {
		ent.Error = dec[ent.stripe]
		ent.Count += ent.Error
		out = append(out, ent.Entry)
	}
	slices.SortFunc(out, func(a, b Entry) int {
		if a.Count != b.Count {
			if a.Count > b.Count {
				return -1
			}
			return 1
		}
		if c := strings.Compare(a.Name, b.Name); c != 0 {
			return c
		}
		return strings.Compare(a.Key, b.Key)
	})
	if n >= 0 && len(out) > n {
		out = out[:n]
	}
	return out
}

// reset empties sm for epoch e, keeping its storage.
func (sm *summary) reset(e int64, k int) {
	sm.epoch = e
	sm.dec, sm.kept = 0, 0
	if sm.doorSet > 0 {
		clear(sm.door)
		sm.doorSet = 0
	}
	if sm.idx == nil {
		sm.idx = make([]cell, 1<<bits.Len(uint(4*k-1)))
		sm.counters = make([]counter, 0, 2*k)
		sm.scratch = make([]uint64, 0, 2*k)
		sm.door = make([]uint64, max(k/2, 1)) // 32k bits: 4 bytes a counter
	}
	clear(sm.idx)
	for i := range sm.counters {
		sm.counters[i].name = "" // drop the name, keep the key's room
	}
	sm.counters = sm.counters[:0]
}

// add counts n for name and key, whose hash is h. Precondition: the
// stripe's lock is held.
func (sm *summary) add(h uint64, name, key string, n uint64, k int) {
	if sm.kept > 0 && n == 1 && sm.doorKeeps(h) {
		return
	}
	sm.addAt((h>>32)&uint64(len(sm.idx)-1), h, name, key, n, k)
}

// addAt is add past the door, with the lookup of h starting from index
// place i, one where h's lookup goes: its first or one it has passed.
func (sm *summary) addAt(i, h uint64, name, key string, n uint64, k int) {
	idx := sm.idx
	mask := uint64(len(idx) - 1)
	for ; idx[i].slot > 0; i = (i + 1) & mask {
		if cl := &idx[i]; cl.h == h {
			c := &sm.counters[cl.slot-1]
			if same(c.name, name) && sameKey(c.kb, key) {
				c.count += n
			}
			// Else two pairs with one 64-bit hash: about n²/2⁶⁵ for n
			// pairs. The newcomer is not counted rather than counted as
			// another.
			return
		}
	}
	slot := len(sm.counters)
	sm.counters = sm.counters[:slot+1] // within its capacity, 2k
	c := &sm.counters[slot]
	c.name, c.h, c.count = name, h, n
	c.kb = keep(c.kb, key)
	idx[i] = cell{h, int32(slot + 1)}
	if slot+1 == 2*k {
		sm.prune(k)
	}
}

// doorKeeps reports whether the door keeps out a refusal of cost 1 of
// the key whose hash is h, once the summary has pruned. A key's first
// refusal in a generation sets its bit and is not counted; its next ones
// are. A flood's keys, refused once, so never reach the counters. The
// door is checked before the index, so that such a key costs no lookup;
// a key with a counter loses its first refusal of a generation too.
// Another key's bit only lets a key in sooner. A generation ends when an
// eighth of the bits, 4k, are set. So each key loses at most one refusal
// a generation, and a key finds its bit set by others one time in 16 on
// average.
func (sm *summary) doorKeeps(h uint64) bool {
	b := h >> 8 & uint64(len(sm.door)*64-1)
	w, m := &sm.door[b>>6], uint64(1)<<(b&63)
	if *w&m != 0 {
		return false
	}
	*w |= m
	if sm.doorSet++; sm.doorSet == len(sm.door)*8 {
		sm.nextGeneration()
	}
	return true
}

// nextGeneration empties the door. Each key may lose one more refusal.
func (sm *summary) nextGeneration() {
	clear(sm.door)
	sm.doorSet = 0
	sm.kept++
}

// prune takes the (k+1)-th largest count from every counter and drops
// the counters left at zero: at most k remain. The dropped counters'
// slots keep their key room for the next keys.
func (sm *summary) prune(k int) {
	v, ok := smallNth(sm.counters, k)
	if !ok {
		s := sm.scratch[:0]
		for i := range sm.counters {
			s = append(s, sm.counters[i].count)
		}
		v = nthLargest(s, k)
		sm.scratch = s
	}
	sm.dec += v
	sm.kept = max(sm.kept, 1) // the door opens
	j := 0
	for i := range sm.counters {
		if c := &sm.counters[i]; c.count > v {
			c.count -= v
			sm.counters[i], sm.counters[j] = sm.counters[j], sm.counters[i]
			j++
		}
	}
	for i := j; i < len(sm.counters); i++ {
		sm.counters[i].name = ""
	}
	sm.counters = sm.counters[:j]
	clear(sm.idx)
	for slot := range sm.counters {
		h := sm.counters[slot].h
		sm.idx[sm.find(h)] = cell{h, int32(slot + 1)}
	}
}

// smallNth returns the (n+1)-th largest count of cs, when it is below
// smallCounts, by a histogram: one pass and no copy. Floods of new keys
// prune counters whose counts are mostly 1. It reports false when the
// answer is larger.
func smallNth(cs []counter, n int) (uint64, bool) {
	var hist [smallCounts + 1]int32
	for i := range cs {
		hist[min(cs[i].count, smallCounts)]++
	}
	above := int(hist[smallCounts]) // counts >= smallCounts
	if above > n {
		return 0, false
	}
	for v := smallCounts - 1; v > 0; v-- {
		if above += int(hist[v]); above > n {
			return uint64(v), true
		}
	}
	return 0, true // len(cs) <= n: nothing to take
}

// nthLargest returns the value that would be at index n if s were
// sorted in descending order (0 <= n < len(s)). It reorders s.
func nthLargest(s []uint64, n int) uint64 {
	lo, hi := 0, len(s)-1
	for lo < hi {
		// Hoare partition around the middle value, descending.
		p := s[lo+(hi-lo)/2]
		i, j := lo, hi
		for i <= j {
			for s[i] > p {
				i++
			}
			for s[j] < p {
				j--
			}
			if i <= j {
				s[i], s[j] = s[j], s[i]
				i++
				j--
			}
		}
		switch {
		case n <= j:
			hi = j
		case n >= i:
			lo = i
		default:
			return s[n]
		}
	}
	return s[n]
}

// keep copies key into kb, the room of the key it replaces. Room much
// larger than the key is let go, so that a slot holds at most twice its
// key or keepRoom bytes.
func keep(kb []byte, key string) []byte {
	n := len(key)
	if cap(kb) > keepRoom && cap(kb) > 2*n {
		kb = nil
	}
	if n >= 8 && n <= 16 && cap(kb) >= n {
		// The common case: two stores of 8 bytes and no call.
		kb = kb[:n]
		b := unsafe.Slice(unsafe.StringData(key), n)
		binary.LittleEndian.PutUint64(kb, binary.LittleEndian.Uint64(b))
		binary.LittleEndian.PutUint64(kb[n-8:], binary.LittleEndian.Uint64(b[n-8:]))
		return kb
	}
	return append(kb[:0], key...)
}

// sameKey reports string(kb) == key. A key of 8 to 16 bytes, the
// common case, takes two compares of 8 bytes and no call.
func sameKey(kb []byte, key string) bool {
	n := len(key)
	if len(kb) != n {
		return false
	}
	if n < 8 || n > 16 {
		return string(kb) == key
	}
	b := unsafe.Slice(unsafe.StringData(key), n)
	return binary.LittleEndian.Uint64(kb) == binary.LittleEndian.Uint64(b) &&
		binary.LittleEndian.Uint64(kb[n-8:]) == binary.LittleEndian.Uint64(b[n-8:])
}

// key is a view of c's key, valid while the stripe's lock is held.
func (c *counter) key() string { return unsafe.String(unsafe.SliceData(c.kb), len(c.kb)) }
