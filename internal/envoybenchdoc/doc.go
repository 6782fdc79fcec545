// Package envoybenchdoc is the file `envoybench -json` writes
// (compat/envoy/cmd/envoybench, make bench-envoy) and resultspage reads
// for docs/results.md: one type for both sides. It lives in the root
// module's internal/ because compat/envoy and lab are separate modules.
package envoybenchdoc

import "time"

// Doc is the run's settings, the table it printed, and every variant.
type Doc struct {
	Started     time.Time `json:"started"`
	DurationNs  int64     `json:"duration_ns"`
	Cores       int       `json:"cores"`
	GoVersion   string    `json:"go_version"`
	PeerVersion string    `json:"peer_version"`
	Redis       string    `json:"redis_version"`
	LoadBefore  float64   `json:"load_before"` // 1-minute load average
	LoadAfter   float64   `json:"load_after"`
	RunNs       int64     `json:"run_duration_ns"` // one variant, one service, one round
	Rounds      int       `json:"rounds"`
	Table       string    `json:"table_markdown"`
	Variants    []Variant `json:"variants"`
}

// Variant is one load (descriptors per request, mostly allowed or
// mostly refused, callers) and what each service did under it.
type Variant struct {
	Name        string  `json:"name"`
	Descriptors int     `json:"descriptors"`
	Refused     bool    `json:"mostly_refused"`
	Callers     int     `json:"callers"`
	Peer        Figures `json:"peer"`
	Slidegate   Figures `json:"slidegate"`
	// Per round, slidegate's figure over the peer's in the same round.
	RateRatios     []float64 `json:"decisions_per_second_ratios"`
	RedisCPURatios []float64 `json:"redis_cpu_ratios"`
}

// Figures are one service's totals over the rounds of a variant.
type Figures struct {
	Decisions    int64   `json:"decisions"`
	Seconds      float64 `json:"seconds"`
	PerSecond    float64 `json:"decisions_per_second"`
	P50Ns        int64   `json:"p50_ns"` // the median of the rounds' p50
	P99Ns        int64   `json:"p99_ns"` // the median of the rounds' p99
	ServiceCPUus float64 `json:"service_cpu_us_per_decision"`
	RedisCPUus   float64 `json:"redis_cpu_us_per_decision"` // user and system
	RedisSysUs   float64 `json:"redis_sys_us_per_decision"` // system alone
	Errors       int64   `json:"errors"`
	OverLimit    int64   `json:"over_limit"`
	Fallbacks    int64   `json:"local_fallbacks"` // slidegate only: decisions made without Redis
	// Redis commands per decision by name (INFO commandstats), the
	// commands scripts run included.
	Commands map[string]float64 `json:"redis_commands_per_decision"`
	// Redis's time in each command per decision, µs (commandstats'
	// usec): a script call's includes the commands it runs.
	CommandUs map[string]float64 `json:"redis_command_us_per_decision"`
}
