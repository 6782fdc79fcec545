package bench

import (
	"math/bits"
	"time"
)

// Histogram counts durations in log-linear buckets: exact below 128 ns,
// then 64 buckets per power of two, so a quantile is within 1/64 (1.6 %)
// of the true value. Recording is one bits.Len64 and an increment, cheap
// enough to time every decision of a latency benchmark. The zero value is
// ready to use; a Histogram is not safe for concurrent use (give each
// goroutine its own and Merge them).
type Histogram struct {
	counts [histBuckets]uint64
	total  uint64
	max    int64
}

const (
	histSub     = 6 // 64 sub-buckets per power of two
	histMaxExp  = 40
	histBuckets = (histMaxExp + 2) << histSub
)

func histIndex(v int64) int {
	if v < 0 {
		v = 0
	}
	u := uint64(v)
	if u < 1<<(histSub+1) {
		return int(u)
	}
	e := bits.Len64(u) - histSub - 1 // ≥ 1
	if e > histMaxExp {
		return histBuckets - 1
	}
	return (e+1)<<histSub + int(u>>uint(e)) - 1<<histSub
}

// histUpper returns the largest value that falls into bucket i.
func histUpper(i int) int64 {
	if i < 1<<(histSub+1) {
		return int64(i)
	}
	e := i>>histSub - 1
	m := i&(1<<histSub-1) + 1<<histSub
	return int64(m+1)<<uint(e) - 1
}

// Record adds one duration in nanoseconds.
func (h *Histogram) Record(ns int64) {
	h.counts[histIndex(ns)]++
	h.total++
	if ns > h.max {
		h.max = ns
	}
}

// Merge adds o's counts to h.
func (h *Histogram) Merge(o *Histogram) {
	for i, c := range o.counts {
		h.counts[i] += c
	}
	h.total += o.total
	h.max = max(h.max, o.max)
}

// Count returns the number of recorded durations.
func (h *Histogram) Count() uint64 { return h.total }

// Quantile returns the q-quantile (0 ≤ q ≤ 1) as the upper edge of its
// bucket, capped at the largest recorded value; 0 when empty.
func (h *Histogram) Quantile(q float64) time.Duration {
	if h.total == 0 {
		return 0
	}
	rank := uint64(q * float64(h.total))
	if rank >= h.total {
		rank = h.total - 1
	}
	var seen uint64
	for i, c := range h.counts {
		seen += c
		if seen > rank {
			return time.Duration(min(histUpper(i), h.max))
		}
	}
	return time.Duration(h.max)
}

// Max returns the largest recorded duration.
func (h *Histogram) Max() time.Duration { return time.Duration(h.max) }
