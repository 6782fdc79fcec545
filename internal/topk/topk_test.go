package topk

import (
	"fmt"
	"math/rand/v2"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"

	"github.com/slidegate/slidegate/internal/leakcheck"
)

func TestMain(m *testing.M) { leakcheck.VerifyTestMain(m) }

// clock is a clock the test moves; the Tracker's goroutine reads it.
type clock struct{ ns atomic.Int64 }

func (c *clock) now() int64 { return c.ns.Load() }

// TestExactBelowCapacity: with fewer keys than counters, every count is
// exact and no error is claimed.
func TestExactBelowCapacity(t *testing.T) {
	c := &clock{}
	tr := New(1024, time.Minute, 5, c.now)
	defer tr.Close()
	want := map[string]uint64{}
	r := rand.New(rand.NewPCG(1, 2))
	for range 20000 {
		k := fmt.Sprintf("k%d", r.IntN(300))
		n := 1 + r.IntN(3)
		tr.Record("api", k, n)
		want[k] += uint64(n)
	}
	got := tr.Top("api", -1)
	if len(got) != len(want) {
		t.Fatalf("Top has %d keys, want %d", len(got), len(want))
	}
	for i, e := range got {
		if e.Count != want[e.Key] || e.Error != 0 {
			t.Errorf("%s: count %d error %d, want %d and 0", e.Key, e.Count, e.Error, want[e.Key])
		}
		if i > 0 && got[i-1].Count < e.Count {
			t.Errorf("not sorted at %d: %d before %d", i, got[i-1].Count, e.Count)
		}
	}
}

// TestAccuracyAgainstExactCounts: a Zipf stream over far more keys than
// counters. Every reported count brackets the true count within its
// error, every error is within N/(k+1)+1 of its stripe (the one for the
// door), and every key refused more than that in its stripe is reported, so
// the heavy hitters are all there.
func TestAccuracyAgainstExactCounts(t *testing.T) {
	c := &clock{}
	const counters = 256
	tr := New(counters, time.Minute, 1, c.now)
	defer tr.Close()
	r := rand.New(rand.NewPCG(3, 4))
	z := rand.NewZipf(r, 1.2, 1, 99999)
	exact := map[string]uint64{}
	perStripe := [stripes]uint64{}
	const total = 200000
	for range total {
		k := fmt.Sprintf("client-%d", z.Uint64())
		tr.Record("rule", k, 1)
		exact[k]++
		perStripe[tr.keyHash(k)&(stripes-1)]++
	}
	k1 := uint64(tr.perLock) + 1
	got := tr.Top("rule", -1)
	reported := map[string]Entry{}
	for _, e := range got {
		reported[e.Key] = e
		truth := exact[e.Key]
		if e.Count < truth || e.Count > truth+e.Error {
			t.Errorf("%s: count %d error %d, true %d", e.Key, e.Count, e.Error, truth)
		}
		if bound := perStripe[tr.keyHash(e.Key)&(stripes-1)]/k1 + 1; e.Error > bound {
			t.Errorf("%s: error %d above N/(k+1)+1 = %d", e.Key, e.Error, bound)
		}
	}
	for key, n := range exact {
		if bound := perStripe[tr.keyHash(key)&(stripes-1)]/k1 + 1; n > bound {
			if _, ok := reported[key]; !ok {
				t.Errorf("%s refused %d times (> N/(k+1)+1 = %d) is missing", key, n, bound)
			}
		}
	}
	// The ten heaviest by true count lead the answer, in some order.
	top := tr.Top("rule", 10)
	if len(top) != 10 {
		t.Fatalf("Top(10) has %d", len(top))
	}
	var heavy []uint64
	for _, n := range exact {
		heavy = append(heavy, n)
	}
	sortDesc(heavy)
	for _, e := range top {
		if exact[e.Key] < heavy[9]-min(heavy[9], e.Error) {
			t.Errorf("%s (true %d) in the top ten, whose tenth has %d", e.Key, exact[e.Key], heavy[9])
		}
	}
	t.Logf("%d refusals, %d distinct keys, %d counters: %d reported, largest error %d", total, len(exact), counters, len(got), maxError(got))
}

func sortDesc(s []uint64) {
	for i := 1; i < len(s); i++ {
		for j := i; j > 0 && s[j] > s[j-1]; j-- {
			s[j], s[j-1] = s[j-1], s[j]
		}
	}
}

func maxError(es []Entry) uint64 {
	var m uint64
	for _, e := range es {
		m = max(m, e.Error)
	}
	return m
}

// TestWindow: a refusal counts while its epoch is one of the last epochs
// and is gone after.
func TestWindow(t *testing.T) {
	c := &clock{}
	tr := New(64, time.Minute, 5, c.now)
	defer tr.Close()
	tr.Record("p", "a", 1)
	c.ns.Store(int64(4*time.Minute + 59*time.Second))
	tr.advance() // the goroutine's tick
	tr.Record("p", "a", 2)
	if got := tr.Top("p", 1); len(got) != 1 || got[0].Count != 3 {
		t.Fatalf("within the window: %+v, want a with 3", got)
	}
	c.ns.Store(int64(5 * time.Minute))
	if got := tr.Top("p", 1); len(got) != 1 || got[0].Count != 2 {
		t.Fatalf("after the first epoch left: %+v, want a with 2", got)
	}
	c.ns.Store(int64(10 * time.Minute))
	if got := tr.Top("p", 1); len(got) != 0 {
		t.Fatalf("after the window: %+v, want none", got)
	}
	// A recycled slot forgets its old keys.
	tr.Record("p", "b", 1)
	if got := tr.Top("", -1); len(got) != 1 || got[0].Key != "b" {
		t.Fatalf("after reuse: %+v, want only b", got)
	}
}

// TestNames: Top filters by name; the same key under two names is two
// entries.
func TestNames(t *testing.T) {
	c := &clock{}
	tr := New(64, time.Minute, 5, c.now)
	defer tr.Close()
	tr.Record("login", "10.0.0.1", 3)
	tr.Record("api", "10.0.0.1", 1)
	if got := tr.Top("login", -1); len(got) != 1 || got[0].Count != 3 || got[0].Name != "login" {
		t.Fatalf("Top(login) = %+v", got)
	}
	if got := tr.Top("", -1); len(got) != 2 {
		t.Fatalf("Top(all) = %+v", got)
	}
}

// TestRecordCopiesKey: the caller may reuse the key's bytes.
func TestRecordCopiesKey(t *testing.T) {
	c := &clock{}
	tr := New(64, time.Minute, 5, c.now)
	defer tr.Close()
	buf := []byte("alice")
	tr.Record("p", unsafeString(buf), 1)
	copy(buf, "mallo")
	if got := tr.Top("p", 1); got[0].Key != "alice" {
		t.Fatalf("key = %q, want alice", got[0].Key)
	}
}

// TestConcurrentRecord: concurrent refusals of a few keys, read while
// they happen; with room for every key the totals are exact.
func TestConcurrentRecord(t *testing.T) {
	c := &clock{}
	tr := New(64, time.Minute, 5, c.now)
	defer tr.Close()
	var wg sync.WaitGroup
	const workers, each = 8, 2000
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range each {
				tr.Record("p", fmt.Sprintf("k%d", (w+i)%16), 1)
			}
		}()
	}
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			select {
			case <-stop:
				return
			default:
				tr.Top("p", 5)
			}
		}
	}()
	wg.Wait()
	close(stop)
	<-done
	var sum uint64
	for _, e := range tr.Top("p", -1) {
		sum += e.Count
	}
	if sum != workers*each {
		t.Fatalf("sum of counts %d, want %d", sum, workers*each)
	}
}

func BenchmarkRecord(b *testing.B) {
	c := &clock{}
	tr := New(DefaultCounters, DefaultEpoch, DefaultEpochs, c.now)
	defer tr.Close()
	keys := make([]string, 1<<16)
	for i := range keys {
		keys[i] = fmt.Sprintf("client-%d", i)
	}
	// first: the key's stripe is free; ring: it is busy, the refusal
	// waits in its ring; wait: the ring is full too, Record waits.
	for busy, path := range []string{"first", "ring", "wait"} {
		b.Run("hot/"+path, func(b *testing.B) { // the same few keys: counters exist
			tr.SetBusy(busy)
			b.ReportAllocs()
			i := 0
			for b.Loop() {
				tr.Record("p", keys[i&15], 1)
				i++
			}
		})
		b.Run("distinct/"+path, func(b *testing.B) { // a new key each time: evictions
			tr.SetBusy(busy)
			b.ReportAllocs()
			i := 0
			for b.Loop() {
				tr.Record("p", keys[i&(len(keys)-1)], 1)
				i++
			}
		})
	}
}

// TestIndexUnderChurn: after many prunes every counter is found by its
// hash at its slot, the index holds exactly the counters, fewer than 2k,
// and each counter's key hashes to its hash.
func TestIndexUnderChurn(t *testing.T) {
	c := &clock{}
	tr := New(64, time.Minute, 1, c.now)
	defer tr.Close()
	r := rand.New(rand.NewPCG(5, 6))
	for i := range 200000 {
		tr.Record("p", fmt.Sprintf("k%d", r.IntN(5000)), 1+i%3)
	}
	tr.flushAll()
	for si := range tr.stripes {
		sm := &tr.stripes[si].ring[0]
		if sm.dec == 0 {
			t.Fatalf("stripe %d: no prune", si)
		}
		if len(sm.counters) >= 2*tr.perLock {
			t.Fatalf("stripe %d: %d counters, want < %d", si, len(sm.counters), 2*tr.perLock)
		}
		used := 0
		for _, cl := range sm.idx {
			if cl.slot > 0 {
				used++
			}
		}
		if used != len(sm.counters) {
			t.Fatalf("stripe %d: %d cells used, %d counters", si, used, len(sm.counters))
		}
		for slot := range sm.counters {
			ct := &sm.counters[slot]
			if got := sm.find(ct.h); sm.idx[got].slot != int32(slot+1) {
				t.Fatalf("stripe %d slot %d: its hash finds slot %d", si, slot, sm.idx[got].slot-1)
			}
			if h := tr.keyHash(ct.key()) ^ nameHash(ct.name); h != ct.h || ct.count == 0 {
				t.Fatalf("stripe %d slot %d: key %q name %q count %d, hash %x want %x", si, slot, ct.key(), ct.name, ct.count, ct.h, h)
			}
		}
	}
}

// TestNthLargest against a sort, on sizes and values with many ties.
func TestNthLargest(t *testing.T) {
	r := rand.New(rand.NewPCG(7, 8))
	for range 2000 {
		s := make([]uint64, 1+r.IntN(40))
		for i := range s {
			s[i] = uint64(r.IntN(1 + r.IntN(20)))
		}
		want := append([]uint64(nil), s...)
		sortDesc(want)
		n := r.IntN(len(s))
		if got := nthLargest(s, n); got != want[n] {
			t.Fatalf("nthLargest(%v, %d) = %d, want %d", want, n, got, want[n])
		}
	}
}

// TestRecordAllocatesNothing: in a flood of keys far more than the
// counters, once every counter has held a key, a refusal allocates
// nothing: Record adds to a counter or copies the key into a ring, and a new counter reuses
// the room of the key it replaces.
func TestRecordAllocatesNothing(t *testing.T) {
	c := &clock{}
	tr := New(DefaultCounters, time.Minute, 1, c.now)
	defer tr.Close()
	keys := make([]string, 1<<14)
	for i := range keys {
		keys[i] = fmt.Sprintf("client-%05d", i)
	}
	for _, k := range keys {
		tr.Record("p", k, 1)
	}
	tr.flushAll()
	i := 0
	allocs := testing.AllocsPerRun(20000, func() {
		tr.Record("p", keys[i%len(keys)], 1)
		i++
		if i%1000 == 0 {
			tr.flushAll() // the summaries replace counters here too
		}
	})
	if allocs != 0 {
		t.Fatalf("%v allocations a refusal, want 0", allocs)
	}
}

// TestConcurrentRecordTopClose: at GOMAXPROCS 32, refusals from many
// goroutines while Top is read and the Tracker closes halfway. With room
// for every key, no refusal is lost: the counts after Close add up to
// every refusal, each key's exactly.
func TestConcurrentRecordTopClose(t *testing.T) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(32))
	c := &clock{}
	tr := New(1024, time.Minute, 5, c.now)
	const workers, each, keys = 64, 3000, 200
	var wg sync.WaitGroup
	var recorded atomic.Int64
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			buf := make([]byte, 0, 16)
			for i := range each {
				// A reused buffer, as the decision path's keys are.
				buf = fmt.Appendf(buf[:0], "k%d", (w*7+i)%keys)
				tr.Record("p", unsafeString(buf), 1+i%2)
				recorded.Add(int64(1 + i%2))
			}
		}()
	}
	stop := make(chan struct{})
	reader := make(chan struct{})
	go func() {
		defer close(reader)
		for {
			select {
			case <-stop:
				return
			default:
			}
			for _, e := range tr.Top("p", 10) {
				if e.Error != 0 {
					t.Errorf("%s: error %d with room for every key", e.Key, e.Error)
					return
				}
			}
		}
	}()
	for recorded.Load() < workers*each/2 {
		runtime.Gosched()
	}
	tr.Close()
	wg.Wait()
	close(stop)
	<-reader
	want := map[string]uint64{}
	for w := range workers {
		for i := range each {
			want[fmt.Sprintf("k%d", (w*7+i)%keys)] += uint64(1 + i%2)
		}
	}
	got := tr.Top("p", -1)
	if len(got) != len(want) {
		t.Fatalf("%d keys, want %d", len(got), len(want))
	}
	for _, e := range got {
		if e.Count != want[e.Key] || e.Error != 0 {
			t.Errorf("%s: count %d error %d, want %d", e.Key, e.Count, e.Error, want[e.Key])
		}
	}
}

// TestStaleRingEntryDropped: a refusal stamped with an epoch that has
// left the window, added from a ring after a newer epoch took its
// summary's place, is dropped and does not empty the newer summary.
func TestStaleRingEntryDropped(t *testing.T) {
	c := &clock{}
	tr := New(64, time.Minute, 2, c.now)
	defer tr.Close()
	tr.Record("p", "start", 1) // starts the goroutine: Record uses the rings
	// A key of old's stripe, so that both use one ring of summaries.
	newer := "new"
	for i := 0; tr.keyHash(newer)&(stripes-1) != tr.keyHash("old")&(stripes-1); i++ {
		newer = fmt.Sprintf("new%d", i)
	}
	tr.SetBusy(1)
	tr.Record("p", "old", 1) // stamped epoch 0, left in the stripe's ring
	tr.SetBusy(0)
	c.ns.Store(int64(2 * time.Minute))
	tr.direct("p", newer, 5) // epoch 2 takes epoch 0's place, then adds the ring
	got := tr.Top("p", -1)
	if len(got) != 1 || got[0].Key != newer || got[0].Count != 5 {
		t.Fatalf("%+v, want only %s with 5", got, newer)
	}
}

// TestMemoryPerCounter: a minute's summaries take the 196 bytes a
// counter that docs/operations.md and server's MaxTopCounters state,
// besides the keys.
func TestMemoryPerCounter(t *testing.T) {
	c := &clock{}
	tr := New(DefaultCounters, time.Minute, 1, c.now)
	defer tr.Close()
	for i := range 1 << 14 {
		tr.Record("p", fmt.Sprintf("k%d", i), 1)
	}
	tr.flushAll()
	var bytes uintptr
	for i := range tr.stripes {
		sm := &tr.stripes[i].ring[0]
		if sm.idx == nil {
			t.Fatalf("stripe %d unused", i)
		}
		bytes += uintptr(cap(sm.idx))*unsafe.Sizeof(cell{}) + uintptr(cap(sm.counters))*unsafe.Sizeof(counter{}) +
			uintptr(cap(sm.scratch))*unsafe.Sizeof(uint64(0)) + uintptr(cap(sm.door))*unsafe.Sizeof(uint64(0))
	}
	if per := bytes / uintptr(tr.Counters()); per != 196 {
		t.Fatalf("%d bytes a counter, want 196 as documented", per)
	}
}

// TestLongKeys: keys longer than a ring's slot, and costs above what a
// slot holds, are counted exactly, with the stripe free and held.
func TestLongKeys(t *testing.T) {
	c := &clock{}
	tr := New(64, time.Minute, 1, c.now)
	defer tr.Close()
	long := strings.Repeat("k", 3*ringKey)
	big := 2 // with 32-bit ints no cost exceeds what a slot holds
	if strconv.IntSize == 64 {
		shift := 33
		big = 1 << shift
	}
	tr.Record("p", long, 2)
	tr.Record("p", "big", big)
	tr.SetBusy(1) // the ring cannot take either: Record waits
	tr.Record("p", long, 3)
	tr.Record("p", "big", big)
	tr.SetBusy(0)
	want := map[string]uint64{long: 5, "big": 2 * uint64(big)}
	got := tr.Top("p", -1)
	if len(got) != len(want) {
		t.Fatalf("%+v", got)
	}
	for _, e := range got {
		if e.Count != want[e.Key] || e.Error != 0 {
			t.Errorf("%.10s: count %d error %d, want %d", e.Key, e.Count, e.Error, want[e.Key])
		}
	}
}
