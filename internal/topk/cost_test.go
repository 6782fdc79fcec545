package topk

import (
	"fmt"
	"math/rand/v2"
	"testing"
	"time"
)

// TestSmallNth: the histogram agrees with nthLargest whenever it answers,
// and declines when the answer is smallCounts or more.
func TestSmallNth(t *testing.T) {
	r := rand.New(rand.NewPCG(9, 10))
	for range 3000 {
		cs := make([]counter, 2+r.IntN(60))
		s := make([]uint64, len(cs))
		top := 1 + r.IntN(2*smallCounts)
		for i := range cs {
			cs[i].count = 1 + uint64(r.IntN(top))
			s[i] = cs[i].count
		}
		n := r.IntN(len(cs))
		want := nthLargest(s, n)
		got, ok := smallNth(cs, n)
		if ok != (want < smallCounts) || ok && got != want {
			t.Fatalf("smallNth(%d) of %v = %d, %v; nthLargest %d", n, s, got, ok, want)
		}
	}
}

// TestIndexClusters: with a stripe's summary just below 2k counters, its
// index has short runs of full cells. A lookup walks at most the run it
// starts in, so the mean run a counter sits in bounds the probes. The
// stripe is picked by the hash's low bits, so an index that started from
// those bits would use one cell in stripes and pile its keys into runs.
func TestIndexClusters(t *testing.T) {
	c := &clock{}
	tr := New(DefaultCounters, time.Minute, 1, c.now)
	defer tr.Close()
	k := tr.perLock
	s := &tr.stripes[0]
	for i := 0; ; i++ {
		key := fmt.Sprintf("client-%d", i)
		if tr.keyHash(key)&(stripes-1) != 0 {
			continue
		}
		tr.direct("p", key, 1)
		if len(s.ring[0].counters) == 2*k-1 {
			break
		}
	}
	idx := s.ring[0].idx
	// For each full cell, the full cells before it in its run.
	total, run := 0, 0
	for i := range 2 * len(idx) { // twice round: a run may wrap
		if idx[i%len(idx)].slot == 0 {
			run = 0
			continue
		}
		run++
		if i >= len(idx) {
			total += run - 1
		}
	}
	mean := float64(total) / float64(2*k-1)
	// Linear probing at half load: about (1/(1-a)²-1)/2 = 1.5 cells.
	if mean > 3 {
		t.Fatalf("mean cells before a counter in its run %.2f, want at most 3", mean)
	}
	t.Logf("%d counters in %d cells: mean %.2f cells before a counter in its run", 2*k-1, len(idx), mean)
}

// TestRepeatsShareAnEntry: refusals that go to a batch while their
// stripe is busy take one entry per key, however often the key repeats,
// so a hot key does not fill batches; the counts add up.
func TestRepeatsShareAnEntry(t *testing.T) {
	c := &clock{}
	tr := New(DefaultCounters, time.Minute, 1, c.now)
	defer tr.Close()
	keys := []string{"hot-a", "hot-b", "a-somewhat-longer-hot-key"}
	for i := range tr.stripes {
		tr.stripes[i].mu.Lock() // busy: every refusal goes to a batch
	}
	for i := range 300 {
		tr.Record("p", keys[i%len(keys)], 1+i%2)
	}
	ents := 0
	for i := range tr.shelves {
		sh := &tr.shelves[i]
		sh.mu.Lock()
		ents += len(sh.cur.ents)
		sh.mu.Unlock()
	}
	tr.qmu.Lock()
	queued := len(tr.queue)
	tr.qmu.Unlock()
	for i := range tr.stripes {
		tr.stripes[i].mu.Unlock()
	}
	if ents != len(keys) || queued != 0 {
		t.Fatalf("%d entries in the shelves and %d batches queued, want %d and 0", ents, queued, len(keys))
	}
	got := map[string]uint64{}
	for _, e := range tr.Top("p", -1) {
		got[e.Key] = e.Count
		if e.Error != 0 {
			t.Fatalf("%s: error %d, want 0", e.Key, e.Error)
		}
	}
	for j, k := range keys {
		var want uint64
		for i := j; i < 300; i += len(keys) {
			want += uint64(1 + i%2)
		}
		if got[k] != want {
			t.Fatalf("%s: count %d, want %d", k, got[k], want)
		}
	}
}

// TestKeyHashSpreads: short keys of every length get distinct hashes,
// spread evenly over the stripes and over the index's bits.
func TestKeyHashSpreads(t *testing.T) {
	tr := New(DefaultCounters, time.Minute, 1, (&clock{}).now)
	defer tr.Close()
	seen := map[uint64]string{}
	var perStripe [stripes]int
	var perHigh [16]int
	n := 0
	for l := range 21 {
		for i := range 10000 {
			key := fmt.Sprintf("%0*d", l, i)
			if len(key) != l {
				key = key[len(key)-l:]
			}
			if _, dup := seen[tr.keyHash(key)]; dup && seen[tr.keyHash(key)] != key {
				t.Fatalf("%q and %q share a hash", key, seen[tr.keyHash(key)])
			}
			seen[tr.keyHash(key)] = key
		}
	}
	for i := range 160000 {
		h := tr.keyHash(fmt.Sprintf("client-%d", i))
		perStripe[h&(stripes-1)]++
		perHigh[(h>>32)&15]++
		n++
	}
	for i, m := range perStripe {
		if d := float64(m)/float64(n/stripes) - 1; d > 0.05 || d < -0.05 {
			t.Fatalf("stripe %d has %d of %d keys", i, m, n)
		}
	}
	for i, m := range perHigh {
		if d := float64(m)/float64(n/16) - 1; d > 0.05 || d < -0.05 {
			t.Fatalf("index bits %d have %d of %d keys", i, m, n)
		}
	}
}

// TestKeyHashSecret: the mixing is symmetric in its two words, so with
// known or equal secrets a key's halves swapped would share its hash. A
// Tracker's secrets are random: the swap and other Trackers differ.
func TestKeyHashSecret(t *testing.T) {
	a := New(DefaultCounters, time.Minute, 1, (&clock{}).now)
	defer a.Close()
	b := New(DefaultCounters, time.Minute, 1, (&clock{}).now)
	defer b.Close()
	const key, swapped = "abcdefghijklmnop", "ijklmnopabcdefgh"
	if a.keyHash(key) == a.keyHash(swapped) {
		t.Fatalf("%q and %q share a hash", key, swapped)
	}
	if a.keyHash(key) == b.keyHash(key) {
		t.Fatalf("two Trackers hash %q alike", key)
	}
}
