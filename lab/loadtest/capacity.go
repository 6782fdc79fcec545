package loadtest

import (
	"context"
	"fmt"
	"math"
	"net/http"
	"path/filepath"
	"runtime"
	"runtime/pprof"
	"strings"
	"time"

	vegeta "github.com/tsenart/vegeta/v12/lib"

	"github.com/slidegate/slidegate/engine"
	"github.com/slidegate/slidegate/lab/internal/latency"
)

// How the capacity phase measures. Capacity is the saturation throughput
// of a closed loop: Config.CapacityWorkers requests in flight at all
// times (vegeta at an unbounded rate with that many workers), each sent
// as soon as one is answered, for one short slice. The p99 bound is
// still checked at that concurrency: a slice whose p99 is over
// Config.CapacityP99, or with an error, holds nothing.
//
// Why a closed loop. An open loop at a constant rate (the previous
// method) finds the highest rate whose p99 stays within the bound. On a
// machine whose cores the attacker shares with the server, one stall of
// the collector or the scheduler puts a step's 1% tail over the bound
// at any rate, so each ramp's answer was one draw, and the rounds'
// ratios spread by a factor of three. In a closed loop a stall only
// delays the requests in flight (a handful of the thousands a slice
// sends), and the throughput falls by the stall's share of the slice
// for both targets alike. Saturated, the process's throughput is the
// share of the cores it got over its CPU per request, so a pair's ratio
// is close to the no-op's CPU per request over slidegate's, whatever
// that share.
//
// Why short slices in pairs. Each round is a pair: one slice against
// slidegate and one against the no-op, back to back (which goes first
// alternates), so that the two halves of a pair see the same machine.
// Each slice starts after a full collection, so that neither pays for
// the garbage of the other's slice.
// A round's ratio is slidegate's throughput over the no-op's. The
// target is judged, as every timed target is (judgeRounds), on the
// interval of the median of the pairs' ratios. A pair during which other
// processes used over capacityBusy cores, or in which the no-op itself
// missed the bound (the reference failed: the machine, not slidegate),
// is left out and another is run in its place. The rounds follow the
// phase's seqPlan: a first look at Config.CapacityRounds clean pairs
// (or twice that many rounds), and, undecided there, more rounds up to
// the last look or Config.CapacityBudget; with too few clean pairs the
// machine was too busy to judge.

// capacitySlice is one closed-loop slice against one target.
type capacitySlice struct {
	Round      int     `json:"round"` // 1-based: the pair it belongs to
	Requests   uint64  `json:"requests"`
	DurationNs int64   `json:"duration_ns"` // first request sent to last answer
	Throughput float64 `json:"throughput"`  // answers per second (200, 429; no-op 204)
	P50Ns      int64   `json:"p50_ns"`
	P99Ns      int64   `json:"p99_ns"`
	Errors     int     `json:"errors"` // neither 200, 429 nor (no-op) 204
	Held       bool    `json:"held"`
	Why        string  `json:"why,omitempty"` // why the slice held nothing
	// Others is the CPU other processes used during the slice, in
	// cores (the machine's busy time from /proc/stat less this
	// process's); -1 where it cannot be read.
	Others float64 `json:"others_cores"`
	// CPUNs is the CPU this process used during the slice (server,
	// vegeta and the harness), nanoseconds.
	CPUNs int64 `json:"cpu_ns"`
}

// capacityRun is one target's slices, one per round.
type capacityRun struct {
	Name   string          `json:"name"` // "slidegate" or "no-op"
	Base   string          `json:"base"`
	Slices []capacitySlice `json:"slices"`
	// Rounds is each round's throughput, req/s (0 when the slice held
	// nothing).
	Rounds []int `json:"rounds"`
	// Capacity is the median of the clean rounds' throughputs.
	Capacity int    `json:"capacity"`
	Results  string `json:"results"` // every slice's results, vegeta's encoding
	client   *http.Client
	rf       *resultFile
}

// capacityReport is the capacity phase's outcome: closed-loop slices
// against slidegate's server and against the harness's no-op handler,
// served the same way, in pairs, in one run.
type capacityReport struct {
	P99BoundNs int64       `json:"p99_bound_ns"`
	SliceNs    int64       `json:"slice_ns"`
	Workers    int         `json:"workers"` // requests in flight
	Slidegate  capacityRun `json:"slidegate"`
	Noop       capacityRun `json:"noop"`
	// Headers are the decision API's header families slidegate's answers
	// carried beside the default (--capacity-headers: draft, x).
	Headers []string `json:"headers,omitempty"`
	// OthersMean is the CPU other processes used, in cores, averaged
	// over the rounds (-1 where it cannot be read).
	OthersMean float64 `json:"others_mean_cores"`
	// CPU per request, server and client together, over the clean
	// rounds; the no-op's over slidegate's (the capacity ratio that the
	// cost of a request alone would give); and slidegate's less the
	// no-op's: what slidegate's decision path adds to a request.
	SlidegateCPUNs float64 `json:"slidegate_cpu_per_request_ns"`
	NoopCPUNs      float64 `json:"noop_cpu_per_request_ns"`
	CPURatio       float64 `json:"cpu_ratio"`
	ExtraCPUNs     float64 `json:"extra_cpu_per_request_ns"`
	// RecordingCPUNs is what recording one of slidegate's decisions for
	// the verification costs (part of SlidegateCPUNs), measured apart in
	// the same process; 0 without --verify.
	RecordingCPUNs float64 `json:"recording_cpu_per_decision_ns,omitempty"`
	// Judgement is the target's verdict, at the look that decided it
	// (Plan). Its Spread holds every round's ratio: slidegate's
	// throughput over the no-op's (0 when slidegate's slice held nothing
	// in a clean round; a left-out round keeps its raw ratio). The plan
	// stops at the look that decides, so no round runs after it. Its
	// Disturbed marks the rounds left out (and run again): other
	// processes used over capacityBusy cores, or the no-op's slice held
	// nothing. Its Median is the clean rounds' median ratio (target ≥
	// 0.90). RoundsNs is how long the rounds took.
	Judgement judgement `json:"judgement"`
	Plan      seqPlan   `json:"plan"`
	RoundsNs  int64     `json:"rounds_ns"`
	// Decisions, Verification and Disagreement cover every decision of
	// slidegate's slices.
	Decisions    int          `json:"decisions"`
	Verification verification `json:"verification"`
	Disagreement string       `json:"disagreement,omitempty"`
	// ServerCost is what slidegate's server adds to a request's CPU over
	// the no-op's, measured with a minimal client (capacitycost.go); nil
	// with --capacity-cost-burst 0.
	ServerCost *serverCost `json:"server_cost,omitempty"`
	// StepsFile is the table of every slice (capacity-steps.txt);
	// CPUProfile the phase's CPU profile, when --profile-dir wrote one.
	StepsFile  string `json:"steps_file,omitempty"`
	CPUProfile string `json:"cpu_profile,omitempty"`
}

// capacityBusy is the CPU other processes may use during a round, in
// cores, before the round is left out of the judgement and run again.
const capacityBusy = 0.2

// capacityWarmup is the length of the one slice per target before the
// rounds: connections, the engine's first keys and the heap's first
// growth stay out of them.
const capacityWarmup = 200 * time.Millisecond

// runCapacity measures, in pairs of closed-loop slices, the throughput
// of slidegate's server (on the in-memory engine) and of the no-op
// handler, until cfg.CapacityRounds clean rounds (or twice that in all).
// Both run in one process, so that they see the same machine.
func runCapacity(ctx context.Context, cfg Config, ui *ui) (*capacityReport, error) {
	policies := cfg.policies()
	rep := &capacityReport{P99BoundNs: int64(cfg.CapacityP99), SliceNs: int64(cfg.CapacitySlice), Workers: cfg.CapacityWorkers, Headers: cfg.CapacityHeaders}
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
		sg, err = startMemorySlidegate(policies, rec, withDecisionHeaders(cfg.CapacityHeaders...))
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
	rep.Slidegate = capacityRun{Name: "slidegate", Base: sg.base, client: newLeanClient(cfg), Results: filepath.Join(cfg.Out, "capacity-slidegate.bin")}
	rep.Noop = capacityRun{Name: "no-op", Base: noop.base, client: newLeanClient(cfg), Results: filepath.Join(cfg.Out, "capacity-noop.bin")}
	runs := []*capacityRun{&rep.Slidegate, &rep.Noop}
	for _, r := range runs {
		if r.rf, err = newResultFile(r.Results); err != nil {
			return nil, err
		}
		// Without the response headers: gob-encoding slidegate's header
		// lines (five by default, eight with the X-RateLimit-* trio)
		// against the no-op's one is bookkeeping of the harness that the
		// slices would charge to the server under test.
		r.rf.noHeaders = true
		defer r.rf.close()
		defer r.client.CloseIdleConnections()
	}
	total := &attackResult{}
	slice := func(r *capacityRun, round int, dur time.Duration, rf *resultFile) (capacitySlice, *attackResult, error) {
		var res *attackResult
		var err error
		// Each slice starts from a collected heap: otherwise a slice
		// pays for the collection of the garbage the slice before it
		// left, the other target's.
		runtime.GC()
		m := startOthers()
		pprof.Do(ctx, pprof.Labels("target", r.Name, "side", "client"), func(ctx context.Context) {
			a := attack{base: r.Base, policies: policies, pacer: vegeta.ConstantPacer{}, // unbounded: a closed loop
				dur: dur, maxHits: uint64(float64(cfg.CapacityMax)*dur.Seconds()) + 1,
				name: fmt.Sprintf("%s round %d", r.Name, round), results: rf}
			res, err = runAttack(ctx, cfg, newClosedAttacker(cfg, r.client), a, nil)
		})
		if err != nil {
			return capacitySlice{}, nil, err
		}
		st := judgeSlice(res, cfg.CapacityP99)
		st.Round = round
		st.CPUNs = int64(m.own() * 1e9)
		st.Others = m.cores(0)
		return st, res, nil
	}
	// The warm-up slices: their results are kept apart from the rounds'
	// (slidegate's decisions are still recorded, and verified).
	for _, r := range runs {
		_, res, err := slice(r, 0, capacityWarmup, nil)
		if err != nil {
			return nil, err
		}
		if r == &rep.Slidegate {
			total.add(res)
		}
	}
	plan := cfg.capacityPlan()
	rep.Plan = plan
	var ratios []float64
	var disturbed []bool
	decidedAt := func(n int) bool {
		return judgeSequence(ratios[:n], disturbed[:n], capacityGoal, plan).decided()
	}
	began := time.Now()
	// capacityMaxRounds holds even if slices end early (at
	// CapacityMax): the check of --max-records counts on it.
	for i := 0; i < cfg.capacityMaxRounds() && plan.more(disturbed, time.Since(began), decidedAt); i++ {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		round := i + 1
		order := runs
		if i%2 == 1 {
			order = []*capacityRun{runs[1], runs[0]}
		}
		var got [2]capacitySlice
		for _, r := range order {
			st, res, err := slice(r, round, cfg.CapacitySlice, r.rf)
			if err != nil {
				return nil, err
			}
			r.Slices = append(r.Slices, st)
			r.Rounds = append(r.Rounds, st.capacity())
			ui.step("capacity round %d %-9s %s", round, r.Name, st.line())
			if r == &rep.Slidegate {
				total.add(res)
				got[0] = st
			} else {
				got[1] = st
			}
		}
		ratio, left := pairRatio(got[0], got[1])
		ratios = append(ratios, ratio)
		disturbed = append(disturbed, left)
	}
	rep.RoundsNs = int64(time.Since(began))
	for _, r := range runs {
		if err := r.rf.close(); err != nil {
			return nil, err
		}
	}
	if cfg.CapacityCostBurst > 0 {
		if rep.ServerCost, err = runServerCost(ctx, cfg, policies, sg.base, noop.base, total); err != nil {
			return nil, err
		}
	}
	rep.summarize(ratios, disturbed)
	rep.Verification, rep.Decisions, rep.Disagreement = verifyServer(ui, "capacity", policies, rec, total, cfg)
	return rep, nil
}

// add counts res's answers into r.
func (r *attackResult) add(res *attackResult) {
	r.allowed += res.allowed
	r.refused += res.refused
	r.errors += res.errors
}

// newClosedAttacker returns an attacker for a closed loop: exactly
// cfg.CapacityWorkers workers, each sending its next request when its
// last is answered (with an unbounded rate, vegeta's pacer never waits).
// A leanTransport enforces cfg.Timeout itself: the client keeps none.
func newClosedAttacker(cfg Config, client *http.Client) *vegeta.Attacker {
	w := uint64(cfg.CapacityWorkers)
	opts := []func(*vegeta.Attacker){
		vegeta.Client(client), // copies the client; shares its transport
		vegeta.Workers(w),
		vegeta.MaxWorkers(w),
		vegeta.MaxBody(4096),
	}
	if _, lean := client.Transport.(*leanTransport); !lean {
		opts = append(opts, vegeta.Timeout(cfg.Timeout))
	}
	return vegeta.NewAttacker(opts...)
}

// judgeSlice says whether a slice held: no error and p99 within the
// bound. Its throughput is the answers per second from the first request
// sent to the last answer.
func judgeSlice(res *attackResult, bound time.Duration) capacitySlice {
	m := &res.metrics
	st := capacitySlice{Requests: m.Requests, DurationNs: int64(m.Duration + m.Wait), P50Ns: int64(m.Latencies.P50),
		P99Ns: int64(m.Latencies.P99), Errors: res.errors}
	if st.DurationNs > 0 {
		st.Throughput = float64(res.allowed+res.refused) / time.Duration(st.DurationNs).Seconds()
	}
	var why []string
	if st.Errors > 0 {
		why = append(why, fmt.Sprintf("%d errors", st.Errors))
	}
	if time.Duration(st.P99Ns) > bound {
		why = append(why, fmt.Sprintf("p99 %s > %s", fmtNs(st.P99Ns), fmtNs(int64(bound))))
	}
	if st.Requests == 0 {
		why = append(why, "no request answered")
	}
	st.Held = len(why) == 0
	st.Why = strings.Join(why, "; ")
	return st
}

// cores is the cores this process used during the slice: near the
// machine's count when the closed loop saturates it.
func (s capacitySlice) cores() float64 {
	if s.DurationNs <= 0 {
		return 0
	}
	return float64(s.CPUNs) / float64(s.DurationNs)
}

// capacity is the throughput the slice held, req/s: 0 when it held
// nothing.
func (s capacitySlice) capacity() int {
	if !s.Held {
		return 0
	}
	return int(math.Round(s.Throughput))
}

// pairRatio is a round's ratio, slidegate's throughput over the no-op's
// (0 when slidegate's slice held nothing in a clean round), and whether
// the round is left
// out: other processes used over capacityBusy cores on average during
// it, or the no-op's slice held nothing (the reference failed, so the
// round says nothing of slidegate). Where the others' CPU cannot be
// read, a round counts as clean.
func pairRatio(sg, noop capacitySlice) (ratio float64, disturbed bool) {
	others := -1.0
	if sg.Others >= 0 && noop.Others >= 0 {
		others = (sg.Others*float64(sg.DurationNs) + noop.Others*float64(noop.DurationNs)) / float64(max(1, sg.DurationNs+noop.DurationNs))
	}
	disturbed = others > capacityBusy || !noop.Held
	// A left-out round keeps its raw ratio, held or not: it is not
	// judged, and the report shows what the machine did.
	if (sg.Held || disturbed) && noop.Throughput > 0 {
		ratio = sg.Throughput / noop.Throughput
	}
	return ratio, disturbed
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
	p, _ := r.policyIndex(policy) // as recordingBackend looks it up, once
	d := engine.Decision{Allowed: true, Remaining: 3, At: 1}
	cpu0 := cpuSeconds()
	for i := range recordingSample {
		r.AddIndex(p, keys[i&(1<<12-1)], 1, d)
	}
	return (cpuSeconds() - cpu0) / recordingSample * 1e9
}

// capacityGoal is the capacity target: slidegate's throughput over the
// no-op's, at least targetCapacityRatio.
var capacityGoal = goal{Bound: targetCapacityRatio}

// summarize fills in what the rounds give (each round's ratio, and
// disturbed marking the rounds left out): each target's median
// throughput over the clean rounds, the judgement of the clean rounds'
// ratios, their CPU per request, and the CPU other processes took.
func (c *capacityReport) summarize(ratios []float64, disturbed []bool) {
	c.Judgement = judgeSequence(ratios, disturbed, capacityGoal, c.Plan)
	clean := func(i int) bool { return i >= len(disturbed) || !disturbed[i] }
	for _, r := range []*capacityRun{&c.Slidegate, &c.Noop} {
		var xs []int
		for i, x := range r.Rounds {
			if clean(i) {
				xs = append(xs, x)
			}
		}
		r.Capacity = medianInt(xs)
	}
	c.SlidegateCPUNs, c.NoopCPUNs = cleanCPU(c.Slidegate.Slices, c.Noop.Slices, clean)
	c.CPURatio, c.ExtraCPUNs = 0, 0
	if c.SlidegateCPUNs > 0 {
		c.CPURatio = c.NoopCPUNs / c.SlidegateCPUNs
		c.ExtraCPUNs = c.SlidegateCPUNs - c.NoopCPUNs
	}
	c.OthersMean = -1
	var others float64
	n := 0
	for _, ss := range [][]capacitySlice{c.Slidegate.Slices, c.Noop.Slices} {
		for _, s := range ss {
			if s.Others >= 0 {
				others += s.Others
				n++
			}
		}
	}
	if n > 0 {
		c.OthersMean = others / float64(n)
	}
}

// cleanCPU is the CPU per request of a's and b's slices over the clean
// rounds (by index), in nanoseconds; 0 and 0 when there is none.
func cleanCPU(a, b []capacitySlice, clean func(int) bool) (aNs, bNs float64) {
	var cpuA, cpuB int64
	var reqA, reqB uint64
	for i := range min(len(a), len(b)) {
		if !clean(i) || a[i].Requests == 0 || b[i].Requests == 0 {
			continue
		}
		cpuA, reqA = cpuA+a[i].CPUNs, reqA+a[i].Requests
		cpuB, reqB = cpuB+b[i].CPUNs, reqB+b[i].Requests
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

// requests is the number of requests over all rounds' slices.
func (r *capacityRun) requests() uint64 {
	var n uint64
	for _, s := range r.Slices {
		n += s.Requests
	}
	return n
}

// headersText names the rate-limit headers of slidegate's answers.
func (c *capacityReport) headersText() string {
	if len(c.Headers) == 0 {
		return "Retry-After on refusals only (the default decision_headers)"
	}
	var on []string
	for _, f := range c.Headers {
		switch f {
		case headersDraft:
			on = append(on, "RateLimit-Policy, RateLimit")
		case headersX:
			on = append(on, "X-RateLimit-*")
		}
	}
	return strings.Join(on, ", ") + " and Retry-After on refusals (--capacity-headers " + strings.Join(c.Headers, ",") + ")"
}

// writeText writes the capacity section of the summary.
func (c *capacityReport) writeText(p func(string, ...any)) {
	p("")
	p("capacity  %d rounds; each a pair of closed-loop slices of %v with %d requests in flight, slidegate and the no-op in turn (which goes",
		len(c.Judgement.Spread.Rounds), time.Duration(c.SliceNs), c.Workers)
	p("          first alternates); a slice holds its throughput with p99 ≤ %s and no error; a round's ratio is slidegate's throughput over", fmtNs(c.P99BoundNs))
	p("          the no-op's; a round during which other processes used over %.1f core, or whose no-op slice held nothing, is left out and run", capacityBusy)
	p("          again; the target is judged on the interval of the median of the clean rounds' ratios")
	hdrs := c.headersText()
	p("          slidegate %s (in-memory engine; headers %s), no-op %s (the harness's handler, served the same way)", c.Slidegate.Base, hdrs, c.Noop.Base)
	p("          vegeta's client for both: a lean HTTP/1.1 transport that reads each answer's status and length and skips the rest (the decisions are recorded at the server)")
	if c.StepsFile != "" {
		p("  every slice (%d): %s", len(c.Slidegate.Slices)+len(c.Noop.Slices), c.StepsFile)
	}
	if c.Plan.First > 0 {
		p("  the target: %s", c.Plan.line(len(c.Judgement.Spread.Rounds), time.Duration(c.RoundsNs)))
	}
	p("  rounds' ratios (* left out): %s", c.Judgement.Spread.roundsList(targetCapacityRatio))
	ratio := "— (no clean round)"
	if c.Judgement.Spread.Clean > 0 {
		ratio = fmtRatio(c.Judgement.Spread.Median, targetCapacityRatio)
	}
	p("  throughput (median of the clean rounds): slidegate %s/s, no-op %s/s; ratio (median of the clean rounds' ratios) %s",
		commas(int64(c.Slidegate.Capacity)), commas(int64(c.Noop.Capacity)), ratio)
	p("  judged: %s: %s", c.Judgement.Verdict, c.Judgement.describe(capacityGoal, ""))
	if c.OthersMean >= 0 {
		shared := ""
		if c.shared() {
			shared = ": the machine was shared"
		}
		p("  other processes used %s core on average during the slices%s", fmtCores(c.OthersMean), shared)
	}
	if c.SlidegateCPUNs > 0 {
		p("  this process's CPU per request (server, vegeta and the harness) over the clean rounds: slidegate %s, no-op %s;",
			fmtNs(int64(c.SlidegateCPUNs)), fmtNs(int64(c.NoopCPUNs)))
		p("          slidegate adds %s per request; no-op / slidegate %.3f (the ratio if CPU alone decided)",
			fmtNs(int64(math.Round(c.ExtraCPUNs))), c.CPURatio)
	}
	if sc := c.ServerCost; sc != nil {
		p("  the server's own cost (a minimal client, %d requests per target per round, in turn): %s", sc.Burst, sc.line())
	}
	if c.RecordingCPUNs > 0 && c.SlidegateCPUNs > 0 {
		p("  recording each decision for the verification (in the server's handler): %s of CPU per decision, %.1f%% of slidegate's CPU per request (measured apart)",
			fmtNs(int64(c.RecordingCPUNs)), 100*c.RecordingCPUNs/c.SlidegateCPUNs)
	}
	p("  requests over all rounds: slidegate %s, no-op %s", commas(int64(c.Slidegate.requests())), commas(int64(c.Noop.requests())))
	if c.CPUProfile != "" {
		p("  CPU per request by target and side: go tool pprof -tags %s", c.CPUProfile)
	}
	p("  results: %s, %s (one attack per slice, named by target and round)", c.Slidegate.Results, c.Noop.Results)
	p("  verify (slidegate's %s decisions): %s", commas(int64(c.Decisions)), fmtVerification(c.Verification))
	if c.Disagreement != "" {
		p("  DISAGREEMENT: %s", c.Disagreement)
	}
}

// machineLine is the capacity's line among the figures shown and not
// judged: the clean rounds' median throughputs, CPU per request and the
// server's own cost, or why there are none.
func (c *capacityReport) machineLine() string {
	if c.Judgement.Spread.Clean == 0 {
		return fmt.Sprintf("capacity  no clean round of %d (closed loop, %d requests in flight, p99 ≤ %s)", len(c.Judgement.Spread.Rounds), c.Workers, fmtNs(c.P99BoundNs))
	}
	s := fmt.Sprintf("capacity  slidegate %s req/s, no-op %s req/s (closed loop, %d requests in flight, p99 ≤ %s); CPU per request no-op / slidegate %.3f",
		commas(int64(c.Slidegate.Capacity)), commas(int64(c.Noop.Capacity)), c.Workers, fmtNs(c.P99BoundNs), c.CPURatio)
	if sc := c.ServerCost; sc != nil && sc.Clean > 0 {
		s += fmt.Sprintf("; the server adds %s per request", fmtNs(int64(sc.ExtraNs)))
	}
	return s
}

// shared reports whether other processes took enough of the machine
// during the slices (on average over half of capacityBusy) that the
// report says so.
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
