package topk

import (
	"fmt"
	"math/rand/v2"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// TestErrorCoversEveryEpoch: a key counted in one epoch of the window
// and dropped from another's summary by a prune still has that epoch's
// refusals within its count and error. The error sums every epoch's D,
// not only those of the epochs where the key has a counter.
func TestErrorCoversEveryEpoch(t *testing.T) {
	c := &clock{}
	tr := New(64, time.Minute, 2, c.now)
	defer tr.Close()
	k := tr.perLock
	// Keys of one stripe, so that the flood prunes the stripe of "x".
	home := tr.keyHash("x") & (stripes - 1)
	var flood []string
	for i := 0; len(flood) < 8*k; i++ {
		if key := fmt.Sprintf("f%d", i); tr.keyHash(key)&(stripes-1) == home {
			flood = append(flood, key)
		}
	}
	exact := map[string]uint64{}
	rec := func(key string, n int) {
		tr.direct("p", key, n)
		exact[key] += uint64(n)
	}
	rec("x", 1000) // epoch 0: x's counter
	c.ns.Store(int64(time.Minute))
	rec("x", 3) // epoch 1: x refused a little, then a flood prunes it
	for round := range 3 {
		for _, key := range flood {
			rec(key, 1+round%2)
		}
	}
	got := tr.Top("p", -1)
	var x *Entry
	for i := range got {
		if got[i].Key == "x" {
			x = &got[i]
		}
	}
	if x == nil {
		t.Fatalf("x (refused %d times) is missing", exact["x"])
	}
	if x.Count < exact["x"] || x.Count > exact["x"]+x.Error {
		t.Fatalf("x: count %d error %d, true %d", x.Count, x.Error, exact["x"])
	}
	for _, e := range got {
		if e.Count < exact[e.Key] || e.Count > exact[e.Key]+e.Error {
			t.Fatalf("%s: count %d error %d, true %d", e.Key, e.Count, e.Error, exact[e.Key])
		}
	}
}

// check compares Top's answer with exact counts: every count brackets
// the true count within its error, every error is within bound(key),
// and every key refused more than bound(key) times is listed.
func check(t *testing.T, tr *Tracker, exact map[string]uint64, bound func(key string) uint64) {
	t.Helper()
	got := tr.Top("p", -1)
	listed := map[string]bool{}
	var worst uint64
	for _, e := range got {
		listed[e.Key] = true
		truth := exact[e.Key]
		if e.Count < truth || e.Count > truth+e.Error {
			t.Errorf("%s: count %d error %d, true %d", e.Key, e.Count, e.Error, truth)
		}
		if b := bound(e.Key); e.Error > b {
			t.Errorf("%s: error %d above its bound %d", e.Key, e.Error, b)
		}
		worst = max(worst, e.Error)
	}
	for key, n := range exact {
		if n > bound(key) && !listed[key] {
			t.Errorf("%s refused %d times (above its bound %d) is missing", key, n, bound(key))
		}
	}
	t.Logf("%d keys refused, %d listed, largest error %d", len(exact), len(got), worst)
}

// TestAccuracyWithBusyStripes: a Zipf stream over far more keys than
// counters, recorded while the key's stripe is taken as busy (the
// refusals go to its ring), while its ring is taken as full too (Record
// waits for the lock), and while neither: each busy level alone and then
// in turn. The bound is the stated one, busy or not: the refusals of the
// key's stripe over k+1, plus one for the door.
func TestAccuracyWithBusyStripes(t *testing.T) {
	for _, levels := range [][]int{{1, 0}, {2, 0}, {1, 2, 0}} {
		t.Run(fmt.Sprint(levels), func(t *testing.T) { accuracyWithBusy(t, levels) })
	}
}

// accuracyWithBusy records the stream with each busy level of levels in
// turn, for equal parts of it.
func accuracyWithBusy(t *testing.T, levels []int) {
	c := &clock{}
	tr := New(256, time.Minute, 1, c.now)
	defer tr.Close()
	r := rand.New(rand.NewPCG(11, 12))
	z := rand.NewZipf(r, 1.2, 1, 99999)
	exact := map[string]uint64{}
	var perStripe [stripes]uint64
	const total = 200000
	for i := range total {
		tr.SetBusy(levels[i*len(levels)/total])
		key := fmt.Sprintf("client-%d", z.Uint64())
		n := 1 + i%3
		tr.Record("p", key, n)
		exact[key] += uint64(n)
		perStripe[tr.keyHash(key)&(stripes-1)] += uint64(n)
	}
	k1 := uint64(tr.perLock) + 1
	check(t, tr, exact, func(key string) uint64 { return perStripe[tr.keyHash(key)&(stripes-1)]/k1 + 1 })
}

// TestConcurrentAccuracy: at GOMAXPROCS 2, 8 and 32, 64 goroutines
// refuse keys of a Zipf stream, far more keys than counters, while
// another moves the busy level through 0 to 2 and Top is read: every
// path (the stripe, its ring, the wait when the ring is full) runs at
// once, and the rings are also filled by real contention. Every refusal
// goes to its key's stripe, so the answer after they end is held to the
// bound stated for no contention: each count brackets the true count
// within its error, each error is at most the refusals of the key's
// stripe over k+1 plus one (the door), and every key refused more often
// is listed.
func TestConcurrentAccuracy(t *testing.T) {
	for _, procs := range []int{2, 8, 32} {
		t.Run(fmt.Sprint(procs), func(t *testing.T) { concurrentAccuracy(t, procs) })
	}
}

func concurrentAccuracy(t *testing.T, procs int) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(procs))
	c := &clock{}
	tr := New(256, time.Minute, 1, c.now)
	defer tr.Close()
	const workers, each = 64, 2000
	keys := make([][]string, workers)
	for w := range keys {
		r := rand.New(rand.NewPCG(uint64(w), 13))
		z := rand.NewZipf(r, 1.1, 1, 49999)
		keys[w] = make([]string, each)
		for i := range keys[w] {
			keys[w][i] = fmt.Sprintf("client-%d", z.Uint64())
		}
	}
	var wg sync.WaitGroup
	var left atomic.Int32
	left.Store(workers)
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer left.Add(-1)
			buf := make([]byte, 0, 16)
			for i, key := range keys[w] {
				buf = append(buf[:0], key...) // a reused buffer
				tr.Record("p", unsafeString(buf), 1+i%2)
			}
		}()
	}
	wg.Add(2)
	go func() {
		defer wg.Done()
		for i := 0; left.Load() > 0; i++ {
			tr.SetBusy(i % 3)
			runtime.Gosched()
		}
	}()
	go func() {
		defer wg.Done()
		for left.Load() > 0 {
			tr.Top("p", 10)
		}
	}()
	wg.Wait()
	exact := map[string]uint64{}
	var perStripe [stripes]uint64
	for w := range keys {
		for i, key := range keys[w] {
			exact[key] += uint64(1 + i%2)
			perStripe[tr.keyHash(key)&(stripes-1)] += uint64(1 + i%2)
		}
	}
	k1 := uint64(tr.perLock) + 1
	check(t, tr, exact, func(key string) uint64 { return perStripe[tr.keyHash(key)&(stripes-1)]/k1 + 1 })
}

// TestRingFullWaits: while a stripe's lock is held, refusals of its keys
// from many goroutines fill its ring, and the rest wait for the lock.
// When it is released, every refusal is counted, each key's exactly,
// with room for every key.
func TestRingFullWaits(t *testing.T) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(32))
	c := &clock{}
	tr := New(DefaultCounters, time.Minute, 1, c.now)
	defer tr.Close()
	tr.Record("p", "start", 1) // starts the goroutine: Record uses the rings
	home := tr.keyHash("start") & (stripes - 1)
	var keys []string
	for i := 0; len(keys) < 50; i++ {
		if key := fmt.Sprintf("client-%d", i); tr.keyHash(key)&(stripes-1) == home {
			keys = append(keys, key)
		}
	}
	s := &tr.stripes[home]
	s.mu.Lock()
	const workers, each = 32, 3 * ringLen / 32
	var wg sync.WaitGroup
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range each {
				tr.Record("p", keys[(w+i)%len(keys)], 1+i%2)
			}
		}()
	}
	for s.tail.Load()-s.head < ringLen {
		runtime.Gosched() // until the ring is full
	}
	s.unlock(tr.perLock)
	wg.Wait()
	want := map[string]uint64{"start": 1}
	for w := range workers {
		for i := range each {
			want[keys[(w+i)%len(keys)]] += uint64(1 + i%2)
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

// TestRecordHashesAsKeyHash: Record's inline hash of a key of 8 to 16
// bytes is keyHash's, which Top and the tests use to find a key's
// stripes: every counter's hash is its key's and name's.
func TestRecordHashesAsKeyHash(t *testing.T) {
	tr := New(DefaultCounters, time.Minute, 1, (&clock{}).now)
	defer tr.Close()
	for l := 1; l <= 24; l++ {
		for i := range 20 {
			key := fmt.Sprintf("%0*d", l, i*7919)
			tr.Record("p", key[len(key)-l:], 1)
		}
	}
	tr.flushAll()
	n := 0
	for si := range tr.stripes {
		sm := &tr.stripes[si].ring[0]
		for slot := range sm.counters {
			c := &sm.counters[slot]
			kh := tr.keyHash(c.key())
			if c.h != kh^nameHash(c.name) || kh&(stripes-1) != uint64(si) {
				t.Fatalf("key %q in stripe %d: hash %x, want %x of stripe %d", c.key(), si, c.h, kh^nameHash(c.name), kh&(stripes-1))
			}
			n++
		}
	}
	if n < 24*20-100 { // short keys repeat: "0" for every i at length 1
		t.Fatalf("%d counters", n)
	}
}
