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

// TestRingHoldsRefusals: refusals recorded while their stripe is held
// wait in its ring, copied from a buffer the caller reuses, keys of every
// length a slot holds; the holder's unlock adds them, each key's exactly.
func TestRingHoldsRefusals(t *testing.T) {
	c := &clock{}
	tr := New(DefaultCounters, time.Minute, 1, c.now)
	defer tr.Close()
	tr.Record("p", "start", 1) // starts the goroutine: Record uses the rings
	home := tr.keyHash("start") & (stripes - 1)
	var keys []string
	for l := 1; l <= ringKey; l++ {
		b := make([]byte, l)
		for i := 0; ; i++ {
			for j := range b {
				b[j] = 'a' + byte(i>>(2*j))%64 // distinct for each i below 64
			}
			if key := string(b); tr.keyHash(key)&(stripes-1) == home {
				keys = append(keys, key)
				break
			}
		}
	}
	s := &tr.stripes[home]
	s.mu.Lock()
	want := map[string]uint64{"start": 1}
	buf := make([]byte, 0, ringKey)
	for i := range 2 * len(keys) {
		key := keys[i%len(keys)]
		buf = append(buf[:0], key...)
		tr.Record("p", unsafeString(buf), 1+i%3)
		want[key] += uint64(1 + i%3)
		for j := range buf {
			buf[j] = 'x' // the caller reuses its buffer
		}
	}
	if waiting := s.tail.Load() - s.head; waiting != uint64(2*len(keys)) {
		t.Fatalf("%d refusals in the ring, want %d", waiting, 2*len(keys))
	}
	if got := len(s.ring[0].counters); got != 1 {
		t.Fatalf("%d counters while the stripe is held, want 1", got)
	}
	s.unlock(tr.perLock)
	if s.tail.Load() != s.head {
		t.Fatalf("ring not emptied by the unlock: tail %d head %d", s.tail.Load(), s.head)
	}
	got := tr.Top("p", -1)
	if len(got) != len(want) {
		t.Fatalf("%d keys, want %d", len(got), len(want))
	}
	for _, e := range got {
		if e.Count != want[e.Key] || e.Error != 0 {
			t.Errorf("%q: count %d error %d, want %d", e.Key, e.Count, e.Error, want[e.Key])
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

// TestDoor: once a stripe's summary has pruned, a new key's first
// refusal of cost 1 only sets its bit at the door, and its next one gets
// a counter; a refusal of a higher cost gets one at once. After 4k such
// first refusals the door starts a new generation, which adds one to
// every key's error. Counts bracket the true counts throughout.
func TestDoor(t *testing.T) {
	c := &clock{}
	tr := New(DefaultCounters, time.Minute, 1, c.now)
	defer tr.Close()
	k := tr.perLock
	home := tr.keyHash("x") & (stripes - 1)
	var fresh []string // keys of x's stripe
	for i := 0; len(fresh) < 8*k+100; i++ {
		if key := fmt.Sprintf("key-%d", i); tr.keyHash(key)&(stripes-1) == home {
			fresh = append(fresh, key)
		}
	}
	exact := map[string]uint64{}
	rec := func(key string, n int) {
		tr.direct("p", key, n)
		exact[key] += uint64(n)
	}
	sm := &tr.stripes[home].ring[0]
	for _, key := range fresh[:2*k] { // 2k keys: the summary prunes
		rec(key, 2)
	}
	if sm.dec == 0 || sm.kept != 1 {
		t.Fatalf("after 2k keys: dec %d kept %d, want a prune and the door open", sm.dec, sm.kept)
	}
	counted := func(key string) bool {
		for i := range sm.counters {
			if sm.counters[i].key() == key {
				return true
			}
		}
		return false
	}
	rec("x", 1)
	if counted("x") {
		t.Fatalf("x has a counter after its first refusal past the door")
	}
	rec("x", 1)
	if !counted("x") {
		t.Fatalf("x has no counter after its second refusal")
	}
	rec("y-heavy", 3)
	if tr.keyHash("y-heavy")&(stripes-1) == home && !counted("y-heavy") {
		t.Fatalf("a refusal of cost 3 was kept out")
	}
	// 4k new keys refused once: one generation ends (a key whose bit
	// another set goes in instead, so take more).
	for _, key := range fresh[2*k:] {
		rec(key, 1)
	}
	if sm.kept < 2 {
		t.Fatalf("kept %d after %d new keys, want a second generation", sm.kept, len(fresh)-2*k)
	}
	var perStripe uint64
	for key, n := range exact {
		if tr.keyHash(key)&(stripes-1) == home {
			perStripe += n
		}
	}
	bound := perStripe/uint64(k+1) + 1
	for _, e := range tr.Top("p", -1) {
		truth := exact[e.Key]
		if e.Count < truth || e.Count > truth+e.Error {
			t.Errorf("%s: count %d error %d, true %d", e.Key, e.Count, e.Error, truth)
		}
		if tr.keyHash(e.Key)&(stripes-1) == home && e.Error > bound {
			t.Errorf("%s: error %d above N/(k+1)+1 = %d", e.Key, e.Error, bound)
		}
	}
}
