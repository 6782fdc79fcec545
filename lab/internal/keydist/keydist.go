// Package keydist draws key indices from the distributions slidegate's
// benchmarks and load tests use: uniform, and a Zipf law with client 0 the
// hottest. Every stream is a deterministic PCG stream, so runs are
// reproducible from their seed.
package keydist

import (
	"fmt"
	"math/rand/v2"
)

// Distribution names.
const (
	Uniform = "uniform"
	Zipf    = "zipf"
)

// Chooser draws indices in [0, n) from a distribution. A Chooser is not
// safe for concurrent use: give each goroutine its own (NewChooser with a
// distinct stream).
type Chooser struct {
	n    int
	rng  *rand.Rand
	zipf *rand.Zipf
}

// NewChooser returns a chooser over n indices. dist is Uniform or Zipf; for
// Zipf, index i is drawn with probability proportional to 1/(i+1)^s, s > 1
// (index 0 is the hottest). seed and stream pick the PCG stream.
func NewChooser(dist string, n int, s float64, seed, stream uint64) (*Chooser, error) {
	if n < 1 {
		return nil, fmt.Errorf("keydist: clients %d must be at least 1", n)
	}
	c := &Chooser{n: n, rng: rand.New(rand.NewPCG(seed, stream))}
	switch dist {
	case Uniform:
	case Zipf:
		if !(s > 1) {
			return nil, fmt.Errorf("keydist: zipf exponent %v must be greater than 1", s)
		}
		// rand.NewZipf draws from [0, imax] with P(k) ∝ (v+k)^-s.
		c.zipf = rand.NewZipf(c.rng, s, 1, uint64(n-1))
	default:
		return nil, fmt.Errorf("keydist: unknown key distribution %q (want uniform or zipf)", dist)
	}
	return c, nil
}

// Next returns the next index.
func (c *Chooser) Next() int {
	if c.zipf != nil {
		return int(c.zipf.Uint64())
	}
	return c.rng.IntN(c.n)
}

// Cost returns a request cost uniform in [1, max], drawn from the same
// stream.
func (c *Chooser) Cost(max int) int {
	if max <= 1 {
		return 1
	}
	return 1 + c.rng.IntN(max)
}
