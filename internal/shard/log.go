package shard

import "unsafe"

// The exact sliding window log: a sorted ring of the accepted instants
// per key (see block.go for its layout and protocol).

// growCap returns the ring capacity to grow a ring of capacity c to when it
// needs room for need instants: double, or quadruple when fast, at least
// need, at most limit; a fast ring that would then hold half its limit or
// more grows to the limit at once, sparing a last growth of at most
// double. Rings start with room for the first request's cost
// (plus the allocator's slack, see newBlock), so a key that sent three
// requests pays for a few slots, not for limit.
//
// fast says the key's live entries span less than a quarter of the window:
// at that rate it needs at least four times its ring within one window, so
// growing four-fold now saves the growths in between. Each growth is an
// allocation on the decision path, and growths set the decisions' p99.9
// at a million Zipf keys (docs/design.md, "The tail, counted").
func growCap(c, need, limit int, fast bool) int {
	if !fast || c < fastMinCap {
		return min(max(2*c, need), limit)
	}
	if g := max(4*c, need); 2*g < limit {
		return g
	}
	return limit
}

// fastMinCap is the smallest ring that grows four-fold: smaller ones
// double, so that a key that stops after a few requests holds what it did.
const fastMinCap = 3

// ring is a log block's ring as one load of meta saw it.
type ring struct {
	d                     data
	m                     uint64 // the meta word (a small ring's slot 0 is in it)
	ref                   int64  // narrow slots decode against it: the watermark read with the ring
	capacity, head, count int
	narrow                bool
}

// geom is where a ring's instants are, as one load of meta saw it: the
// meta word, the watermark its narrow slots decode against (ring.ref),
// and the capacity and head. It is four words, so the compiler keeps it
// in registers on the decision's hot path, where a ring of seven fields
// would be built in memory.
type geom struct {
	m              uint64
	ref            int64
	capacity, head int
}

// geomOf is the geometry of the ring whose meta is m, with w the
// watermark word read with it, and its count of entries: wm's entry
// (block.go, "The entry in wm") included.
func geomOf(m uint64, w int64) (geom, int) {
	capacity, head, count := unpackMeta(m)
	return geom{m: m, ref: wmTime(w), capacity: capacity, head: head}, count + wmExtra(w)
}

// ringOf loads b's ring geometry. w is b's watermark word as the caller
// read it together with the ring; the ring's count includes wm's entry
// when w has wmEntry set.
func (s *Store) ringOf(b *block, d data, w int64) ring {
	m := b.meta.Load()
	c, h, n := unpackMeta(m)
	return ring{d: d, m: m, ref: wmTime(w), capacity: c, head: h, count: n + wmExtra(w), narrow: s.narrow}
}

// at returns the i-th oldest stored instant (0 ≤ i < count).
func (r *ring) at(i int) int64 {
	return slotAt(r.d, geom{m: r.m, ref: r.ref, capacity: r.capacity, head: r.head}, i, r.narrow)
}

// slotAt is ring.at on the ring's data words and geometry (see geom). The
// narrow slot's loads are written out here (see storeNarrow for the
// layout).
func slotAt(d data, g geom, i int, narrow bool) int64 {
	j := g.head + i
	if j >= g.capacity {
		if i >= g.capacity {
			return g.ref // wm's entry (block.go): only a full ring has one
		}
		j -= g.capacity
	}
	if !narrow {
		return d.slot(j).Load()
	}
	if g.m&metaSmall != 0 {
		if j == 0 {
			return decode(g.m&narrowMask, g.ref)
		}
		j--
	}
	var s uint64
	if q := 3 * (j >> 1); j&1 == 0 {
		s = uint64(d.u32(q).Load()) | uint64(d.u32(q+1).Load()&0xffff)<<32
	} else {
		s = uint64(d.u32(q+1).Load()>>16) | uint64(d.u32(q+2).Load())<<16
	}
	return decode(s, g.ref)
}

// fill stores e in physical slot p of a ring whose block no other
// goroutine can reach yet (a growth's new block, before the map holds it),
// with plain stores; a small ring's slot 0 goes into r.m, which the caller
// stores as the block's meta. A growth copies up to a whole ring, and
// slotSet's atomic stores (an exchange on amd64 for every 32-bit word)
// would make that copy the cost of a new key's first requests.
func (r *ring) fill(p int, e int64) {
	if r.m, p = inMeta(r.m, p, e); p < 0 {
		return
	}
	if r.narrow {
		r.d.fillNarrow(p, e)
	} else {
		*(*int64)(unsafe.Pointer(r.d.slot(p))) = e
	}
}

// slotSet stores e in physical slot p of the ring whose meta is m and data
// words d. It returns m, with e in it when the ring is small and p is 0:
// the caller stores that meta after the other slots.
func slotSet(d data, m uint64, p int, e int64, narrow bool) uint64 {
	if m, p = inMeta(m, p, e); p < 0 {
		return m
	}
	if narrow {
		d.storeNarrow(p, e)
	} else {
		d.slot(p).Store(e)
	}
	return m
}

// inMeta maps physical slot p of the ring whose meta is m to its data
// slot. A small ring keeps slot 0 in meta: for p == 0 it returns m with
// e's low 48 bits in it and −1, and for p ≥ 1 the data slot p−1. Any
// other ring returns m and p unchanged.
func inMeta(m uint64, p int, e int64) (uint64, int) {
	if m&metaSmall == 0 {
		return m, p
	}
	if p == 0 {
		return m&^narrowMask | uint64(e)&narrowMask, -1
	}
	return m, p - 1
}

// firstLive returns the logical index j of the oldest entry > cutoff in
// the ring of count entries, or count when none is, and that entry's
// instant (0 when j == count), given that the oldest entry (count > 0) is
// ≤ cutoff. The ring is sorted oldest first. (logDecide checks the oldest
// entry itself: a full window, the hot refused key, needs that one load.)
func firstLive(d data, g geom, count int, narrow bool, cutoff int64) (int, int64) {
	// A fully expired window (a returning client) needs one load, not a
	// search.
	if slotAt(d, g, count-1, narrow) <= cutoff {
		return count, 0
	}
	// A key accepting at a steady rate drops about one entry per accept:
	// look at the second oldest before searching.
	if e := slotAt(d, g, 1, narrow); e > cutoff {
		return 1, e
	}
	lo, hi := 2, count-1
	for lo < hi {
		mid := int(uint(lo+hi) >> 1)
		if slotAt(d, g, mid, narrow) <= cutoff {
			lo = mid + 1
		} else {
			hi = mid
		}
	}
	return lo, slotAt(d, g, lo, narrow)
}

// logDecide is the sliding window log decision at q's instant. It reads
// the block and writes nothing. The ring holds every entry that was live
// when the key last accepted a request (older ones are dropped then), so
// the entries > t−W in it are exactly the live log. w is the block's
// watermark word, read with the ring.
//
// It also returns the logical index of the oldest live entry, for logAppend.
func (s *Store) logDecide(q req, b *block, d data, w int64) int {
	g, count := geomOf(b.meta.Load(), w)
	n, t, w, limit := q.n, q.t, q.p.window, q.p.limit
	var j int
	var oldest int64
	if count > 0 {
		if oldest = slotAt(d, g, 0, s.narrow); oldest <= t-w {
			j, oldest = firstLive(d, g, count, s.narrow, t-w)
		}
	}
	live := count - j
	r := q.r
	*r = Result{Limit: limit, At: t}
	if live+n <= limit {
		r.Allowed = true
		r.Remaining = limit - live - n
		if live == 0 {
			oldest = t
		}
		r.Reset = w - (t - oldest)
		return j
	}
	r.Remaining = limit - live // < 0 when SetPolicy lowered the limit below live
	r.Reset = w - (t - oldest)
	// The k-th oldest live entry's expiry makes room for n.
	if k := live + n - limit; k > 1 {
		r.RetryAfter = w - (t - slotAt(d, g, j+k-1, s.narrow))
	} else {
		r.RetryAfter = r.Reset
	}
	return j
}

// logAppend records q.n entries of q.t for key k of shard sh, whose block
// is b. Precondition: the caller holds b's busy bit, q.t is allowed, and j
// is the logical index of the oldest entry live at q.t (wm's entry
// counted). b's watermark is ≥ q.t, or holds an entry (block.go, "The
// entry in wm"). It releases the bit.
func (s *Store) logAppend(q req, sh *shard, k mkey, b *block, d data, j int) {
	n, t := q.n, q.t
	// The holder of the busy bit is ctl's only writer (block.go), so ctl
	// is v|busy for the v the bit was taken from.
	v := b.ctl.Load() &^ ctlBusy
	m := b.meta.Load()
	capacity, head, count := unpackMeta(m)
	if live := count - j; live+n <= capacity && b.wm.Load() >= 0 {
		// The common case, written out: drop the expired prefix and
		// append in place.
		head += j
		if head >= capacity {
			head -= capacity
		}
		for i := range n {
			p := head + live + i
			if p >= capacity {
				p -= capacity
			}
			m = slotSet(d, m, p, t, s.narrow)
		}
		b.meta.Store(repack(m, capacity, head, live+n))
		b.ctl.Store(v + ctlVersion)
		if delta := live + n - count; delta != 0 {
			sh.instants.Add(int64(delta))
		}
		return
	}
	s.logAppendMore(q, sh, k, b, d, j, v)
}

// logAppendMore is logAppend when wm holds an entry, or when the ring has
// no room for the new ones: it puts the newest in wm if one slot is
// missing, or grows the block. v is ctl without the busy bit.
func (s *Store) logAppendMore(q req, sh *shard, k mkey, b *block, d data, j int, v uint64) {
	// Only live entries are read below, and every one is in (t−W, t]: t
	// decodes them (block.go), or wm's entry does when it is one.
	n, t := q.n, q.t
	m := b.meta.Load()
	capacity, head, count := unpackMeta(m)
	w := b.wm.Load()
	x, e := wmExtra(w), wmTime(w)
	total := count + x
	live := total - j
	// The newest new entry goes into wm when the slots are one short: a
	// CAS, which fails if a refusal raised wm past t meanwhile (that
	// refusal then retries; the block grows instead). A wm that holds an
	// entry changes only under the busy bit, so its CAS succeeds.
	inWM := live+n == capacity+1
	if live+n <= capacity || inWM && (x == 1 || w == t) && b.wm.CompareAndSwap(w, t|wmEntry) {
		// Drop the expired prefix (wm's entry expires last) and append
		// in place: wm's entry first if it is live, then the new ones.
		drop := min(j, count)
		head += drop
		if head >= capacity {
			head -= capacity
		}
		kept := count - drop
		add := n
		if inWM {
			add--
		}
		if x == 1 && j <= count {
			m = slotSet(d, m, ringPos(head+kept, capacity), e, s.narrow)
			kept++
		}
		for i := range add {
			m = slotSet(d, m, ringPos(head+kept+i, capacity), t, s.narrow)
		}
		b.meta.Store(repack(m, capacity, head, kept+add))
		if x == 1 && !inWM {
			b.wm.Store(t) // no other goroutine writes a wm that holds an entry
		}
		b.ctl.Store(v + ctlVersion)
		if delta := live + n - total; delta != 0 {
			sh.instants.Add(int64(delta))
		}
		return
	}
	// Grow: copy the live entries into a larger block, publish it in the
	// map, then retire this one. Readers holding this block see dead and
	// go back to the map.
	limit := q.p.limit
	kw := k.kw()
	ref := t
	if x == 1 {
		ref = e
	}
	// The oldest live entry (logical index j) dates the key's rate: its
	// live entries arrived since.
	rg := ring{d: d, m: m, ref: ref, capacity: capacity, head: head, count: total, narrow: s.narrow}
	fast := live > 0 && 4*(t-rg.at(j)) < q.p.window
	need := live + n
	gc := growCap(capacity, need, limit, fast)
	// wm as it is now: a refusal that failed the CAS above raised it.
	nwm := max(wmTime(b.wm.Load()), t)
	ask := gc
	if s.narrow && gc == need && gc >= 2 && gc <= smallMaxCap && nwm == t {
		// A growth to just what the key needs asks for two slots fewer:
		// the new block's slot 0 in meta and its newest entry in wm (a
		// small ring, which newLogBlock makes of a block this size,
		// holds one more slot than it asked for, so it holds need − 1).
		// A key of 9 to 16 bytes then grows from its 40-byte first
		// block (two entries) into a 48-byte one (three), not into the
		// 64-byte class.
		ask = gc - 2
	}
	nb, c, ks := newLogBlock(ask, limit, k.s, s.narrow, nil, &s.stock)
	nr := ring{d: nb.words(kw), m: nb.meta.Load(), capacity: c, narrow: s.narrow}
	for i := range live {
		nr.fill(i, rg.at(j+i))
	}
	placed := min(need, c)
	for i := live; i < placed; i++ {
		nr.fill(i, t)
	}
	nb.meta.Store(repack(nr.m, c, 0, placed))
	if placed < need {
		nwm = t | wmEntry // c = need − 1, and then nwm = t (above)
	}
	nb.wm.Store(nwm)
	sh.store(mkey{s: ks, h: k.h, h2: k.h2, linked: k.linked}, nb)
	sh.bytes.Add(s.blockBytes(nb, kw) - s.blockBytes(b, kw))
	sh.instants.Add(int64(need - total))
	b.ctl.Store(v + ctlVersion | ctlDead)
}

// ringPos is physical slot p of a ring of capacity slots, for p < 2·capacity.
func ringPos(p, capacity int) int {
	if p >= capacity {
		p -= capacity
	}
	return p
}

// unflag moves the entry b's watermark holds (block.go, "The entry in
// wm") into the ring of a grown block, whose watermark holds the same
// instant without wmEntry, publishes that block in the map and retires b.
// A ring whose wm holds an entry is full, so the entry needs a new block.
// The writers that do not append through logAppend (a refusal that raises
// wm, a group request, a reservation) call it once they hold the bit, then
// load the key's block again. Precondition: the caller holds b's busy bit,
// taken from ctl value v, and b's wm has wmEntry set. It releases the bit.
func (s *Store) unflag(sh *shard, k mkey, b *block, v uint64, limit int) {
	kw := k.kw()
	w := b.wm.Load()
	rg := s.ringOf(b, b.words(kw), w)
	need := rg.count
	gc := growCap(rg.capacity, need, max(limit, need), false)
	nb, c, ks := newLogBlock(gc, max(limit, gc), k.s, s.narrow, nil, &s.stock)
	nr := ring{d: nb.words(kw), m: nb.meta.Load(), capacity: c, narrow: s.narrow}
	for i := range need {
		nr.fill(i, rg.at(i))
	}
	nb.meta.Store(repack(nr.m, c, 0, need))
	nb.wm.Store(wmTime(w))
	sh.store(mkey{s: ks, h: k.h, h2: k.h2, linked: k.linked}, nb)
	sh.bytes.Add(s.blockBytes(nb, kw) - s.blockBytes(b, kw))
	b.ctl.Store(v + ctlVersion | ctlDead)
}

// logDropExpired drops the entries of b's ring before logical index j, all
// of them ≤ t − W where t is an instant b's watermark is being raised to,
// so that narrow slots keep decoding (block.go). Dropping them changes no
// decision: every later one on b is made at ≥ t, where they have expired.
// Precondition: the caller holds b's busy bit.
func (s *Store) logDropExpired(sh *shard, b *block, d data, j int) {
	if j == 0 {
		return
	}
	rg := s.ringOf(b, d, 0)
	head := rg.head + j
	if head >= rg.capacity {
		head -= rg.capacity
	}
	b.meta.Store(repack(rg.m, rg.capacity, head, rg.count-j))
	sh.instants.Add(-int64(j))
}
