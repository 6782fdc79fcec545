package shard

// The exact sliding window log: a sorted ring of the accepted instants
// per key (see block.go for its layout and protocol).

// growCap returns the ring capacity to grow a ring of capacity c to when it
// needs room for need instants: double, at least need, at most limit.
// Rings start with room for the first request's cost (plus the allocator's
// slack, see newBlock), so a key that sent three requests pays for a few
// slots, not for limit.
func growCap(c, need, limit int) int {
	return min(max(2*c, need), limit)
}

// at returns the i-th oldest stored instant (0 ≤ i < count).
func at(d data, capacity, head, i int) int64 {
	j := head + i
	if j >= capacity {
		j -= capacity
	}
	return d.slot(j).Load()
}

// firstLive returns the logical index of the oldest entry > cutoff, or count
// when none is. The ring is sorted oldest first.
func firstLive(d data, capacity, head, count int, cutoff int64) int {
	// Fast paths: a full window (the hot refused key) and a fully
	// expired one (a returning client) need one load, not a search.
	if count == 0 || at(d, capacity, head, 0) > cutoff {
		return 0
	}
	if at(d, capacity, head, count-1) <= cutoff {
		return count
	}
	lo, hi := 1, count-1
	for lo < hi {
		mid := int(uint(lo+hi) >> 1)
		if at(d, capacity, head, mid) <= cutoff {
			lo = mid + 1
		} else {
			hi = mid
		}
	}
	return lo
}

// logDecide is the sliding window log decision at instant t. It reads the
// block and writes nothing. The ring holds every entry that was live when
// the key last accepted a request (older ones are dropped then), so the
// entries > t−W in it are exactly the live log.
//
// It also returns the logical index of the oldest live entry, for logAppend.
func (s *Store) logDecide(b *block, d data, n int, t int64, r *Result) int {
	capacity, head, count := unpackMeta(b.meta.Load())
	w := s.window
	j := firstLive(d, capacity, head, count, t-w)
	live := count - j
	*r = Result{At: t}
	if live+n <= s.limit {
		r.Allowed = true
		r.Remaining = s.limit - live - n
		oldest := t
		if live > 0 {
			oldest = at(d, capacity, head, j)
		}
		r.Reset = w - (t - oldest)
		return j
	}
	r.Remaining = s.limit - live
	r.Reset = w - (t - at(d, capacity, head, j))
	// The k-th oldest live entry's expiry makes room for n.
	k := live + n - s.limit
	r.RetryAfter = w - (t - at(d, capacity, head, j+k-1))
	return j
}

// logAppend records n entries of t. Precondition: the caller holds b's busy
// bit, taken from ctl value v, t is allowed, and j is the logical index of
// the oldest entry live at t. It releases the bit.
func (s *Store) logAppend(sh *shard, k mkey, b *block, d data, v uint64, n int, t int64, j int) {
	capacity, head, count := unpackMeta(b.meta.Load())
	live := count - j
	if live+n <= capacity {
		// Drop the expired prefix and append in place.
		head += j
		if head >= capacity {
			head -= capacity
		}
		for i := range n {
			p := head + live + i
			if p >= capacity {
				p -= capacity
			}
			d.slot(p).Store(t)
		}
		b.meta.Store(packMeta(capacity, head, live+n))
		b.ctl.Store(v + ctlVersion)
		if delta := live + n - count; delta != 0 {
			sh.instants.Add(int64(delta))
		}
		return
	}
	// Grow: copy the live entries into a larger block, publish it in the
	// map, then retire this one. Readers holding this block see dead and
	// go back to the map.
	keyLen := len(k.s)
	nb, c, ks := newBlock(growCap(capacity, live+n, s.limit), s.limit, k.s)
	nd := nb.words(keyLen)
	for i := range live {
		nd.slot(i).Store(at(d, capacity, head, j+i))
	}
	for i := range n {
		nd.slot(live + i).Store(t)
	}
	nb.meta.Store(packMeta(c, 0, live+n))
	nb.wm.Store(b.wm.Load())
	sh.store(mkey{s: ks, h: k.h}, nb)
	sh.bytes.Add(blockBytes(c, keyLen) - blockBytes(capacity, keyLen))
	sh.instants.Add(int64(live + n - count))
	b.ctl.Store(v + ctlVersion | ctlDead)
}
