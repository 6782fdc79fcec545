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
// counters, recorded while the first stripes are taken as busy (the
// refusals go to the second stripes), then the first and second (to the
// next free stripe), then none, then every stripe (to the batches), and
// each of the first two alone. The batches come last: the goroutine that adds them holds every stripe,
// which would send a refusal elsewhere than this test expects. The
// bound is the stated one: the refusals of each summary that may hold
// the key's, over k+1.
func TestAccuracyWithBusyStripes(t *testing.T) {
	for _, levels := range [][]int{{1, 0}, {2, 0}, {1, 2, 0, 3}} {
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
	var landed [stripes]uint64      // the refusals each stripe's summary took
	var second, other [stripes]bool // it took some of busy first stripes, of busy pairs
	const total = 200000
	for i := range total {
		level := levels[i*len(levels)/total]
		tr.SetBusy(level)
		key := fmt.Sprintf("client-%d", z.Uint64())
		n := 1 + i%3
		tr.Record("p", key, n)
		exact[key] += uint64(n)
		kh := tr.keyHash(key)
		first, sec := kh&(stripes-1), secondStripe(kh)
		switch level {
		case 1:
			landed[sec] += uint64(n)
			second[sec] = true
		case 2: // the next stripe after the first that is not the second
			s := (first + 1) & (stripes - 1)
			if s == sec {
				s = (first + 2) & (stripes - 1)
			}
			landed[s] += uint64(n)
			other[s] = true
		default: // a batch goes to the first stripe
			landed[first] += uint64(n)
		}
	}
	k1 := uint64(tr.perLock) + 1
	check(t, tr, exact, func(key string) uint64 {
		kh := tr.keyHash(key)
		first, sec := kh&(stripes-1), secondStripe(kh)
		var b uint64
		for s := range uint64(stripes) {
			if s == first || s == sec && (second[s] || other[s]) || other[s] {
				b += landed[s] / k1
			}
		}
		return b
	})
}

// TestConcurrentAccuracy: at GOMAXPROCS 32, 64 goroutines refuse keys
// of a Zipf stream, far more keys than counters, while another moves
// the busy level through 0 to 3 and Top is read: every path (first
// stripe, second stripe, next free stripe, batch) runs at once. The
// answer after they end brackets every true count within its error and
// lists every key refused more often than its bound. Which summary a
// refusal went to is not known here, and a refusal whose two stripes
// were busy may go to any, so the bound is the worst case: all the
// refusals over k+1.
func TestConcurrentAccuracy(t *testing.T) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(32))
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
			tr.SetBusy(i % 4)
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
	var total uint64
	for w := range keys {
		for i, key := range keys[w] {
			exact[key] += uint64(1 + i%2)
			total += uint64(1 + i%2)
		}
	}
	k1 := uint64(tr.perLock) + 1
	check(t, tr, exact, func(string) uint64 { return total / k1 })
}

// TestSecondStripe: a key's second stripe is another stripe, and a
// stripe's keys spread their second stripes over four others.
func TestSecondStripe(t *testing.T) {
	tr := New(DefaultCounters, time.Minute, 1, (&clock{}).now)
	defer tr.Close()
	seen := map[[2]uint64]bool{}
	for i := range 10000 {
		kh := tr.keyHash(fmt.Sprintf("client-%d", i))
		first, second := kh&(stripes-1), secondStripe(kh)
		if first == second || second >= stripes {
			t.Fatalf("key %d: stripes %d and %d", i, first, second)
		}
		seen[[2]uint64{first, second}] = true
	}
	if len(seen) != stripes*stripes/2 {
		t.Fatalf("%d pairs of stripes, want %d", len(seen), stripes*stripes/2)
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
