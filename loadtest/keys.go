package loadtest

import (
	"fmt"
	"math/rand/v2"
	"strconv"
)

// Key distributions.
const (
	Uniform = "uniform"
	Zipf    = "zipf"
)

// KeyPrefix starts every client key the harness makes: client i is
// "client-<i>". The HTTP recorder maps keys back to indices by it.
const KeyPrefix = "client-"

// ClientKey returns the key of client i. Each call allocates a fresh string,
// so that a limiter populated with it owns its key's bytes, as it would in a
// server (the memory phase counts them).
func ClientKey(i int) string {
	var buf [32]byte
	return string(strconv.AppendInt(append(buf[:0], KeyPrefix...), int64(i), 10))
}

// clientIndex parses a key made by ClientKey; ok is false for other keys.
// It allocates nothing: the recorder calls it for every decision the
// server under test makes, on the server's goroutines.
func clientIndex(key string) (int, bool) {
	if len(key) <= len(KeyPrefix) || key[:len(KeyPrefix)] != KeyPrefix {
		return 0, false
	}
	// Canonical decimal only, as ClientKey writes it: digits, no sign, no
	// leading zero.
	digits := key[len(KeyPrefix):]
	if digits[0] < '0' || digits[0] > '9' || (digits[0] == '0' && len(digits) > 1) {
		return 0, false
	}
	n, err := strconv.Atoi(digits)
	if err != nil {
		return 0, false
	}
	return n, true
}

// Chooser draws client indices in [0, n) from a distribution. A Chooser is
// not safe for concurrent use: give each goroutine its own (NewChooser with
// a distinct stream).
type Chooser struct {
	n    int
	rng  *rand.Rand
	zipf *rand.Zipf
}

// NewChooser returns a chooser over n clients. dist is Uniform or Zipf; for
// Zipf, client i is drawn with probability proportional to 1/(i+1)^s, s > 1
// (client 0 is the hottest). seed and stream pick a deterministic PCG
// stream, so runs are reproducible.
func NewChooser(dist string, n int, s float64, seed, stream uint64) (*Chooser, error) {
	if n < 1 {
		return nil, fmt.Errorf("loadtest: clients %d must be at least 1", n)
	}
	c := &Chooser{n: n, rng: rand.New(rand.NewPCG(seed, stream))}
	switch dist {
	case Uniform:
	case Zipf:
		if !(s > 1) {
			return nil, fmt.Errorf("loadtest: zipf exponent %v must be greater than 1", s)
		}
		// rand.NewZipf draws from [0, imax] with P(k) ∝ (v+k)^-s.
		c.zipf = rand.NewZipf(c.rng, s, 1, uint64(n-1))
	default:
		return nil, fmt.Errorf("loadtest: unknown key distribution %q (want uniform or zipf)", dist)
	}
	return c, nil
}

// Next returns the next client index.
func (c *Chooser) Next() int {
	if c.zipf != nil {
		return int(c.zipf.Uint64())
	}
	return c.rng.IntN(c.n)
}

// Cost returns a request cost uniform in [1, max].
func (c *Chooser) Cost(max int) int {
	if max <= 1 {
		return 1
	}
	return 1 + c.rng.IntN(max)
}
