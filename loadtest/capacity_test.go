package loadtest

import (
	"math"
	"testing"
)

// TestMedian: the capacity phase's medians, odd and even counts, none,
// and the caller's slice left in its order.
func TestMedian(t *testing.T) {
	for _, tc := range []struct {
		in   []float64
		want float64
	}{
		{nil, 0},
		{[]float64{0.7}, 0.7},
		{[]float64{1.38, 0.48, 0.77}, 0.77},
		{[]float64{0.9, 0.5, 0.8, 1.2}, 0.85},
		{[]float64{0, 0, 1}, 0},
	} {
		in := append([]float64(nil), tc.in...)
		if got := medianFloat(in); math.Abs(got-tc.want) > 1e-12 {
			t.Errorf("medianFloat(%v) = %v, want %v", tc.in, got, tc.want)
		}
		for i := range in {
			if in[i] != tc.in[i] {
				t.Errorf("medianFloat reordered its input: %v", in)
			}
		}
	}
	if got := medianInt([]int{6997, 14432, 5246}); got != 6997 {
		t.Errorf("medianInt = %d", got)
	}
	if got := medianInt([]int{4000, 4001}); got != 4001 { // 4000.5 rounds half away from zero
		t.Errorf("medianInt of two = %d", got)
	}
}

// TestMissAbove: the bisection's upper end is the lowest rate missed above
// the highest held; none when nothing above it was missed.
func TestMissAbove(t *testing.T) {
	s := rampState{lastHeld: 5000, missed: []int{3000, 8450, 6500}}
	if got := s.missAbove(); got != 6500 {
		t.Errorf("missAbove = %d, want 6500", got)
	}
	s.missed = []int{3000}
	if got := s.missAbove(); got != 0 {
		t.Errorf("missAbove = %d, want 0", got)
	}
}
