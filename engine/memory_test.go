package engine_test

import (
	"fmt"
	"runtime"
	"strconv"
	"testing"
	"time"

	"github.com/slidegate/slidegate/engine"
)

// keyOfLen returns distinct key i of exactly n bytes (n ≥ 8): the number
// first, so that keys differ at the front as well as anywhere after.
func keyOfLen(buf []byte, i, n int) string {
	buf = append(strconv.AppendInt(buf[:0], int64(i), 36), '-')
	for len(buf) < n {
		buf = append(buf, 'x')
	}
	return string(buf[:n])
}

// heapPerKey returns the live heap bytes per key that keys distinct keys
// of keyLen bytes, one request each, add to a limiter of policy p, and the
// limiter's own estimate (Stats.Bytes) per key. The keys are built one at
// a time and dropped, so the heap keeps only what the limiter keeps.
func heapPerKey(tb testing.TB, p engine.Policy, keyLen, keys int, opts ...engine.Option) (heap, stats float64) {
	tb.Helper()
	return heapPerKeyN(tb, p, keyLen, keys, 1, opts...)
}

// heapPerKeyN is heapPerKey with reqs requests of cost 1 per key, each
// key's at consecutive instants.
func heapPerKeyN(tb testing.TB, p engine.Policy, keyLen, keys, reqs int, opts ...engine.Option) (heap, stats float64) {
	tb.Helper()
	lim, err := engine.New(p, append([]engine.Option{engine.WithSweepInterval(0)}, opts...)...)
	if err != nil {
		tb.Fatal(err)
	}
	defer lim.Close()
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	buf := make([]byte, 0, keyLen+16)
	for i := range keys {
		for r := range reqs {
			if _, err := lim.AllowNAt(keyOfLen(buf, i, keyLen), 1, int64(i*reqs+r)); err != nil {
				tb.Fatal(err)
			}
		}
	}
	runtime.GC()
	runtime.ReadMemStats(&after)
	st := lim.Stats()
	if st.Keys != keys {
		tb.Fatalf("%d keys held, want %d", st.Keys, keys)
	}
	heap = float64(int64(after.HeapAlloc)-int64(before.HeapAlloc)) / float64(keys)
	runtime.KeepAlive(lim)
	return heap, float64(st.Bytes) / float64(keys)
}

// A key costs a bounded number of bytes whatever its length: a key of
// 4096 bytes costs no more live heap than one of LongKeyBytes+1, and no
// more than a key of LongKeyBytes (the longest kept as bytes) does.
func TestKeyBytesBoundedWhateverItsLength(t *testing.T) {
	p := engine.Policy{Limit: 10, Window: time.Hour}
	const keys = 20000
	atMax, _ := heapPerKey(t, p, engine.LongKeyBytes, keys)
	for _, n := range []int{engine.LongKeyBytes + 1, 1000, 4096} {
		heap, stats := heapPerKey(t, p, n, keys)
		t.Logf("key of %d bytes: %.0f heap B/key, Stats %.0f B/key (key of %d bytes: %.0f heap B/key)", n, heap, stats, engine.LongKeyBytes, atMax)
		if heap > atMax {
			t.Errorf("a key of %d bytes costs %.0f heap bytes, more than the %.0f of a key of %d bytes", n, heap, atMax, engine.LongKeyBytes)
		}
		if heap > 200 {
			t.Errorf("a key of %d bytes costs %.0f heap bytes, want at most 200", n, heap)
		}
	}
}

// BenchmarkBytesPerKey prints the memory a key costs by its length: live
// heap bytes per key (heap-B/key, measured after a GC) and the limiter's
// own estimate (stats-B/key, what slidegate_store_bytes reports), for
// 100,000 distinct keys with one request each on the exact log. It is a
// measurement, not a timing: run it with -benchtime 1x
// (docs/operations.md, "Memory").
func BenchmarkBytesPerKey(b *testing.B) {
	p := engine.Policy{Limit: 100, Window: time.Hour}
	for _, n := range []int{8, 16, 32, 64, 65, 128, 256, 1000, 4096} {
		b.Run(fmt.Sprintf("key=%dB", n), func(b *testing.B) {
			var heap, stats float64
			for range b.N {
				heap, stats = heapPerKey(b, p, n, 100000)
			}
			b.ReportMetric(heap, "heap-B/key")
			b.ReportMetric(stats, "stats-B/key")
		})
	}
}
