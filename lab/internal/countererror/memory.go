package countererror

import (
	"fmt"
	"io"
	"runtime"
	"strconv"
	"time"

	"github.com/cespare/xxhash/v2"
	"github.com/puzpuzpuz/xsync/v3"

	"github.com/slidegate/slidegate/engine"
)

// HeapReport is the heap a limiter retains per key, measured by
// MeasureHeap.
type HeapReport struct {
	Keys           int
	RequestsPerKey int
	Limit          int
	// LogPerKey and CounterPerKey are the retained heap bytes per key of a
	// limiter of each algorithm after every key made RequestsPerKey unit
	// requests at instant 0 (all accepted when RequestsPerKey ≤ Limit).
	LogPerKey, CounterPerKey float64
	// MapPerKey is the retained heap per key of the same sharded map shape
	// (DefaultShards xsync maps from key to a pointer) with no state behind
	// the pointers: what a key costs before any algorithm state.
	MapPerKey float64
}

// CounterStatePerKey is the counter's state per key beyond the map entry.
func (h HeapReport) CounterStatePerKey() float64 { return h.CounterPerKey - h.MapPerKey }

// LogStatePerKey is the log's state per key beyond the map entry.
func (h HeapReport) LogStatePerKey() float64 { return h.LogPerKey - h.MapPerKey }

// Ratio is the counter's retained heap per key as a share of the log's.
func (h HeapReport) Ratio() float64 { return h.CounterPerKey / h.LogPerKey }

// MeasureHeap measures the heap retained per key by a log limiter and by a
// counter limiter holding keys keys after requestsPerKey unit requests each,
// and by the bare map shape for comparison. Key strings are made before the
// first measurement and shared with the limiters, so their bytes are not
// counted (they cost the same for both algorithms). It forces garbage
// collections and reads process-wide statistics: run it with nothing else
// allocating.
func MeasureHeap(keys, requestsPerKey, limit int, window time.Duration) (HeapReport, error) {
	h := HeapReport{Keys: keys, RequestsPerKey: requestsPerKey, Limit: limit}
	if keys < 1 || requestsPerKey < 1 || requestsPerKey > limit {
		return h, fmt.Errorf("%w: heap measurement needs keys ≥ 1 and 1 ≤ requests per key ≤ limit (got %d, %d, %d)", ErrInvalidConfig, keys, requestsPerKey, limit)
	}
	names := make([]string, keys)
	for i := range names {
		names[i] = "key-" + strconv.Itoa(i)
	}
	var err error
	if h.LogPerKey, err = limiterHeap(engine.SlidingLog, names, requestsPerKey, limit, window); err != nil {
		return h, err
	}
	if h.CounterPerKey, err = limiterHeap(engine.SlidingCounter, names, requestsPerKey, limit, window); err != nil {
		return h, err
	}
	h.MapPerKey = mapHeap(names)
	runtime.KeepAlive(names)
	return h, nil
}

// heapInUse collects garbage until the live heap is stable and returns it.
func heapInUse() uint64 {
	var ms runtime.MemStats
	runtime.GC()
	runtime.GC()
	runtime.ReadMemStats(&ms)
	return ms.HeapAlloc
}

func perKey(before, after uint64, keys int) float64 {
	return (float64(after) - float64(before)) / float64(keys)
}

func limiterHeap(alg engine.Algorithm, names []string, requestsPerKey, limit int, window time.Duration) (float64, error) {
	before := heapInUse()
	lim, err := engine.New(engine.Policy{Limit: limit, Window: window, Algorithm: alg}, engine.WithSweepInterval(0))
	if err != nil {
		return 0, fmt.Errorf("countererror: %w", err)
	}
	for _, k := range names {
		for range requestsPerKey {
			if d, err := lim.AllowNAt(k, 1, 0); err != nil || !d.Allowed {
				return 0, fmt.Errorf("countererror: heap fill of %s refused or failed: %+v, %v", alg, d, err)
			}
		}
	}
	after := heapInUse()
	if st := lim.Stats(); st.Keys != len(names) {
		return 0, fmt.Errorf("countererror: %s limiter holds %d keys, want %d", alg, st.Keys, len(names))
	}
	runtime.KeepAlive(lim)
	return perKey(before, after, len(names)), nil
}

// mapHeap is the same shape as the engine's store (DefaultShards xsync maps
// keyed by xxhash) with every value pointing at one shared word.
func mapHeap(names []string) float64 {
	var shared uint64
	before := heapInUse()
	maps := make([]*xsync.MapOf[string, *uint64], engine.DefaultShards)
	for i := range maps {
		maps[i] = xsync.NewMapOf[string, *uint64]()
	}
	for _, k := range names {
		maps[xxhash.Sum64String(k)&uint64(len(maps)-1)].Store(k, &shared)
	}
	after := heapInUse()
	runtime.KeepAlive(maps)
	return perKey(before, after, len(names))
}

// WriteHeap prints reports as one markdown table, a row per measurement.
func WriteHeap(w io.Writer, reports []HeapReport) error {
	_, err := fmt.Fprintln(w, "| keys | requests per key (L) | log B/key | counter B/key | map entry only B/key | log state beyond the entry | counter state beyond the entry | counter / log |\n|---:|---:|---:|---:|---:|---:|---:|---:|")
	if err != nil {
		return err
	}
	for _, h := range reports {
		_, err := fmt.Fprintf(w, "| %d | %d (%d) | %.1f | %.1f | %.1f | %.1f | %.1f | %.0f%% |\n",
			h.Keys, h.RequestsPerKey, h.Limit, h.LogPerKey, h.CounterPerKey, h.MapPerKey,
			h.LogStatePerKey(), h.CounterStatePerKey(), 100*h.Ratio())
		if err != nil {
			return err
		}
	}
	return nil
}
