package peers

import (
	"fmt"
	"io"
	"runtime"
	"strings"

	"github.com/slidegate/slidegate/internal/numfmt"
	"github.com/slidegate/slidegate/lab/internal/latency"
)

// WriteTable writes the results as one markdown table: per limiter the
// median time per decision of each scenario with its median ratio to
// slidegate in the same round, latency percentiles, retained bytes per
// key, and the exactness counts; then the notes a reader needs.
func (r *Results) WriteTable(w io.Writer) error {
	cfg := r.Config
	var b strings.Builder
	cols := []string{"limiter", "design"}
	kl := keyLabel(cfg.Keys)
	for _, m := range TimeMetrics {
		switch m {
		case UniAllowed, ZipfAllowed, UniRefused, ZipfRefused, FewReqs, FewReqsHeap:
			cols = append(cols, kl+" "+string(m))
		case P99, P999:
			cols = append(cols, string(m)+", "+kl+" Zipf")
		default:
			cols = append(cols, string(m))
		}
	}
	cols = append(cols, string(BytesPerKey1), fmt.Sprintf("B/key, %d reqs", RefusedLimit))
	if !cfg.SkipExact {
		cols = append(cols, fmt.Sprintf("most admitted in any W, L = %d: boundary / tail / parallel", cfg.ExactLimit))
	}
	b.WriteString("| " + strings.Join(cols, " | ") + " |\n")
	b.WriteString("|" + strings.Repeat("---|", len(cols)) + "\n")
	base := r.Values[Baseline]
	rows := cfg.measured()
	for _, p := range rows {
		v := r.Values[p.Name]
		row := []string{p.Name, p.Design}
		for _, m := range TimeMetrics {
			row = append(row, fmt.Sprintf("%s · %.2f×", formatNs(latency.Median(v[m])), latency.Median(r.Ratios[p.Name][m])))
		}
		for _, m := range []Metric{BytesPerKey1, BytesPerKeyL} {
			row = append(row, fmt.Sprintf("%.0f · %.2f×", latency.Median(v[m]), latency.Median(v[m])/latency.Median(base[m])))
		}
		if !cfg.SkipExact && notLimiter(p.Name) {
			row = append(row, "—")
		} else if !cfg.SkipExact {
			var ex []string
			for _, m := range []Metric{Boundary, TailBurst, Parallel} {
				n := int(latency.Median(v[m]))
				s := fmt.Sprint(n)
				if n > cfg.ExactLimit {
					s = "**" + s + "**"
				}
				ex = append(ex, s)
			}
			row = append(row, strings.Join(ex, " / "))
		}
		b.WriteString("| " + strings.Join(row, " | ") + " |\n")
	}
	fmt.Fprintf(&b, "\nTimes are per decision, median of %d rounds, with the median ratio to %s measured in the same round (below 1 is faster). "+
		"Hot key: one key on one goroutine, limit %d/min (all but the first %d refused), beside %d other keys holding one request each; every request brings its own copy of the key. "+
		"Many-key scenarios: %d keys on %d goroutines, limit %d/min (allowed: every key holding %d requests) or %d/min (refused: every key full); "+
		"p99 and p99.9 time every decision at %d Zipf keys and include one clock read of the timer. "+
		"Few reqs: limit %d/min, every key holding one request; the timed traffic brings each key one to three more (drawn uniformly, two on average) in a shuffled order, "+
		"the same schedule for every limiter; big heap: the same beside %d other live 32-byte objects holding pointers. "+
		"B/key: retained heap after one request per key, and after %d per key, each request bringing a fresh copy of its key.",
		cfg.Rounds, Baseline, AllowedLimit, AllowedLimit, HotKeyOthers, cfg.Keys, cfg.Procs, AllowedLimit, SteadyPrefill, RefusedLimit, cfg.Keys, AllowedLimit, cfg.HeapObjects, RefusedLimit)
	if cfg.CachedKeys {
		b.WriteString(" Keys (-cached-keys): the timed many-key loops took each key from a copy of their key sequence laid out in order, so choosing a key cost no cache miss.")
	} else {
		b.WriteString(" Keys: the timed many-key loops index one table of the keys with a precomputed stream, which costs the harness itself up to two cache misses per decision at a million keys (the key's string header and its bytes); -cached-keys takes them out.")
	}
	if share := r.AllowedShare[Baseline]; len(share) > 0 {
		fmt.Fprintf(&b, " Share of %s's decisions allowed in the last round: uniform/Zipf %.0f %%/%.0f %% (allowed), %.0f %%/%.0f %% (refused).",
			Baseline, 100*share[UniAllowed], 100*share[ZipfAllowed], 100*share[UniRefused], 100*share[ZipfRefused])
	}
	if !cfg.SkipExact {
		fmt.Fprintf(&b, "\n\nExactness: real time, limit %d per %v, counted over windows shorter than W (%d, %d and %d of them). "+
			"**Bold**: more than L in one window. Token buckets (x/time/rate), GCRA (throttled), fixed windows (ulule, go-limiter) "+
			"and sliding counters (httprate, slidegate-counter) over-admit by design; the exact logs never do "+
			"(slidegate-hashed: unless two keys' 64-bit hashes collide, and then the two share one limit).",
			cfg.ExactLimit, cfg.ExactWindow, r.ExactWindows[Boundary], r.ExactWindows[TailBurst], r.ExactWindows[Parallel])
	}
	b.WriteString("\n")
	r.writeVersus(&b)
	r.writeCPU(&b)
	r.writeAllocs(&b)
	r.writeCores(&b)
	_, err := io.WriteString(w, b.String())
	return err
}

// writeVersus writes the baseline's time per column as a ratio to the
// floor's and to the fastest peer's (slidegate's own modes left out), each
// the median over rounds of the ratio measured in one round.
func (r *Results) writeVersus(b *strings.Builder) {
	cfg := r.Config
	var lines []string
	if !cfg.NoFloor {
		lines = append(lines, fmt.Sprintf("- %s's time over the floor's, same rounds: %s.", Baseline, r.overFloorCells(Baseline, TimeMetrics, false)))
		if cfg.Diagnostics {
			for _, p := range Diagnostics() {
				lines = append(lines, fmt.Sprintf("- %s: time over the floor's, same rounds: %s.", p.Name, r.overFloorCells(p.Name, TimeMetrics, false)))
			}
		}
	}
	if cells := r.bestPeerCells(TimeMetrics, false); len(cells) > 0 {
		lines = append(lines, fmt.Sprintf("- Fastest peer per column (slidegate's own modes left out), as its time over %s's (below 1: the peer is faster): %s.",
			Baseline, strings.Join(cells, ", ")))
	}
	if len(lines) > 0 {
		b.WriteString("\n" + strings.Join(lines, "\n") + "\n")
	}
}

// writeCPU writes the process CPU time per decision of every throughput
// scenario (median over rounds, with the median ratio to the baseline in
// the same round), and the baseline's over the floor's.
func (r *Results) writeCPU(b *strings.Builder) {
	cfg := r.Config
	if len(r.Values[Baseline][cpuMetric(HotKey)]) == 0 {
		return
	}
	cols := []string{"CPU time per decision"}
	for _, m := range ThroughputMetrics {
		cols = append(cols, string(m))
	}
	cols = append(cols, "cores busy")
	b.WriteString("\n| " + strings.Join(cols, " | ") + " |\n")
	b.WriteString("|" + strings.Repeat("---|", len(cols)) + "\n")
	for _, p := range cfg.measured() {
		row := []string{p.Name}
		for _, m := range ThroughputMetrics {
			c := cpuMetric(m)
			row = append(row, fmt.Sprintf("%s · %.2f×", formatNs(latency.Median(r.Values[p.Name][c])), latency.Median(r.Ratios[p.Name][c])))
		}
		row = append(row, fmt.Sprintf("%.2f", r.coresBusy(p.Name)))
		b.WriteString("| " + strings.Join(row, " | ") + " |\n")
	}
	fmt.Fprintf(b, "\nCPU time: user and system time of the whole process (every thread, the collector's too) over each timed run, divided by its decisions; "+
		"for the parallel scenarios it is the sum over the %d goroutines. "+
		"It does not grow while other processes hold the cores, so on a shared machine it is the steadier figure; it still grows with their cache and memory traffic. "+
		"Cores busy: CPU time over wall time, median over the rounds of the many-key scenarios. "+
		"A design whose decisions queue on one mutex keeps about one core busy however many goroutines call it, because the goroutines waiting for the lock sleep: "+
		"its CPU time per decision is then about its wall time, and a low CPU time says it spends little CPU, not that it decides faster; "+
		"the wall times of the first table (the inverse of throughput) say which decides faster.\n", cfg.Procs)
	if !cfg.NoFloor {
		fmt.Fprintf(b, "\n- %s's CPU time over the floor's, same rounds: %s.\n", Baseline, r.overFloorCells(Baseline, ThroughputMetrics, true))
	}
	if cells := r.bestPeerCells(ThroughputMetrics, true); len(cells) > 0 {
		fmt.Fprintf(b, "- Least CPU time among the peers per column (slidegate's own modes left out), as its CPU time over %s's: %s.\n", Baseline, strings.Join(cells, ", "))
	}
}

// bestPeerCells lists, for each of metrics, the peer with the least
// median ratio to the baseline of its time (its CPU time with cpu).
// slidegate's own modes are left out.
func (r *Results) bestPeerCells(metrics []Metric, cpu bool) []string {
	var cells []string
	for _, m := range metrics {
		v := m
		if cpu {
			v = cpuMetric(m)
		}
		best, bestName := 0.0, ""
		for _, p := range r.Config.Peers {
			if isOwnMode(p.Name) {
				continue
			}
			if q := latency.Median(r.Ratios[p.Name][v]); bestName == "" || q < best {
				best, bestName = q, p.Name
			}
		}
		if bestName != "" {
			cells = append(cells, fmt.Sprintf("%s %s %.2f×", m, bestName, best))
		}
	}
	return cells
}

// overFloorCells lists, for each of metrics, the row's time (its CPU time
// with cpu) over the floor's.
func (r *Results) overFloorCells(name string, metrics []Metric, cpu bool) string {
	cells := make([]string, 0, len(metrics))
	for _, m := range metrics {
		v := m
		if cpu {
			v = cpuMetric(m)
		}
		cells = append(cells, fmt.Sprintf("%s %.2f×", m, r.overFloor(name, v)))
	}
	return strings.Join(cells, ", ")
}

// overFloor is the row's time for metric m over the floor's, the median
// over rounds of the ratio measured in one round.
func (r *Results) overFloor(name string, m Metric) float64 {
	v, f := r.Values[name][m], r.Values[FloorName][m]
	var qs []float64
	for i := range min(len(v), len(f)) {
		if f[i] > 0 {
			qs = append(qs, v[i]/f[i])
		}
	}
	return latency.Median(qs)
}

// isOwnMode reports whether the peer called name is slidegate itself or
// one of its own modes (hashed keys, the counter): the "fastest peer" lines
// compare slidegate with the other designs, not with itself.
func isOwnMode(name string) bool { return strings.HasPrefix(name, Baseline) }

// coresBusy is the peer's CPU time over its wall time, the median over the
// rounds of the parallel (many-key) throughput scenarios: about the
// goroutine count for a design whose callers never wait for each other,
// about 1 for one whose callers queue on one lock; 0 when CPU time was
// not measured.
func (r *Results) coresBusy(name string) float64 {
	var qs []float64
	for _, m := range ThroughputMetrics {
		if m == HotKey {
			continue // one goroutine
		}
		wall, cpu := r.Values[name][m], r.Values[name][cpuMetric(m)]
		for i := range min(len(wall), len(cpu)) {
			if wall[i] > 0 {
				qs = append(qs, cpu[i]/wall[i])
			}
		}
	}
	return latency.Median(qs)
}

// writeAllocs writes the heap allocations per decision of every
// throughput scenario (median over rounds).
func (r *Results) writeAllocs(b *strings.Builder) {
	cfg := r.Config
	cols := []string{"allocations per decision"}
	for _, m := range ThroughputMetrics {
		cols = append(cols, string(m))
	}
	b.WriteString("\n| " + strings.Join(cols, " | ") + " |\n")
	b.WriteString("|" + strings.Repeat("---|", len(cols)) + "\n")
	for _, p := range cfg.measured() {
		row := []string{p.Name}
		for _, m := range ThroughputMetrics {
			row = append(row, fmt.Sprintf("%.2f", latency.Median(r.Allocs[p.Name][m])))
		}
		b.WriteString("| " + strings.Join(row, " | ") + " |\n")
	}
	b.WriteString("\nAllocations: runtime.MemStats.Mallocs over each timed run divided by its decisions (the benchmark's own goroutines allocate nothing per decision).\n")
}

// writeCores writes the core sweep: uniform allowed decisions at the
// key population, GOMAXPROCS and goroutines set to each core count.
func (r *Results) writeCores(b *strings.Builder) {
	cfg := r.Config
	if len(cfg.Cores) == 0 {
		return
	}
	cols := []string{"core sweep, " + keyLabel(cfg.Keys) + " uniform, allowed"}
	for _, c := range cfg.Cores {
		cols = append(cols, fmt.Sprintf("%d cores", c))
	}
	b.WriteString("\n| " + strings.Join(cols, " | ") + " |\n")
	b.WriteString("|" + strings.Repeat("---|", len(cols)) + "\n")
	for _, p := range cfg.measured() {
		row := []string{p.Name}
		for _, c := range cfg.Cores {
			m := coreMetric(c)
			row = append(row, fmt.Sprintf("%s · %.2f×", formatNs(latency.Median(r.Values[p.Name][m])), latency.Median(r.Ratios[p.Name][m])))
		}
		b.WriteString("| " + strings.Join(row, " | ") + " |\n")
	}
	fmt.Fprintf(b, "\nCore sweep: wall time per decision (the inverse of throughput) with GOMAXPROCS and the goroutine count set to each; the machine has %d logical CPUs. "+
		"Lock-freedom pays off over one mutex only where many cores decide at once; a machine with few cores cannot show it.\n", runtime.NumCPU())
}

func keyLabel(n int) string {
	switch {
	case n >= 1_000_000 && n%1_000_000 == 0:
		return fmt.Sprintf("%dM", n/1_000_000)
	case n >= 1000 && n%1000 == 0:
		return fmt.Sprintf("%dk", n/1000)
	}
	return fmt.Sprint(n)
}

// formatNs formats a time per decision: 812 ns, 8.25 µs, 12.5 µs, 1.2 ms.
func formatNs(ns float64) string {
	return numfmt.Scaled(ns, numfmt.Unit{From: 1e6, Div: 1e6, Format: "%.1f ms"},
		numfmt.Unit{From: 10000, Div: 1000, Format: "%.1f µs"}, numfmt.Unit{From: 1000, Div: 1000, Format: "%.2f µs"},
		numfmt.Unit{Div: 1, Format: "%.0f ns"})
}
