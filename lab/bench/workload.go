package bench

import (
	"fmt"
	"strconv"
	"sync"

	"github.com/slidegate/slidegate/lab/internal/keydist"
)

// Keys returns n distinct keys, "k0" … "k<n-1>", built once per n and
// shared: benchmark loops index into the slice instead of formatting.
func Keys(n int) []string {
	keysMu.Lock()
	defer keysMu.Unlock()
	if ks, ok := keysCache[n]; ok {
		return ks
	}
	ks := make([]string, n)
	for i := range ks {
		ks[i] = "k" + strconv.Itoa(i)
	}
	keysCache[n] = ks
	return ks
}

var (
	keysMu    sync.Mutex
	keysCache = map[int][]string{}
)

// StreamLen is the length of a precomputed index stream: long enough that
// a goroutine cycling through it revisits keys the way the distribution
// says, short enough (16 MiB) to build in well under a second.
const StreamLen = 1 << 22

// Distribution names a key-choice distribution.
type Distribution string

// The distributions of the benchmarks.
const (
	Uniform Distribution = keydist.Uniform
	Zipf    Distribution = keydist.Zipf // s = ZipfS, rank 0 hottest
)

// ZipfS is the Zipf exponent of the skewed scenarios.
const ZipfS = 1.1

// Stream returns a precomputed stream of StreamLen key indexes in [0, n)
// drawn from d with a fixed seed, built once per (d, n) and shared. The
// loops of parallel benchmarks read it from different offsets, so choosing
// a key costs one load.
func Stream(d Distribution, n int) ([]uint32, error) {
	streamMu.Lock()
	defer streamMu.Unlock()
	k := streamKey{d, n}
	if s, ok := streamCache[k]; ok {
		return s, nil
	}
	if n < 1 || int64(n) > 1<<31 {
		return nil, fmt.Errorf("bench: key count %d outside 1..2^31", n)
	}
	if d != Uniform && d != Zipf {
		return nil, fmt.Errorf("bench: unknown distribution %q", d)
	}
	c, err := keydist.NewChooser(string(d), n, ZipfS, 1, uint64(n))
	if err != nil {
		return nil, fmt.Errorf("bench: %w", err)
	}
	s := make([]uint32, StreamLen)
	for i := range s {
		s[i] = uint32(c.Next())
	}
	streamCache[k] = s
	return s, nil
}

type streamKey struct {
	d Distribution
	n int
}

var (
	streamMu    sync.Mutex
	streamCache = map[streamKey][]uint32{}
)

// Cursor walks a stream from a starting offset, wrapping around. Each
// goroutine of a parallel benchmark owns one.
type Cursor struct {
	s []uint32
	i int
}

// NewCursor returns a cursor over s starting at offset off (taken modulo
// len(s)). Giving each goroutine a different offset keeps them from
// hitting the same key at the same time more than the distribution does.
func NewCursor(s []uint32, off int) *Cursor {
	return &Cursor{s: s, i: off % len(s)}
}

// Next returns the next index.
func (c *Cursor) Next() uint32 {
	v := c.s[c.i]
	c.i++
	if c.i == len(c.s) {
		c.i = 0
	}
	return v
}
