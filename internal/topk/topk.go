// Package topk keeps, per policy or rule, the keys refused most in the
// last minutes, in bounded memory.
//
// Each epoch (one minute by default) has its own Space-Saving summary
// (Metwally, Agrawal and El Abbadi, "Efficient Computation of Frequent
// and Top-k Elements in Data Streams", ICDT 2005). A summary holds at most
// a fixed number of counters. A new key takes the smallest counter's place
// and inherits its count as its error, so a count is never too low and is
// too high by at most its error. With N refusals in a summary of k
// counters, the error is at most N/k, and every key refused more than
// N/k times is in the summary.
//
// The summaries are striped by the key's hash. A key always lands in the
// same stripe, so the stripes partition the keys and their union is
// exact. Top sums the summaries of the epochs still in the window.
//
// Record does not touch the summaries: it copies the refusal into a
// batch (batch.go), and a background goroutine adds full batches to the
// summaries. Top adds every waiting refusal first, so it misses none.
package topk

import (
	"math/bits"
	"slices"
	"strings"
	"sync"
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
	// stripes is a power of two: 8 locks are enough on the machines the
	// decision path runs on, and each keeps DefaultCounters/8 counters.
	stripes = 8
	// keepRoom is the key room a counter keeps for the next key.
	keepRoom = 1024
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
	stripes [stripes]stripe
	batches // batch.go
}

type stripe struct {
	mu   sync.Mutex
	ring []summary // ring[e % len(ring)] holds epoch e, if ring[...].epoch == e
	// The pad keeps two stripes' locks off one cache line.
	_ [64]byte
}

type pair struct{ name, key string }

type counter struct {
	name         string
	kb           []byte // the key's bytes, reused by the next key in this slot
	h            uint64 // p's hash
	count, error uint64
	pos          int // the counter's place in heap
	cell         int // its place in idx
}

// summary is one epoch's Space-Saving summary. Counters stay in their
// slots; heap orders the slots by count (a min-heap), and each counter
// knows its place in it, so a move touches no index. idx finds a slot by
// the pair's hash: open addressing with linear probing, at most half
// full, so that a lookup reads one or two cache lines.
type summary struct {
	epoch    int64
	idx      []cell
	counters []counter
	heap     []int
}

// cell is one place of the index: a hash and its slot, or slot -1.
type cell struct {
	h    uint64
	slot int32
}

// find returns the index place of h: its cell, or the empty cell where
// it would go.
func (sm *summary) find(h uint64) int {
	mask := len(sm.idx) - 1
	i := int(h) & mask
	for sm.idx[i].slot >= 0 && sm.idx[i].h != h {
		i = (i + 1) & mask
	}
	return i
}

// remove empties place i, shifting later cells of its probe run back so
// that every hash stays reachable (deletion without tombstones).
func (sm *summary) remove(i int) {
	mask := len(sm.idx) - 1
	for {
		sm.idx[i].slot = -1
		j := i
		for {
			j = (j + 1) & mask
			if sm.idx[j].slot < 0 {
				return
			}
			home := int(sm.idx[j].h) & mask
			// The cell at j may move to i if its home is not in (i, j].
			if (j > i && (home <= i || home > j)) || (j < i && home <= i && home > j) {
				break
			}
		}
		sm.idx[i] = sm.idx[j]
		sm.counters[sm.idx[i].slot].cell = i
		i = j
	}
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
	for i := range t.stripes {
		t.stripes[i].ring = make([]summary, epochs)
		for j := range t.stripes[i].ring {
			t.stripes[i].ring[j].epoch = -1
		}
	}
	t.initBatches()
	return t
}

// Counters returns the number of counters per epoch.
func (t *Tracker) Counters() int { return t.perLock * stripes }

// Window returns the span Top reads.
func (t *Tracker) Window() time.Duration { return time.Duration(t.epoch * int64(t.epochs)) }

// direct counts n refusals of key under name in the summaries at once,
// reading the clock: Record's way once the Tracker is closed.
func (t *Tracker) direct(name, key string, n int) {
	e := t.now() / t.epoch
	kh := xxhash.Sum64String(key)
	s := &t.stripes[kh&(stripes-1)]
	s.mu.Lock()
	s.add(e, kh, name, key, uint64(n), t.perLock)
	s.mu.Unlock()
}

// add counts n refusals of key under name in epoch e; kh is key's hash.
// Precondition: s.mu is held. A refusal of an epoch older than the
// summary in its place is out of the window and is dropped.
func (s *stripe) add(e int64, kh uint64, name, key string, n uint64, k int) {
	sm := &s.ring[int(e%int64(len(s.ring)))]
	if sm.epoch > e {
		return
	}
	if sm.epoch != e {
		sm.reset(e, k)
	}
	h := kh ^ bits.RotateLeft64(xxhash.Sum64String(name)*0x9e3779b97f4a7c15, 31)
	sm.add(h, pair{name, key}, n, k)
}

// Top returns the keys of name (every name when name is "") refused most
// in the window, at most n, by count and then by key.
func (t *Tracker) Top(name string, n int) []Entry {
	t.flushAll()
	e := t.now() / t.epoch
	sums := map[pair]*Entry{}
	for i := range t.stripes {
		s := &t.stripes[i]
		s.mu.Lock()
		for j := range s.ring {
			sm := &s.ring[j]
			if sm.epoch < 0 || sm.epoch > e || e-sm.epoch >= int64(t.epochs) {
				continue
			}
			for i := range sm.counters {
				c := &sm.counters[i]
				if name != "" && c.name != name {
					continue
				}
				ent := sums[pair{c.name, c.key()}]
				if ent == nil {
					// The counter's key bytes are reused after the lock.
					p := pair{c.name, string(c.kb)}
					ent = &Entry{Name: p.name, Key: p.key}
					sums[p] = ent
				}
				ent.Count += c.count
				ent.Error += c.error
			}
		}
		s.mu.Unlock()
	}
	out := make([]Entry, 0, len(sums))
	for _, ent := range sums {
		out = append(out, *ent)
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
	if sm.idx == nil {
		sm.idx = make([]cell, 1<<bits.Len(uint(2*k-1)))
		sm.counters = make([]counter, 0, k)
		sm.heap = make([]int, 0, k)
	}
	for i := range sm.idx {
		sm.idx[i].slot = -1
	}
	for i := range sm.counters {
		sm.counters[i].name = "" // drop the name, keep the key's room
	}
	sm.counters = sm.counters[:0]
	sm.heap = sm.heap[:0]
}

// add counts n for p, whose hash is h. Precondition: the stripe's lock
// is held.
func (sm *summary) add(h uint64, p pair, n uint64, k int) {
	i := sm.find(h)
	if slot := sm.idx[i].slot; slot >= 0 {
		c := &sm.counters[slot]
		if c.name != p.name || c.key() != p.key {
			// Two pairs with one 64-bit hash: about n²/2⁶⁵ for n pairs.
			// The newcomer is not counted rather than counted as another.
			return
		}
		c.count += n
		sm.down(c.pos)
		return
	}
	if len(sm.counters) < k {
		slot := len(sm.counters)
		kb := keep(sm.counters[:slot+1][slot].kb, p.key)
		sm.counters = append(sm.counters, counter{name: p.name, kb: kb, h: h, count: n, pos: len(sm.heap), cell: i})
		sm.heap = append(sm.heap, slot)
		sm.idx[i] = cell{h, int32(slot)}
		sm.up(len(sm.heap) - 1)
		return
	}
	// Space-Saving: the new key replaces the smallest counter and
	// inherits its count as its error.
	slot := sm.heap[0]
	low := sm.counters[slot].count
	sm.remove(sm.counters[slot].cell)
	i = sm.find(h) // the removal may have moved h's empty place
	kb := keep(sm.counters[slot].kb, p.key)
	sm.counters[slot] = counter{name: p.name, kb: kb, h: h, count: low + n, error: low, pos: 0, cell: i}
	sm.idx[i] = cell{h, int32(slot)}
	sm.down(0)
}

// keep copies key into kb, the room of the key it replaces. Room much
// larger than the key is let go, so that a slot holds at most twice its
// key or keepRoom bytes.
func keep(kb []byte, key string) []byte {
	if cap(kb) > keepRoom && cap(kb) > 2*len(key) {
		kb = nil
	}
	return append(kb[:0], key...)
}

// key is a view of c's key, valid while the stripe's lock is held.
func (c *counter) key() string { return unsafe.String(unsafe.SliceData(c.kb), len(c.kb)) }

func (sm *summary) less(i, j int) bool {
	return sm.counters[sm.heap[i]].count < sm.counters[sm.heap[j]].count
}

func (sm *summary) swap(i, j int) {
	sm.heap[i], sm.heap[j] = sm.heap[j], sm.heap[i]
	sm.counters[sm.heap[i]].pos = i
	sm.counters[sm.heap[j]].pos = j
}

func (sm *summary) up(i int) {
	for i > 0 {
		p := (i - 1) / 2
		if !sm.less(i, p) {
			return
		}
		sm.swap(i, p)
		i = p
	}
}

func (sm *summary) down(i int) {
	n := len(sm.heap)
	for {
		l := 2*i + 1
		if l >= n {
			return
		}
		m := l
		if r := l + 1; r < n && sm.less(r, l) {
			m = r
		}
		if !sm.less(m, i) {
			return
		}
		sm.swap(i, m)
		i = m
	}
}
