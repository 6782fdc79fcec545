package main

import (
	"bytes"
	"encoding/json"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/slidegate/slidegate/lab/bench/peers"
)

func TestRunSmall(t *testing.T) {
	var out, errb bytes.Buffer
	code := run([]string{"-keys", "500", "-rounds", "1", "-duration", "2ms", "-skip-exact", "-heap-objects", "1000", "-q", "-peers", "textbook, go-limiter"}, &out, &errb)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errb.String())
	}
	s := out.String()
	for _, want := range []string{"Machine: ", "| slidegate |", "| textbook |", "| go-limiter |", "command: `cd lab/bench/peers && go run ./cmd/peerbench -keys 500"} {
		if !strings.Contains(s, want) {
			t.Errorf("output lacks %q:\n%s", want, s)
		}
	}
	if strings.Contains(s, "| throttled |") {
		t.Errorf("unselected peer in the table:\n%s", s)
	}
}

func TestRunBadInput(t *testing.T) {
	for _, args := range [][]string{{"-peers", "nope"}, {"-bogus"}, {"-rounds", "-1", "-q"}} {
		var out, errb bytes.Buffer
		if code := run(args, &out, &errb); code == 0 {
			t.Errorf("%v: exit 0", args)
		} else if errb.Len() == 0 {
			t.Errorf("%v: no message", args)
		}
	}
}

// TestRunJSON: -json writes the machine, the table printed and the
// measured values, readable back.
func TestRunJSON(t *testing.T) {
	path := filepath.Join(t.TempDir(), "peers.json")
	var out, errb bytes.Buffer
	code := run([]string{"-keys", "500", "-rounds", "1", "-duration", "2ms", "-skip-exact", "-heap-objects", "1000", "-q", "-peers", "textbook", "-json", path}, &out, &errb)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errb.String())
	}
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var doc runDoc
	if err := json.Unmarshal(b, &doc); err != nil {
		t.Fatal(err)
	}
	if doc.Machine.Cores < 1 || doc.Machine.GoVersion == "" || doc.Machine.CPUModel == "" || doc.Started.IsZero() {
		t.Errorf("machine %+v, started %v", doc.Machine, doc.Started)
	}
	if doc.Table == "" || !strings.Contains(out.String(), doc.Table) || !strings.Contains(doc.Table, "| textbook |") {
		t.Errorf("table %q is not the one printed:\n%s", doc.Table, out.String())
	}
	if len(doc.Results.Values["slidegate"]) == 0 || len(doc.Results.Values["textbook"]) == 0 || len(doc.Results.Values["floor"]) == 0 {
		t.Errorf("values %v", doc.Results.Values)
	}
	if doc.Results.Keys != 500 || len(doc.Results.Peers) != 2 {
		t.Errorf("config %+v", doc.Results)
	}
}

// TestRunCPUProfile: -cpuprofile writes a CPU profile of the run, and a
// path it cannot create fails the run before it starts.
func TestRunCPUProfile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "cpu.out")
	var out, errb bytes.Buffer
	code := run([]string{"-keys", "2000", "-rounds", "1", "-duration", "50ms", "-skip-exact", "-heap-objects", "1000", "-q", "-peers", "textbook", "-cpuprofile", path}, &out, &errb)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errb.String())
	}
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	// runtime/pprof writes a gzipped protocol buffer.
	if len(b) < 100 || b[0] != 0x1f || b[1] != 0x8b {
		t.Errorf("profile of %d bytes does not look like pprof output", len(b))
	}
	if code := run([]string{"-q", "-cpuprofile", filepath.Join(t.TempDir(), "no", "such", "dir")}, &out, &errb); code != 1 {
		t.Errorf("an unwritable profile path: exit %d, want 1", code)
	}
}

func TestCommandLine(t *testing.T) {
	for _, c := range []struct{ args, want string }{
		{"", "make bench-peers"},
		{"-q -json out/peers.json", "make bench-peers"},
		{"-json=x.json -rounds 5", "cd lab/bench/peers && go run ./cmd/peerbench -rounds 5"},
		{"-cpuprofile cpu.out -rounds 5 -cpuprofile=b.out", "cd lab/bench/peers && go run ./cmd/peerbench -rounds 5"},
	} {
		if got := commandLine(strings.Fields(c.args)); got != c.want {
			t.Errorf("commandLine(%q) = %q, want %q", c.args, got, c.want)
		}
	}
}

// TestJSONNotFinite: a value that is not finite (a ratio over a round in
// which a limiter made no decision) is written as null and read back as
// NaN, instead of failing the whole file.
func TestJSONNotFinite(t *testing.T) {
	r := &peers.Results{
		Values:       map[string]map[peers.Metric][]float64{"slidegate": {"m": {1.5, math.Inf(1), math.NaN()}}},
		Ratios:       map[string]map[peers.Metric][]float64{"textbook": {"m": {math.Inf(-1)}}},
		AllowedShare: map[string]map[peers.Metric]float64{"slidegate": {"m": math.Inf(1)}},
	}
	path := filepath.Join(t.TempDir(), "peers.json")
	if err := writeJSON(path, runDoc{Results: docOf(r)}); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var doc runDoc
	if err := json.Unmarshal(b, &doc); err != nil {
		t.Fatal(err)
	}
	v := doc.Results.Values["slidegate"]["m"]
	if len(v) != 3 || v[0] != 1.5 || !math.IsNaN(float64(v[1])) || !math.IsNaN(float64(v[2])) {
		t.Errorf("values read back %v, want [1.5 NaN NaN]", v)
	}
	if x := doc.Results.Ratios["textbook"]["m"]; len(x) != 1 || !math.IsNaN(float64(x[0])) {
		t.Errorf("ratios read back %v, want [NaN]", x)
	}
	if x := doc.Results.AllowedShare["slidegate"]["m"]; !math.IsNaN(float64(x)) {
		t.Errorf("allowed share read back %v, want NaN", x)
	}
}
