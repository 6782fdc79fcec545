package peers

import (
	"context"
	"fmt"
	"io"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/slidegate/slidegate/bench"
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

	Progress io.Writer // one line per step; nil for none
}

// Defaults of Config.
const (
	DefaultKeys        = 1_000_000
	DefaultRounds      = 3
	DefaultDuration    = 250 * time.Millisecond
	DefaultExactLimit  = 10
	DefaultExactWindow = time.Second
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
}

func (c *Config) defaults() {
	if c.Keys == 0 {
		c.Keys = DefaultKeys
	}
	if c.Rounds == 0 {
		c.Rounds = DefaultRounds
	}
	if c.Duration == 0 {
		c.Duration = DefaultDuration
	}
	if c.Procs == 0 {
		c.Procs = runtime.GOMAXPROCS(0)
	}
	if c.Peers == nil {
		c.Peers = All()
	}
	if c.ExactLimit == 0 {
		c.ExactLimit = DefaultExactLimit
	}
	if c.ExactWindow == 0 {
		c.ExactWindow = DefaultExactWindow
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
	}
	for _, p := range cfg.Peers {
		res.Values[p.Name] = map[Metric][]float64{}
		res.Ratios[p.Name] = map[Metric][]float64{}
		res.AllowedShare[p.Name] = map[Metric]float64{}
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
	w := workload{cfg: cfg, keys: keys, uni: uni, zipf: zipf}
	for round := range cfg.Rounds {
		n := len(cfg.Peers)
		for i := range n {
			p := cfg.Peers[(i+round)%n]
			if err := ctx.Err(); err != nil {
				return nil, err
			}
			cfg.progress("round %d/%d: %s", round+1, cfg.Rounds, p.Name)
			m, share, err := w.measure(p)
			if err != nil {
				return nil, fmt.Errorf("peers: %s: %w", p.Name, err)
			}
			for k, v := range m {
				res.Values[p.Name][k] = append(res.Values[p.Name][k], v)
			}
			res.AllowedShare[p.Name] = share
		}
		base := res.Values[Baseline]
		for _, p := range cfg.Peers {
			for _, k := range TimeMetrics {
				vs := res.Values[p.Name][k]
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
var TimeMetrics = []Metric{HotKey, UniAllowed, ZipfAllowed, UniRefused, ZipfRefused, P99, P999}

func (c *Config) progress(format string, args ...any) {
	if c.Progress != nil {
		fmt.Fprintf(c.Progress, format+"\n", args...)
	}
}

type workload struct {
	cfg       Config
	keys      []string
	uni, zipf []uint32
}

// measure runs every scenario on peer p once: a mostly-allowed instance
// (its first fill gives B/key after one request; topped up to
// SteadyPrefill requests per key, it runs uniform, Zipf and the latency
// run), a mostly-refused one (its fill gives B/key after L
// requests), and the hot key.
func (w *workload) measure(p Peer) (map[Metric]float64, map[Metric]float64, error) {
	m := map[Metric]float64{}
	share := map[Metric]float64{}

	l, bpk, err := w.filled(p, AllowedLimit, 1)
	if err != nil {
		return nil, nil, err
	}
	m[BytesPerKey1] = bpk
	w.send(l, SteadyPrefill-1)
	runtime.GC() // no collection left running into the timed runs
	m[UniAllowed], share[UniAllowed] = w.parallel(l, w.uni)
	m[ZipfAllowed], share[ZipfAllowed] = w.parallel(l, w.zipf)
	h := w.latency(l, w.zipf)
	m[P99], m[P999] = float64(h.Quantile(0.99)), float64(h.Quantile(0.999))
	if err := l.Close(); err != nil {
		return nil, nil, err
	}
	l = nil

	l, bpk, err = w.filled(p, RefusedLimit, RefusedLimit)
	if err != nil {
		return nil, nil, err
	}
	m[BytesPerKeyL] = bpk
	m[UniRefused], share[UniRefused] = w.parallel(l, w.uni)
	m[ZipfRefused], share[ZipfRefused] = w.parallel(l, w.zipf)
	if err := l.Close(); err != nil {
		return nil, nil, err
	}

	hot, err := p.New(AllowedLimit, Window)
	if err != nil {
		return nil, nil, err
	}
	m[HotKey] = w.hotKey(hot)
	return m, share, hot.Close()
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
	w.sendFresh(l, requests)
	runtime.GC()
	runtime.ReadMemStats(&after)
	return l, (float64(after.HeapAlloc) - float64(before.HeapAlloc)) / float64(len(w.keys)), nil
}

// send sends requests requests to every key, spread over Procs goroutines.
func (w *workload) send(l Limiter, requests int) {
	procs := w.cfg.Procs
	var wg sync.WaitGroup
	for g := range procs {
		wg.Go(func() {
			for i := g; i < len(w.keys); i += procs {
				for range requests {
					l.Allow(w.keys[i])
				}
			}
		})
	}
	wg.Wait()
}

// sendFresh is send with a fresh copy of the key's string for every
// request, as keys arrive in a server: each limiter is charged for the key
// bytes it retains (the caller's string, its own copy, or none).
func (w *workload) sendFresh(l Limiter, requests int) {
	procs := w.cfg.Procs
	var wg sync.WaitGroup
	for g := range procs {
		wg.Go(func() {
			for i := g; i < len(w.keys); i += procs {
				for range requests {
					l.Allow(strings.Clone(w.keys[i]))
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

// parallel runs Procs goroutines deciding keys from stream for Duration
// and returns the wall time per decision (as RunParallel reports it) and
// the share of allowed decisions.
func (w *workload) parallel(l Limiter, stream []uint32) (nsPerOp, allowed float64) {
	var (
		stop        atomic.Bool
		ops, admits atomic.Int64
		ready, wg   sync.WaitGroup
		start       = make(chan struct{})
	)
	for g := range w.cfg.Procs {
		ready.Add(1)
		wg.Go(func() {
			c := bench.NewCursor(stream, g*(bench.StreamLen/w.cfg.Procs))
			n, a := int64(0), int64(0)
			ready.Done()
			<-start
			for !stop.Load() {
				for range 64 {
					if l.Allow(w.keys[c.Next()]) {
						a++
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
	return float64(el) / float64(ops.Load()), float64(admits.Load()) / float64(ops.Load())
}

// latency times every decision of a parallel Zipf run.
func (w *workload) latency(l Limiter, stream []uint32) *bench.Histogram {
	var (
		stop     atomic.Bool
		mu       sync.Mutex
		all      = new(bench.Histogram)
		wg       sync.WaitGroup
		deadline = time.Now().Add(w.cfg.Duration)
	)
	for g := range w.cfg.Procs {
		wg.Go(func() {
			h := new(bench.Histogram)
			c := bench.NewCursor(stream, g*(bench.StreamLen/w.cfg.Procs)+bench.StreamLen/3)
			base := time.Now()
			for i := 0; !stop.Load(); i++ {
				k := w.keys[c.Next()]
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

// hotKey decides one key on one goroutine for Duration.
func (w *workload) hotKey(l Limiter) float64 {
	n := 0
	t0 := time.Now()
	var el time.Duration
	for {
		for range 256 {
			l.Allow("hot")
		}
		n += 256
		if el = time.Since(t0); el >= w.cfg.Duration {
			break
		}
	}
	return float64(el) / float64(n)
}
