package main

import (
	"encoding/json"
	"fmt"
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
	Keys         int                                   `json:"keys"`
	Rounds       int                                   `json:"rounds"`
	DurationNs   int64                                 `json:"duration_ns"`
	CachedKeys   bool                                  `json:"cached_keys"`
	Peers        []peerDoc                             `json:"peers"`
	Values       map[string]map[peers.Metric][]float64 `json:"values"`
	Ratios       map[string]map[peers.Metric][]float64 `json:"ratios"`
	AllowedShare map[string]map[peers.Metric]float64   `json:"allowed_share"`
	ExactWindows map[peers.Metric]int                  `json:"exact_windows"`
	Allocs       map[string]map[peers.Metric][]float64 `json:"allocs"`
}

type peerDoc struct {
	Name   string `json:"name"`
	Design string `json:"design"`
}

func docOf(r *peers.Results) resultsDoc {
	d := resultsDoc{Keys: r.Config.Keys, Rounds: r.Config.Rounds, DurationNs: int64(r.Config.Duration), CachedKeys: r.Config.CachedKeys,
		Values: r.Values, Ratios: r.Ratios, AllowedShare: r.AllowedShare, ExactWindows: r.ExactWindows, Allocs: r.Allocs}
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
