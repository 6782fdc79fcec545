package shard

import "math/bits"

// The approximate sliding window counter: two fixed-window counts per key
// (see block.go for its layout and protocol).

// counterState returns the previous and current window counts as of window
// idx, from the counts stored for window sidx.
func counterState(b *block, d data, idx int64) (prev, cur uint64) {
	return countsAt(int64(b.meta.Load()), d.slot(0).Load(), idx)
}

// countsAt returns the counts as of window idx from the stored window index
// sidx and the stored word c.
func countsAt(sidx, c, idx int64) (prev, cur uint64) {
	sp, sc := uint64(c)>>32, uint64(c)&0xffffffff
	switch idx - sidx {
	case 0:
		return sp, sc
	case 1:
		return sc, 0
	default:
		return 0, 0
	}
}

// counterDecide is the sliding window counter decision at instant t.
// Windows are aligned to the epoch: window idx covers [idx·W, (idx+1)·W).
// With e the time elapsed in the current window, the estimate is
// prev·(W−e)/W + cur, and a request of cost n is allowed iff
// estimate + n ≤ L. The comparison is done exactly in 128-bit integers.
func (s *Store) counterDecide(p *policy, b *block, d data, n int, t int64, r *Result) {
	w := uint64(p.window)
	// The stored window is usually the current one: check that with a
	// multiplication before paying for a division.
	sidx, c := int64(b.meta.Load()), d.slot(0).Load()
	idx := sidx
	if start := sidx * p.window; t < start || t-start >= p.window {
		idx = t / p.window
	}
	e := uint64(t - idx*p.window)
	prev, cur := countsAt(sidx, c, idx)
	L, N := uint64(p.limit), uint64(n)
	*r = Result{Limit: p.limit, At: t}

	// weighted = prev·(W−e), compared against (L − cur − n)·W.
	wh, wl := bits.Mul64(prev, w-e)
	r.Allowed = cur+N <= L && !gt128(wh, wl, (L-cur-N), w)
	if r.Allowed {
		cur += N
	}
	// Remaining = L − cur − ceil(prev·(W−e)/W), at least 0.
	var q uint64
	if prev != 0 { // a division costs more than the whole rest of a refusal
		var rem uint64
		q, rem = bits.Div64(wh, wl, w)
		if rem != 0 {
			q++
		}
	}
	if used := cur + q; used < L {
		r.Remaining = int(L - used)
	}
	r.Reset = counterReset(prev, cur, p.window, int64(e))
	if r.Allowed {
		return
	}
	// RetryAfter: the least d ≥ 0 with estimate(t+d) + n ≤ L, no new requests.
	if cur+N <= L {
		// Within this window: prev·(W−e−d) ≤ (L−cur−n)·W.
		k := (L - cur - N)
		fh, fl := bits.Mul64(k, w)
		f, _ := bits.Div64(fh, fl, prev) // prev > k here, so no overflow
		r.RetryAfter = int64(w - e - min(f, w-e))
		return
	}
	// In the next window the current count becomes prev' and decays:
	// cur·(W−e') ≤ (L−n)·W.
	fh, fl := bits.Mul64(L-N, w)
	f, _ := bits.Div64(fh, fl, cur) // cur > L−n here
	r.RetryAfter = int64(w-e) + int64(w-min(f, w))
}

// counterReset is how long until a counter holding prev and cur, e into
// its current window of length w, decays to zero: the current count weighs
// until the end of the next window, the previous one until this window's.
func counterReset(prev, cur uint64, w, e int64) int64 {
	switch {
	case cur > 0:
		return 2*w - e
	case prev > 0:
		return w - e
	}
	return 0
}

// gt128 reports whether the 128-bit value hi:lo is greater than a·b.
func gt128(hi, lo, a, b uint64) bool {
	ph, pl := bits.Mul64(a, b)
	return hi > ph || hi == ph && lo > pl
}

// counterAppend records an accepted request of cost n at t. Precondition:
// the caller holds b's busy bit; the caller releases it.
func (s *Store) counterAppend(p *policy, b *block, d data, n int, t int64) {
	idx := t / p.window
	prev, cur := counterState(b, d, idx)
	cur += uint64(n)
	d.slot(0).Store(int64(prev<<32 | cur))
	b.meta.Store(uint64(idx))
}
