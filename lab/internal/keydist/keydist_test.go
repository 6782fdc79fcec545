package keydist

import (
	"math"
	"testing"
)

func TestNewChooserErrors(t *testing.T) {
	for _, tc := range []struct {
		dist string
		n    int
		s    float64
	}{{Uniform, 0, 0}, {Zipf, 10, 1}, {Zipf, 10, 0.5}, {"pareto", 10, 1.1}} {
		if _, err := NewChooser(tc.dist, tc.n, tc.s, 1, 0); err == nil {
			t.Errorf("NewChooser(%q, %d, %v) succeeded", tc.dist, tc.n, tc.s)
		}
	}
}

// draw counts n draws over clients.
func draw(t *testing.T, dist string, clients int, s float64, n int) []int {
	t.Helper()
	ch, err := NewChooser(dist, clients, s, 7, 3)
	if err != nil {
		t.Fatal(err)
	}
	counts := make([]int, clients)
	for range n {
		i := ch.Next()
		if i < 0 || i >= clients {
			t.Fatalf("index %d outside [0, %d)", i, clients)
		}
		counts[i]++
	}
	return counts
}

// TestUniformSpread checks uniform draws with a chi-square test: with 99
// degrees of freedom the statistic exceeds 150 with probability < 0.1%
// (the seed is fixed, so the test is deterministic).
func TestUniformSpread(t *testing.T) {
	const clients, n = 100, 200_000
	counts := draw(t, Uniform, clients, 0, n)
	want := float64(n) / clients
	chi2 := 0.0
	for _, c := range counts {
		chi2 += (float64(c) - want) * (float64(c) - want) / want
	}
	if chi2 > 150 {
		t.Errorf("chi-square %.1f over 99 degrees of freedom: not uniform; counts %v", chi2, counts[:10])
	}
}

// TestZipfSpread checks Zipf draws against P(i) = (i+1)^-s / H(N, s) for
// the hottest ranks, and that the ranks fall off in order.
func TestZipfSpread(t *testing.T) {
	const clients, n = 1000, 1_000_000
	for _, s := range []float64{1.1, 1.5} {
		counts := draw(t, Zipf, clients, s, n)
		h := 0.0
		for i := range clients {
			h += math.Pow(float64(i+1), -s)
		}
		for i := range 10 {
			want := float64(n) * math.Pow(float64(i+1), -s) / h
			// 5 standard deviations of a binomial count.
			tol := 5 * math.Sqrt(want)
			if math.Abs(float64(counts[i])-want) > tol {
				t.Errorf("s=%v rank %d: %d draws, want %.0f ± %.0f", s, i, counts[i], want, tol)
			}
		}
		// Decile sums fall off monotonically.
		prev := math.MaxInt
		for d := range 10 {
			sum := 0
			for _, c := range counts[d*100 : (d+1)*100] {
				sum += c
			}
			if sum > prev {
				t.Errorf("s=%v decile %d has %d draws, more than decile %d's %d", s, d, sum, d-1, prev)
			}
			prev = sum
		}
	}
}

func TestCost(t *testing.T) {
	ch, _ := NewChooser(Uniform, 10, 0, 1, 1)
	seen := map[int]bool{}
	for range 1000 {
		c := ch.Cost(4)
		if c < 1 || c > 4 {
			t.Fatalf("cost %d outside [1, 4]", c)
		}
		seen[c] = true
	}
	if len(seen) != 4 {
		t.Errorf("costs seen %v, want all of 1..4", seen)
	}
	if c := ch.Cost(1); c != 1 {
		t.Errorf("Cost(1) = %d", c)
	}
}
