package bench

// Engine benchmarks: slidegate's exact log against the textbook log (and,
// on many cores, its 64-shard variant) in the same run. Sub-benchmarks end
// in the subject's name, so `go run ./lab/bench/cmd/benchgate ratios` can pair
// "…/slidegate" with "…/textbook" and print in-run ratios.
//
// The engine runs with its background sweeper off
// (engine.WithSweepInterval(0)): the windows here are a minute long, so a
// sweep would drop nothing, but walking a million keys would take a core's
// share of the run away from the decisions being timed, and the textbook
// has no sweeper to match. The sweeper's cost is the sweep benchmarks'
// business, not these.

import (
	"fmt"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/slidegate/slidegate/engine"
	"github.com/slidegate/slidegate/lab/internal/latency"
)

// subject is a limiter under benchmark.
type subject interface {
	Allow(key string) engine.Decision
}

type subjectSpec struct {
	name string
	make func(limit int, window time.Duration) (subject, error)
}

var (
	slidegateSpec = subjectSpec{"slidegate", func(l int, w time.Duration) (subject, error) {
		return engine.New(engine.Policy{Limit: l, Window: w}, engine.WithSweepInterval(0))
	}}
	textbookSpec = subjectSpec{"textbook", func(l int, w time.Duration) (subject, error) {
		return NewTextbook(l, w)
	}}
	textbook64Spec = subjectSpec{"textbook64", func(l int, w time.Duration) (subject, error) {
		return NewShardedTextbook(l, w)
	}}
)

// floorSpec is not a limiter: a read-only Go map from every key to a
// pointer to 16 bytes of state, and a decision that finds the key and
// reads its state. No limiter keeps per-key state in less, so its
// latency percentiles are the floor the machine's memory sets for every
// design at this key count.
var floorSpec = subjectSpec{"floor", func(int, time.Duration) (subject, error) {
	keys := Keys(manyKeys)
	m := make(floorMap, len(keys))
	for i, k := range keys {
		m[k] = &[2]int64{int64(i), 1}
	}
	return m, nil
}}

type floorMap map[string]*[2]int64

func (m floorMap) Allow(key string) engine.Decision {
	st := m[key]
	return engine.Decision{Allowed: st != nil && st[1] > 0}
}

// mode is a load level: the limit and how many requests each key gets
// before timing starts.
type mode struct {
	name    string
	limit   int
	prefill int
}

// SteadyPrefill is how many requests each key holds before a mostly-allowed
// run. With 6, slidegate's ring and the textbook's deque both have room for
// the next two, so most timed decisions are steady-state decisions, not
// ring growth (after one request both would grow on the next, and nearly
// every timed decision of a uniform run would be one); what growth remains
// shows as B/op.
const SteadyPrefill = 6

var (
	// mostly allowed: 100/min, every key holding SteadyPrefill requests.
	allowedMode = mode{"allowed", 100, SteadyPrefill}
	// mostly refused: every key is full, 10/min.
	refusedMode = mode{"refused", 10, 10}
)

const (
	window   = time.Minute
	manyKeys = 1_000_000
)

// fill sends prefill requests to every key, spread over all cores.
func fill(s subject, keys []string, prefill int) {
	procs := runtime.GOMAXPROCS(0)
	var wg sync.WaitGroup
	for g := range procs {
		wg.Go(func() {
			for i := g; i < len(keys); i += procs {
				for range prefill {
					s.Allow(keys[i])
				}
			}
		})
	}
	wg.Wait()
}

// fillFresh is fill with a fresh copy of the key's string for every
// request, as keys arrive in a server (parsed from each request): a
// limiter is then charged for the key bytes it retains, whether it keeps
// the caller's string (the textbook's map does) or its own copy
// (slidegate's block does).
func fillFresh(s subject, keys []string, requests int) {
	procs := runtime.GOMAXPROCS(0)
	var wg sync.WaitGroup
	for g := range procs {
		wg.Go(func() {
			for i := g; i < len(keys); i += procs {
				for range requests {
					s.Allow(strings.Clone(keys[i]))
				}
			}
		})
	}
	wg.Wait()
}

// populated caches one filled subject across the calls the testing package
// makes to one benchmark function (b.N = 1, then larger), and across the
// uniform and Zipf runs of one mode, so that each million-key fill is paid
// once per mode and subject. Only one subject is alive at a time: another
// limiter's million keys in the heap would spread the measured one's
// memory over more pages and cost it page walks (see docs/results.md), and
// would leave more for the GC to scan.
var populated struct {
	sync.Mutex
	key string
	s   subject
}

func populatedSubject(b *testing.B, spec subjectSpec, md mode) subject {
	populated.Lock()
	defer populated.Unlock()
	key := md.name + "/" + spec.name
	if populated.key == key {
		return populated.s
	}
	populated.key, populated.s = "", nil
	runtime.GC()
	s, err := spec.make(md.limit, window)
	if err != nil {
		b.Fatal(err)
	}
	fill(s, Keys(manyKeys), md.prefill)
	// Finish the collection the fill started: a concurrent mark of a heap
	// of millions of keys would otherwise run on the cores the timed loop
	// is about to use.
	runtime.GC()
	populated.key, populated.s = key, s
	return s
}

func dropPopulated() {
	populated.Lock()
	populated.key, populated.s = "", nil
	populated.Unlock()
}

// BenchmarkHotKey: one key on one goroutine, limit 100/min, so after the
// first 100 requests every decision is a refusal. Each decision reads the
// subject's monotonic clock.
func BenchmarkHotKey(b *testing.B) {
	for _, spec := range []subjectSpec{slidegateSpec, textbookSpec} {
		b.Run(spec.name, func(b *testing.B) {
			s, err := spec.make(100, window)
			if err != nil {
				b.Fatal(err)
			}
			b.ReportAllocs()
			allowed := 0
			for b.Loop() {
				if s.Allow("hot").Allowed {
					allowed++
				}
			}
			if allowed > 100 {
				b.Fatalf("%d allowed, limit 100", allowed)
			}
		})
	}
}

// BenchmarkHotKeyAmong1k is BenchmarkHotKey with 1,000 other keys holding
// state. With "hot" the only key, Go's map in the textbook takes its
// small-map path (up to 8 entries: no hashing at all), a shortcut no
// limiter serving real traffic gets; here both sides hash.
func BenchmarkHotKeyAmong1k(b *testing.B) {
	others := Keys(1000)
	for _, spec := range []subjectSpec{slidegateSpec, textbookSpec} {
		b.Run(spec.name, func(b *testing.B) {
			s, err := spec.make(100, window)
			if err != nil {
				b.Fatal(err)
			}
			for _, k := range others {
				s.Allow(k)
			}
			b.ReportAllocs()
			allowed := 0
			for b.Loop() {
				if s.Allow("hot").Allowed {
					allowed++
				}
			}
			if allowed > 100 {
				b.Fatalf("%d allowed, limit 100", allowed)
			}
		})
	}
}

// BenchmarkKeys1M: a million keys on all cores (RunParallel), keys drawn
// uniformly or Zipf-distributed (s = 1.1) from precomputed streams, every
// key already holding state. "allowed": limit 100/min, every key holding
// SteadyPrefill requests; "refused": limit 10/min with every key full.
// "floor" is the bare map lookup (see floorSpec), for scale. The metric
// allowed-% says which it really was (Zipf's hottest keys fill up).
func BenchmarkKeys1M(b *testing.B) {
	keys := Keys(manyKeys)
	for _, md := range []mode{allowedMode, refusedMode} {
		// Subject-major order: each subject is filled once per mode and
		// runs both distributions while it is the only one in the heap.
		for _, spec := range []subjectSpec{slidegateSpec, textbookSpec, textbook64Spec, floorSpec} {
			for _, d := range []Distribution{Uniform, Zipf} {
				stream, err := Stream(d, manyKeys)
				if err != nil {
					b.Fatal(err)
				}
				b.Run(fmt.Sprintf("%s/%s/%s", md.name, d, spec.name), func(b *testing.B) {
					s := populatedSubject(b, spec, md)
					var allowed atomic.Int64
					var off atomic.Int64
					b.ReportAllocs()
					b.ResetTimer()
					b.RunParallel(func(pb *testing.PB) {
						c := NewCursor(stream, int(off.Add(StreamLen/7)))
						n := int64(0)
						for pb.Next() {
							if s.Allow(keys[c.Next()]).Allowed {
								n++
							}
						}
						allowed.Add(n)
					})
					b.ReportMetric(100*float64(allowed.Load())/float64(b.N), "allowed-%")
				})
			}
		}
	}
}

// BenchmarkLatency1MZipf times every decision at a million Zipf keys on
// all cores (limit 100/min, every key holding SteadyPrefill requests) and reports the
// p50/p99/p99.9 of the per-decision times. Each time includes one extra
// monotonic clock read (the timer's own), reported as timer-ns; GC pauses
// and scheduler preemptions land in the tail like they do in a server.
// GCs and GC-pause-µs count the collections during the timed run and their
// stop-the-world pauses. The "floor" subject is a plain map lookup plus one
// read of per-key state: what the machine's memory costs any design.
func BenchmarkLatency1MZipf(b *testing.B) {
	stream, err := Stream(Zipf, manyKeys)
	if err != nil {
		b.Fatal(err)
	}
	keys := Keys(manyKeys)
	timer := timerOverhead()
	for _, spec := range []subjectSpec{slidegateSpec, textbookSpec, textbook64Spec, floorSpec} {
		b.Run(spec.name, func(b *testing.B) {
			s := populatedSubject(b, spec, mode{"latency", allowedMode.limit, allowedMode.prefill})
			var (
				mu  sync.Mutex
				all latency.Histogram
				off atomic.Int64
			)
			var ms0, ms1 runtime.MemStats
			runtime.ReadMemStats(&ms0)
			b.ReportAllocs()
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				h := new(latency.Histogram)
				c := NewCursor(stream, int(off.Add(StreamLen/7)))
				base := time.Now()
				for pb.Next() {
					k := keys[c.Next()]
					t0 := time.Since(base)
					s.Allow(k)
					h.Record(int64(time.Since(base) - t0))
				}
				mu.Lock()
				all.Merge(h)
				mu.Unlock()
			})
			b.StopTimer()
			runtime.ReadMemStats(&ms1)
			b.ReportMetric(float64(ms1.NumGC-ms0.NumGC), "GCs")
			b.ReportMetric(float64(ms1.PauseTotalNs-ms0.PauseTotalNs)/1e3, "GC-pause-µs")
			b.ReportMetric(float64(all.Quantile(0.5)), "p50-ns")
			b.ReportMetric(float64(all.Quantile(0.99)), "p99-ns")
			b.ReportMetric(float64(all.Quantile(0.999)), "p99.9-ns")
			b.ReportMetric(float64(timer), "timer-ns")
		})
	}
}

// timerOverhead is the median time of an empty timed section.
func timerOverhead() time.Duration {
	var h latency.Histogram
	base := time.Now()
	for range 100000 {
		t0 := time.Since(base)
		h.Record(int64(time.Since(base) - t0))
	}
	return h.Quantile(0.5)
}

// BenchmarkMemory measures the heap a limiter retains: runtime.GC and
// HeapAlloc before and after filling a fresh limiter, divided by keys
// (B/key) and by stored instants (B/instant). Every request brings a
// fresh copy of its key (fillFresh), so each side is charged for the key
// bytes it retains, along with map buckets, per-key structs and rings.
// Limit 100/min; every request is allowed. ns/op is the time of one whole
// fill.
func BenchmarkMemory(b *testing.B) {
	cases := []struct {
		name     string
		keys     int
		requests int
	}{
		{"1Mx1", manyKeys, 1},
		{"100kx100", 100_000, 100},
	}
	for _, c := range cases {
		keys := Keys(c.keys)
		for _, spec := range []subjectSpec{slidegateSpec, textbookSpec} {
			b.Run(c.name+"/"+spec.name, func(b *testing.B) {
				dropPopulated() // free the big fills
				var perKey, perInstant float64
				for b.Loop() {
					var before, after runtime.MemStats
					runtime.GC()
					runtime.ReadMemStats(&before)
					s, err := spec.make(100, window)
					if err != nil {
						b.Fatal(err)
					}
					fillFresh(s, keys, c.requests)
					runtime.GC()
					runtime.ReadMemStats(&after)
					if d := s.Allow(keys[0]); d.Allowed && c.requests == 100 {
						b.Fatalf("key 0 allowed a 101st request: %+v", d)
					}
					runtime.KeepAlive(s)
					retained := float64(after.HeapAlloc) - float64(before.HeapAlloc)
					perKey = retained / float64(c.keys)
					perInstant = retained / float64(c.keys*c.requests)
				}
				b.ReportMetric(perKey, "B/key")
				b.ReportMetric(perInstant, "B/instant")
			})
		}
	}
}
