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
)

// capacityBisections is how many steps refine a ramp between the highest
// rate held and the lowest missed above it.
const capacityBisections = 2

// capacityMissStreak is how many rates in a row a target must miss (each
// on both tries) for its ramp to end.
const capacityMissStreak = 2

// capacityStep is one constant-rate step of a capacity ramp.
type capacityStep struct {
	Rate     int     `json:"rate"`     // asked, requests per second
	Achieved float64 `json:"achieved"` // vegeta's send rate
	Requests uint64  `json:"requests"`
	P50Ns    int64   `json:"p50_ns"`
	P99Ns    int64   `json:"p99_ns"`
	Errors   int     `json:"errors"` // neither 200, 429 nor (no-op) 204
	Held     bool    `json:"held"`
	Why      string  `json:"why,omitempty"`   // why a step was not held
	Retry    bool    `json:"retry,omitempty"` // the second try of a rate (a miss counts when both miss)
}

// capacityRun is one target's ramp.
type capacityRun struct {
	Name  string         `json:"name"` // "slidegate" or "no-op"
	Base  string         `json:"base"`
	Steps []capacityStep `json:"steps"`
	// Capacity is the highest rate held (0 when none was); AtMax is set
	// when no rate above it was missed up to --capacity-max, so the
	// capacity is at least that.
	Capacity int    `json:"capacity"`
	AtMax    bool   `json:"at_max"`
	Results  string `json:"results"` // every step's results, vegeta's encoding
	lastHeld int
	missed   []int        // rates missed on both tries
	streak   int          // rates missed in a row on the ramp
	client   *http.Client // shared by the steps' attackers
	rf       *resultFile
}

// capacityReport is the capacity phase's outcome: the same ramp against
// slidegate's server and against the harness's no-op handler, served the
// same way, in one run.
type capacityReport struct {
	P99BoundNs int64       `json:"p99_bound_ns"`
	StepNs     int64       `json:"step_ns"`
	Factor     float64     `json:"factor"`
	Slidegate  capacityRun `json:"slidegate"`
	Noop       capacityRun `json:"noop"`
	// Ratio is slidegate's capacity over the no-op's (target ≥ 0.85).
	Ratio float64 `json:"ratio"`
	// Decisions, Verification and Disagreement cover every decision of
	// slidegate's ramp.
	Decisions    int          `json:"decisions"`
	Verification verification `json:"verification"`
	Disagreement string       `json:"disagreement,omitempty"`
}

// capacityMinShare is the share of the asked rate a step must send: below
// it, the client could not keep up with the server's answers.
const capacityMinShare = 0.95

// runCapacity finds the highest rate at which slidegate's server (on the
// in-memory engine) and the no-op handler each keep p99 within
// cfg.CapacityP99 with no error. Both ramps run in one process, step by
// step in turn at each rate, so that they see the same machine.
func runCapacity(ctx context.Context, cfg Config, ui *ui) (*capacityReport, error) {
	policies := cfg.policies()
	rep := &capacityReport{P99BoundNs: int64(cfg.CapacityP99), StepNs: int64(cfg.CapacityStep), Factor: cfg.CapacityFactor}
	var rec *recorder
	if cfg.Verify {
		rec = newRecorder(cfg.Tiers, cfg.Clients, int(cfg.MaxRecords))
	}
	// pprof labels split the phase's CPU profile by target and side
	// (go tool pprof -tagfocus=target=slidegate,side=server): goroutines
	// inherit the labels of the one that starts them, so each server's
	// connections carry its labels, and each attack's workers and client
	// connections theirs.
	var sg, noop *target
	var err error
	pprof.Do(ctx, pprof.Labels("target", "slidegate", "side", "server"), func(context.Context) {
		sg, err = startMemorySlidegate(policies, rec)
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
		defer r.rf.close()
		defer r.client.CloseIdleConnections()
	}
	total := &attackResult{}
	var try func(r *capacityRun, rate int, retry bool) error
	try = func(r *capacityRun, rate int, retry bool) error {
		var res *attackResult
		var err error
		pprof.Do(ctx, pprof.Labels("target", r.Name, "side", "client"), func(ctx context.Context) {
			res, err = runAttack(ctx, cfg, newAttacker(cfg, r.client), r.Base, policies, vegeta.ConstantPacer{Freq: rate, Per: time.Second},
				cfg.CapacityStep, uint64(float64(rate)*cfg.CapacityStep.Seconds())+1,
				fmt.Sprintf("%s %d/s", r.Name, rate), r.rf, nil, nil)
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
		st.Retry = retry
		r.Steps = append(r.Steps, st)
		switch {
		case st.Held:
			r.lastHeld = max(r.lastHeld, rate)
			r.streak = 0
		case !retry:
			// One try is noise-prone on a shared machine (a
			// scheduler stall fills a 1% tail): a miss counts
			// only when the retry misses too.
			return try(r, rate, true)
		default:
			r.missed = append(r.missed, rate)
			r.streak++
		}
		return nil
	}
	step := func(r *capacityRun, rate int) error { return try(r, rate, false) }
	// Which target goes first alternates from round to round, so that
	// neither always runs right after the other's heaviest step.
	round := 0
	order := func() []*capacityRun {
		round++
		if round%2 == 0 {
			return []*capacityRun{runs[1], runs[0]}
		}
		return runs
	}
	// The ramp: geometric steps until each target misses
	// capacityMissStreak rates in a row (one missed rate between held ones
	// is the machine, not the target).
	for rate := cfg.CapacityStart; rate <= cfg.CapacityMax; rate = nextRate(rate, cfg.CapacityFactor, cfg.CapacityMax) {
		alive := false
		for _, r := range order() {
			if r.streak < capacityMissStreak {
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
	// Bisection between the highest rate held and the lowest missed above
	// it.
	for range capacityBisections {
		for _, r := range order() {
			miss := r.missAbove()
			if miss == 0 {
				continue
			}
			mid := (r.lastHeld + miss) / 2
			if mid <= r.lastHeld || mid >= miss {
				continue
			}
			if err := step(r, mid); err != nil {
				return nil, err
			}
		}
	}
	for _, r := range runs {
		r.Capacity, r.AtMax = r.lastHeld, r.missAbove() == 0
		if err := r.rf.close(); err != nil {
			return nil, err
		}
	}
	if rep.Noop.Capacity > 0 {
		rep.Ratio = float64(rep.Slidegate.Capacity) / float64(rep.Noop.Capacity)
	}
	rep.Verification, rep.Decisions, rep.Disagreement = verifyServer(ui, "capacity", policies, rec, total, cfg)
	return rep, nil
}

// missAbove is the lowest rate missed above the highest held, 0 if none.
func (r *capacityRun) missAbove() int {
	m := 0
	for _, rate := range r.missed {
		if rate > r.lastHeld && (m == 0 || rate < m) {
			m = rate
		}
	}
	return m
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
	p("capacity  vegeta ramps, steps of %v ×%.2g; a step is held with p99 ≤ %s, no error, ≥ %.0f%% of the rate sent (a miss is retried once;",
		time.Duration(c.StepNs), c.Factor, fmtNs(c.P99BoundNs), 100*capacityMinShare)
	p("          a ramp ends after %d rates missed in a row; capacity is the highest rate held)", capacityMissStreak)
	p("          slidegate %s (in-memory engine), no-op %s (the harness's handler, served the same way)", c.Slidegate.Base, c.Noop.Base)
	for _, r := range []*capacityRun{&c.Slidegate, &c.Noop} {
		p("  %-9s %9s %10s %10s %10s  %s", r.Name, "rate", "sent", "p50", "p99", "step")
		for _, s := range r.Steps {
			mark := "held"
			if !s.Held {
				mark = "missed: " + s.Why
			}
			if s.Retry {
				mark = "retry, " + mark
			}
			p("  %-9s %7s/s %8.0f/s %10s %10s  %s", "", commas(int64(s.Rate)), s.Achieved, fmtNs(s.P50Ns), fmtNs(s.P99Ns), mark)
		}
	}
	atLeast := func(r capacityRun) string {
		if r.AtMax {
			return fmt.Sprintf("≥ %s/s (never missed)", commas(int64(r.Capacity)))
		}
		return commas(int64(r.Capacity)) + "/s"
	}
	p("  capacity: slidegate %s, no-op %s; ratio %.2f", atLeast(c.Slidegate), atLeast(c.Noop), c.Ratio)
	p("  requests over all steps: slidegate %s, no-op %s (CPU per request by target and side: go tool pprof -tags on capacity-cpu.pprof)",
		commas(int64(c.Slidegate.requests())), commas(int64(c.Noop.requests())))
	p("  results: %s, %s (one attack per step, named by target and rate)", c.Slidegate.Results, c.Noop.Results)
	p("  verify (slidegate's %s decisions): %s", commas(int64(c.Decisions)), fmtVerification(c.Verification))
	if c.Disagreement != "" {
		p("  DISAGREEMENT: %s", c.Disagreement)
	}
}
