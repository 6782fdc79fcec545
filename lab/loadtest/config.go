package loadtest

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/url"
	"os"
	"runtime"
	"slices"
	"strings"
	"time"

	"github.com/slidegate/slidegate/engine"
	"github.com/slidegate/slidegate/lab/internal/keydist"
)

// Phases a run can include (Config.Modes).
const (
	ModeMemory = "memory" // populate N clients × k requests, measure the heap
	ModeEngine = "engine" // the in-process engine at full speed
	ModeHTTP   = "http"   // a real server attacked by vegeta
	// ModeCapacity measures the server's saturation throughput against
	// the harness's no-op handler's, served the same way, in pairs of
	// closed-loop slices.
	ModeCapacity = "capacity"
	// ModeScale measures memory and decision cost at growing client
	// counts (10k, 100k, 1M and 10M, up to Config.ScaleMax).
	ModeScale = "scale"
	// ModeRedis runs the engine-style and HTTP phases against Redis and a
	// Redis Cluster (Config.RedisAddr, Config.RedisCluster).
	ModeRedis = "redis"
)

// modeOrder is the order phases run in; "all" is the first four.
var modeOrder = []string{ModeMemory, ModeEngine, ModeHTTP, ModeCapacity, ModeScale, ModeRedis, ModeGRPC}

// Defaults, shared by the flags and DefaultConfig.
const (
	defaultClients     = 1_000_000
	defaultDist        = keydist.Zipf
	defaultZipfS       = 1.1
	defaultSeed        = 1
	defaultLimit       = 100
	defaultWindow      = time.Second
	defaultPerClient   = 1
	defaultRequests    = 4_000_000
	defaultDuration    = 30 * time.Second
	defaultSampleEvery = 8
	// defaultEngineRounds is the engine phase's rounds: thirty-one give
	// the median's interval from the eleventh smallest to the eleventh
	// largest round (93%), so that ten rounds blown on one side (the
	// first, which meets most keys for the first time, or pauses of the
	// machine: pauses.go) leave the interval where the others put it. A
	// round still times about 16,000 decisions a side, so its p99.9 is
	// its sixteenth slowest (docs/design.md, "The machine's pauses", has
	// the runs that chose it over fifteen rounds).
	defaultEngineRounds = 31
	// defaultEngineParts is the parts of an engine round, each through
	// the engine and the floor in turn: a collection or another
	// process's burst within the round then falls on both.
	defaultEngineParts = 4
	// defaultCapacityBudget bounds the time of the capacity phase's
	// rounds. Its target, still undecided at its first look, is measured
	// on until its last look (capacityGrowth times the first look's
	// rounds) or this budget, whichever comes first; the rounds before
	// the first look are not cut. A ratio near the bound needs the last
	// look's rounds to narrow its interval clear of it; a ratio far from
	// the bound is decided at the first look and never spends the
	// budget. Its rounds' records stay within defaultMaxRecords.
	defaultCapacityBudget = 56 * time.Second
	// defaultGRPCRoundCalls is how many calls each target of the grpc
	// phase's rounds serves in a round.
	defaultGRPCRoundCalls = 20_000
	defaultRate           = 5000
	defaultHTTPDuration   = 10 * time.Second
	defaultTiers          = "free,pro"
	defaultConnections    = 64
	defaultTimeout        = 5 * time.Second
	defaultMaxRecords     = 8_000_000
	defaultOut            = "out/loadtest"
	// Capacity: defaultCapacityRounds clean rounds, each a pair of
	// closed-loop slices (slidegate, the no-op) of defaultCapacitySlice
	// with defaultCapacityWorkers requests in flight; a slice holds with
	// p99 within defaultCapacityP99 and no error. Fifteen rounds put the
	// first look's 95% interval between the 4th and the 12th ratio.
	// defaultCapacityMax bounds the requests a slice may send, per
	// second of it.
	defaultCapacityWorkers = 16
	defaultCapacitySlice   = 300 * time.Millisecond
	defaultCapacityMax     = 200_000
	defaultCapacityP99     = 10 * time.Millisecond
	defaultCapacityRounds  = 15
	// defaultCapacityCostBurst is how many requests each target serves
	// in a round of the server's cost (capacitycost.go).
	defaultCapacityCostBurst = 8000
	// Scale mode: client counts measured (up to --scale-max), and
	// decisions timed per client (D) once every client holds L = --limit
	// requests (so every timed decision is a refusal of a full client).
	// maxScaleInstants bounds the instants the fills store (clients × L):
	// 2^31 full-ring instants are about 14 GiB of heap.
	defaultScaleMax       = 1_000_000
	defaultScaleDecisions = 3
	maxScaleInstants      = 1 << 31
	// Redis phase: decisions of the engine-style phase, concurrent callers,
	// and the population measured for memory per entry.
	defaultRedisRequests   = 200_000
	defaultRedisCallers    = 64
	defaultRedisRate       = 2000
	defaultRedisDuration   = 5 * time.Second
	defaultRedisEngineTime = time.Minute
	defaultRedisMemClients = 50_000
	// maxClients bounds --clients: client indices are stored in 32 bits.
	maxClients = 1 << 30
	// maxDuration bounds every timed phase, so that no attack runs unbounded.
	maxDuration = time.Hour
	// seqGrowth is the last look's clean rounds over the first look's.
	seqGrowth = 3
	// capacityGrowth is seqGrowth for the capacity phase, whose rounds
	// are short: twice seqGrowth narrows its last look's interval by
	// about √2, so that a ratio a few hundredths over the bound is met
	// at the last look rather than left undecided.
	capacityGrowth = 2 * seqGrowth
)

// defaultWorkers is the engine phase's goroutine count: four per P, so the
// scheduler interleaves more goroutines than cores, as a server would.
func defaultWorkers() int { return 4 * runtime.GOMAXPROCS(0) }

// Config is one load-test run; its fields are the flags of `slidegate
// loadtest`. DefaultConfig fills every field; Validate says what is wrong
// with a changed one. Every phase is bounded: Clients by 2^30 (client
// indices are kept in 32 bits), each duration by an hour, and the decisions
// recorded per phase by MaxRecords.
type Config struct {
	Modes     []string      `json:"modes"`      // phases, run in the order memory, engine, http, capacity, scale, redis
	Clients   int           `json:"clients"`    // distinct keys, ≥ 1
	Dist      string        `json:"dist"`       // "uniform" or "zipf"
	ZipfS     float64       `json:"zipf_s"`     // Zipf exponent, > 1
	Seed      uint64        `json:"seed"`       // key streams are reproducible per seed
	Limit     int           `json:"limit"`      // policy limit (the first tier's in http mode)
	Window    time.Duration `json:"window_ns"`  // policy window
	Algorithm string        `json:"algorithm"`  // "log" or "counter"
	MaxCost   int           `json:"max_cost"`   // costs are uniform in [1, MaxCost]
	PerClient int           `json:"per_client"` // memory phase: requests per client (k)

	Requests       int64         `json:"requests"`         // engine phase: decisions
	Duration       time.Duration `json:"duration_ns"`      // engine phase: time bound
	Workers        int           `json:"workers"`          // engine phase goroutines
	SampleEvery    int           `json:"sample_every"`     // engine phase: time 1 decision in SampleEvery
	EngineRounds   int           `json:"engine_rounds"`    // engine phase: rounds of engine and floor side by side
	EngineParts    int           `json:"engine_parts"`     // engine phase: parts of a round, engine and floor in turn in each
	GRPCRoundCalls int           `json:"grpc_round_calls"` // grpc phase: calls per target in each round of its target

	Target       string        `json:"target,omitempty"` // http phase: base URL; "" starts a server on loopback
	Rate         int           `json:"rate"`             // http phase: requests per second (ramp start)
	RampTo       int           `json:"ramp_to"`          // http phase: final rate of a linear ramp; 0 for constant
	HTTPDuration time.Duration `json:"http_duration_ns"` // http phase: attack length
	Tiers        []string      `json:"tiers"`            // http phase: policy names; clients spread round-robin
	Connections  int           `json:"connections"`      // http phase: idle connections per host
	Timeout      time.Duration `json:"timeout_ns"`       // http phase: per-request timeout

	CapacityWorkers   int           `json:"capacity_workers"`    // capacity: requests in flight in a slice (the closed loop's workers)
	CapacitySlice     time.Duration `json:"capacity_slice_ns"`   // capacity: length of one slice
	CapacityMax       int           `json:"capacity_max"`        // capacity: bound on a slice's requests per second of it
	CapacityP99       time.Duration `json:"capacity_p99_ns"`     // capacity: p99 bound a slice must keep
	CapacityCostBurst int           `json:"capacity_cost_burst"` // capacity: requests per target in a round of the server's cost; 0 skips them
	CapacityRounds    int           `json:"capacity_rounds"`     // capacity: clean rounds (pairs of slices) at the first look
	CapacityBudget    time.Duration `json:"capacity_budget_ns"`  // capacity: time bound of its rounds; 0 looks once
	ScaleMax          int           `json:"scale_max"`           // scale: largest client count (10k, 100k, 1M, 10M up to it)
	ScaleDecisions    int           `json:"scale_decisions"`     // scale: decisions timed per client (D), after the L = Limit requests that fill each client
	RedisAddr         string        `json:"redis_addr"`          // redis: standalone host:port ("" skips it)
	RedisCluster      string        `json:"redis_cluster"`       // redis: cluster host:port list ("" skips it)
	RedisRequests     int64         `json:"redis_requests"`      // redis: decisions of the engine-style phase
	RedisCallers      int           `json:"redis_callers"`       // redis: concurrent callers (and redis-benchmark -c)
	RedisRate         int           `json:"redis_rate"`          // redis: HTTP phase's rate
	RedisDuration     time.Duration `json:"redis_duration_ns"`   // redis: HTTP phase's length
	RedisEngineMax    time.Duration `json:"redis_engine_max_ns"` // redis: time bound of the engine-style phase and of the memory population, each
	RedisMemClient    int           `json:"redis_mem_clients"`   // redis: clients populated to measure memory

	// CapacityHeaders are the decision API's header families that the
	// capacity phase's server turns on (draft, x: decision_headers' keys),
	// to measure what they cost. Empty keeps the server's default: only
	// Retry-After, on refusals.
	CapacityHeaders []string `json:"capacity_headers,omitempty"`

	Verify     bool  `json:"verify"`      // record every decision and replay it offline
	MaxRecords int64 `json:"max_records"` // bound on recorded decisions (40 B each)
	Strict     bool  `json:"strict"`      // a missed target fails the run too

	Out          string `json:"out"`                    // report directory
	CPUProfile   string `json:"cpuprofile,omitempty"`   // whole-run CPU profile
	MemProfile   string `json:"memprofile,omitempty"`   // heap profile at the end
	MutexProfile string `json:"mutexprofile,omitempty"` // mutex profile at the end
	ProfileDir   string `json:"profile_dir,omitempty"`  // per-phase cpu, heap and mutex profiles
	Progress     string `json:"-"`                      // "auto", "on" or "off"
	Title        string `json:"title,omitempty"`        // shown in the report
}

// DefaultConfig returns the reference scenario (`make loadtest`): memory,
// engine, http and capacity over 1,000,000 Zipf clients.
func DefaultConfig() Config {
	return Config{
		Modes: []string{ModeMemory, ModeEngine, ModeHTTP, ModeCapacity}, Clients: defaultClients, Dist: defaultDist,
		ZipfS: defaultZipfS, Seed: defaultSeed, Limit: defaultLimit, Window: defaultWindow,
		Algorithm: "log", MaxCost: 1, PerClient: defaultPerClient,
		Requests: defaultRequests, Duration: defaultDuration, Workers: defaultWorkers(), SampleEvery: defaultSampleEvery, EngineRounds: defaultEngineRounds, EngineParts: defaultEngineParts, GRPCRoundCalls: defaultGRPCRoundCalls,
		Rate: defaultRate, HTTPDuration: defaultHTTPDuration, Tiers: strings.Split(defaultTiers, ","),
		Connections: defaultConnections, Timeout: defaultTimeout,
		CapacityWorkers: defaultCapacityWorkers, CapacitySlice: defaultCapacitySlice, CapacityMax: defaultCapacityMax,
		CapacityP99: defaultCapacityP99, CapacityRounds: defaultCapacityRounds, CapacityBudget: defaultCapacityBudget, CapacityCostBurst: defaultCapacityCostBurst,
		ScaleMax: defaultScaleMax, ScaleDecisions: defaultScaleDecisions,
		RedisRequests: defaultRedisRequests, RedisCallers: defaultRedisCallers, RedisRate: defaultRedisRate,
		RedisDuration: defaultRedisDuration, RedisEngineMax: defaultRedisEngineTime, RedisMemClient: defaultRedisMemClients,
		Verify: true, MaxRecords: defaultMaxRecords, Out: defaultOut, Progress: "auto",
	}
}

func (c Config) has(mode string) bool { return slices.Contains(c.Modes, mode) }

// policy returns the policy of tier i: tier 0 has Limit, each next tier ten
// times more (capped at the algorithm's maximum).
func (c Config) policy(i int) engine.Policy {
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
		return errors.New("--mode: no mode given (want all, or memory, engine, http, capacity, scale, redis, grpc)")
	}
	for _, m := range c.Modes {
		if !slices.Contains(modeOrder, m) {
			return fmt.Errorf("--mode: unknown mode %q (want all, or memory, engine, http, capacity, scale, redis, grpc)", m)
		}
	}
	alg, err := engine.ParseAlgorithm(c.Algorithm)
	switch {
	case c.Clients < 1:
		return fmt.Errorf("--clients %d: must be at least 1", c.Clients)
	case c.Clients > maxClients:
		return fmt.Errorf("--clients %d: must be at most %d", c.Clients, maxClients)
	case c.Dist != keydist.Uniform && c.Dist != keydist.Zipf:
		return fmt.Errorf("--dist %q: want uniform or zipf", c.Dist)
	case c.Dist == keydist.Zipf && !(c.ZipfS > 1):
		return fmt.Errorf("--zipf-s %v: must be greater than 1", c.ZipfS)
	case err != nil:
		return fmt.Errorf("--algorithm %q: want log or counter", c.Algorithm)
	case c.MaxCost < 1 || c.MaxCost > c.Limit:
		return fmt.Errorf("--max-cost %d: must be from 1 to --limit %d", c.MaxCost, c.Limit)
	case c.has(ModeMemory) && (c.PerClient < 1 || c.PerClient > c.Limit):
		return fmt.Errorf("--memory-per-client %d: must be from 1 to --limit %d", c.PerClient, c.Limit)
	case c.Verify && c.MaxRecords < 1:
		return fmt.Errorf("--max-records %d: must be at least 1", c.MaxRecords)
	case c.Progress != "auto" && c.Progress != "on" && c.Progress != "off":
		return fmt.Errorf("--progress %q: want auto, on or off", c.Progress)
	}
	if err := (engine.Policy{Limit: c.Limit, Window: c.Window, Algorithm: alg}).Validate(); err != nil {
		return fmt.Errorf("--limit %d / --window %v: %v", c.Limit, c.Window, err)
	}
	for _, check := range []struct {
		mode  bool
		check func() error
	}{
		{c.has(ModeEngine), c.validateEngine},
		{c.has(ModeHTTP) || c.has(ModeCapacity) || c.has(ModeRedis) || c.has(ModeGRPC), c.validateServed},
		{c.has(ModeCapacity), c.validateCapacity},
		{c.has(ModeScale), c.validateScale},
		{c.has(ModeRedis), c.validateRedis},
		{c.has(ModeHTTP), c.validateHTTP},
		{c.has(ModeGRPC), c.validateGRPC},
	} {
		if !check.mode {
			continue
		}
		if err := check.check(); err != nil {
			return err
		}
	}
	if c.Out == "" {
		return errors.New("--out: must name a directory")
	}
	return nil
}

// validateEngine checks the engine phase's flags.
func (c Config) validateEngine() error {
	switch {
	case c.Requests < 1:
		return fmt.Errorf("--engine-requests %d: must be at least 1", c.Requests)
	case c.Verify && c.Requests > c.MaxRecords:
		return fmt.Errorf("--engine-requests %d: verification records every decision, at most --max-records %d", c.Requests, c.MaxRecords)
	case c.Duration <= 0 || c.Duration > maxDuration:
		return fmt.Errorf("--engine-duration %v: must be positive and at most %v", c.Duration, maxDuration)
	case c.Workers < 1:
		return fmt.Errorf("--engine-workers %d: must be at least 1", c.Workers)
	case c.SampleEvery < 1:
		return fmt.Errorf("--engine-sample %d: must be at least 1", c.SampleEvery)
	case c.EngineRounds < 1 || c.EngineRounds > 63:
		return fmt.Errorf("--engine-rounds %d: must be from 1 to 63", c.EngineRounds)
	case c.EngineParts < 1 || c.EngineParts > 64:
		return fmt.Errorf("--engine-parts %d: must be from 1 to 64", c.EngineParts)
	}
	return nil
}

// validateServed checks the flags of the phases that send requests to a server (http, capacity, redis, grpc).
func (c Config) validateServed() error {
	switch {
	case len(c.Tiers) == 0 || len(c.Tiers) > 255:
		return fmt.Errorf("--tiers: want 1 to 255 comma-separated names")
	case c.Connections < 1:
		return fmt.Errorf("--http-connections %d: must be at least 1", c.Connections)
	case c.Timeout <= 0:
		return fmt.Errorf("--http-timeout %v: must be positive", c.Timeout)
	}
	return nil
}

// validateCapacity checks the capacity phase's flags.
func (c Config) validateCapacity() error {
	switch {
	case c.CapacityWorkers < 1 || c.CapacityWorkers > c.Connections:
		return fmt.Errorf("--capacity-workers %d: must be from 1 to --http-connections %d", c.CapacityWorkers, c.Connections)
	case c.CapacitySlice < 100*time.Millisecond || c.CapacitySlice > time.Minute:
		return fmt.Errorf("--capacity-slice %v: must be from 100ms to 1m", c.CapacitySlice)
	case c.CapacityMax < 1:
		return fmt.Errorf("--capacity-max %d: must be positive", c.CapacityMax)
	case c.CapacityCostBurst < 0 || c.CapacityCostBurst > 1_000_000:
		return fmt.Errorf("--capacity-cost-burst %d: must be from 0 to 1000000", c.CapacityCostBurst)
	case c.CapacityP99 <= 0:
		return fmt.Errorf("--capacity-p99 %v: must be positive", c.CapacityP99)
	case c.CapacityRounds < 1 || c.CapacityRounds > 50:
		return fmt.Errorf("--capacity-rounds %d: must be from 1 to 50", c.CapacityRounds)
	case c.CapacityBudget < 0 || c.CapacityBudget > maxDuration:
		return fmt.Errorf("--capacity-budget %v: must be from 0 to %v", c.CapacityBudget, maxDuration)
	case slices.ContainsFunc(c.CapacityHeaders, func(h string) bool { return h != headersDraft && h != headersX }):
		return fmt.Errorf("--capacity-headers %s: a comma list of %s and %s", strings.Join(c.CapacityHeaders, ","), headersDraft, headersX)
	case c.Verify && c.capacityMaxRequests() > c.MaxRecords:
		return fmt.Errorf("--capacity-max × --capacity-slice × --capacity-rounds: up to %d requests, verification records every decision, at most --max-records %d", c.capacityMaxRequests(), c.MaxRecords)
	}
	return nil
}

// validateScale checks the scale phase's flags.
func (c Config) validateScale() error {
	switch {
	case c.ScaleMax < scaleSizes[0] || c.ScaleMax > maxClients:
		return fmt.Errorf("--scale-max %d: must be from %d to %d", c.ScaleMax, scaleSizes[0], maxClients)
	case c.ScaleDecisions < 1:
		return fmt.Errorf("--scale-decisions %d: must be at least 1", c.ScaleDecisions)
	case int64(c.ScaleMax)*int64(c.ScaleDecisions) > 1<<31:
		return fmt.Errorf("--scale-decisions %d × --scale-max %d: at most 2^31 decisions", c.ScaleDecisions, c.ScaleMax)
	case int64(c.ScaleMax)*int64(c.Limit) > maxScaleInstants:
		return fmt.Errorf("--scale-max %d × --limit %d: scale fills every client to its limit, at most %d stored instants", c.ScaleMax, c.Limit, int64(maxScaleInstants))
	}
	return nil
}

// validateRedis checks the redis phase's flags; Redis addresses must be loopback.
func (c Config) validateRedis() error {
	switch {
	case c.RedisAddr == "" && c.RedisCluster == "":
		return errors.New("--redis-addr and --redis-cluster: give at least one (make loadtest-redis starts both)")
	case c.RedisRequests < 1:
		return fmt.Errorf("--redis-requests %d: must be at least 1", c.RedisRequests)
	case c.Verify && c.RedisRequests > c.MaxRecords:
		return fmt.Errorf("--redis-requests %d: verification records every decision, at most --max-records %d", c.RedisRequests, c.MaxRecords)
	case c.RedisCallers < 1 || c.RedisCallers > 1024:
		return fmt.Errorf("--redis-callers %d: must be from 1 to 1024", c.RedisCallers)
	case c.RedisRate < 1:
		return fmt.Errorf("--redis-http-rate %d: must be positive", c.RedisRate)
	case c.RedisDuration <= 0 || c.RedisDuration > maxDuration:
		return fmt.Errorf("--redis-http-duration %v: must be positive and at most %v", c.RedisDuration, maxDuration)
	case c.RedisEngineMax <= 0 || c.RedisEngineMax > maxDuration:
		return fmt.Errorf("--redis-engine-duration %v: must be positive and at most %v", c.RedisEngineMax, maxDuration)
	case c.RedisMemClient < 1 || c.RedisMemClient > 10_000_000:
		return fmt.Errorf("--redis-mem-clients %d: must be from 1 to 10,000,000", c.RedisMemClient)
	case c.Verify && int64(float64(c.RedisRate)*c.RedisDuration.Seconds())+1 > c.MaxRecords:
		return fmt.Errorf("--redis-http-rate × --redis-http-duration: verification records every decision, at most --max-records %d", c.MaxRecords)
	}
	for _, a := range append([]string{c.RedisAddr}, strings.Split(c.RedisCluster, ",")...) {
		if a == "" {
			continue
		}
		if !isLoopback(a) {
			return fmt.Errorf("--redis-addr/--redis-cluster %q: the load test sends traffic to loopback only (127.0.0.1, ::1, localhost)", a)
		}
	}
	return nil
}

// validateGRPC checks the grpc phase's own flags.
func (c Config) validateGRPC() error {
	if c.GRPCRoundCalls < 1 || c.GRPCRoundCalls > 10_000_000 {
		return fmt.Errorf("--grpc-round-calls %d: must be from 1 to 10,000,000", c.GRPCRoundCalls)
	}
	return nil
}

// validateHTTP checks the http phase's flags.
func (c Config) validateHTTP() error {
	switch {
	case c.Rate <= 0:
		return fmt.Errorf("--http-rate %d: must be positive", c.Rate)
	case c.RampTo < 0:
		return fmt.Errorf("--http-ramp-to %d: must not be negative", c.RampTo)
	case c.HTTPDuration <= 0 || c.HTTPDuration > maxDuration:
		return fmt.Errorf("--http-duration %v: must be positive and at most %v", c.HTTPDuration, maxDuration)
	case c.Verify && c.Target == "" && c.maxHTTPRequests() > c.MaxRecords:
		return fmt.Errorf("--http-rate × --http-duration = %d requests: verification records every decision, at most --max-records %d", c.maxHTTPRequests(), c.MaxRecords)
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
	return nil
}

// capacityMaxRequests bounds the requests of slidegate's capacity
// slices (capacityMaxRounds rounds and the warm-up, each at most
// CapacityMax per second of it) and of its cost rounds (up to twice
// costRounds, and the warm-up).
func (c Config) capacityMaxRequests() int64 {
	perSecond := float64(c.CapacityMax)
	rounds := c.capacityMaxRounds()
	slices := int64(perSecond*(float64(rounds)*c.CapacitySlice.Seconds()+capacityWarmup.Seconds())) + int64(rounds) + 1
	return slices + int64(2*costRounds+1)*int64(c.CapacityCostBurst)
}

// capacityPlan is the capacity phase's looks: CapacityRounds clean
// rounds at the first, capacityGrowth times that at the last, within
// CapacityBudget.
func (c Config) capacityPlan() seqPlan {
	return seqPlan{First: c.CapacityRounds, Last: capacityGrowth * c.CapacityRounds, Budget: c.CapacityBudget}
}

// capacityMaxRounds bounds the capacity phase's rounds: twice the first
// look's before it; after it, one round per two slices of the budget (a
// round is two slices, so a plan's budget allows no more), and never
// more than twice the last look's in all. The phase stops at it.
func (c Config) capacityMaxRounds() int {
	p := c.capacityPlan()
	if p.looks() == 1 {
		return 2 * p.First
	}
	after := int(p.Budget/(2*c.CapacitySlice)) + 1
	return min(2*p.Last, 2*p.First+after)
}

// isLoopback reports whether host:port names a loopback address.
func isLoopback(hostport string) bool {
	h, _, err := net.SplitHostPort(strings.TrimSpace(hostport))
	if err != nil {
		return false
	}
	if h == "localhost" {
		return true
	}
	ip := net.ParseIP(h)
	return ip != nil && ip.IsLoopback()
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

// parseFlags parses the loadtest subcommand's arguments over
// DefaultConfig. It returns flag.ErrHelp for -h, having printed usage to
// usage.
func parseFlags(args []string, usage io.Writer) (Config, error) {
	c := DefaultConfig()
	fs := flag.NewFlagSet("slidegate-loadtest", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	modes := fs.String("mode", "all", "phases to run: all (memory,engine,http,capacity), or a comma list of memory, engine, http, capacity, scale, redis, grpc")
	fs.IntVar(&c.Clients, "clients", c.Clients, "distinct client keys (memory, engine, http, capacity, redis)")
	fs.StringVar(&c.Dist, "dist", c.Dist, "key distribution: uniform or zipf")
	fs.Float64Var(&c.ZipfS, "zipf-s", c.ZipfS, "Zipf exponent s (> 1); client i has weight 1/(i+1)^s")
	fs.Uint64Var(&c.Seed, "seed", c.Seed, "random seed of the key streams")
	fs.IntVar(&c.Limit, "limit", c.Limit, "policy limit (first tier; each next tier has 10× more)")
	fs.DurationVar(&c.Window, "window", c.Window, "policy window")
	fs.StringVar(&c.Algorithm, "algorithm", c.Algorithm, "log (exact) or counter")
	fs.IntVar(&c.MaxCost, "max-cost", c.MaxCost, "request costs are uniform in [1, max-cost]")
	fs.IntVar(&c.PerClient, "memory-per-client", c.PerClient, "memory phase: requests per client (k)")
	fs.Int64Var(&c.Requests, "engine-requests", c.Requests, "engine phase: decisions to make")
	fs.DurationVar(&c.Duration, "engine-duration", c.Duration, "engine phase: time bound of the engine's decisions (the floor's get as long again)")
	fs.IntVar(&c.Workers, "engine-workers", c.Workers, "engine phase: goroutines")
	fs.IntVar(&c.SampleEvery, "engine-sample", c.SampleEvery, "engine phase: time one decision in this many")
	fs.IntVar(&c.EngineRounds, "engine-rounds", c.EngineRounds, "engine phase: rounds, each a slice of the streams through the engine and the floor in turn; the latency targets are judged on the rounds' ratios")
	fs.IntVar(&c.EngineParts, "engine-parts", c.EngineParts, "engine phase: parts of a round, each through the engine and the floor in turn (the order alternating part by part); 1 runs a round's slice through each once")
	fs.StringVar(&c.Target, "target", c.Target, "http phase: base URL of a running server; empty starts one on 127.0.0.1")
	fs.IntVar(&c.Rate, "http-rate", c.Rate, "http phase: requests per second (start of a ramp)")
	fs.IntVar(&c.RampTo, "http-ramp-to", c.RampTo, "http phase: ramp linearly to this rate; 0 keeps the rate constant")
	fs.DurationVar(&c.HTTPDuration, "http-duration", c.HTTPDuration, "http phase: attack length")
	fs.IntVar(&c.GRPCRoundCalls, "grpc-round-calls", c.GRPCRoundCalls, "grpc phase: calls per target in each round of its target (the service against a no-op gRPC server)")
	tiers := fs.String("tiers", strings.Join(c.Tiers, ","), "http, capacity and redis phases: tier (policy) names, comma-separated")
	fs.IntVar(&c.Connections, "http-connections", c.Connections, "http, capacity and redis phases: vegeta's connections per host")
	fs.DurationVar(&c.Timeout, "http-timeout", c.Timeout, "http, capacity and redis phases: per-request timeout")
	fs.IntVar(&c.CapacityWorkers, "capacity-workers", c.CapacityWorkers, "capacity phase: requests in flight in a closed-loop slice (at most --http-connections)")
	fs.DurationVar(&c.CapacitySlice, "capacity-slice", c.CapacitySlice, "capacity phase: length of one slice (a round is a pair: slidegate, the no-op)")
	fs.IntVar(&c.CapacityCostBurst, "capacity-cost-burst", c.CapacityCostBurst, "capacity phase: requests per target in each round of the server's own cost (a minimal client, slidegate against the no-op); 0 skips them")
	fs.IntVar(&c.CapacityMax, "capacity-max", c.CapacityMax, "capacity phase: bound on a slice's requests per second of it")
	fs.DurationVar(&c.CapacityP99, "capacity-p99", c.CapacityP99, "capacity phase: a slice holds its throughput when its p99 is at most this, with no error")
	fs.IntVar(&c.CapacityRounds, "capacity-rounds", c.CapacityRounds, "capacity phase: clean rounds at the first look (pairs of slices; disturbed ones are run again, up to twice this in all)")
	fs.DurationVar(&c.CapacityBudget, "capacity-budget", c.CapacityBudget, "capacity phase: time bound of its rounds; undecided at the first look, the target is measured on until 6× --capacity-rounds clean rounds or this; 0 looks once")
	fs.Func("capacity-headers", "capacity phase: the decision API's header families the server turns on, a comma list of draft (RateLimit-Policy, RateLimit) and x (X-RateLimit-*); empty keeps the default, Retry-After on refusals only", func(v string) error {
		c.CapacityHeaders = nil
		for _, h := range strings.Split(v, ",") {
			if h = strings.TrimSpace(h); h != "" && !slices.Contains(c.CapacityHeaders, h) {
				c.CapacityHeaders = append(c.CapacityHeaders, h)
			}
		}
		return nil
	})
	fs.IntVar(&c.ScaleMax, "scale-max", c.ScaleMax, "scale phase: largest client count of 10k, 100k, 1M, 10M measured")
	fs.IntVar(&c.ScaleDecisions, "scale-decisions", c.ScaleDecisions, "scale phase: decisions per client timed at each size, after the --limit requests that fill each client (all refusals)")
	fs.StringVar(&c.RedisAddr, "redis-addr", os.Getenv("SLIDEGATE_REDIS_ADDR"), "redis phase: standalone Redis host:port on loopback (default $SLIDEGATE_REDIS_ADDR)")
	fs.StringVar(&c.RedisCluster, "redis-cluster", os.Getenv("SLIDEGATE_REDIS_CLUSTER_ADDRS"), "redis phase: Redis Cluster host:port,... on loopback (default $SLIDEGATE_REDIS_CLUSTER_ADDRS)")
	fs.Int64Var(&c.RedisRequests, "redis-requests", c.RedisRequests, "redis phase: decisions of its engine-style phase, per deployment")
	fs.IntVar(&c.RedisCallers, "redis-callers", c.RedisCallers, "redis phase: concurrent callers (and redis-benchmark's -c)")
	fs.IntVar(&c.RedisRate, "redis-http-rate", c.RedisRate, "redis phase: rate of its HTTP phase (req/s)")
	fs.DurationVar(&c.RedisDuration, "redis-http-duration", c.RedisDuration, "redis phase: length of its HTTP phase")
	fs.DurationVar(&c.RedisEngineMax, "redis-engine-duration", c.RedisEngineMax, "redis phase: time bound of its engine-style phase, and of its memory population")
	fs.IntVar(&c.RedisMemClient, "redis-mem-clients", c.RedisMemClient, "redis phase: clients populated to measure Redis memory per key and entry")
	fs.BoolVar(&c.Verify, "verify", c.Verify, "record every decision and replay it through the reference model")
	fs.Int64Var(&c.MaxRecords, "max-records", c.MaxRecords, "most decisions recorded per phase (40 bytes each)")
	fs.BoolVar(&c.Strict, "strict", c.Strict, "a performance target missed or undecided fails the run (exit 1), as a correctness failure does")
	fs.StringVar(&c.Out, "out", c.Out, "directory for report.json, summary.txt, the vegeta results and the HTML plots")
	fs.StringVar(&c.CPUProfile, "cpuprofile", "", "write a CPU profile of the whole run to this file")
	fs.StringVar(&c.MemProfile, "memprofile", "", "write a heap profile at the end of the run to this file (what the run allocated: -sample_index=alloc_space)")
	fs.StringVar(&c.MutexProfile, "mutexprofile", "", "write a mutex profile of the run to this file")
	fs.StringVar(&c.ProfileDir, "profile-dir", "", "write <phase>-cpu.pprof, <phase>-heap.pprof and <phase>-mutex.pprof here")
	fs.StringVar(&c.Progress, "progress", c.Progress, "progress: auto (a status line redrawn on a terminal, a line per step otherwise), on or off")
	fs.StringVar(&c.Title, "title", "", "title of the report")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			fmt.Fprintln(usage, "usage: slidegate-loadtest [flags]")
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
			c.Modes = append(c.Modes, ModeMemory, ModeEngine, ModeHTTP, ModeCapacity)
		} else if m != "" && !slices.Contains(c.Modes, m) {
			c.Modes = append(c.Modes, m)
		}
	}
	c.Tiers = nil
	for _, t := range strings.Split(*tiers, ",") {
		c.Tiers = append(c.Tiers, strings.TrimSpace(t))
	}
	return c, c.Validate()
}
