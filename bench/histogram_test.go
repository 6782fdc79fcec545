package bench

import (
	"math/rand/v2"
	"slices"
	"testing"
	"time"
)

func TestHistogramBuckets(t *testing.T) {
	prev := -1
	for v := int64(0); v < 1<<22; v += 1 + v/97 {
		i := histIndex(v)
		if i < prev {
			t.Fatalf("index not monotone at %d: %d after %d", v, i, prev)
		}
		prev = i
		up := histUpper(i)
		if up < v {
			t.Fatalf("value %d in bucket %d whose upper edge is %d", v, i, up)
		}
		if v >= 128 && float64(up-v) > float64(v)/64 {
			t.Fatalf("value %d: bucket upper %d is more than 1/64 above", v, up)
		}
		if i > 0 && histUpper(i-1) >= v && histIndex(histUpper(i-1)) == i-1 {
			t.Fatalf("value %d fits bucket %d below its own %d", v, i-1, i)
		}
	}
}

func TestHistogramQuantiles(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	var a, b Histogram
	vals := make([]int64, 0, 100000)
	for i := range 100000 {
		v := int64(r.ExpFloat64() * 5000)
		vals = append(vals, v)
		if i%2 == 0 {
			a.Record(v)
		} else {
			b.Record(v)
		}
	}
	a.Merge(&b)
	if a.Count() != 100000 {
		t.Fatalf("count %d", a.Count())
	}
	slices.Sort(vals)
	for _, q := range []float64{0.5, 0.99, 0.999, 1} {
		want := vals[min(int(q*float64(len(vals))), len(vals)-1)]
		got := int64(a.Quantile(q))
		if got < want || float64(got-want) > float64(want)/64+1 {
			t.Errorf("q%.3f = %d, want %d within 1/64 above", q, got, want)
		}
	}
	if a.Max() != time.Duration(vals[len(vals)-1]) {
		t.Errorf("max %v, want %d", a.Max(), vals[len(vals)-1])
	}
	var empty Histogram
	if empty.Quantile(0.5) != 0 {
		t.Error("empty histogram quantile not 0")
	}
}

func TestStreams(t *testing.T) {
	if _, err := Stream("pareto", 10); err == nil {
		t.Error("unknown distribution: no error")
	}
	if _, err := Stream(Uniform, 0); err == nil {
		t.Error("zero keys: no error")
	}
	const n = 1000
	z, err := Stream(Zipf, n)
	if err != nil {
		t.Fatal(err)
	}
	u, err := Stream(Uniform, n)
	if err != nil {
		t.Fatal(err)
	}
	var zc, uc [n]int
	for i := range z {
		zc[z[i]]++
		uc[u[i]]++
	}
	// Zipf s = 1.1 over 1000 ranks: rank 0 takes about 1/H(1000, 1.1) ≈ 20 %;
	// uniform about 0.1 %.
	if f := float64(zc[0]) / StreamLen; f < 0.15 || f > 0.3 {
		t.Errorf("zipf rank 0 share %.3f, want about 0.2", f)
	}
	if f := float64(uc[0]) / StreamLen; f > 0.002 {
		t.Errorf("uniform index 0 share %.4f, want about 0.001", f)
	}
	ks := Keys(n)
	if len(ks) != n || ks[7] != "k7" || &Keys(n)[0] != &ks[0] {
		t.Error("Keys: wrong or not shared")
	}
	c := NewCursor([]uint32{1, 2, 3}, 5)
	if got := []uint32{c.Next(), c.Next(), c.Next()}; !slices.Equal(got, []uint32{3, 1, 2}) {
		t.Errorf("cursor from offset 5 over 3: %v", got)
	}
}
