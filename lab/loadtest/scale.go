package loadtest

import (
	"context"
	"fmt"
	"html"
	"io"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/slidegate/slidegate/engine"
	"github.com/slidegate/slidegate/internal/numfmt"
	"github.com/slidegate/slidegate/lab/internal/latency"
)

// scaleSizes are the client counts scale mode measures, up to
// --scale-max (the default stops at 1,000,000; 10,000,000 is optional).
var scaleSizes = []int{10_000, 100_000, 1_000_000, 10_000_000}

// scalePoint is scale mode's measure at one client count.
type scalePoint struct {
	Clients int `json:"clients"`
	// After1 and AfterL are the retained heap and RSS growth per client
	// after one request per client and after L (ScaleReport.PerClient),
	// measured as the memory phase measures (keys included).
	Heap1PerClient float64 `json:"heap1_per_client"`
	RSS1PerClient  float64 `json:"rss1_per_client"`
	HeapLPerClient float64 `json:"heapL_per_client"`
	RSSLPerClient  float64 `json:"rssL_per_client"`
	// Decisions timed on the populated limiter: D per client in a uniform
	// random order (the working set is the population), every one a
	// refusal of a full client; Allowed counts any admitted (an error).
	Decisions  int64   `json:"decisions"`
	Allowed    int64   `json:"allowed"`
	DurationNs int64   `json:"duration_ns"`
	Throughput float64 `json:"decisions_per_sec"`
	// NsPerDecision is wall time per decision over all workers
	// (1e9 / Throughput).
	NsPerDecision float64         `json:"ns_per_decision"`
	Latency       latency.Summary `json:"latency"` // 1 in SampleEvery decisions timed
}

// scaleReport is scale mode's outcome.
type scaleReport struct {
	Policy      policyReport `json:"policy"`
	PerClient   int          `json:"per_client"` // L
	Decisions   int          `json:"decisions"`  // D per client
	Workers     int          `json:"workers"`
	SampleEvery int          `json:"sample_every"`
	Points      []scalePoint `json:"points"`
	Plot        string       `json:"plot"`
}

// scaleWindow is scale mode's window: nothing expires while it measures.
const scaleWindow = time.Hour

// runScale measures, at each of scaleSizes up to cfg.ScaleMax, an
// engine.Limiter's heap and RSS per client after one request per client
// and after L (the policy's limit: every client's ring full), then
// cfg.ScaleDecisions (D) more decisions per client in a uniform random
// order: every one a refusal (the window is long enough that nothing
// expires), so that the work per decision is the same at every size and
// only the key space grows. Decisions per second and sampled latency.
func runScale(ctx context.Context, cfg Config, u *ui) (*scaleReport, error) {
	pol := cfg.policy(0)
	pol.Window = scaleWindow
	rep := &scaleReport{Policy: policyInfo(pol), PerClient: pol.Limit, Decisions: cfg.ScaleDecisions, Workers: defaultWorkers(), SampleEvery: defaultSampleEvery}
	for _, n := range scaleSizes {
		if n > cfg.ScaleMax {
			break
		}
		pt, err := scaleAt(ctx, cfg, u, pol, n, rep.Workers)
		if err != nil {
			return nil, err
		}
		rep.Points = append(rep.Points, pt)
	}
	return rep, nil
}

func scaleAt(ctx context.Context, cfg Config, u *ui, pol engine.Policy, n, workers int) (scalePoint, error) {
	pt := scalePoint{Clients: n}
	runtime.GC()
	debug.FreeOSMemory()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	heap0, rss0 := int64(ms.HeapAlloc), rss()
	lim, err := engine.New(pol, engine.WithSweepInterval(0))
	if err != nil {
		return pt, err
	}
	defer lim.Close()
	populate := func(from, to int, desc string) error {
		var done atomic.Int64
		bar := u.bar(int64(n)*int64(to-from), desc, &done)
		defer bar.finish()
		p := runtime.GOMAXPROCS(0)
		var wg sync.WaitGroup
		for w := range p {
			wg.Go(func() {
				// Progress in batches of this worker's own clients (every
				// p-th client is this worker's).
				batch := 0
				for c := w; c < n; c += p {
					k := clientKey(c)
					for range to - from {
						lim.Allow(k)
					}
					if batch++; batch == 4096 {
						done.Add(int64(batch * (to - from)))
						batch = 0
						if ctx.Err() != nil {
							return
						}
					}
				}
				done.Add(int64(batch * (to - from)))
			})
		}
		wg.Wait()
		return ctx.Err()
	}
	measure := func() (heap, rssPer float64) {
		runtime.GC()
		runtime.ReadMemStats(&ms)
		return float64(int64(ms.HeapAlloc)-heap0) / float64(n), float64(rss()-rss0) / float64(n)
	}
	if err := populate(0, 1, fmt.Sprintf("scale %s: 1 request", commas(int64(n)))); err != nil {
		return pt, err
	}
	pt.Heap1PerClient, pt.RSS1PerClient = measure()
	if pol.Limit > 1 {
		if err := populate(1, pol.Limit, fmt.Sprintf("scale %s: %d requests", commas(int64(n)), pol.Limit)); err != nil {
			return pt, err
		}
	}
	pt.HeapLPerClient, pt.RSSLPerClient = measure()

	// Decisions: keys and streams made first, outside the timing.
	keys := make([]string, n)
	for i := range keys {
		keys[i] = clientKey(i)
	}
	// D rounds over every client, shuffled, split among the workers.
	total := int64(n) * int64(cfg.ScaleDecisions)
	order := make([]uint32, total)
	for i := range order {
		order[i] = uint32(i % n)
	}
	rng := rand.New(rand.NewPCG(cfg.Seed, uint64(n)))
	rng.Shuffle(len(order), func(i, j int) { order[i], order[j] = order[j], order[i] })
	per := splitCount(total, workers)
	seqs := make([][]uint32, workers)
	var off int64
	for w := range workers {
		seqs[w] = order[off : off+per[w]]
		off += per[w]
	}
	hists := make([]latency.Histogram, workers)
	allowed := make([]int64, workers)
	var wg sync.WaitGroup
	start := time.Now()
	for w := range workers {
		wg.Go(func() {
			h := &hists[w]
			var a int64
			for i, k := range seqs[w] {
				var d engine.Decision
				if i%defaultSampleEvery == 0 {
					key := keys[k]
					t0 := time.Now()
					d = lim.Allow(key)
					h.Record(int64(time.Since(t0)))
				} else {
					d = lim.Allow(keys[k])
				}
				if d.Allowed {
					a++
				}
			}
			allowed[w] = a
		})
	}
	wg.Wait()
	el := time.Since(start)
	var h latency.Histogram
	for w := range workers {
		h.Merge(&hists[w])
		pt.Allowed += allowed[w]
	}
	if pt.Allowed != 0 {
		return pt, fmt.Errorf("scale %s: %d of %d timed decisions admitted on clients already holding %d requests in a window that had not moved: over-admission", commas(int64(n)), pt.Allowed, total, pol.Limit)
	}
	pt.Decisions, pt.DurationNs = total, int64(el)
	pt.Throughput = float64(pt.Decisions) / el.Seconds()
	pt.NsPerDecision = 1e9 / pt.Throughput
	pt.Latency = h.Summary()
	runtime.KeepAlive(keys)
	return pt, ctx.Err()
}

// writeHTML writes both curves of scale mode in one HTML page: bytes per
// client and nanoseconds per decision against clients, both axes in log
// scale, drawn as inline SVG (no script, no network), with the table of
// figures below.
func (r *scaleReport) writeHTML(w io.Writer, title string) error {
	var b strings.Builder
	fmt.Fprintf(&b, "<!doctype html>\n<html><head><meta charset=\"utf-8\"><title>%s</title>\n", html.EscapeString(title))
	b.WriteString("<style>body{font-family:sans-serif;margin:2em} svg{margin-right:2em} text{font-size:12px} table{border-collapse:collapse} td,th{padding:2px 8px;text-align:right;border-bottom:1px solid #ddd}</style></head><body>\n")
	fmt.Fprintf(&b, "<h1>%s</h1>\n", html.EscapeString(title))
	r.charts(&b)
	L := fmt.Sprint(r.PerClient)
	b.WriteString("<table><tr><th>clients</th><th>heap B/client (1)</th><th>heap B/client (" + L + ")</th><th>RSS B/client (1)</th><th>RSS B/client (" + L + ")</th><th>decisions/s</th><th>ns/decision</th><th>p50</th><th>p99</th></tr>\n")
	for _, p := range r.Points {
		fmt.Fprintf(&b, "<tr><td>%s</td><td>%.1f</td><td>%.1f</td><td>%.1f</td><td>%.1f</td><td>%s</td><td>%.0f</td><td>%s</td><td>%s</td></tr>\n",
			commas(int64(p.Clients)), p.Heap1PerClient, p.HeapLPerClient, p.RSS1PerClient, p.RSSLPerClient, si(p.Throughput), p.NsPerDecision,
			fmtNs(p.Latency.P50Ns), fmtNs(p.Latency.P99Ns))
	}
	b.WriteString("</table></body></html>\n")
	_, err := io.WriteString(w, b.String())
	return err
}

// writeSVG writes both curves side by side as one SVG image (for
// documents that show images but not HTML).
func (r *scaleReport) writeSVG(w io.Writer) error {
	var b strings.Builder
	b.WriteString("<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"1040\" height=\"360\" font-family=\"sans-serif\" font-size=\"12\">\n<rect width=\"1040\" height=\"360\" fill=\"white\"/>\n")
	var inner strings.Builder
	r.charts(&inner)
	// Place the second chart to the right of the first.
	parts := strings.SplitAfter(inner.String(), "</svg>\n")
	x := 0
	for _, part := range parts {
		if strings.TrimSpace(part) == "" {
			continue
		}
		b.WriteString(strings.Replace(part, "<svg ", fmt.Sprintf("<svg x=\"%d\" ", x), 1))
		x += 520
	}
	b.WriteString("</svg>\n")
	_, err := io.WriteString(w, b.String())
	return err
}

// charts draws the two charts.
func (r *scaleReport) charts(w io.Writer) {
	var xs []float64
	var h1, hl, r1, rl, ns, p50, p99 []float64
	for _, p := range r.Points {
		xs = append(xs, float64(p.Clients))
		h1, hl = append(h1, p.Heap1PerClient), append(hl, p.HeapLPerClient)
		r1, rl = append(r1, p.RSS1PerClient), append(rl, p.RSSLPerClient)
		ns = append(ns, p.NsPerDecision)
		p50, p99 = append(p50, float64(p.Latency.P50Ns)), append(p99, float64(p.Latency.P99Ns))
	}
	L := fmt.Sprint(r.PerClient)
	svgChart(w, "bytes per client (heap, RSS)", "bytes", xs, []series{
		{"heap, 1 request", "#1f77b4", false, h1}, {"heap, " + L + " requests", "#d62728", false, hl},
		{"RSS, 1 request", "#1f77b4", true, r1}, {"RSS, " + L + " requests", "#d62728", true, rl},
	})
	svgChart(w, "time per decision", "ns", xs, []series{
		{"wall ns per decision (all workers)", "#2ca02c", false, ns},
		{"p50 latency", "#9467bd", true, p50}, {"p99 latency", "#ff7f0e", false, p99},
	})
}

// writeScalePlots writes scale.html and scale.svg under dir.
func writeScalePlots(dir string, r *scaleReport, title string) (htmlPath, svgPath string, err error) {
	htmlPath, svgPath = filepath.Join(dir, "scale.html"), filepath.Join(dir, "scale.svg")
	var hb, sb strings.Builder
	if err := r.writeHTML(&hb, title); err != nil {
		return "", "", err
	}
	if err := r.writeSVG(&sb); err != nil {
		return "", "", err
	}
	if err := os.WriteFile(htmlPath, []byte(hb.String()), 0o644); err != nil {
		return "", "", err
	}
	return htmlPath, svgPath, os.WriteFile(svgPath, []byte(sb.String()), 0o644)
}

type series struct {
	name   string
	color  string
	dashed bool
	ys     []float64
}

// svgChart draws series against xs on log-log axes.
func svgChart(w io.Writer, title, unit string, xs []float64, ss []series) {
	const W, H, left, right, top, bottom = 520.0, 360.0, 70.0, 20.0, 30.0, 110.0
	lo, hi := math.Inf(1), math.Inf(-1)
	for _, s := range ss {
		for _, y := range s.ys {
			if y > 0 {
				lo, hi = min(lo, y), max(hi, y)
			}
		}
	}
	if len(xs) == 0 || math.IsInf(lo, 1) {
		return
	}
	ylo, yhi := math.Floor(math.Log10(lo)), math.Ceil(math.Log10(hi))
	if yhi == ylo {
		yhi++
	}
	xlo, xhi := math.Floor(math.Log10(xs[0])), math.Ceil(math.Log10(xs[len(xs)-1]))
	if xhi == xlo {
		xhi++
	}
	px := func(x float64) float64 { return left + (math.Log10(x)-xlo)/(xhi-xlo)*(W-left-right) }
	py := func(y float64) float64 { return top + (yhi-math.Log10(y))/(yhi-ylo)*(H-top-bottom) }
	fmt.Fprintf(w, "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%.0f\" height=\"%.0f\">\n", W, H)
	fmt.Fprintf(w, "<text x=\"%.0f\" y=\"18\" font-weight=\"bold\">%s</text>\n", left, html.EscapeString(title))
	for e := ylo; e <= yhi; e++ {
		for _, m := range []float64{1, 2, 5} {
			v := m * math.Pow(10, e)
			if math.Log10(v) > yhi+1e-9 {
				break
			}
			y := py(v)
			fmt.Fprintf(w, "<line x1=\"%.1f\" x2=\"%.1f\" y1=\"%.1f\" y2=\"%.1f\" stroke=\"#eee\"/><text x=\"%.1f\" y=\"%.1f\" text-anchor=\"end\">%s</text>\n",
				left, W-right, y, y, left-4, y+4, axisLabel(v))
		}
	}
	for e := xlo; e <= xhi; e++ {
		x := px(math.Pow(10, e))
		fmt.Fprintf(w, "<line x1=\"%.1f\" x2=\"%.1f\" y1=\"%.1f\" y2=\"%.1f\" stroke=\"#eee\"/><text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\">%s</text>\n",
			x, x, top, H-bottom, x, H-bottom+16, axisLabel(math.Pow(10, e)))
	}
	fmt.Fprintf(w, "<text x=\"%.0f\" y=\"%.0f\" text-anchor=\"middle\">clients (log scale)</text>\n", (left+W-right)/2, H-bottom+34)
	fmt.Fprintf(w, "<text x=\"14\" y=\"%.0f\" transform=\"rotate(-90 14 %.0f)\" text-anchor=\"middle\">%s (log scale)</text>\n", (top+H-bottom)/2, (top+H-bottom)/2, unit)
	for i, s := range ss {
		var pts []string
		for j, y := range s.ys {
			if y > 0 {
				pts = append(pts, fmt.Sprintf("%.1f,%.1f", px(xs[j]), py(y)))
			}
		}
		dash := ""
		if s.dashed {
			dash = " stroke-dasharray=\"5,4\""
		}
		fmt.Fprintf(w, "<polyline fill=\"none\" stroke=\"%s\" stroke-width=\"2\"%s points=\"%s\"/>\n", s.color, dash, strings.Join(pts, " "))
		for _, p := range pts {
			xy := strings.Split(p, ",")
			fmt.Fprintf(w, "<circle cx=\"%s\" cy=\"%s\" r=\"3\" fill=\"%s\"/>\n", xy[0], xy[1], s.color)
		}
		ly := H - bottom + 52 + float64(i)*15
		fmt.Fprintf(w, "<line x1=\"%.0f\" x2=\"%.0f\" y1=\"%.0f\" y2=\"%.0f\" stroke=\"%s\" stroke-width=\"2\"%s/><text x=\"%.0f\" y=\"%.0f\">%s</text>\n",
			left, left+30, ly-4, ly-4, s.color, dash, left+36, ly, html.EscapeString(s.name))
	}
	fmt.Fprintln(w, "</svg>")
}

// axisLabel is an axis tick's label: 500, 20k, 1.5M.
func axisLabel(v float64) string {
	return numfmt.Scaled(v, numfmt.Unit{From: 1e6, Div: 1e6, Format: "%gM"},
		numfmt.Unit{From: 1e3, Div: 1e3, Format: "%gk"}, numfmt.Unit{Div: 1, Format: "%g"})
}

// writeText writes the scale section of the summary.
func (r *scaleReport) writeText(p func(string, ...any)) {
	p("")
	p("scale     policy %d per %v (%s), the window long enough that nothing expires; clients filled to the limit, then %d more decisions per client (all refusals)",
		r.Policy.Limit, time.Duration(r.Policy.WindowNs), r.Policy.Algorithm, r.Decisions)
	p("          in a shuffled order from %d goroutines, 1 in %d timed", r.Workers, r.SampleEvery)
	p("  %12s %10s %12s %10s %12s %12s %9s %9s %9s", "clients", "heap/c (1)", fmt.Sprintf("heap/c (%d)", r.PerClient), "RSS/c (1)",
		fmt.Sprintf("RSS/c (%d)", r.PerClient), "decisions/s", "ns/dec", "p50", "p99")
	for _, pt := range r.Points {
		p("  %12s %8.1f B %10.1f B %8.1f B %10.1f B %12s %9.0f %9s %9s", commas(int64(pt.Clients)), pt.Heap1PerClient, pt.HeapLPerClient,
			pt.RSS1PerClient, pt.RSSLPerClient, si(pt.Throughput), pt.NsPerDecision, fmtNs(pt.Latency.P50Ns), fmtNs(pt.Latency.P99Ns))
	}
	if r.Plot != "" {
		p("  curves: %s", r.Plot)
	}
}
