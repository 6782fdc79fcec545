// Package latency is the latency histogram of slidegate's benchmarks and
// load tests: log-linear buckets, exact below 1024 ns and within 1/64 above,
// cheap enough to record every timed decision.
package latency

import (
	"math"
	"math/bits"
	"slices"
	"time"
)

// Median is the median of xs (the mean of the middle two for an even
// count), 0 for none. The lab judges its rounds on medians of ratios.
func Median(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	if n := len(s); n%2 == 0 {
		return (s[n/2-1] + s[n/2]) / 2
	}
	return s[len(s)/2]
}

// Histogram records durations in nanoseconds with a bounded relative
// error: values below 1024 ns have their own bucket (exact to the
// nanosecond), and above that each power of two is split into 64 buckets
// (error under 1.6%). It needs no allocation per value and 36 KiB in all.
// The zero value is ready to use; a Histogram is not safe for concurrent
// use (give each goroutine its own and Merge them).
type Histogram struct {
	counts [histBuckets]uint64
	n      uint64
	sum    float64
	max    int64
	min    int64
}

const (
	histLinear  = 1024 // exact buckets for [0, 1024)
	histSubBits = 6    // 64 buckets per power of two above
	histBuckets = histLinear + (64-10)*(1<<histSubBits)
)

func bucketOf(v int64) int {
	if v < histLinear {
		if v < 0 {
			return 0
		}
		return int(v)
	}
	e := bits.Len64(uint64(v)) - 1 // 10..62
	sub := int(uint64(v)>>(e-histSubBits)) & (1<<histSubBits - 1)
	return histLinear + (e-10)<<histSubBits + sub
}

// bucketHigh is the largest value that falls in bucket i.
func bucketHigh(i int) int64 {
	if i < histLinear {
		return int64(i)
	}
	i -= histLinear
	e := i>>histSubBits + 10
	sub := int64(i & (1<<histSubBits - 1))
	lo := int64(1)<<e + sub<<(e-histSubBits)
	return lo + int64(1)<<(e-histSubBits) - 1
}

// Record adds one value in nanoseconds.
func (h *Histogram) Record(ns int64) {
	if ns < 0 {
		ns = 0
	}
	h.counts[bucketOf(ns)]++
	if h.n == 0 || ns < h.min {
		h.min = ns
	}
	h.n++
	h.sum += float64(ns)
	if ns > h.max {
		h.max = ns
	}
}

// Merge adds o's values to h.
func (h *Histogram) Merge(o *Histogram) {
	if o.n == 0 {
		return
	}
	for i, c := range o.counts {
		h.counts[i] += c
	}
	if h.n == 0 || o.min < h.min {
		h.min = o.min
	}
	h.n += o.n
	h.sum += o.sum
	h.max = max(h.max, o.max)
}

// Count returns the number of values recorded.
func (h *Histogram) Count() uint64 { return h.n }

// AtLeast returns how many values are at least ns, to the histogram's
// resolution: the values of ns's own bucket all count, so values up to
// 1.6% under ns may too.
func (h *Histogram) AtLeast(ns int64) uint64 {
	var c uint64
	for _, x := range h.counts[bucketOf(ns):] {
		c += x
	}
	return c
}

// Max returns the largest value, exactly.
func (h *Histogram) Max() time.Duration { return time.Duration(h.max) }

// Mean returns the mean value.
func (h *Histogram) Mean() time.Duration {
	if h.n == 0 {
		return 0
	}
	return time.Duration(h.sum / float64(h.n))
}

// Quantile returns the smallest bucket bound at or below which a fraction
// q of the values lie (never more than Max).
func (h *Histogram) Quantile(q float64) time.Duration {
	if h.n == 0 {
		return 0
	}
	rank := uint64(math.Ceil(q * float64(h.n)))
	rank = max(rank, 1)
	var seen uint64
	for i, c := range h.counts {
		seen += c
		if seen >= rank {
			return time.Duration(min(bucketHigh(i), h.max))
		}
	}
	return time.Duration(h.max)
}

// Summary is a histogram's figures for reports. Durations are nanoseconds.
type Summary struct {
	Samples uint64 `json:"samples"`
	MeanNs  int64  `json:"mean_ns"`
	P50Ns   int64  `json:"p50_ns"`
	P90Ns   int64  `json:"p90_ns"`
	P99Ns   int64  `json:"p99_ns"`
	P999Ns  int64  `json:"p99_9_ns"`
	MaxNs   int64  `json:"max_ns"`
}

// Summary returns the report figures of h.
func (h *Histogram) Summary() Summary {
	return Summary{
		Samples: h.n,
		MeanNs:  int64(h.Mean()),
		P50Ns:   int64(h.Quantile(0.50)),
		P90Ns:   int64(h.Quantile(0.90)),
		P99Ns:   int64(h.Quantile(0.99)),
		P999Ns:  int64(h.Quantile(0.999)),
		MaxNs:   h.max,
	}
}
