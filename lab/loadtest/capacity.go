package loadtest

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net/http"
	"path/filepath"
	"runtime/pprof"
	"time"

	vegeta "github.com/tsenart/vegeta/v12/lib"

	"github.com/slidegate/slidegate/engine"
	"github.com/slidegate/slidegate/internal/server"
	"github.com/slidegate/slidegate/lab/internal/latency"
)

// capacityBisections is how many steps refine a round's ramp between the
// highest rate held and the lowest missed above it: three narrow a ×1.3
// gap to about 3%, finer than the rounds' spread (with two, every round
// of a quiet run landed on the same ramp rate).
const capacityBisections = 3

// capacityMissStreak is how many rates in a row a target must miss for
// its ramp to end.
const capacityMissStreak = 2

// How the capacity phase decides. One ramp's verdict is one draw: on a
// machine shared with other work, a stall of a few tens of milliseconds
// fills a step's 1% tail at any rate, so one ramp per target gives ratios
// that differ widely between runs minutes apart. So the phase runs several
// rounds; in each, both targets climb the same rates in turn (which goes
// first alternates from rate to rate), so that a pair of steps sees the
// same machine; a round gives each target's highest rate held and their
// ratio, paired in time; the phase reports each target's median capacity
// over the rounds and the median of the rounds' ratios. A median of three
// is unmoved by one round that a burst of other work spoiled in either
// direction. Each step also records the CPU other processes took during
// it, so that a report from a busy machine says so, and this process's
// CPU per request, which does not depend on the share of the cores the
// run got.

// capacityStep is one constant-rate step of a capacity ramp.
type capacityStep struct {
	Round    int     `json:"round"`    // 1-based
	Rate     int     `json:"rate"`     // asked, requests per second
	Achieved float64 `json:"achieved"` // vegeta's send rate
	Requests uint64  `json:"requests"`
	P50Ns    int64   `json:"p50_ns"`
	P99Ns    int64   `json:"p99_ns"`
	Errors   int     `json:"errors"` // neither 200, 429 nor (no-op) 204
	Held     bool    `json:"held"`
	Why      string  `json:"why,omitempty"`   // why a step was not held
	Retry    bool    `json:"retry,omitempty"` // the second try of a rate
	// Others is the CPU other processes used during the step, in cores
	// (the machine's busy time from /proc/stat less this process's); -1
	// where it cannot be read.
	Others float64 `json:"others_cores"`
	// CPUNs is the CPU this process used during the step (server,
	// vegeta and the harness), nanoseconds.
	CPUNs int64 `json:"cpu_ns"`
}

// capacityRun is one target's ramps, one per round.
type capacityRun struct {
	Name  string         `json:"name"` // "slidegate" or "no-op"
	Base  string         `json:"base"`
	Steps []capacityStep `json:"steps"`
	// Rounds is the highest rate held in each round (0 when none was).
	Rounds []int `json:"rounds"`
	// Capacity is the median of Rounds; AtMax is set when it is
	// --capacity-max, never missed, so that the capacity is at least that.
	Capacity int    `json:"capacity"`
	AtMax    bool   `json:"at_max"`
	Results  string `json:"results"` // every step's results, vegeta's encoding
	ramp     rampState
	client   *http.Client // shared by the steps' attackers
	rf       *resultFile
}

// rampState is one target's progress in the current round.
type rampState struct {
	lastHeld int
	missed   []int // rates missed on both tries
	streak   int   // rates missed in a row on the ramp
}

// missAbove is the lowest rate missed above the highest held, 0 if none.
func (s *rampState) missAbove() int {
	m := 0
	for _, rate := range s.missed {
		if rate > s.lastHeld && (m == 0 || rate < m) {
			m = rate
		}
	}
	return m
}

// capacityReport is the capacity phase's outcome: the same ramps against
// slidegate's server and against the harness's no-op handler, served the
// same way, in one run.
type capacityReport struct {
	P99BoundNs int64       `json:"p99_bound_ns"`
	StepNs     int64       `json:"step_ns"`
	Factor     float64     `json:"factor"`
	Slidegate  capacityRun `json:"slidegate"`
	Noop       capacityRun `json:"noop"`
	// XHeaders: slidegate's answers carried the X-RateLimit-* trio too
	// (--capacity-x-headers).
	XHeaders bool `json:"x_headers,omitempty"`
	// OthersMean is the CPU other processes used, in cores, averaged
	// over the steps (-1 where it cannot be read); BusySteps counts the
	// steps during which they used more than capacityBusy.
	OthersMean float64 `json:"others_mean_cores"`
	BusySteps  int     `json:"busy_steps"`
	// CPU per request, server and client together, over the rates both
	// targets ran in the same round (first tries), and the no-op's over
	// slidegate's: the capacity ratio that the cost of a request alone
	// would give, whatever share of the cores the run got.
	SlidegateCPUNs float64 `json:"slidegate_cpu_per_request_ns"`
	NoopCPUNs      float64 `json:"noop_cpu_per_request_ns"`
	CPURatio       float64 `json:"cpu_ratio"`
	// RecordingCPUNs is what recording one of slidegate's decisions for
	// the verification costs (part of SlidegateCPUNs), measured apart in
	// the same process; 0 without --verify.
	RecordingCPUNs float64 `json:"recording_cpu_per_decision_ns,omitempty"`
	// RoundRatios is slidegate's capacity over the no-op's in each round
	// (0 for a round in which the no-op held no rate).
	RoundRatios []float64 `json:"round_ratios"`
	// RoundDisturbed marks the rounds during which other processes used
	// over capacityBusy cores on average: they are left out of the
	// judgement, and another round is run in their place.
	RoundDisturbed []bool `json:"round_disturbed"`
	// Ratio is the median of the clean rounds' ratios (target ≥ 0.90);
	// Judgement is the target's verdict on their interval.
	Ratio     float64   `json:"ratio"`
	Judgement judgement `json:"judgement"`
	// Decisions, Verification and Disagreement cover every decision of
	// slidegate's ramps.
	Decisions    int          `json:"decisions"`
	Verification verification `json:"verification"`
	Disagreement string       `json:"disagreement,omitempty"`
	// StepsFile is the table of every step (capacity-steps.txt);
	// CPUProfile the phase's CPU profile, when --profile-dir wrote one.
	StepsFile  string `json:"steps_file,omitempty"`
	CPUProfile string `json:"cpu_profile,omitempty"`
}

// capacityMinShare is the share of the asked rate a step must send: below
// it, the client could not keep up with the server's answers.
const capacityMinShare = 0.95

// capacityBusy is the CPU other processes may use during a missed step,
// in cores, before the miss is put down to them and the rate tried again.
const capacityBusy = 0.2

// runCapacity finds, cfg.CapacityRounds times, the highest rate at which
// slidegate's server (on the in-memory engine) and the no-op handler each
// keep p99 within cfg.CapacityP99 with no error. Both run in one process,
// step by step in turn at each rate, so that they see the same machine.
func runCapacity(ctx context.Context, cfg Config, ui *ui) (*capacityReport, error) {
	policies := cfg.policies()
	rep := &capacityReport{P99BoundNs: int64(cfg.CapacityP99), StepNs: int64(cfg.CapacityStep), Factor: cfg.CapacityFactor, XHeaders: cfg.CapacityXHeaders}
	var rec *recorder
	if cfg.Verify {
		rec = newRecorder(cfg.Tiers, cfg.Clients, int(cfg.MaxRecords))
		rep.RecordingCPUNs = recordingCost(cfg.Tiers[0])
	}
	// pprof labels split the phase's CPU profile by target and side
	// (go tool pprof -tagfocus=target=slidegate,side=server): goroutines
	// inherit the labels of the one that starts them, so each server's
	// connections carry its labels, and each attack's workers and client
	// connections theirs.
	var sg, noop *target
	var err error
	pprof.Do(ctx, pprof.Labels("target", "slidegate", "side", "server"), func(context.Context) {
		var mods []func(*server.Config)
		if cfg.CapacityXHeaders {
			mods = append(mods, withDecisionX)
		}
		sg, err = startMemorySlidegate(policies, rec, mods...)
	})
	if err != nil {
		return nil, err
	}
	defer sg.close()
	pprof.Do(ctx, pprof.Labels("target", "no-op", "side", "server"), func(context.Context) {
		noop, err = startNoop()
	})
	if err != nil {
		return nil, err
	}
	defer noop.close()
	rep.Slidegate = capacityRun{Name: "slidegate", Base: sg.base, client: newClient(cfg), Results: filepath.Join(cfg.Out, "capacity-slidegate.bin")}
	rep.Noop = capacityRun{Name: "no-op", Base: noop.base, client: newClient(cfg), Results: filepath.Join(cfg.Out, "capacity-noop.bin")}
	runs := []*capacityRun{&rep.Slidegate, &rep.Noop}
	for _, r := range runs {
		if r.rf, err = newResultFile(r.Results); err != nil {
			return nil, err
		}
		// Without the response headers: gob-encoding slidegate's header
		// lines (five by default, eight with the X-RateLimit-* trio)
		// against the no-op's one is bookkeeping of the harness that the
		// ramp would charge to the server under test.
		r.rf.noHeaders = true
		defer r.rf.close()
		defer r.client.CloseIdleConnections()
	}
	total := &attackResult{}
	round := 0
	var try func(r *capacityRun, rate int, retry bool) error
	try = func(r *capacityRun, rate int, retry bool) error {
		var res *attackResult
		var err error
		m := startOthers()
		pprof.Do(ctx, pprof.Labels("target", r.Name, "side", "client"), func(ctx context.Context) {
			a := attack{base: r.Base, policies: policies, pacer: vegeta.ConstantPacer{Freq: rate, Per: time.Second},
				dur: cfg.CapacityStep, maxHits: uint64(float64(rate)*cfg.CapacityStep.Seconds()) + 1,
				name: fmt.Sprintf("%s round %d %d/s", r.Name, round, rate), results: r.rf}
			res, err = runAttack(ctx, cfg, newAttacker(cfg, r.client), a, nil)
		})
		if err != nil {
			return err
		}
		if r == &rep.Slidegate {
			total.allowed += res.allowed
			total.refused += res.refused
			total.errors += res.errors
		}
		st := judgeStep(rate, res, cfg.CapacityP99)
		st.Round, st.Retry = round, retry
		st.CPUNs = int64(m.own() * 1e9)
		st.Others = m.cores(0)
		r.Steps = append(r.Steps, st)
		ui.step("capacity round %d %-9s %s", round, r.Name, st.line())
		s := &r.ramp
		switch {
		case st.Held:
			s.lastHeld = max(s.lastHeld, rate)
			s.streak = 0
		case !retry && (st.Others < 0 || st.Others > capacityBusy):
			// A step during which other processes took the
			// cores (or where that cannot be told) is tried
			// again: a scheduler stall of a few tens of
			// milliseconds fills a step's 1% tail at any rate.
			// The miss counts when the retry misses too.
			return try(r, rate, true)
		default:
			s.missed = append(s.missed, rate)
			s.streak++
		}
		return nil
	}
	step := func(r *capacityRun, rate int) error { return try(r, rate, false) }
	// Which target goes first alternates from rate to rate, so that
	// neither always runs right after the other's heaviest step.
	turn := 0
	order := func() []*capacityRun {
		turn++
		if turn%2 == 0 {
			return []*capacityRun{runs[1], runs[0]}
		}
		return runs
	}
	start := cfg.CapacityStart
	clean := 0
	for round = 1; clean < cfg.CapacityRounds && round <= cfg.maxCapacityRounds(); round++ {
		for _, r := range runs {
			r.ramp = rampState{}
		}
		firstStep := [2]int{len(rep.Slidegate.Steps), len(rep.Noop.Steps)}
		// The ramp: geometric steps until each target misses
		// capacityMissStreak rates in a row (one missed rate between
		// held ones is the machine, not the target).
		for rate := start; rate <= cfg.CapacityMax; rate = nextRate(rate, cfg.CapacityFactor, cfg.CapacityMax) {
			alive := false
			for _, r := range order() {
				if r.ramp.streak < capacityMissStreak {
					alive = true
					if err := step(r, rate); err != nil {
						return nil, err
					}
				}
			}
			if !alive || rate == cfg.CapacityMax {
				break
			}
		}
		// Bisection between the highest rate held and the lowest missed
		// above it.
		for range capacityBisections {
			for _, r := range order() {
				miss := r.ramp.missAbove()
				if miss == 0 {
					continue
				}
				mid := (r.ramp.lastHeld + miss) / 2
				if mid <= r.ramp.lastHeld || mid >= miss {
					continue
				}
				if err := step(r, mid); err != nil {
					return nil, err
				}
			}
		}
		for _, r := range runs {
			r.Rounds = append(r.Rounds, r.ramp.lastHeld)
		}
		ratio := 0.0
		if n := rep.Noop.ramp.lastHeld; n > 0 {
			ratio = float64(rep.Slidegate.ramp.lastHeld) / float64(n)
		}
		rep.RoundRatios = append(rep.RoundRatios, ratio)
		// A round during which other processes took the cores is left
		// out of the judgement and run again (up to maxCapacityRounds).
		disturbed := roundDisturbed(rep.Slidegate.Steps[firstStep[0]:], rep.Noop.Steps[firstStep[1]:])
		rep.RoundDisturbed = append(rep.RoundDisturbed, disturbed)
		if !disturbed {
			clean++
		}
		// The next round starts, for both targets, three rates of the
		// ramp below the lower of the two capacities found so far: the
		// rates far below both need no second look.
		low := min(medianInt(rep.Slidegate.Rounds), medianInt(rep.Noop.Rounds))
		start = max(cfg.CapacityStart, int(float64(low)/math.Pow(cfg.CapacityFactor, 3)))
	}
	for _, r := range runs {
		if err := r.rf.close(); err != nil {
			return nil, err
		}
	}
	rep.summarize(cfg.CapacityMax)
	rep.Verification, rep.Decisions, rep.Disagreement = verifyServer(ui, "capacity", policies, rec, total, cfg)
	return rep, nil
}

// recordingCost is the CPU one recorded decision costs, in nanoseconds:
// recordingSample decisions under policy into a scratch recorder, timed
// on this process's CPU clock.
func recordingCost(policy string) float64 {
	const recordingSample = 200_000
	keys := make([]string, 1<<12)
	for i := range keys {
		keys[i] = clientKey(i * 7919)
	}
	r := newRecorder([]string{policy}, 1<<30, recordingSample)
	d := engine.Decision{Allowed: true, Remaining: 3, At: 1}
	cpu0 := cpuSeconds()
	for i := range recordingSample {
		r.Add(policy, keys[i&(1<<12-1)], 1, d)
	}
	return (cpuSeconds() - cpu0) / recordingSample * 1e9
}

// capacityGoal is the capacity target: slidegate's capacity over the
// no-op's, at least targetCapacityRatio.
var capacityGoal = goal{Bound: targetCapacityRatio}

// roundDisturbed reports whether other processes used over capacityBusy
// cores on average over a round's steps (of both targets). Where that
// cannot be read, a round counts as clean.
func roundDisturbed(steps ...[]capacityStep) bool {
	var sum float64
	n := 0
	for _, ss := range steps {
		for _, st := range ss {
			if st.Others >= 0 {
				sum += st.Others
				n++
			}
		}
	}
	return n > 0 && sum/float64(n) > capacityBusy
}

// summarize fills in what the rounds' steps give: each target's median
// capacity, the median ratio, the paired CPU per request, and the CPU
// other processes took.
func (c *capacityReport) summarize(maxRate int) {
	for _, r := range []*capacityRun{&c.Slidegate, &c.Noop} {
		r.Capacity = medianInt(r.Rounds)
		r.AtMax = r.Capacity >= maxRate
	}
	c.Judgement = judgeRounds(c.RoundRatios, c.RoundDisturbed, capacityGoal)
	c.Ratio = c.Judgement.Spread.Median
	c.SlidegateCPUNs, c.NoopCPUNs = pairedCPU(c.Slidegate.Steps, c.Noop.Steps)
	if c.SlidegateCPUNs > 0 {
		c.CPURatio = c.NoopCPUNs / c.SlidegateCPUNs
	}
	c.OthersMean = -1
	var others float64
	n := 0
	for _, steps := range [][]capacityStep{c.Slidegate.Steps, c.Noop.Steps} {
		for _, st := range steps {
			if st.Others < 0 {
				continue
			}
			others += st.Others
			n++
			if st.Others > capacityBusy {
				c.BusySteps++
			}
		}
	}
	if n > 0 {
		c.OthersMean = others / float64(n)
	}
}

// pairedCPU is the CPU per request of a's and b's steps over the rates
// both ran in the same round (first tries), in nanoseconds; 0 and 0 when
// they share none. Pairing keeps the comparison to the same rates: at a
// low rate the fixed costs (timers, the collector) weigh more per request.
func pairedCPU(a, b []capacityStep) (aNs, bNs float64) {
	type at struct{ round, rate int }
	first := map[at]capacityStep{}
	for _, s := range b {
		if !s.Retry {
			first[at{s.Round, s.Rate}] = s
		}
	}
	var cpuA, cpuB int64
	var reqA, reqB uint64
	for _, s := range a {
		o, ok := first[at{s.Round, s.Rate}]
		if s.Retry || !ok || s.Requests == 0 || o.Requests == 0 {
			continue
		}
		cpuA, reqA = cpuA+s.CPUNs, reqA+s.Requests
		cpuB, reqB = cpuB+o.CPUNs, reqB+o.Requests
	}
	if reqA == 0 || reqB == 0 {
		return 0, 0
	}
	return float64(cpuA) / float64(reqA), float64(cpuB) / float64(reqB)
}

// medianInt is the median of xs (the mean of the middle two for an even
// count), 0 for none.
func medianInt(xs []int) int {
	fs := make([]float64, len(xs))
	for i, x := range xs {
		fs[i] = float64(x)
	}
	return int(math.Round(latency.Median(fs)))
}

// requests is the number of requests over all steps.
func (r *capacityRun) requests() uint64 {
	var n uint64
	for _, s := range r.Steps {
		n += s.Requests
	}
	return n
}

// nextRate is rate × factor, at least rate + 1, at most maxRate.
func nextRate(rate int, factor float64, maxRate int) int {
	return min(max(int(math.Round(float64(rate)*factor)), rate+1), maxRate)
}

// judgeStep says whether a step held its rate: no error, p99 within the
// bound, and at least capacityMinShare of the rate sent.
func judgeStep(rate int, res *attackResult, bound time.Duration) capacityStep {
	m := &res.metrics
	st := capacityStep{Rate: rate, Achieved: m.Rate, Requests: m.Requests, P50Ns: int64(m.Latencies.P50),
		P99Ns: int64(m.Latencies.P99), Errors: res.errors}
	var why []error
	if st.Errors > 0 {
		why = append(why, fmt.Errorf("%d errors", st.Errors))
	}
	if time.Duration(st.P99Ns) > bound {
		why = append(why, fmt.Errorf("p99 %s > %s", fmtNs(st.P99Ns), fmtNs(int64(bound))))
	}
	if st.Achieved < capacityMinShare*float64(rate) {
		why = append(why, fmt.Errorf("sent %.0f/s, under %.0f%% of the rate", st.Achieved, 100*capacityMinShare))
	}
	st.Held = len(why) == 0
	if !st.Held {
		st.Why = oneLine(errors.Join(why...))
	}
	return st
}

// writeText writes the capacity section of the summary.
func (c *capacityReport) writeText(p func(string, ...any)) {
	p("")
	p("capacity  %d rounds of vegeta ramps, steps of %v ×%.2g; a step is held with p99 ≤ %s, no error, ≥ %.0f%% of the rate sent; both targets take turns",
		len(c.RoundRatios), time.Duration(c.StepNs), c.Factor, fmtNs(c.P99BoundNs), 100*capacityMinShare)
	p("          at each rate; a miss during which other processes used over %.1f core is retried once; a ramp ends after %d rates missed in a row;",
		capacityBusy, capacityMissStreak)
	p("          a round's capacity is the highest rate held, the target's the median over the rounds; a round during which other processes used over")
	p("          %.1f core on average is left out and run again; the target is judged on the interval of the median of the clean rounds' ratios", capacityBusy)
	hdrs := "RateLimit-Policy, RateLimit (the default decision_headers)"
	if c.XHeaders {
		hdrs = "RateLimit-Policy, RateLimit and X-RateLimit-* (--capacity-x-headers)"
	}
	p("          slidegate %s (in-memory engine; headers %s), no-op %s (the harness's handler, served the same way)", c.Slidegate.Base, hdrs, c.Noop.Base)
	if c.StepsFile != "" {
		p("  every step (%d): %s", len(c.Slidegate.Steps)+len(c.Noop.Steps), c.StepsFile)
	}
	for i, ratio := range c.RoundRatios {
		if i >= len(c.Slidegate.Rounds) || i >= len(c.Noop.Rounds) {
			break
		}
		note := ""
		if i < len(c.RoundDisturbed) && c.RoundDisturbed[i] {
			note = fmt.Sprintf(" (disturbed: other processes used over %.1f core on average; left out, run again)", capacityBusy)
		}
		p("  round %d: slidegate %s/s, no-op %s/s; ratio %s%s", i+1,
			commas(int64(c.Slidegate.Rounds[i])), commas(int64(c.Noop.Rounds[i])), fmtRatio(ratio, targetCapacityRatio), note)
	}
	atLeast := func(r capacityRun) string {
		if r.AtMax {
			return fmt.Sprintf("≥ %s/s (never missed)", commas(int64(r.Capacity)))
		}
		return commas(int64(r.Capacity)) + "/s"
	}
	ratio := "— (no clean round)"
	if c.Judgement.Spread.Clean > 0 {
		ratio = fmtRatio(c.Ratio, targetCapacityRatio)
	}
	p("  capacity (median of the rounds): slidegate %s, no-op %s; ratio (median of the clean rounds' ratios) %s",
		atLeast(c.Slidegate), atLeast(c.Noop), ratio)
	p("  judged: %s: %s", c.Judgement.Verdict, c.Judgement.describe(capacityGoal, ""))
	steps := len(c.Slidegate.Steps) + len(c.Noop.Steps)
	if c.OthersMean >= 0 {
		shared := ""
		if c.shared() {
			shared = ": the machine was shared, and the ratio measures it as much as the servers"
		}
		p("  other processes used %s core on average during the steps, over %.1f in %d of %d steps%s",
			fmtCores(c.OthersMean), capacityBusy, c.BusySteps, steps, shared)
	}
	if c.SlidegateCPUNs > 0 {
		p("  this process's CPU per request over the rates both ran in a round: slidegate %s, no-op %s; no-op / slidegate %.2f (the ratio if CPU alone decided)",
			fmtNs(int64(c.SlidegateCPUNs)), fmtNs(int64(c.NoopCPUNs)), c.CPURatio)
	}
	if c.RecordingCPUNs > 0 && c.SlidegateCPUNs > 0 {
		p("  recording each decision for the verification (in the server's handler): %s of CPU per decision, %.1f%% of slidegate's CPU per request (measured apart)",
			fmtNs(int64(c.RecordingCPUNs)), 100*c.RecordingCPUNs/c.SlidegateCPUNs)
	}
	p("  requests over all steps: slidegate %s, no-op %s", commas(int64(c.Slidegate.requests())), commas(int64(c.Noop.requests())))
	if c.CPUProfile != "" {
		p("  CPU per request by target and side: go tool pprof -tags %s", c.CPUProfile)
	}
	p("  results: %s, %s (one attack per step, named by target, round and rate)", c.Slidegate.Results, c.Noop.Results)
	p("  verify (slidegate's %s decisions): %s", commas(int64(c.Decisions)), fmtVerification(c.Verification))
	if c.Disagreement != "" {
		p("  DISAGREEMENT: %s", c.Disagreement)
	}
}

// shared reports whether other processes took enough of the machine
// during the steps (on average over half of capacityBusy) that the ratio
// measures the machine as much as the servers.
func (c *capacityReport) shared() bool { return c.OthersMean > capacityBusy/2 }

// sharedNote marks the ratio in the targets when shared says so.
func (c *capacityReport) sharedNote() string {
	if c.shared() {
		return " (shared)"
	}
	return ""
}

// fmtCores formats a CPU share in cores, "?" when it was not measured.
func fmtCores(c float64) string {
	if c < 0 {
		return "?"
	}
	return fmt.Sprintf("%.2f", c)
}
