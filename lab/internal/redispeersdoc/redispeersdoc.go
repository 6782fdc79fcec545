// Package redispeersdoc is the file `redispeers -json` writes and
// resultspage reads for docs/results.md: one type for both sides.
package redispeersdoc

import "time"

// Doc is the run's settings, the table it printed, and every cell.
type Doc struct {
	Started    time.Time `json:"started"`
	DurationNs int64     `json:"duration_ns"`
	Cores      int       `json:"cores"`
	GoVersion  string    `json:"go_version"`
	Callers    int       `json:"callers"`
	Limit      int       `json:"limit"`
	WindowNs   int64     `json:"window_ns"`
	CellNs     int64     `json:"cell_duration_ns"`
	Rounds     int       `json:"rounds"`
	Table      string    `json:"table_markdown"`
	Cells      []Cell    `json:"cells"`
}

// Cell is one limiter's run on one deployment and workload.
type Cell struct {
	Peer         string  `json:"peer"`
	Algorithm    string  `json:"algorithm"`
	Deployment   string  `json:"deployment"`
	Workload     string  `json:"workload"`
	Round        int     `json:"round"`
	Decisions    int64   `json:"decisions"`
	Allowed      int64   `json:"allowed"`
	Errors       int64   `json:"errors"`
	PerSecond    float64 `json:"decisions_per_second"`
	RedisCPUus   float64 `json:"redis_cpu_us_per_decision"`
	Commands     float64 `json:"redis_commands_per_decision"`
	RoundTrips   float64 `json:"round_trips_per_decision"`
	MostInWindow int     `json:"most_admitted_in_a_window"`
}
