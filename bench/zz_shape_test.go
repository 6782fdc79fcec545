package bench

import (
	"os"
	"runtime"
	"runtime/pprof"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/puzpuzpuz/xsync/v3"
	"github.com/slidegate/slidegate/engine"
)

func shapeRun(b *testing.B, name string, allow func(string) bool, procs int, ops int) {
	keys := Keys(manyKeys)
	stream, _ := Stream(Uniform, manyKeys)
	runtime.GC()
	if p := os.Getenv("SHAPE_PROF"); p != "" {
		f, _ := os.Create(p + "." + name)
		pprof.StartCPUProfile(f)
		defer func() { pprof.StopCPUProfile(); f.Close() }()
	}
	var ms0, ms1 runtime.MemStats
	runtime.ReadMemStats(&ms0)
	var wg sync.WaitGroup
	t0 := time.Now()
	for g := range procs {
		wg.Go(func() {
			c := NewCursor(stream, g*StreamLen/procs)
			for range ops / procs {
				allow(keys[c.Next()])
			}
		})
	}
	wg.Wait()
	el := time.Since(t0)
	runtime.ReadMemStats(&ms1)
	b.ReportMetric(float64(el)/float64(ops), "wall-ns/dec")
	b.ReportMetric(float64(ms1.Mallocs-ms0.Mallocs)/float64(ops), "allocs/dec")
	b.ReportMetric(float64(ms1.NumGC-ms0.NumGC), "GCs")
}

func BenchmarkShape(b *testing.B) {
	keys := Keys(manyKeys)
	ops := 1 << 20
	if s := os.Getenv("SHAPE_OPS"); s != "" {
		ops = atoiOr(s, ops)
	}
	prefill := atoiOr(os.Getenv("SHAPE_PREFILL"), 6)
	for b.Loop() {
		for round := 0; round < 3; round++ {
			func() {
				m := xsync.NewMapOf[string, *atomic.Int64]()
				for _, k := range keys {
					m.Store(k, new(atomic.Int64))
				}
				epoch := time.Now()
				b.Run("floor", func(b *testing.B) {
					shapeRun(b, "floor", func(k string) bool {
						v, _ := m.Load(k)
						return int64(time.Since(epoch)) >= v.Load()
					}, 2, ops)
				})
			}()
			func() {
				l, _ := engine.New(engine.Policy{Limit: 100, Window: time.Minute}, engine.WithSweepInterval(0))
				for range prefill {
					for _, k := range keys {
						l.Allow(k)
					}
				}
				b.Run("slidegate", func(b *testing.B) {
					shapeRun(b, "slidegate", func(k string) bool { return l.Allow(k).Allowed }, 2, ops)
				})
			}()
		}
	}
}

func atoiOr(s string, d int) int {
	n := 0
	if s == "" {
		return d
	}
	for _, c := range s {
		n = n*10 + int(c-'0')
	}
	return n
}
