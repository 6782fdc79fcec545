package bench

import (
	"slices"
	"testing"
)

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
