package main

import (
	"bytes"
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// synth writes `go test -bench` output: runs runs of the two core
// benchmarks, slidegate at sg ns/op and the textbook at tb ns/op, each
// value jittered deterministically by ±1 %.
func synth(sg, tb float64, runs int) string {
	var b strings.Builder
	b.WriteString("goos: linux\ngoarch: amd64\npkg: github.com/slidegate/slidegate/lab/bench\ncpu: test\n")
	for i := range runs {
		j := 1 + float64(i%3-1)/100
		fmt.Fprintf(&b, "BenchmarkHotKey/slidegate-2   \t1000000\t%.2f ns/op\t0 B/op\t0 allocs/op\n", sg*j)
		fmt.Fprintf(&b, "BenchmarkHotKey/textbook-2    \t1000000\t%.2f ns/op\t0 B/op\t0 allocs/op\n", tb*j)
		fmt.Fprintf(&b, "BenchmarkKeys1M/allowed/zipf/slidegate-2 \t1000000\t%.2f ns/op\t27.0 allowed-%%\t6 B/op\t0 allocs/op\n", 3*sg*j)
		fmt.Fprintf(&b, "BenchmarkKeys1M/allowed/zipf/textbook-2  \t1000000\t%.2f ns/op\t28.0 allowed-%%\t6 B/op\t0 allocs/op\n", 3*tb*j)
	}
	return b.String()
}

func mustParse(t *testing.T, s string) Runs {
	t.Helper()
	r, err := Parse(strings.NewReader(s))
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func TestParse(t *testing.T) {
	r := mustParse(t, synth(100, 60, 3)+"PASS\nok  \tgithub.com/slidegate/slidegate/lab/bench\t1.0s\n")
	if got := r["HotKey/slidegate"]["ns/op"]; len(got) != 3 || got[1] != 100 {
		t.Fatalf("HotKey/slidegate ns/op = %v", got)
	}
	if got := r["Keys1M/allowed/zipf/textbook"]["allowed-%"]; len(got) != 3 || got[0] != 28 {
		t.Fatalf("custom metric = %v", got)
	}
	if ratio, ok := r.Ratio("HotKey/slidegate"); !ok || math.Abs(ratio-100.0/60) > 1e-9 {
		t.Fatalf("ratio %v %v", ratio, ok)
	}
	if _, ok := r.Ratio("HotKey/textbook"); ok {
		t.Fatal("ratio of a non-slidegate benchmark")
	}
	if _, err := Parse(strings.NewReader("BenchmarkX-2 10 5 ns/op 3\n")); err == nil {
		t.Fatal("odd value/unit fields: no error")
	}
	if _, err := Parse(strings.NewReader("BenchmarkX-2 10 five ns/op\n")); err == nil {
		t.Fatal("non-numeric value: no error")
	}
}

// A benchstat -format csv output as the pinned version prints it.
const benchstatCSV = `goos: linux
goarch: amd64
pkg: github.com/slidegate/slidegate/lab/bench
,old,,new,,,
,sec/op,CI,sec/op,CI,vs base,P
HotKey/slidegate-2,1e-07,1%,1.4e-07,1%,+40.00%,p=0.002 n=6
HotKey/textbook-2,6e-08,1%,6e-08,1%,~,p=0.937 n=6
Keys1M/allowed/zipf/slidegate-2,3e-07,1%,2.5e-07,1%,-16.67%,p=0.002 n=6
geomean,1e-07,,1.2e-07,,+10.00%,

,old,,new,,,
,B/op,CI,B/op,CI,vs base,P
HotKey/slidegate-2,64,0%,128,0%,+100.00%,p=0.002 n=6
`

func TestParseBenchstatCSV(t *testing.T) {
	st, err := parseBenchstatCSV([]byte(benchstatCSV))
	if err != nil {
		t.Fatal(err)
	}
	if len(st) != 3 {
		t.Fatalf("%d sec/op rows, want 3: %+v", len(st), st)
	}
	if st[0].Name != "HotKey/slidegate" || !st[0].Significant || st[0].DeltaPct != 40 || st[0].P != 0.002 {
		t.Errorf("row 0: %+v", st[0])
	}
	if st[1].Significant || st[1].P != 0.937 {
		t.Errorf("row 1: %+v", st[1])
	}
	if st[2].DeltaPct != -16.67 {
		t.Errorf("row 2: %+v", st[2])
	}
}

var core = regexp.MustCompile(`^(HotKey|Keys1M/allowed/zipf)/slidegate$`)

func TestGate(t *testing.T) {
	g := Gate{ThresholdPct: 25, Alpha: 0.05, Core: core}
	old := mustParse(t, synth(100, 60, 6))
	sig := func(name string, d float64) Stat { return Stat{Name: name, DeltaPct: d, P: 0.002, Significant: true} }
	cases := []struct {
		name  string
		cur   Runs
		stats []Stat
		fail  bool
	}{
		{"identical", old, []Stat{{Name: "HotKey/slidegate", P: 1}, {Name: "Keys1M/allowed/zipf/slidegate", P: 1}}, false},
		{"planted regression", mustParse(t, synth(140, 60, 6)), []Stat{sig("HotKey/slidegate", 40), sig("Keys1M/allowed/zipf/slidegate", 40)}, true},
		{"slower machine", mustParse(t, synth(140, 84, 6)), []Stat{sig("HotKey/slidegate", 40), sig("Keys1M/allowed/zipf/slidegate", 40)}, false},
		{"small slowdown", mustParse(t, synth(115, 60, 6)), []Stat{sig("HotKey/slidegate", 15)}, false},
		{"large but not significant", mustParse(t, synth(140, 60, 6)), []Stat{{Name: "HotKey/slidegate", DeltaPct: 40, P: 0.2, Significant: true}}, false},
		{"textbook slower only", mustParse(t, synth(100, 90, 6)), []Stat{{Name: "HotKey/slidegate", P: 0.9}, sig("HotKey/textbook", 50)}, false},
		{"faster", mustParse(t, synth(60, 60, 6)), []Stat{sig("HotKey/slidegate", -40)}, false},
	}
	for _, c := range cases {
		fs := g.Decide(c.stats, old, c.cur)
		failed := false
		for _, f := range fs {
			failed = failed || f.Regression
		}
		if failed != c.fail {
			t.Errorf("%s: failed = %v, want %v: %+v", c.name, failed, c.fail, fs)
		}
	}
	// Without a textbook in the runs, benchstat's verdict alone decides.
	noTB := mustParse(t, "BenchmarkHotKey/slidegate-2 1 100 ns/op\n")
	noTB2 := mustParse(t, "BenchmarkHotKey/slidegate-2 1 140 ns/op\n")
	if fs := g.Decide([]Stat{sig("HotKey/slidegate", 40)}, noTB, noTB2); len(fs) != 1 || !fs[0].Regression {
		t.Errorf("no textbook: %+v", fs)
	}
}

func TestRatiosOutput(t *testing.T) {
	var out bytes.Buffer
	writeRatios(&out, mustParse(t, synth(100, 50, 3)))
	if !strings.Contains(out.String(), "HotKey") || !strings.Contains(out.String(), "(2.00× textbook)") {
		t.Errorf("ratios output:\n%s", out.String())
	}
}

func TestUsageErrors(t *testing.T) {
	for _, args := range [][]string{nil, {"what"}, {"ratios"}, {"compare", "one"}, {"compare", "-core", "(", "a", "b"}, {"ratios", "/nonexistent"}} {
		var out, errb bytes.Buffer
		if code := run(args, &out, &errb); code == 0 || errb.Len() == 0 {
			t.Errorf("%v: exit %d, stderr %q", args, code, errb.String())
		}
	}
}

// The whole check as CI runs it, on synthetic outputs, through the real
// script and the pinned benchstat: a planted regression fails, identical
// outputs pass. Skipped with -short, or when benchstat cannot be fetched.
func TestBenchCheckScript(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the pinned benchstat through the go command")
	}
	if err := exec.Command("go", strings.Fields(DefaultBenchstat)[1:]...).Run(); err != nil {
		// benchstat with no arguments exits non-zero after printing usage;
		// what matters is whether it could be built at all.
		if _, ok := err.(*exec.ExitError); !ok {
			t.Skipf("benchstat unavailable: %v", err)
		}
	}
	dir := t.TempDir()
	write := func(name, s string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	base := write("old.txt", synth(100, 60, 6))
	same := write("same.txt", synth(100, 60, 6))
	slow := write("slow.txt", synth(140, 60, 6))
	machine := write("machine.txt", synth(140, 84, 6))
	script := filepath.Join("..", "..", "..", "scripts", "bench-check.sh")
	check := func(newPath string) (string, error) {
		out, err := exec.Command("bash", script, "compare", base, newPath).CombinedOutput()
		return string(out), err
	}
	if out, err := check(same); err != nil {
		t.Errorf("identical outputs failed the check: %v\n%s", err, out)
	}
	if out, err := check(machine); err != nil {
		t.Errorf("a uniformly slower machine failed the check: %v\n%s", err, out)
	}
	out, err := check(slow)
	if err == nil {
		t.Errorf("a planted 40%% regression passed the check:\n%s", out)
	} else if !strings.Contains(out, "FAIL HotKey/slidegate") {
		t.Errorf("regression output does not name the benchmark:\n%s", out)
	}
}

func TestTable(t *testing.T) {
	var out bytes.Buffer
	writeTable(&out, mustParse(t, synth(100, 50, 3)+"BenchmarkMemory/1Mx1/slidegate-2 1 5 ns/op 90.0 B/key\nBenchmarkMemory/1Mx1/textbook-2 1 5 ns/op 112 B/key\n"))
	got := out.String()
	for _, want := range []string{
		"| hot key, 1 goroutine, limit 100/min (the only key) | 100 ns | 50 ns | 2.00× |  |  |  | 0 · 0 |",
		"| heap per key, 1M keys × 1 request | 90 B | 112 B | 0.80× |  |  |  |  |",
		"| 1M keys Zipf s = 1.1, 100/min | 300 ns | 150 ns | 2.00× |  |  |  | 0 · 6 |",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("table lacks %q:\n%s", want, got)
		}
	}
	if strings.Contains(got, "among 1,000") {
		t.Errorf("row without data printed:\n%s", got)
	}
}
