package loadtest

import (
	"testing"
	"time"
)

func TestHistogramBuckets(t *testing.T) {
	prevHigh := int64(-1)
	for i := range histBuckets {
		h := bucketHigh(i)
		if h <= prevHigh {
			t.Fatalf("bucket %d high %d not above previous %d", i, h, prevHigh)
		}
		if b := bucketOf(h); b != i {
			t.Fatalf("bucketOf(bucketHigh(%d)=%d) = %d", i, h, b)
		}
		if b := bucketOf(prevHigh + 1); b != i {
			t.Fatalf("bucketOf(%d) = %d, want %d", prevHigh+1, b, i)
		}
		// Relative width under 1/64 above the exact range.
		if lo := prevHigh + 1; lo >= histLinear && float64(h-lo+1)/float64(lo) > 1.0/64 {
			t.Fatalf("bucket %d [%d, %d] too wide", i, lo, h)
		}
		prevHigh = h
		if h > 1<<62 {
			break
		}
	}
}

func TestHistogramQuantiles(t *testing.T) {
	var a, b Histogram
	for v := int64(1); v <= 1000; v++ {
		a.Record(v)
	}
	for v := int64(1001); v <= 2000; v++ {
		b.Record(v * 1000) // 1.001 ms .. 2 ms
	}
	a.Merge(&b)
	if a.Count() != 2000 {
		t.Fatalf("count %d", a.Count())
	}
	steps := []struct {
		q    float64
		want int64
		tol  float64
	}{
		{0.25, 500, 0},               // exact below 1024 ns
		{0.5, 1000, 0},               // the last of the first half
		{0.75, 1_500_000, 1.0 / 64},  // within a bucket's width
		{0.999, 1_998_000, 1.0 / 64}, //
		{1, 2_000_000, 0},            // max is exact
	}
	for _, s := range steps {
		got := int64(a.Quantile(s.q))
		if d := float64(got-s.want) / float64(s.want); d < 0 || d > s.tol {
			t.Errorf("Quantile(%v) = %d, want %d (+%.1f%%)", s.q, got, s.want, 100*s.tol)
		}
	}
	if a.Max() != 2*time.Millisecond {
		t.Errorf("Max = %v", a.Max())
	}
	sum := a.Summary()
	if sum.Samples != 2000 || sum.P50Ns != 1000 || sum.MaxNs != 2_000_000 {
		t.Errorf("Summary = %+v", sum)
	}
	var empty Histogram
	if empty.Quantile(0.99) != 0 || empty.Mean() != 0 {
		t.Error("empty histogram is not zero")
	}
}
