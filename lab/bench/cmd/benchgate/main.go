// Command benchgate reads `go test -bench` output for slidegate's CI
// performance check and for `make bench`.
//
//	benchgate ratios FILE
//	benchgate table FILE
//	benchgate compare [flags] OLD NEW
//
// ratios prints, per benchmark, slidegate's median ns/op, the textbook
// baselines' in the same run, and the ratios; plus the custom metrics
// (latency percentiles, bytes per key). table prints the same as a
// markdown table.
//
// compare runs benchstat on OLD and NEW (printing its table), and fails
// (exit 1) only on a large, statistically clear slowdown of a core
// benchmark: benchstat finds the slidegate benchmark's sec/op more than
// -threshold percent higher with p < -alpha, AND the in-run ratio of
// slidegate to the textbook baseline of the same run worsened by more
// than -threshold percent as well (when the run has that baseline). The
// second condition is the primary guard: a machine that is slower
// overall slows the textbook too and leaves the ratio alone.
package main

import (
	"bufio"
	"bytes"
	"encoding/csv"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"regexp"
	"sort"
	"strconv"
	"strings"

	"github.com/slidegate/slidegate/internal/numfmt"
	"github.com/slidegate/slidegate/lab/internal/latency"
)

// DefaultBenchstat is how compare runs benchstat: the version is pinned so
// that its output format, which compare parses, does not move.
const DefaultBenchstat = "go run golang.org/x/perf/cmd/benchstat@v0.0.0-20260908200009-22c9c6c9d4da"

// Subject names: sub-benchmarks end in one of them.
const (
	subject   = "slidegate"
	reference = "textbook"
)

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

func usage(w io.Writer) {
	fmt.Fprintln(w, "usage: benchgate ratios FILE | benchgate table FILE | benchgate compare [-threshold 25] [-alpha 0.05] [-core REGEXP] [-benchstat CMD] OLD NEW")
}

func run(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		usage(stderr)
		return 2
	}
	switch args[0] {
	case "ratios":
		return report(args, stdout, stderr, writeRatios)
	case "compare":
		return compare(args[1:], stdout, stderr)
	case "table":
		return report(args, stdout, stderr, writeTable)
	}
	usage(stderr)
	return 2
}

// report parses the one benchmark file args[1] and writes it with write.
func report(args []string, stdout, stderr io.Writer, write func(io.Writer, Runs)) int {
	if len(args) != 2 {
		usage(stderr)
		return 2
	}
	runs, err := parseFile(args[1])
	if err != nil {
		fmt.Fprintln(stderr, "benchgate:", err)
		return 1
	}
	write(stdout, runs)
	return 0
}

// Runs holds, per benchmark name (GOMAXPROCS suffix removed) and unit, the
// values of every run.
type Runs map[string]map[string][]float64

var benchLine = regexp.MustCompile(`^Benchmark(\S+?)(-\d+)?\s+\d+\s+(.*)$`)

// Parse reads `go test -bench` output.
func Parse(r io.Reader) (Runs, error) {
	runs := Runs{}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 1<<16), 1<<20)
	for sc.Scan() {
		m := benchLine.FindStringSubmatch(sc.Text())
		if m == nil {
			continue
		}
		f := strings.Fields(m[3])
		if len(f)%2 != 0 {
			return nil, fmt.Errorf("benchgate: malformed line %q", sc.Text())
		}
		for i := 0; i < len(f); i += 2 {
			v, err := strconv.ParseFloat(f[i], 64)
			if err != nil {
				return nil, fmt.Errorf("benchgate: malformed value in %q: %w", sc.Text(), err)
			}
			if runs[m[1]] == nil {
				runs[m[1]] = map[string][]float64{}
			}
			runs[m[1]][f[i+1]] = append(runs[m[1]][f[i+1]], v)
		}
	}
	return runs, sc.Err()
}

func parseFile(path string) (Runs, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	runs, err := Parse(f)
	if err == nil && len(runs) == 0 {
		err = fmt.Errorf("benchgate: no benchmark results in %s", path)
	}
	return runs, err
}

// Ratio returns the median over runs of slidegate's ns/op divided by the
// textbook's in the same run (the i-th value of each), for a benchmark
// name ending in /slidegate; ok is false when the run has no textbook.
func (r Runs) Ratio(name string) (ratio float64, ok bool) {
	base, found := strings.CutSuffix(name, "/"+subject)
	if !found {
		return 0, false
	}
	s, t := r[name]["ns/op"], r[base+"/"+reference]["ns/op"]
	n := min(len(s), len(t))
	if n == 0 {
		return 0, false
	}
	rs := make([]float64, n)
	for i := range n {
		rs[i] = s[i] / t[i]
	}
	return latency.Median(rs), true
}

func sortedNames(r Runs) []string {
	names := make([]string, 0, len(r))
	for n := range r {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

// writeRatios prints one line per slidegate benchmark.
func writeRatios(w io.Writer, r Runs) {
	fmt.Fprintln(w, "In-run ratios (medians over runs; below 1: slidegate is faster or smaller):")
	for _, name := range sortedNames(r) {
		base, ok := strings.CutSuffix(name, "/"+subject)
		if !ok {
			continue
		}
		line := fmt.Sprintf("  %-32s", base)
		units := []string{"ns/op", "p50-ns", "p99-ns", "p99.9-ns", "B/key", "B/instant"}
		for _, u := range units {
			s := r[name][u]
			if len(s) == 0 {
				continue
			}
			line += fmt.Sprintf("  %s %.4g", u, latency.Median(s))
			for _, other := range []string{"textbook", "textbook64", "floor"} {
				t := r[base+"/"+other][u]
				if len(t) == 0 || latency.Median(t) == 0 {
					continue
				}
				line += fmt.Sprintf(" (%.2f× %s)", latency.Median(s)/latency.Median(t), other)
			}
		}
		fmt.Fprintln(w, line)
	}
}

// Stat is benchstat's verdict on one benchmark's sec/op.
type Stat struct {
	Name        string
	DeltaPct    float64 // NaN when benchstat printed "~" (no significant change)
	P           float64
	Significant bool
}

// parseBenchstatCSV extracts the sec/op rows of `benchstat -format csv`.
func parseBenchstatCSV(data []byte) ([]Stat, error) {
	rd := csv.NewReader(bytes.NewReader(data))
	rd.FieldsPerRecord = -1
	var (
		out   []Stat
		inSec bool
	)
	for {
		rec, err := rd.Read()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, fmt.Errorf("benchgate: benchstat csv: %w", err)
		}
		if len(rec) < 7 {
			continue
		}
		if rec[0] == "" {
			inSec = rec[1] == "sec/op"
			continue
		}
		if !inSec || rec[0] == "geomean" {
			continue
		}
		st := Stat{Name: trimProcs(rec[0]), P: 1}
		if p, ok := strings.CutPrefix(strings.Fields(rec[6] + " ")[0], "p="); ok {
			if v, err := strconv.ParseFloat(p, 64); err == nil {
				st.P = v
			}
		}
		if d, ok := strings.CutSuffix(rec[5], "%"); ok {
			v, err := strconv.ParseFloat(strings.TrimPrefix(d, "+"), 64)
			if err != nil {
				return nil, fmt.Errorf("benchgate: benchstat delta %q: %w", rec[5], err)
			}
			st.DeltaPct, st.Significant = v, true
		}
		out = append(out, st)
	}
	return out, nil
}

var procsSuffix = regexp.MustCompile(`-\d+$`)

func trimProcs(s string) string { return procsSuffix.ReplaceAllString(s, "") }

// Gate is the decision's parameters.
type Gate struct {
	ThresholdPct float64        // fail above this slowdown
	Alpha        float64        // and below this p-value
	Core         *regexp.Regexp // benchmarks that can fail the check
}

// Finding is one benchmark's verdict.
type Finding struct {
	Name       string
	DeltaPct   float64
	P          float64
	OldRatio   float64
	NewRatio   float64
	HasRatio   bool
	Regression bool
	Why        string
}

// Decide applies the gate to benchstat's verdicts and the two runs.
func (g Gate) Decide(stats []Stat, old, cur Runs) []Finding {
	var out []Finding
	for _, st := range stats {
		if !g.Core.MatchString(st.Name) || !strings.HasSuffix(st.Name, "/"+subject) {
			continue
		}
		f := Finding{Name: st.Name, DeltaPct: st.DeltaPct, P: st.P}
		or, ok1 := old.Ratio(st.Name)
		nr, ok2 := cur.Ratio(st.Name)
		f.OldRatio, f.NewRatio, f.HasRatio = or, nr, ok1 && ok2
		slower := st.Significant && st.DeltaPct > g.ThresholdPct && st.P < g.Alpha
		switch {
		case !slower:
			f.Why = "no large, significant slowdown"
		case f.HasRatio && nr <= or*(1+g.ThresholdPct/100):
			f.Why = fmt.Sprintf("slower, but so was the textbook in the same run (ratio %.3f → %.3f): the machine", or, nr)
		default:
			f.Regression = true
			f.Why = fmt.Sprintf("%+.1f%% (p=%.3g)", st.DeltaPct, st.P)
			if f.HasRatio {
				f.Why += fmt.Sprintf(", ratio to the textbook %.3f → %.3f", or, nr)
			}
		}
		out = append(out, f)
	}
	return out
}

func compare(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("benchgate compare", flag.ContinueOnError)
	fs.SetOutput(stderr)
	threshold := fs.Float64("threshold", 25, "fail on slowdowns above this many percent")
	alpha := fs.Float64("alpha", 0.05, "and with a p-value below this")
	core := fs.String("core", ".", "regexp of the benchmarks that can fail the check")
	bs := fs.String("benchstat", DefaultBenchstat, "benchstat command")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if fs.NArg() != 2 {
		usage(stderr)
		return 2
	}
	re, err := regexp.Compile(*core)
	if err != nil {
		fmt.Fprintln(stderr, "benchgate: -core:", err)
		return 2
	}
	oldPath, newPath := fs.Arg(0), fs.Arg(1)
	old, err := parseFile(oldPath)
	if err != nil {
		fmt.Fprintln(stderr, "benchgate:", err)
		return 1
	}
	cur, err := parseFile(newPath)
	if err != nil {
		fmt.Fprintln(stderr, "benchgate:", err)
		return 1
	}
	text, err := benchstat(*bs, nil, oldPath, newPath)
	if err != nil {
		fmt.Fprintln(stderr, "benchgate:", err)
		return 1
	}
	stdout.Write(text)
	csvOut, err := benchstat(*bs, []string{"-format", "csv"}, oldPath, newPath)
	if err != nil {
		fmt.Fprintln(stderr, "benchgate:", err)
		return 1
	}
	stats, err := parseBenchstatCSV(csvOut)
	if err != nil {
		fmt.Fprintln(stderr, err)
		return 1
	}
	fmt.Fprintln(stdout, "\nbaseline:")
	writeRatios(stdout, old)
	fmt.Fprintln(stdout, "current:")
	writeRatios(stdout, cur)
	g := Gate{ThresholdPct: *threshold, Alpha: *alpha, Core: re}
	findings := g.Decide(stats, old, cur)
	if len(findings) == 0 {
		fmt.Fprintln(stderr, "benchgate: no core slidegate benchmark in both runs")
		return 1
	}
	failed := false
	fmt.Fprintf(stdout, "\nverdict (fail above +%.0f%% with p < %.2g and a worse ratio to the textbook):\n", *threshold, *alpha)
	for _, f := range findings {
		mark := "ok  "
		if f.Regression {
			mark, failed = "FAIL", true
		}
		fmt.Fprintf(stdout, "  %s %s: %s\n", mark, f.Name, f.Why)
	}
	if failed {
		fmt.Fprintln(stdout, "bench-check: performance regression")
		return 1
	}
	fmt.Fprintln(stdout, "bench-check: ok")
	return 0
}

// benchstat runs the benchstat command with extra flags on the two files.
func benchstat(command string, flags []string, oldPath, newPath string) ([]byte, error) {
	argv := strings.Fields(command)
	if len(argv) == 0 {
		return nil, errors.New("empty -benchstat command")
	}
	argv = append(argv, flags...)
	argv = append(argv, "old="+oldPath, "new="+newPath)
	cmd := exec.Command(argv[0], argv[1:]...)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Run(); err != nil {
		return nil, fmt.Errorf("%s: %w\n%s", strings.Join(argv, " "), err, errb.String())
	}
	return out.Bytes(), nil
}

// tableRow is one row of the Engine table: a benchmark (without the
// subject) and the unit to show.
type tableRow struct {
	label, bench, unit string
}

var tableRows = []tableRow{
	{"hot key, 1 goroutine, limit 100/min (the only key)", "HotKey", "ns/op"},
	{"hot key among 1,000 keys", "HotKeyAmong1k", "ns/op"},
	{"1M keys uniform, 100/min, every key holding 6", "Keys1M/allowed/uniform", "ns/op"},
	{"1M keys Zipf s = 1.1, 100/min", "Keys1M/allowed/zipf", "ns/op"},
	{"1M keys uniform, 10/min, every key full", "Keys1M/refused/uniform", "ns/op"},
	{"1M keys Zipf, 10/min, every key full", "Keys1M/refused/zipf", "ns/op"},
	{"latency at 1M Zipf keys, p50", "Latency1MZipf", "p50-ns"},
	{"p99", "Latency1MZipf", "p99-ns"},
	{"p99.9", "Latency1MZipf", "p99.9-ns"},
	{"heap per key, 1M keys × 1 request", "Memory/1Mx1", "B/key"},
	{"heap per stored instant, 100k keys × 100 (L = 100)", "Memory/100kx100", "B/instant"},
}

// writeTable prints the Engine table: medians, and ratios of medians.
func writeTable(w io.Writer, r Runs) {
	fmt.Fprintln(w, "| benchmark | slidegate | textbook | ratio | textbook64 | ratio | floor | slidegate allocs/op · B/op |")
	fmt.Fprintln(w, "|---|---:|---:|---:|---:|---:|---:|---:|")
	for _, row := range tableRows {
		s := r[row.bench+"/"+subject][row.unit]
		if len(s) == 0 {
			continue
		}
		sm := latency.Median(s)
		cells := []string{row.label, formatValue(sm, row.unit)}
		for _, other := range []string{"textbook", "textbook64"} {
			t := r[row.bench+"/"+other][row.unit]
			if len(t) == 0 || latency.Median(t) == 0 {
				cells = append(cells, "", "")
				continue
			}
			cells = append(cells, formatValue(latency.Median(t), row.unit), fmt.Sprintf("%.2f×", sm/latency.Median(t)))
		}
		if f := r[row.bench+"/floor"][row.unit]; len(f) > 0 {
			cells = append(cells, formatValue(latency.Median(f), row.unit))
		} else {
			cells = append(cells, "")
		}
		// Allocations of the timed loop (go test -benchmem rounds
		// allocs/op down to an integer; B/op shows a fraction of one).
		a, bo := r[row.bench+"/"+subject]["allocs/op"], r[row.bench+"/"+subject]["B/op"]
		if row.unit == "ns/op" && len(a) > 0 && len(bo) > 0 {
			cells = append(cells, fmt.Sprintf("%.0f · %.0f", latency.Median(a), latency.Median(bo)))
		} else {
			cells = append(cells, "")
		}
		fmt.Fprintln(w, "| "+strings.Join(cells, " | ")+" |")
	}
}

func formatValue(v float64, unit string) string {
	switch unit {
	case "B/key", "B/instant":
		return fmt.Sprintf("%.3g B", v)
	}
	return numfmt.Scaled(v, numfmt.Unit{From: 1e6, Div: 1e6, Format: "%.3g ms"},
		numfmt.Unit{From: 1e3, Div: 1e3, Format: "%.3g µs"}, numfmt.Unit{Div: 1, Format: "%.3g ns"})
}
