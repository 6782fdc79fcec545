package loadtest

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"net/url"
	"runtime"
	"slices"
	"strings"
	"time"

	"github.com/slidegate/slidegate/engine"
)

// Phases a run can include (Config.Modes).
const (
	ModeMemory = "memory" // populate N clients × k requests, measure the heap
	ModeEngine = "engine" // the in-process engine at full speed
	ModeHTTP   = "http"   // a real server attacked by vegeta
)

// Defaults, shared by the flags and DefaultConfig.
const (
	DefaultClients      = 1_000_000
	DefaultDist         = Zipf
	DefaultZipfS        = 1.1
	DefaultSeed         = 1
	DefaultLimit        = 100
	DefaultWindow       = time.Second
	DefaultPerClient    = 1
	DefaultRequests     = 4_000_000
	DefaultDuration     = 30 * time.Second
	DefaultSampleEvery  = 8
	DefaultRate         = 5000
	DefaultHTTPDuration = 15 * time.Second
	DefaultTiers        = "free,pro"
	DefaultConnections  = 64
	DefaultTimeout      = 5 * time.Second
	DefaultMaxRecords   = 8_000_000
	DefaultOut          = "out/loadtest"
	// MaxClients bounds --clients: client indices are stored in 32 bits.
	MaxClients = 1 << 30
	// MaxDuration bounds every timed phase, so that no attack runs unbounded.
	MaxDuration = time.Hour
)

// DefaultWorkers is the engine phase's goroutine count: four per P, so the
// scheduler interleaves more goroutines than cores, as a server would.
func DefaultWorkers() int { return 4 * runtime.GOMAXPROCS(0) }

// Config is one load-test run. DefaultConfig fills every field; Validate
// says what is wrong with a changed one.
type Config struct {
	Modes     []string      `json:"modes"`      // phases, run in the order memory, engine, http
	Clients   int           `json:"clients"`    // distinct keys, ≥ 1
	Dist      string        `json:"dist"`       // Uniform or Zipf
	ZipfS     float64       `json:"zipf_s"`     // Zipf exponent, > 1
	Seed      uint64        `json:"seed"`       // key streams are reproducible per seed
	Limit     int           `json:"limit"`      // policy limit (the first tier's in http mode)
	Window    time.Duration `json:"window_ns"`  // policy window
	Algorithm string        `json:"algorithm"`  // "log" or "counter"
	MaxCost   int           `json:"max_cost"`   // costs are uniform in [1, MaxCost]
	PerClient int           `json:"per_client"` // memory phase: requests per client (k)

	Requests    int64         `json:"requests"`     // engine phase: decisions
	Duration    time.Duration `json:"duration_ns"`  // engine phase: time bound
	Workers     int           `json:"workers"`      // engine phase goroutines
	SampleEvery int           `json:"sample_every"` // engine phase: time 1 decision in SampleEvery

	Target       string        `json:"target,omitempty"` // http phase: base URL; "" starts a server on loopback
	Rate         int           `json:"rate"`             // http phase: requests per second (ramp start)
	RampTo       int           `json:"ramp_to"`          // http phase: final rate of a linear ramp; 0 for constant
	HTTPDuration time.Duration `json:"http_duration_ns"` // http phase: attack length
	Tiers        []string      `json:"tiers"`            // http phase: policy names; clients spread round-robin
	Connections  int           `json:"connections"`      // http phase: idle connections per host
	Timeout      time.Duration `json:"timeout_ns"`       // http phase: per-request timeout
	Baseline     bool          `json:"baseline"`         // http phase: send 1 request in 10 to /v1/noop

	Verify     bool  `json:"verify"`      // record every decision and replay it offline
	MaxRecords int64 `json:"max_records"` // bound on recorded decisions (40 B each)

	Out          string `json:"out"`                    // report directory
	CPUProfile   string `json:"cpuprofile,omitempty"`   // whole-run CPU profile
	MemProfile   string `json:"memprofile,omitempty"`   // heap profile at the end
	MutexProfile string `json:"mutexprofile,omitempty"` // mutex profile at the end
	ProfileDir   string `json:"profile_dir,omitempty"`  // per-phase cpu, heap and mutex profiles
	Progress     string `json:"-"`                      // "auto", "on" or "off"
	Title        string `json:"title,omitempty"`        // shown in the report
}

// DefaultConfig returns the reference scenario: every phase, 1,000,000
// Zipf clients.
func DefaultConfig() Config {
	return Config{
		Modes: []string{ModeMemory, ModeEngine, ModeHTTP}, Clients: DefaultClients, Dist: DefaultDist,
		ZipfS: DefaultZipfS, Seed: DefaultSeed, Limit: DefaultLimit, Window: DefaultWindow,
		Algorithm: "log", MaxCost: 1, PerClient: DefaultPerClient,
		Requests: DefaultRequests, Duration: DefaultDuration, Workers: DefaultWorkers(), SampleEvery: DefaultSampleEvery,
		Rate: DefaultRate, HTTPDuration: DefaultHTTPDuration, Tiers: strings.Split(DefaultTiers, ","),
		Connections: DefaultConnections, Timeout: DefaultTimeout, Baseline: true,
		Verify: true, MaxRecords: DefaultMaxRecords, Out: DefaultOut, Progress: "auto",
	}
}

func (c Config) has(mode string) bool { return slices.Contains(c.Modes, mode) }

// Policy returns the policy of tier i: tier 0 has Limit, each next tier ten
// times more (capped at the algorithm's maximum).
func (c Config) Policy(i int) engine.Policy {
	alg, _ := engine.ParseAlgorithm(c.Algorithm)
	limit := c.Limit
	maxLimit := engine.MaxLogLimit
	if alg == engine.SlidingCounter {
		maxLimit = engine.MaxCounterLimit
	}
	for range i {
		limit = min(limit*10, maxLimit)
	}
	name := "loadtest"
	if i < len(c.Tiers) {
		name = c.Tiers[i]
	}
	return engine.Policy{Name: name, Limit: limit, Window: c.Window, Algorithm: alg}
}

// Validate returns an error naming the first bad flag.
func (c Config) Validate() error {
	if len(c.Modes) == 0 {
		return errors.New("--mode: no mode given (want memory, engine, http or all)")
	}
	for _, m := range c.Modes {
		if m != ModeMemory && m != ModeEngine && m != ModeHTTP {
			return fmt.Errorf("--mode: unknown mode %q (want memory, engine, http or all)", m)
		}
	}
	alg, err := engine.ParseAlgorithm(c.Algorithm)
	switch {
	case c.Clients < 1:
		return fmt.Errorf("--clients %d: must be at least 1", c.Clients)
	case c.Clients > MaxClients:
		return fmt.Errorf("--clients %d: must be at most %d", c.Clients, MaxClients)
	case c.Dist != Uniform && c.Dist != Zipf:
		return fmt.Errorf("--dist %q: want uniform or zipf", c.Dist)
	case c.Dist == Zipf && !(c.ZipfS > 1):
		return fmt.Errorf("--zipf-s %v: must be greater than 1", c.ZipfS)
	case err != nil:
		return fmt.Errorf("--algorithm %q: want log or counter", c.Algorithm)
	case c.MaxCost < 1 || c.MaxCost > c.Limit:
		return fmt.Errorf("--max-cost %d: must be from 1 to --limit %d", c.MaxCost, c.Limit)
	case c.has(ModeMemory) && (c.PerClient < 1 || c.PerClient > c.Limit):
		return fmt.Errorf("--per-client %d: must be from 1 to --limit %d", c.PerClient, c.Limit)
	case c.Verify && c.MaxRecords < 1:
		return fmt.Errorf("--max-records %d: must be at least 1", c.MaxRecords)
	case c.Progress != "auto" && c.Progress != "on" && c.Progress != "off":
		return fmt.Errorf("--progress %q: want auto, on or off", c.Progress)
	}
	if err := (engine.Policy{Limit: c.Limit, Window: c.Window, Algorithm: alg}).Validate(); err != nil {
		return fmt.Errorf("--limit %d / --window %v: %v", c.Limit, c.Window, err)
	}
	if c.has(ModeEngine) {
		switch {
		case c.Requests < 1:
			return fmt.Errorf("--requests %d: must be at least 1", c.Requests)
		case c.Verify && c.Requests > c.MaxRecords:
			return fmt.Errorf("--requests %d: verification records every decision, at most --max-records %d", c.Requests, c.MaxRecords)
		case c.Duration <= 0 || c.Duration > MaxDuration:
			return fmt.Errorf("--duration %v: must be positive and at most %v", c.Duration, MaxDuration)
		case c.Workers < 1:
			return fmt.Errorf("--workers %d: must be at least 1", c.Workers)
		case c.SampleEvery < 1:
			return fmt.Errorf("--sample %d: must be at least 1", c.SampleEvery)
		}
	}
	if c.has(ModeHTTP) {
		switch {
		case c.Rate <= 0:
			return fmt.Errorf("--rate %d: must be positive", c.Rate)
		case c.RampTo < 0:
			return fmt.Errorf("--ramp-to %d: must not be negative", c.RampTo)
		case c.HTTPDuration <= 0 || c.HTTPDuration > MaxDuration:
			return fmt.Errorf("--http-duration %v: must be positive and at most %v", c.HTTPDuration, MaxDuration)
		case len(c.Tiers) == 0 || len(c.Tiers) > 255:
			return fmt.Errorf("--tiers: want 1 to 255 comma-separated names")
		case c.Connections < 1:
			return fmt.Errorf("--connections %d: must be at least 1", c.Connections)
		case c.Timeout <= 0:
			return fmt.Errorf("--timeout %v: must be positive", c.Timeout)
		case c.Verify && c.Target == "" && c.maxHTTPRequests() > c.MaxRecords:
			return fmt.Errorf("--rate × --http-duration = %d requests: verification records every decision, at most --max-records %d", c.maxHTTPRequests(), c.MaxRecords)
		}
		for i, t := range c.Tiers {
			if t == "" || slices.Contains(c.Tiers[:i], t) {
				return fmt.Errorf("--tiers %q: names must be distinct and non-empty", strings.Join(c.Tiers, ","))
			}
		}
		if c.Target != "" {
			u, err := url.Parse(c.Target)
			if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
				return fmt.Errorf("--target %q: want a base URL such as http://10.0.0.5:8080", c.Target)
			}
		}
	}
	if c.Out == "" {
		return errors.New("--out: must name a directory")
	}
	return nil
}

// maxHTTPRequests is the bound on the attack's request count.
func (c Config) maxHTTPRequests() int64 {
	secs := c.HTTPDuration.Seconds()
	end := c.Rate
	if c.RampTo > 0 {
		end = c.RampTo
	}
	return int64(float64(c.Rate+end)/2*secs) + 1
}

// ParseFlags parses the loadtest subcommand's arguments over
// DefaultConfig. It returns flag.ErrHelp for -h, having printed usage to
// usage.
func ParseFlags(args []string, usage io.Writer) (Config, error) {
	c := DefaultConfig()
	fs := flag.NewFlagSet("slidegate loadtest", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	modes := fs.String("mode", "all", "phases to run: all, or a comma list of memory, engine, http")
	fs.IntVar(&c.Clients, "clients", c.Clients, "distinct client keys")
	fs.StringVar(&c.Dist, "dist", c.Dist, "key distribution: uniform or zipf")
	fs.Float64Var(&c.ZipfS, "zipf-s", c.ZipfS, "Zipf exponent s (> 1); client i has weight 1/(i+1)^s")
	fs.Uint64Var(&c.Seed, "seed", c.Seed, "random seed of the key streams")
	fs.IntVar(&c.Limit, "limit", c.Limit, "policy limit (first tier; each next tier has 10× more)")
	fs.DurationVar(&c.Window, "window", c.Window, "policy window")
	fs.StringVar(&c.Algorithm, "algorithm", c.Algorithm, "log (exact) or counter")
	fs.IntVar(&c.MaxCost, "max-cost", c.MaxCost, "request costs are uniform in [1, max-cost]")
	fs.IntVar(&c.PerClient, "per-client", c.PerClient, "memory phase: requests per client (k)")
	fs.Int64Var(&c.Requests, "requests", c.Requests, "engine phase: decisions to make")
	fs.DurationVar(&c.Duration, "duration", c.Duration, "engine phase: time bound")
	fs.IntVar(&c.Workers, "workers", c.Workers, "engine phase: goroutines")
	fs.IntVar(&c.SampleEvery, "sample", c.SampleEvery, "engine phase: time one decision in this many")
	fs.StringVar(&c.Target, "target", c.Target, "http phase: base URL of a running server; empty starts one on 127.0.0.1")
	fs.IntVar(&c.Rate, "rate", c.Rate, "http phase: requests per second (start of a ramp)")
	fs.IntVar(&c.RampTo, "ramp-to", c.RampTo, "http phase: ramp linearly to this rate; 0 keeps the rate constant")
	fs.DurationVar(&c.HTTPDuration, "http-duration", c.HTTPDuration, "http phase: attack length")
	tiers := fs.String("tiers", strings.Join(c.Tiers, ","), "http phase: tier (policy) names, comma-separated")
	fs.IntVar(&c.Connections, "connections", c.Connections, "http phase: connections per host")
	fs.DurationVar(&c.Timeout, "timeout", c.Timeout, "http phase: per-request timeout")
	fs.BoolVar(&c.Baseline, "baseline", c.Baseline, "http phase, in-process server: send one request in 10 to /v1/noop, the same server without a decision, as a baseline")
	fs.BoolVar(&c.Verify, "verify", c.Verify, "record every decision and replay it through the reference model")
	fs.Int64Var(&c.MaxRecords, "max-records", c.MaxRecords, "most decisions recorded (40 bytes each)")
	fs.StringVar(&c.Out, "out", c.Out, "directory for report.json, summary.txt and the HTML plots")
	fs.StringVar(&c.CPUProfile, "cpuprofile", "", "write a CPU profile of the whole run to this file")
	fs.StringVar(&c.MemProfile, "memprofile", "", "write a heap profile at the end of the run to this file (what the run allocated: -sample_index=alloc_space)")
	fs.StringVar(&c.MutexProfile, "mutexprofile", "", "write a mutex profile of the run to this file")
	fs.StringVar(&c.ProfileDir, "profile-dir", "", "write <phase>-cpu.pprof, <phase>-heap.pprof and <phase>-mutex.pprof here")
	fs.StringVar(&c.Progress, "progress", c.Progress, "progress bars: auto (when stdout is a terminal), on or off")
	fs.StringVar(&c.Title, "title", "", "title of the report")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			fmt.Fprintln(usage, "usage: slidegate loadtest [flags]")
			fs.SetOutput(usage)
			fs.PrintDefaults()
			return c, err
		}
		return c, err
	}
	if fs.NArg() > 0 {
		return c, fmt.Errorf("unexpected argument %q", fs.Arg(0))
	}
	c.Modes = nil
	for _, m := range strings.Split(*modes, ",") {
		m = strings.TrimSpace(m)
		if m == "all" {
			c.Modes = append(c.Modes, ModeMemory, ModeEngine, ModeHTTP)
		} else if m != "" {
			c.Modes = append(c.Modes, m)
		}
	}
	c.Tiers = nil
	for _, t := range strings.Split(*tiers, ",") {
		c.Tiers = append(c.Tiers, strings.TrimSpace(t))
	}
	return c, c.Validate()
}
