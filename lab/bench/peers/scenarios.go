package peers

import (
	"cmp"
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/slidegate/slidegate/lab/bench"
	"github.com/slidegate/slidegate/lab/internal/latency"
)

// Config is one comparison run. Zero fields take the defaults.
type Config struct {
	Keys     int           // key population of the many-key scenarios; default 1,000,000
	Rounds   int           // rounds (each a different order of peers); default 3
	Duration time.Duration // timed phase of each scenario per round; default 250 ms
	Procs    int           // goroutines of parallel scenarios; default GOMAXPROCS
	Peers    []Peer        // default All()

	// Exactness scenarios: limit ExactLimit per ExactWindow in real time.
	ExactLimit  int           // default 10
	ExactWindow time.Duration // default 1 s
	SkipExact   bool

	// Cores of the core sweep: the uniform allowed scenario again with
	// GOMAXPROCS and goroutines set to each. Default 1, 2, 4, … up to the
	// machine's cores (and the machine's cores).
	Cores []int
	// NoFloor leaves out the floor row (see Floor).
	NoFloor bool
	// Diagnostics adds the rows of Diagnostics after the floor's (ignored
	// with NoFloor: they are read against the floor).
	Diagnostics bool
	// HeapObjects is the size of the live heap of the "big heap" scenario:
	// that many pointer-holding objects of 32 bytes; default 4,000,000.
	HeapObjects int
	// CachedKeys makes the timed many-key loops (throughput, latency and
	// few requests) take their keys from a copy of their key sequence laid
	// out in order, bytes included (see keySeq), so that choosing a key
	// costs no cache miss, as with a server's just-parsed key. By default
	// they index the shared key table (bench.Keys), which at a million
	// keys costs the harness up to two cache misses of its own per
	// decision, the key's string header and its bytes; a CPU can hide
	// them behind a short decision and not behind a long one
	// (docs/design.md, "Where the time goes"), so the option tells how
	// much of a column is the limiter's own.
	CachedKeys bool

	Progress io.Writer // one line per step; nil for none
}

// Defaults of Config.
const (
	DefaultKeys        = 1_000_000
	DefaultRounds      = 3
	DefaultDuration    = 250 * time.Millisecond
	DefaultExactLimit  = 10
	DefaultExactWindow = time.Second
	DefaultHeapObjects = 4_000_000
)

// The load levels of the many-key scenarios, as in package bench: mostly
// allowed is 100/min with every key holding SteadyPrefill requests (so that
// no ring or deque grows during a timed run), mostly refused is 10/min with
// every key full. Windows are a minute long, so nothing expires during a
// run.
const (
	SteadyPrefill = 6
	AllowedLimit  = 100
	RefusedLimit  = 10
	Window        = time.Minute
)

// Metric names a column of the table.
type Metric string

// The metrics, in table order.
const (
	HotKey       Metric = "hot key"
	UniAllowed   Metric = "uniform, allowed"
	ZipfAllowed  Metric = "Zipf, allowed"
	UniRefused   Metric = "uniform, refused"
	ZipfRefused  Metric = "Zipf, refused"
	P99          Metric = "p99"
	P999         Metric = "p99.9"
	BytesPerKey1 Metric = "B/key, 1 req"
	BytesPerKeyL Metric = "B/key, L reqs"
	FewReqs      Metric = "few reqs"
	FewReqsHeap  Metric = "few reqs, big heap"
	Boundary     Metric = "boundary burst"
	TailBurst    Metric = "tail burst"
	Parallel     Metric = "parallel load"
)

// Results holds every measurement: per peer, per metric, one value per
// round (exactness: one value).
type Results struct {
	Config Config
	Values map[string]map[Metric][]float64
	// Ratios: per peer and time metric, the per-round ratio to Baseline
	// measured in the same round.
	Ratios map[string]map[Metric][]float64
	// AllowedShare: per peer and throughput metric, the share of allowed
	// decisions in the last round (says what "mostly" meant).
	AllowedShare map[string]map[Metric]float64
	// ExactWindows: per exactness metric, how many windows were valid.
	ExactWindows map[Metric]int
	// Allocs: per peer and throughput metric, heap allocations per
	// decision (runtime.MemStats.Mallocs over the timed run), one value
	// per round.
	Allocs map[string]map[Metric][]float64
}

// coreMetric names the core sweep's column for c cores.
func coreMetric(c int) Metric { return Metric(fmt.Sprintf("uniform, allowed, %d cores", c)) }

// cpuMetric names the process CPU time per decision of a throughput
// metric: CPU time of all the process's threads (the limiter's, the
// collector's) over the timed run, divided by its decisions. Unlike wall
// time it does not grow while other processes hold the cores, so it is
// the steadier figure on a shared machine; it still grows with their
// cache and memory traffic.
func cpuMetric(m Metric) Metric { return m + ", CPU" }

// timeMetrics are the per-decision time columns of cfg's run: TimeMetrics,
// the core sweep's, and the CPU times of ThroughputMetrics.
func (c *Config) timeMetrics() []Metric {
	ms := slices.Clone(TimeMetrics)
	for _, n := range c.Cores {
		ms = append(ms, coreMetric(n))
	}
	for _, m := range ThroughputMetrics {
		ms = append(ms, cpuMetric(m))
	}
	return ms
}

// measured returns the rows measured in every round: the peers and,
// unless NoFloor, the floor (and with Diagnostics the diagnostic rows).
func (c *Config) measured() []Peer {
	if c.NoFloor {
		return c.Peers
	}
	rows := append(slices.Clip(c.Peers), Floor())
	if c.Diagnostics {
		rows = append(rows, Diagnostics()...)
	}
	return rows
}

func (c *Config) defaults() {
	c.Keys = cmp.Or(c.Keys, DefaultKeys)
	c.Rounds = cmp.Or(c.Rounds, DefaultRounds)
	c.Duration = cmp.Or(c.Duration, DefaultDuration)
	c.Procs = cmp.Or(c.Procs, runtime.GOMAXPROCS(0))
	c.ExactLimit = cmp.Or(c.ExactLimit, DefaultExactLimit)
	c.ExactWindow = cmp.Or(c.ExactWindow, DefaultExactWindow)
	c.HeapObjects = cmp.Or(c.HeapObjects, DefaultHeapObjects)
	if c.Peers == nil {
		c.Peers = All()
	}
	if c.Cores == nil {
		n := runtime.NumCPU()
		for k := 1; k < n; k *= 2 {
			c.Cores = append(c.Cores, k)
		}
		c.Cores = append(c.Cores, n)
	}
}

func (c *Config) validate() error {
	switch {
	case c.Keys < 1 || c.Keys > 1<<30:
		return fmt.Errorf("peers: keys %d outside 1..2^30", c.Keys)
	case c.Rounds < 1:
		return fmt.Errorf("peers: rounds %d must be at least 1", c.Rounds)
	case c.Duration < time.Millisecond:
		return fmt.Errorf("peers: duration %v shorter than 1ms", c.Duration)
	case c.Procs < 1:
		return fmt.Errorf("peers: procs %d must be at least 1", c.Procs)
	case len(c.Peers) == 0:
		return fmt.Errorf("peers: no peers")
	case c.ExactLimit < 1 || c.ExactWindow < 20*time.Millisecond:
		return fmt.Errorf("peers: exactness limit %d must be ≥ 1 and window %v ≥ 20ms", c.ExactLimit, c.ExactWindow)
	case c.HeapObjects < 0 || c.HeapObjects > 1<<28:
		return fmt.Errorf("peers: heap objects %d outside 0..2^28", c.HeapObjects)
	}
	for _, n := range c.Cores {
		if n < 1 || n > 1024 {
			return fmt.Errorf("peers: core count %d outside 1..1024", n)
		}
	}
	if c.Peers[0].Name != Baseline {
		return fmt.Errorf("peers: the first peer must be %q, the baseline of the ratios", Baseline)
	}
	return nil
}

// Run measures every peer on every scenario, Rounds times, each round in
// a different (rotated) order of peers, and then the exactness scenarios
// once with all peers at the same time. It stops early, with ctx's error,
// when ctx is done.
func Run(ctx context.Context, cfg Config) (*Results, error) {
	cfg.defaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	res := &Results{
		Config:       cfg,
		Values:       map[string]map[Metric][]float64{},
		Ratios:       map[string]map[Metric][]float64{},
		AllowedShare: map[string]map[Metric]float64{},
		ExactWindows: map[Metric]int{},
		Allocs:       map[string]map[Metric][]float64{},
	}
	rows := cfg.measured()
	for _, p := range rows {
		res.Values[p.Name] = map[Metric][]float64{}
		res.Ratios[p.Name] = map[Metric][]float64{}
		res.AllowedShare[p.Name] = map[Metric]float64{}
		res.Allocs[p.Name] = map[Metric][]float64{}
	}
	keys := bench.Keys(cfg.Keys)
	uni, err := bench.Stream(bench.Uniform, cfg.Keys)
	if err != nil {
		return nil, err
	}
	zipf, err := bench.Stream(bench.Zipf, cfg.Keys)
	if err != nil {
		return nil, err
	}
	w := workload{cfg: cfg, keys: keys, uni: traffic{stream: uni}, zipf: traffic{stream: zipf}, few: fewSchedule(cfg.Keys)}
	if cfg.CachedKeys {
		w.uni.seq, w.zipf.seq, w.fewSeq = packKeys(keys, uni), packKeys(keys, zipf), packKeys(keys, w.few)
	}
	for round := range cfg.Rounds {
		n := len(rows)
		for i := range n {
			p := rows[(i+round)%n]
			if err := ctx.Err(); err != nil {
				return nil, err
			}
			cfg.progress("round %d/%d: %s", round+1, cfg.Rounds, p.Name)
			m, share, allocs, err := w.measure(p)
			if err != nil {
				return nil, fmt.Errorf("peers: %s: %w", p.Name, err)
			}
			for k, v := range m {
				res.Values[p.Name][k] = append(res.Values[p.Name][k], v)
			}
			for k, v := range allocs {
				res.Allocs[p.Name][k] = append(res.Allocs[p.Name][k], v)
			}
			res.AllowedShare[p.Name] = share
		}
		base := res.Values[Baseline]
		for _, p := range rows {
			for _, k := range cfg.timeMetrics() {
				vs := res.Values[p.Name][k]
				if len(vs) <= round || len(base[k]) <= round || base[k][round] == 0 {
					continue // no CPU time on this system
				}
				res.Ratios[p.Name][k] = append(res.Ratios[p.Name][k], vs[round]/base[k][round])
			}
		}
	}
	if !cfg.SkipExact {
		cfg.progress("exactness: limit %d per %v, all peers at once", cfg.ExactLimit, cfg.ExactWindow)
		ex, err := Exactness(ctx, cfg.Peers, cfg.ExactLimit, cfg.ExactWindow)
		if err != nil {
			return nil, err
		}
		for _, e := range ex {
			res.Values[e.Peer][e.Scenario] = []float64{float64(e.MaxInWindow)}
			res.ExactWindows[e.Scenario] = max(res.ExactWindows[e.Scenario], e.Windows)
		}
	}
	return res, nil
}

// TimeMetrics are the per-decision time columns, shown as ratios.
var TimeMetrics = []Metric{HotKey, UniAllowed, ZipfAllowed, UniRefused, ZipfRefused, FewReqs, FewReqsHeap, P99, P999}

// ThroughputMetrics are the time columns that are not percentiles; their
// allocations per decision are measured too.
var ThroughputMetrics = []Metric{HotKey, UniAllowed, ZipfAllowed, UniRefused, ZipfRefused, FewReqs, FewReqsHeap}

func (c *Config) progress(format string, args ...any) {
	if c.Progress != nil {
		fmt.Fprintf(c.Progress, format+"\n", args...)
	}
}

type workload struct {
	cfg       Config
	keys      []string
	uni, zipf traffic
	few       []uint32 // the few-requests scenarios' schedule (fewSchedule)
	fewSeq    *keySeq  // with Config.CachedKeys: the keys of few in order
	lastOps   float64  // decisions of the last timed run
}

// traffic is the key sequence of the uniform or the Zipf scenarios: a
// stream of indexes into the key table and, with Config.CachedKeys, the
// same keys packed in order.
type traffic struct {
	stream []uint32
	seq    *keySeq
}

// keySeq is a sequence of keys laid out in order in one byte array, with
// no pointer for the collector to mark: key i is arena[off[i]:off[i+1]].
// Reading it in order touches memory sequentially, so the keys' bytes
// arrive ahead of use.
type keySeq struct {
	arena []byte
	off   []int
}

// packKeys returns keys[idx[0]], keys[idx[1]], … as a keySeq.
func packKeys(keys []string, idx []uint32) *keySeq {
	n := 0
	for _, i := range idx {
		n += len(keys[i])
	}
	s := &keySeq{arena: make([]byte, 0, n), off: make([]int, 1, len(idx)+1)}
	for _, i := range idx {
		s.arena = append(s.arena, keys[i]...)
		s.off = append(s.off, len(s.arena))
	}
	return s
}

func (s *keySeq) len() int { return len(s.off) - 1 }

// next returns key *i and moves *i on, wrapping around at the end.
func (s *keySeq) next(i *int) string {
	k := s.at(*i)
	if *i++; *i == s.len() {
		*i = 0
	}
	return k
}

// at returns key i, sharing the arena's bytes. A limiter that keeps the
// string keeps the arena; the timed loops only decide keys that already
// hold state, which no peer stores again.
func (s *keySeq) at(i int) string {
	a, b := s.off[i], s.off[i+1]
	return unsafe.String(unsafe.SliceData(s.arena[a:b]), b-a)
}

// measure runs every scenario on peer p once: a mostly-allowed instance
// (its first fill gives B/key after one request; topped up to
// SteadyPrefill requests per key, it runs uniform, Zipf, the core sweep
// and the latency run), a mostly-refused one (its fill gives B/key after
// L requests), two few-requests instances (the second with a big live
// heap beside it), and the hot key. It returns the values, the allowed
// shares and the allocations per decision.
func (w *workload) measure(p Peer) (m, share, allocs map[Metric]float64, err error) {
	m = map[Metric]float64{}
	share = map[Metric]float64{}
	allocs = map[Metric]float64{}
	run := func(metric Metric, f func() (ns, allowed float64)) {
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		cpu0 := processCPU()
		ns, allowed := f()
		cpu1 := processCPU()
		runtime.ReadMemStats(&after)
		m[metric], share[metric] = ns, allowed
		allocs[metric] = float64(after.Mallocs-before.Mallocs) / w.lastOps
		if cpu0 > 0 {
			m[cpuMetric(metric)] = float64(cpu1-cpu0) / w.lastOps
		}
	}

	l, bpk, err := w.filled(p, AllowedLimit, 1)
	if err != nil {
		return nil, nil, nil, err
	}
	m[BytesPerKey1] = bpk
	w.send(l, SteadyPrefill-1, false)
	runtime.GC() // no collection left running into the timed runs
	run(UniAllowed, func() (float64, float64) { return w.parallel(l, w.uni, w.cfg.Procs) })
	run(ZipfAllowed, func() (float64, float64) { return w.parallel(l, w.zipf, w.cfg.Procs) })
	for _, c := range w.cfg.Cores {
		if c == w.cfg.Procs && c == runtime.GOMAXPROCS(0) {
			m[coreMetric(c)] = m[UniAllowed]
			continue
		}
		prev := runtime.GOMAXPROCS(c)
		m[coreMetric(c)], _ = w.parallel(l, w.uni, c)
		runtime.GOMAXPROCS(prev)
	}
	h := w.latency(l, w.zipf)
	m[P99], m[P999] = float64(h.Quantile(0.99)), float64(h.Quantile(0.999))
	if err := l.Close(); err != nil {
		return nil, nil, nil, err
	}
	l = nil

	l, bpk, err = w.filled(p, RefusedLimit, RefusedLimit)
	if err != nil {
		return nil, nil, nil, err
	}
	m[BytesPerKeyL] = bpk
	run(UniRefused, func() (float64, float64) { return w.parallel(l, w.uni, w.cfg.Procs) })
	run(ZipfRefused, func() (float64, float64) { return w.parallel(l, w.zipf, w.cfg.Procs) })
	if err := l.Close(); err != nil {
		return nil, nil, nil, err
	}
	l = nil

	for _, metric := range []Metric{FewReqs, FewReqsHeap} {
		var heap []*heapNode
		if metric == FewReqsHeap {
			heap = bigHeap(w.cfg.HeapObjects)
		}
		l, _, err = w.filled(p, AllowedLimit, 1)
		if err != nil {
			return nil, nil, nil, err
		}
		runtime.GC()
		run(metric, func() (float64, float64) { return w.passes(l) })
		if err := l.Close(); err != nil {
			return nil, nil, nil, err
		}
		l = nil
		runtime.KeepAlive(heap)
	}

	hot, err := p.New(AllowedLimit, Window)
	if err != nil {
		return nil, nil, nil, err
	}
	run(HotKey, func() (float64, float64) { return w.hotKey(hot), 0 })
	return m, share, allocs, hot.Close()
}

// heapNode is one object of the big live heap: a pointer the collector
// must follow and a little payload.
type heapNode struct {
	next *heapNode
	_    [3]int64
}

// bigHeap allocates n heapNodes linked into one chain, the live data of a
// server that holds more than its limiter: every collection marks all of
// it, so a limiter that allocates per decision pays for it.
func bigHeap(n int) []*heapNode {
	nodes := make([]*heapNode, n)
	for i := range nodes {
		nodes[i] = &heapNode{}
		if i > 0 {
			nodes[i-1].next = nodes[i]
		}
	}
	return nodes
}

// filled builds a limiter, sends requests requests to every key, and
// returns it with the heap it retains per key (runtime.GC and HeapAlloc
// around the fill; every request brings a fresh copy of its key, so the
// key bytes a limiter keeps are charged to it).
func (w *workload) filled(p Peer, limit, requests int) (Limiter, float64, error) {
	var before, after runtime.MemStats
	settle()
	runtime.ReadMemStats(&before)
	l, err := p.New(limit, Window)
	if err != nil {
		return nil, 0, err
	}
	w.send(l, requests, true)
	runtime.GC()
	runtime.ReadMemStats(&after)
	return l, (float64(after.HeapAlloc) - float64(before.HeapAlloc)) / float64(len(w.keys)), nil
}

// send sends requests requests to every key, spread over Procs
// goroutines. With fresh, every request brings a fresh copy of the key's
// string, as keys arrive in a server: each limiter is then charged for
// the key bytes it retains (the caller's string, its own copy, or none).
func (w *workload) send(l Limiter, requests int, fresh bool) {
	procs := w.cfg.Procs
	var wg sync.WaitGroup
	for g := range procs {
		wg.Go(func() {
			for i := g; i < len(w.keys); i += procs {
				for range requests {
					k := w.keys[i]
					if fresh {
						k = strings.Clone(k)
					}
					l.Allow(k)
				}
			}
		})
	}
	wg.Wait()
}

// settle collects garbage until the live heap stops shrinking, so that
// limiters freed by finalizers (ulule's memory store stops its cleaner in
// one, so its state outlives the first collection) are gone before a
// measurement starts.
func settle() {
	var ms runtime.MemStats
	last := uint64(0)
	for range 5 {
		runtime.GC()
		time.Sleep(5 * time.Millisecond) // let the finalizer goroutine run
		runtime.ReadMemStats(&ms)
		if ms.HeapAlloc == last {
			return
		}
		last = ms.HeapAlloc
	}
}

// parallel runs procs goroutines deciding the keys of tr for Duration
// and returns the wall time per decision (as RunParallel reports it) and
// the share of allowed decisions.
func (w *workload) parallel(l Limiter, tr traffic, procs int) (nsPerOp, allowed float64) {
	var (
		stop        atomic.Bool
		ops, admits atomic.Int64
		ready, wg   sync.WaitGroup
		start       = make(chan struct{})
	)
	seq := tr.seq
	for g := range procs {
		ready.Add(1)
		wg.Go(func() {
			off := g * (bench.StreamLen / procs)
			c := bench.NewCursor(tr.stream, off)
			n, a := int64(0), int64(0)
			ready.Done()
			<-start
			for !stop.Load() {
				if seq != nil {
					for range 64 {
						if l.Allow(seq.next(&off)) {
							a++
						}
					}
				} else {
					for range 64 {
						if l.Allow(w.keys[c.Next()]) {
							a++
						}
					}
				}
				n += 64
			}
			ops.Add(n)
			admits.Add(a)
		})
	}
	ready.Wait()
	t0 := time.Now()
	close(start)
	time.Sleep(w.cfg.Duration)
	stop.Store(true)
	wg.Wait()
	el := time.Since(t0)
	w.lastOps = float64(ops.Load())
	return float64(el) / float64(ops.Load()), float64(admits.Load()) / float64(ops.Load())
}

// passes is the timed run of the few-requests scenarios: Procs goroutines
// decide, together and in order, the keys of w.few, a shuffled schedule in
// which every key appears one to three times (uniformly drawn), two per
// key on average. Every peer does the same work. It returns the wall time
// per decision and the share allowed.
func (w *workload) passes(l Limiter) (nsPerOp, allowed float64) {
	const chunk = 256
	var (
		next, admits atomic.Int64
		ready, wg    sync.WaitGroup
		start        = make(chan struct{})
		total        = int64(len(w.few))
	)
	for range w.cfg.Procs {
		ready.Add(1)
		wg.Go(func() {
			a := int64(0)
			ready.Done()
			<-start
			for {
				i := next.Add(chunk) - chunk
				if i >= total {
					break
				}
				end := min(i+chunk, total)
				if w.fewSeq != nil {
					for j := i; j < end; j++ {
						if l.Allow(w.fewSeq.at(int(j))) {
							a++
						}
					}
					continue
				}
				for _, k := range w.few[i:end] {
					if l.Allow(w.keys[k]) {
						a++
					}
				}
			}
			admits.Add(a)
		})
	}
	ready.Wait()
	t0 := time.Now()
	close(start)
	wg.Wait()
	el := time.Since(t0)
	w.lastOps = float64(total)
	return float64(el) / float64(total), float64(admits.Load()) / float64(total)
}

// fewSchedule returns the few-requests scenarios' schedule: every key
// index 1 to 3 times (drawn uniformly with a fixed seed), shuffled.
func fewSchedule(keys int) []uint32 {
	r := rand.New(rand.NewPCG(2, uint64(keys)))
	s := make([]uint32, 0, 2*keys+keys/16)
	for i := range keys {
		for range 1 + r.IntN(3) {
			s = append(s, uint32(i))
		}
	}
	r.Shuffle(len(s), func(i, j int) { s[i], s[j] = s[j], s[i] })
	return s
}

// latency times every decision of a parallel run over the keys of tr.
func (w *workload) latency(l Limiter, tr traffic) *latency.Histogram {
	var (
		stop     atomic.Bool
		mu       sync.Mutex
		all      = new(latency.Histogram)
		wg       sync.WaitGroup
		deadline = time.Now().Add(w.cfg.Duration)
	)
	seq := tr.seq
	for g := range w.cfg.Procs {
		wg.Go(func() {
			h := new(latency.Histogram)
			off := (g*(bench.StreamLen/w.cfg.Procs) + bench.StreamLen/3) % len(tr.stream)
			c := bench.NewCursor(tr.stream, off)
			base := time.Now()
			for i := 0; !stop.Load(); i++ {
				var k string
				if seq != nil {
					k = seq.next(&off)
				} else {
					k = w.keys[c.Next()]
				}
				t0 := time.Since(base)
				l.Allow(k)
				t1 := time.Since(base)
				h.Record(int64(t1 - t0))
				if i&1023 == 0 && base.Add(t1).After(deadline) {
					stop.Store(true)
				}
			}
			mu.Lock()
			all.Merge(h)
			mu.Unlock()
		})
	}
	wg.Wait()
	return all
}

// HotKeyOthers is how many other keys hold state in the hot-key
// scenario's limiter, so that no map takes a one-key shortcut.
const HotKeyOthers = 1000

// hotKey sends one request to each of HotKeyOthers other keys, then
// decides one key on one goroutine for Duration.
func (w *workload) hotKey(l Limiter) float64 {
	for _, k := range bench.Keys(HotKeyOthers) {
		l.Allow(k)
	}
	// Every request brings its own copy of the key, as a server builds
	// it per request: a limiter that keeps the caller's string gets no
	// pointer-equal key to compare. The copies are made before the timed
	// loop, so that the loop allocates nothing of the harness's own.
	l.Allow(strings.Clone("hot"))
	var fresh [256]string
	for i := range fresh {
		fresh[i] = strings.Clone("hot")
	}
	n := 0
	t0 := time.Now()
	var el time.Duration
	for {
		for _, k := range fresh {
			l.Allow(k)
		}
		n += len(fresh)
		if el = time.Since(t0); el >= w.cfg.Duration {
			break
		}
	}
	w.lastOps = float64(n)
	return float64(el) / float64(n)
}
