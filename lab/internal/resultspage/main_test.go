package main

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"
)

// TestREADMEQuotesThePage: the README's figures are the generated page's
// summary block, byte for byte, so the two cannot disagree.
func TestREADMEQuotesThePage(t *testing.T) {
	readme := mustRead(t, "../../../README.md")
	page := mustRead(t, "../../../docs/results.md")
	rb, err := Block(readme)
	if err != nil {
		t.Fatalf("README.md: %v", err)
	}
	pb, err := Block(page)
	if err != nil {
		t.Fatalf("docs/results.md: %v", err)
	}
	if !bytes.Equal(rb, pb) {
		t.Errorf("README.md's summary differs from docs/results.md's; run make results or copy the block:\nREADME:\n%s\npage:\n%s", rb, pb)
	}
}

// figure matches a measured figure as the summary writes it: a number
// with a unit. Ratios are left out: "1.05×" is as likely a ratio of
// another doc's own.
var figure = regexp.MustCompile(`\d[\d,]*(\.\d+)? ?(ns|µs|ms|B|req/s)`)

// TestFiguresStatedOnce: no figure of the summary is restated by hand in
// the README outside its block or in another doc; they link to the page
// instead.
func TestFiguresStatedOnce(t *testing.T) {
	page := mustRead(t, "../../../docs/results.md")
	block, err := Block(page)
	if err != nil {
		t.Fatal(err)
	}
	figs := map[string]bool{}
	for _, f := range figure.FindAllString(string(block), -1) {
		// Small round figures (10 ms, 1 ns) also occur as configuration.
		if strings.ContainsAny(f, ".,") && len(f) > 4 {
			figs[f] = true
		}
	}
	if len(figs) < 5 {
		t.Fatalf("the summary holds only %v", figs)
	}
	readme := mustRead(t, "../../../README.md")
	rb, _ := Block(readme)
	docs := map[string][]byte{"README.md (outside the summary)": bytes.Replace(readme, rb, nil, 1)}
	others, _ := filepath.Glob("../../../docs/*.md")
	for _, p := range others {
		if filepath.Base(p) != "results.md" {
			docs["docs/"+filepath.Base(p)] = mustRead(t, p)
		}
	}
	for name, b := range docs {
		for f := range figs {
			if containsFigure(b, f) {
				t.Errorf("%s restates %q, a figure of docs/results.md", name, f)
			}
		}
	}
}

// containsFigure reports whether b holds the figure f as a whole number:
// "2.14 µs" inside "262.14 µs" is another figure.
func containsFigure(b []byte, f string) bool {
	for i := 0; ; {
		j := bytes.Index(b[i:], []byte(f))
		if j < 0 {
			return false
		}
		at := i + j
		if at == 0 || !strings.ContainsRune("0123456789.,", rune(b[at-1])) {
			return true
		}
		i = at + 1
	}
}

// TestGenerate writes a page and a README from small inputs and checks
// the page names the machine and the date, the README's block is the
// page's, and the text around the block is kept.
func TestGenerate(t *testing.T) {
	dir := t.TempDir()
	started := time.Date(2031, 5, 6, 7, 8, 9, 0, time.UTC)
	lt := map[string]any{
		"started": started, "duration_ns": 6e10,
		"machine": map[string]any{"cpu_model": "Test CPU 9000", "go_version": "go1.99", "os": "linux", "arch": "amd64", "num_cpu": 3, "load_before": 0.5, "load_after": 1.5},
		"memory":  map[string]any{"clients": 1000, "per_client": 1, "engine": map[string]any{"heap_per_client": 101.5}, "textbook": map[string]any{"heap_per_client": 120.5}, "ratio": 0.84},
		"engine": map[string]any{"workers": 8, "decisions": 4000, "decisions_per_sec": 2.5e6, "sample_every": 8, "latency": map[string]any{"mean_ns": 500, "p99_ns": 1234, "p99_9_ns": 2345}, "verification": map[string]any{"verified": true, "records": 4000}, "floor": map[string]any{"decisions_per_sec": 3e6, "latency": map[string]any{"mean_ns": 250, "p99_ns": 1000, "p99_9_ns": 2000}},
			"machine_pauses": map[string]any{"threshold_ns": 10000, "duration_ns": 2e8, "goroutines": 3, "per_core_second": 1200, "median_ns": 25000},
			"rounds":         []map[string]any{{"samples": 10000, "engine_paused": 7, "floor_paused": 2}, {"samples": 10000, "engine_paused": 5, "floor_paused": 4}}},
		"http": map[string]any{"requests": 500, "rate": 50, "target_rate": 50, "verification": map[string]any{"verified": true, "records": 500, "mismatches": 1}},
		"capacity": map[string]any{"p99_bound_ns": 1e7, "workers": 16, "slidegate": map[string]any{"capacity": 900, "rounds": []int{900, 100, 950}}, "noop": map[string]any{"capacity": 1000, "rounds": []int{1000, 1000, 1000}},
			"judgement": map[string]any{"spread": map[string]any{"rounds": []float64{0.9, 0.1, 0.95}, "disturbed": []bool{false, true, false}, "median": 0.9}}, "cpu_ratio": 0.8,
			"server_cost": map[string]any{"extra_ns": 2500, "lo_ns": 2100, "hi_ns": 2900, "confidence": 0.984375, "clean": 7}, "verification": map[string]any{"verified": true, "records": 700}},
		"targets": []map[string]any{{"name": "memory: engine heap / textbook log", "want": "≤ 0.50×", "got": "0.84×", "met": false},
			{"name": "engine: p99 / the floor's p99", "want": "≤ 2.00×", "got": "median 1.9×", "met": false, "verdict": "undecided", "why": "too noisy", "bound": 2,
				"spread": map[string]any{"rounds": []float64{1.5, 2.003, 1.9}, "disturbed": []bool{false, false, true}}}},
		"correct": false, "failures": []string{"http: 1 mismatches"},
	}
	pr := map[string]any{
		"machine": map[string]any{"cpu_model": "Test CPU 9000", "cores": 3, "go_version": "go1.99", "load_average": 2.0},
		"started": started, "command": "make bench-peers", "duration_ns": 1e10, "table_markdown": "| limiter |\n|---|\n| slidegate |\n",
		"results": map[string]any{"keys": 1000, "values": map[string]any{
			"slidegate": map[string]any{"hot key": []float64{50, 52, 54}, "boundary burst": []float64{10}, "tail burst": []float64{10}, "parallel load": []float64{10}},
			"textbook":  map[string]any{"hot key": []float64{60, 65, 70}, "boundary burst": []float64{10}},
			"gcra":      map[string]any{"boundary burst": []float64{19}},
		}},
	}
	write := func(name string, v any) string {
		b, err := json.Marshal(v)
		if err != nil {
			t.Fatal(err)
		}
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, b, 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	rp := map[string]any{
		"started": started, "duration_ns": 4e11, "cores": 3, "go_version": "go1.99", "callers": 64, "limit": 100,
		"window_ns": 6e10, "cell_duration_ns": 3e9, "rounds": 3,
		"table_markdown": "### one server, 100k keys uniform\n\n| limiter | decisions/s |\n|---|---|\n| slidegate | 20000 |\n",
		"cells":          []map[string]any{{"peer": "slidegate"}},
	}
	fig := func(rate, svc, red float64) map[string]any {
		return map[string]any{"decisions_per_second": rate, "service_cpu_us_per_decision": svc, "redis_cpu_us_per_decision": red}
	}
	ev := map[string]any{
		"started": started, "duration_ns": 2e11, "cores": 3, "go_version": "go1.99", "peer_version": "v9.9.9", "redis_version": "7.9.9",
		"load_before": 4.25, "load_after": 3.5, "run_duration_ns": 3e9, "rounds": 3,
		"table_markdown": "| variant | decisions/s peer / slidegate (ratio) |\n|---|---|\n| 1 desc, mostly allowed, 16 callers | 100 / 150 (1.50) |\n",
		"variants": []map[string]any{
			{"name": "1 desc, mostly allowed, 16 callers", "peer": fig(100, 80, 20), "slidegate": fig(150, 40, 30), "redis_cpu_ratios": []float64{1.4, 1.6, 1.5}},
			{"name": "3 desc, mostly refused, 64 callers", "peer": fig(200, 100, 25), "slidegate": fig(180, 60, 20), "redis_cpu_ratios": []float64{0.7, 0.8, 0.9}},
		},
	}
	ltp, prp, rpp, evp := write("report.json", lt), write("peers.json", pr), write("redispeers.json", rp), write("envoybench.json", ev)
	readme := filepath.Join(dir, "README.md")
	if err := os.WriteFile(readme, []byte("before\n"+BeginMarker+"\nstale\n"+EndMarker+"\nafter\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(dir, "results.md")
	if code := run([]string{"-loadtest", ltp, "-peers", prp, "-redispeers", rpp, "-envoy", evp, "-out", out, "-readme", readme}, os.Stderr); code != 0 {
		t.Fatalf("exit %d", code)
	}
	page, rd := mustRead(t, out), mustRead(t, readme)
	if m := rootLink.FindAll(page, -1); len(m) > 0 {
		t.Errorf("the page links from the repository's root: %q", m)
	}
	for _, want := range []string{"Test CPU 9000, 3 cores, go1.99", "Date: 2031-05-06", "Correctness: **FAIL** (http: 1 mismatches)",
		"| engine p99 / p99.9, 1,000 Zipf clients, 8 goroutines | 1.23 µs / 2.35 µs | floor 1.00 µs / 2.00 µs (1.23× / 1.17×) |",
		"| one hot key, one goroutine (peers) | 52 ns | textbook log 65 ns (0.80×) |",
		"| machine pauses | 200.00 ms of 3 goroutines spinning on the clock saw 1200 pauses of 10.00 µs or more per second per core (median 25.00 µs); a timed decision meets one with a chance of about its length × that rate, 0.060% at the engine's mean (500 ns) and 0.030% at the floor's (250 ns); timed decisions of 10.00 µs or more: engine 0.060%, floor 0.030%. A round's p99.9 is a pause once they pass 0.1% |",
		"| 10 | 19 (gcra) |", "| slidegate |",
		"| HTTP capacity, 16 requests in flight, p99 ≤ 10.00 ms (median of 2 clean rounds) | 900 req/s | no-op handler 1,000 req/s (median of the rounds' ratios 0.90×; CPU per request 1.25×) |",
		"slidegate / no-op per round (a pair of slices, * left out): 0.90 0.10* 0.95;",
		"slidegate's server adds 2.50 µs of CPU per request over the no-op's (a minimal client, median of 7 rounds, 98% interval 2.10 µs … 2.90 µs)",
		"| memory: engine heap / textbook log | ≤ 0.50× | 0.84× |  | **missed** |",
		"| engine: p99 / the floor's p99 | ≤ 2.00× | median 1.9× | 1.50 2.003 1.90* | **undecided**: too noisy |",
		"## Redis peers", "64 callers, L = 100 per 1m0s, 3s per cell, 3 rounds", "(3 cores, go1.99), 2031-05-06:",
		"one of `make bench-peers`, one of `make bench-redis-peers` and one of `make bench-envoy`", "### one server, 100k keys uniform\n\n| limiter | decisions/s |\n|---|---|\n| slidegate | 20000 |",
		"## Envoy service beside envoyproxy/ratelimit\n\n`make bench-envoy` (`compat/envoy/cmd/envoybench`), 200 s, on the same machine (3 cores, go1.99), 2031-05-06; envoyproxy/ratelimit v9.9.9, Redis 7.9.9.",
		"3s per variant and service, 3 rounds interleaved;", "load average (1 minute) 4.25 at the start, 3.50 at the end.",
		"\n\n| variant | decisions/s peer / slidegate (ratio) |\n|---|---|\n| 1 desc, mostly allowed, 16 callers | 100 / 150 (1.50) |\n\n",
		"Over the 2 variants, slidegate ÷ the peer: decisions per second 0.90–1.50×, service CPU per decision 0.50–0.60×, Redis CPU per decision 0.80–1.50× (single rounds: 0.70–1.60×)."} {
		if !bytes.Contains(page, []byte(want)) {
			t.Errorf("page lacks %q:\n%s", want, page)
		}
	}
	pb, _ := Block(page)
	rb, _ := Block(rd)
	if !bytes.Equal(pb, rb) || !bytes.HasPrefix(rd, []byte("before\n")) || !bytes.HasSuffix(rd, []byte("\nafter\n")) || bytes.Contains(rd, []byte("stale")) {
		t.Errorf("README after:\n%s", rd)
	}
	// Without a Redis peers file or an Envoy bench file the page has no
	// such section.
	if code := run([]string{"-loadtest", ltp, "-peers", prp, "-redispeers", "", "-envoy", "", "-out", out, "-readme", ""}, os.Stderr); code != 0 {
		t.Fatalf("without -redispeers and -envoy: exit %d", code)
	}
	if page := mustRead(t, out); bytes.Contains(page, []byte("Redis peers")) || bytes.Contains(page, []byte("Envoy")) ||
		!bytes.Contains(page, []byte("from one run of `make loadtest` and one of `make bench-peers` (their")) {
		t.Errorf("a page without a Redis peers file or an Envoy bench file has the sections, or names their runs:\n%s", page)
	}
	// Bad input is an error, not a page.
	if code := run([]string{"-loadtest", ltp, "-peers", prp, "-redispeers", write("empty.json", map[string]any{"cells": []any{}}), "-envoy", evp, "-out", out, "-readme", ""}, &bytes.Buffer{}); code != 1 {
		t.Errorf("a Redis peers file without cells: exit %d", code)
	}
	if code := run([]string{"-loadtest", ltp, "-peers", prp, "-redispeers", rpp, "-envoy", write("noenvoy.json", map[string]any{"table_markdown": "| x |", "variants": []any{}}), "-out", out, "-readme", ""}, &bytes.Buffer{}); code != 1 {
		t.Errorf("an Envoy bench file without variants: exit %d", code)
	}
	if code := run([]string{"-loadtest", filepath.Join(dir, "none.json"), "-peers", prp, "-out", out, "-readme", ""}, &bytes.Buffer{}); code != 1 {
		t.Errorf("missing report: exit %d", code)
	}
}

func mustRead(t *testing.T, path string) []byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// rootLink is a Markdown link to a path from the repository's root, such
// as docs/results.md: from a page under docs/ it names docs/docs/….
var rootLink = regexp.MustCompile(`\]\((docs|internal|cmd|deploy)/[^)]*\)`)

// TestPageLinksResolve: docs/results.md, and the summary block it shares
// with README.md, hold no link written from the repository's root, which
// would point nowhere from docs/.
func TestPageLinksResolve(t *testing.T) {
	page := mustRead(t, "../../../docs/results.md")
	if m := rootLink.FindAll(page, -1); len(m) > 0 {
		t.Errorf("docs/results.md links from the repository's root, which does not resolve from docs/: %q", m)
	}
	block, err := Block(page)
	if err != nil {
		t.Fatal(err)
	}
	if m := rootLink.FindAll(block, -1); len(m) > 0 {
		t.Errorf("the summary block links from the repository's root: %q", m)
	}
}

// TestContainsFigure: a figure counts as restated only as a whole number.
func TestContainsFigure(t *testing.T) {
	for _, c := range []struct {
		doc, fig string
		want     bool
	}{
		{"p99.9 2.14 µs", "2.14 µs", true},
		{"(2.14 µs)", "2.14 µs", true},
		{"2.14 µs at the start", "2.14 µs", true},
		{"p50 262.14 µs", "2.14 µs", false},
		{"p50 262.14 µs, then 2.14 µs", "2.14 µs", true},
		{"1,859.5 B", "59.5 B", false},
	} {
		if got := containsFigure([]byte(c.doc), c.fig); got != c.want {
			t.Errorf("containsFigure(%q, %q) = %v, want %v", c.doc, c.fig, got, c.want)
		}
	}
}
