package main

import (
	"encoding/json"
	"fmt"
	"math"
	"os"
	"runtime"
	"time"

	"github.com/slidegate/slidegate/lab/bench/peers"
)

// runDoc is what -json writes: the machine, when and how the run was
// made, the markdown table it printed, and every value it measured, so
// that a page can be generated from it (make results).
type runDoc struct {
	Machine    machineDoc `json:"machine"`
	Started    time.Time  `json:"started"`
	Command    string     `json:"command"`
	DurationNs int64      `json:"duration_ns"`
	Table      string     `json:"table_markdown"`
	Results    resultsDoc `json:"results"`
}

type machineDoc struct {
	CPUModel   string  `json:"cpu_model"`
	Cores      int     `json:"cores"`
	GOMAXPROCS int     `json:"gomaxprocs"`
	OS         string  `json:"os"`
	Arch       string  `json:"arch"`
	GoVersion  string  `json:"go_version"`
	LoadAvg    float64 `json:"load_average"` // 1-minute, at the end of the run (Linux)
}

func thisMachine() machineDoc {
	return machineDoc{CPUModel: cpuModel(), Cores: runtime.NumCPU(), GOMAXPROCS: runtime.GOMAXPROCS(0),
		OS: runtime.GOOS, Arch: runtime.GOARCH, GoVersion: runtime.Version(), LoadAvg: loadAverage()}
}

// resultsDoc is peers.Results without the peers' constructors.
type resultsDoc struct {
	Keys         int                               `json:"keys"`
	Rounds       int                               `json:"rounds"`
	DurationNs   int64                             `json:"duration_ns"`
	CachedKeys   bool                              `json:"cached_keys"`
	Peers        []peerDoc                         `json:"peers"`
	Values       map[string]map[peers.Metric][]num `json:"values"`
	Ratios       map[string]map[peers.Metric][]num `json:"ratios"`
	AllowedShare map[string]map[peers.Metric]num   `json:"allowed_share"`
	ExactWindows map[peers.Metric]int              `json:"exact_windows"`
	Allocs       map[string]map[peers.Metric][]num `json:"allocs"`
}

// num is a measured value. One that is not finite (a ratio over a round
// in which a limiter made no decision, as a loaded machine can leave a
// very short round) is written as null, since JSON has no infinity, and
// read back as NaN.
type num float64

func (n num) MarshalJSON() ([]byte, error) {
	if math.IsInf(float64(n), 0) || math.IsNaN(float64(n)) {
		return []byte("null"), nil
	}
	return json.Marshal(float64(n))
}

func (n *num) UnmarshalJSON(b []byte) error {
	if string(b) == "null" {
		*n = num(math.NaN())
		return nil
	}
	return json.Unmarshal(b, (*float64)(n))
}

// nums copies m's values as nums.
func nums(m map[string]map[peers.Metric][]float64) map[string]map[peers.Metric][]num {
	out := make(map[string]map[peers.Metric][]num, len(m))
	for name, byMetric := range m {
		out[name] = make(map[peers.Metric][]num, len(byMetric))
		for metric, vs := range byMetric {
			ns := make([]num, len(vs))
			for i, v := range vs {
				ns[i] = num(v)
			}
			out[name][metric] = ns
		}
	}
	return out
}

// shares copies m's values as nums.
func shares(m map[string]map[peers.Metric]float64) map[string]map[peers.Metric]num {
	out := make(map[string]map[peers.Metric]num, len(m))
	for name, byMetric := range m {
		out[name] = make(map[peers.Metric]num, len(byMetric))
		for metric, v := range byMetric {
			out[name][metric] = num(v)
		}
	}
	return out
}

type peerDoc struct {
	Name   string `json:"name"`
	Design string `json:"design"`
}

func docOf(r *peers.Results) resultsDoc {
	d := resultsDoc{Keys: r.Config.Keys, Rounds: r.Config.Rounds, DurationNs: int64(r.Config.Duration), CachedKeys: r.Config.CachedKeys,
		Values: nums(r.Values), Ratios: nums(r.Ratios), AllowedShare: shares(r.AllowedShare), ExactWindows: r.ExactWindows, Allocs: nums(r.Allocs)}
	for _, p := range r.Config.Peers {
		d.Peers = append(d.Peers, peerDoc{p.Name, p.Design})
	}
	return d
}

func writeJSON(path string, doc runDoc) error {
	b, err := json.MarshalIndent(doc, "", "  ")
	if err != nil {
		return fmt.Errorf("-json: %w", err)
	}
	if err := os.WriteFile(path, append(b, '\n'), 0o644); err != nil {
		return fmt.Errorf("-json: %w", err)
	}
	return nil
}

// loadAverage is the 1-minute load average from /proc/loadavg, 0 where
// there is none.
func loadAverage() float64 {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return 0
	}
	var v float64
	fmt.Sscan(string(b), &v)
	return v
}
