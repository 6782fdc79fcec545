package loadtest

import (
	"context"
	"os"
	"runtime"
	"runtime/debug"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/slidegate/slidegate/engine"
	"github.com/slidegate/slidegate/lab/bench"
)

// memoryFigures is what one limiter retains for the memory phase's
// population. Heap figures are runtime.MemStats.HeapAlloc after a full GC,
// minus the same before population: live bytes, keys included (each key is
// a fresh string the limiter owns). RSS is the resident set's growth, which
// also holds freed but unreturned heap and so is noisier.
type memoryFigures struct {
	HeapBytes       int64   `json:"heap_bytes"`
	RSSBytes        int64   `json:"rss_bytes"`
	HeapPerClient   float64 `json:"heap_per_client"`
	RSSPerClient    float64 `json:"rss_per_client"`
	StoredInstants  int64   `json:"stored_instants"`
	BytesPerInstant float64 `json:"bytes_per_instant"`
	// FloorBytes is 8 bytes per stored instant, a log of raw int64
	// instants with nothing else (the engine's 6-byte slots can go below
	// it); OverFloor is HeapBytes / FloorBytes.
	FloorBytes int64   `json:"floor_bytes"`
	OverFloor  float64 `json:"over_floor"`
	PopulateNs int64   `json:"populate_ns"`
}

// memoryReport compares the engine with the textbook map of deques on the
// same population, measured in one run.
type memoryReport struct {
	Clients   int           `json:"clients"`
	PerClient int           `json:"per_client"`
	Engine    memoryFigures `json:"engine"`
	Textbook  memoryFigures `json:"textbook"`
	// Ratio is the engine's heap over the textbook's (the target is ≤ 0.5).
	Ratio float64 `json:"ratio"`
}

// memoryWindow is the memory phase's window: long enough that nothing
// expires (and no sweep runs) while the population is measured.
const memoryWindow = time.Hour

// runMemory populates cfg.Clients keys with cfg.PerClient requests each,
// first in an engine.Limiter and then in a bench.Textbook, and measures each.
func runMemory(ctx context.Context, cfg Config, ui *ui, prof *profiler) (*memoryReport, error) {
	rep := &memoryReport{Clients: cfg.Clients, PerClient: cfg.PerClient}
	pol := cfg.policy(0)
	pol.Window = memoryWindow

	var err error
	rep.Engine, err = measure(ctx, cfg, ui, "memory: engine", func() (population, error) {
		lim, err := engine.New(pol, engine.WithSweepInterval(0))
		return enginePopulation{lim}, err
	}, func() { prof.heap("memory") })
	if err != nil {
		return nil, err
	}
	rep.Textbook, err = measure(ctx, cfg, ui, "memory: textbook", func() (population, error) {
		tb, err := bench.NewTextbook(pol.Limit, pol.Window)
		return textbookPopulation{tb}, err
	}, nil)
	if err != nil {
		return nil, err
	}
	if rep.Textbook.HeapBytes > 0 {
		rep.Ratio = float64(rep.Engine.HeapBytes) / float64(rep.Textbook.HeapBytes)
	}
	return rep, nil
}

// population is a limiter under the memory phase.
type population interface {
	allow(key string) bool
	stored() int64
	close()
}

type enginePopulation struct{ *engine.Limiter }

func (p enginePopulation) allow(key string) bool { return p.Allow(key).Allowed }
func (p enginePopulation) stored() int64         { return p.Stats().StoredInstants }
func (p enginePopulation) close()                { p.Close() }

// textbookPopulation is the textbook design, a mutex over a map of deques,
// as the benchmarks measure it (bench.Textbook).
type textbookPopulation struct{ *bench.Textbook }

func (p textbookPopulation) allow(key string) bool { return p.Allow(key).Allowed }
func (p textbookPopulation) stored() int64         { return p.StoredInstants() }
func (p textbookPopulation) close()                {}

// measure builds a limiter with mk, populates it from GOMAXPROCS
// goroutines, and returns its retained heap and RSS.
// heap, if not nil, is called while the population is still alive.
func measure(ctx context.Context, cfg Config, ui *ui, name string, mk func() (population, error), heap func()) (memoryFigures, error) {
	var f memoryFigures
	runtime.GC()
	debug.FreeOSMemory()
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	rss0 := rss()

	pop, err := mk()
	if err != nil {
		return f, err
	}
	defer pop.close()

	total := int64(cfg.Clients) * int64(cfg.PerClient)
	var done atomic.Int64
	bar := ui.bar(total, name, &done)
	start := time.Now()
	workers := runtime.GOMAXPROCS(0)
	var wg sync.WaitGroup
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var n int64
			for c := w; c < cfg.Clients; c += workers {
				k := clientKey(c)
				for range cfg.PerClient {
					pop.allow(k)
				}
				if n++; n == 1024 {
					done.Add(n * int64(cfg.PerClient))
					n = 0
					if ctx.Err() != nil {
						return
					}
				}
			}
			done.Add(n * int64(cfg.PerClient))
		}()
	}
	wg.Wait()
	f.PopulateNs = int64(time.Since(start))
	bar.finish()
	if err := ctx.Err(); err != nil {
		return f, err
	}

	runtime.GC()
	runtime.ReadMemStats(&after)
	f.RSSBytes = rss() - rss0
	f.HeapBytes = int64(after.HeapAlloc) - int64(before.HeapAlloc)
	f.StoredInstants = pop.stored()
	n := float64(cfg.Clients)
	f.HeapPerClient = float64(f.HeapBytes) / n
	f.RSSPerClient = float64(f.RSSBytes) / n
	if f.StoredInstants > 0 {
		f.BytesPerInstant = float64(f.HeapBytes) / float64(f.StoredInstants)
		f.FloorBytes = 8 * f.StoredInstants
		f.OverFloor = float64(f.HeapBytes) / float64(f.FloorBytes)
	}
	if heap != nil {
		heap()
	}
	runtime.KeepAlive(pop)
	return f, nil
}

// rss returns the resident set size in bytes (Linux; 0 elsewhere).
func rss() int64 {
	b, err := os.ReadFile("/proc/self/statm")
	if err != nil {
		return 0
	}
	fields := strings.Fields(string(b))
	if len(fields) < 2 {
		return 0
	}
	pages, err := strconv.ParseInt(fields[1], 10, 64)
	if err != nil {
		return 0
	}
	return pages * int64(os.Getpagesize())
}

// writeText writes the memory section of the summary.
func (m *memoryReport) writeText(p func(string, ...any)) {
	p("")
	p("memory    %s clients × %d request(s), retained after GC (keys included)", commas(int64(m.Clients)), m.PerClient)
	p("  %-9s %12s %11s %11s %13s %11s %8s", "", "heap", "heap/client", "RSS/client", "instants", "B/instant", "× floor")
	for _, row := range []struct {
		name string
		f    memoryFigures
	}{{"engine", m.Engine}, {"textbook", m.Textbook}} {
		p("  %-9s %12s %9.1f B %9.1f B %13s %9.1f B %7.1f×", row.name, fmtBytes(row.f.HeapBytes), row.f.HeapPerClient,
			row.f.RSSPerClient, commas(row.f.StoredInstants), row.f.BytesPerInstant, row.f.OverFloor)
	}
	p("  reference: 8 B (one int64) × %s instants = %s; engine heap is %.2f× the textbook's (mutex map[string]*deque)",
		commas(m.Engine.StoredInstants), fmtBytes(m.Engine.FloorBytes), m.Ratio)
}
