package loadtest

import (
	"fmt"
	"time"
)

// othersMeter measures the cores other processes used over a span of the
// run: the machine's busy CPU time less this process's and less the CPU
// of the helpers the span ran (Redis, redis-benchmark), over the span's
// wall time. A round during which others used over engineBusy cores is
// left out of a judgement.
type othersMeter struct {
	t0          time.Time
	own0, busy0 float64
	known       bool
}

// startOthers starts measuring.
func startOthers() othersMeter {
	m := othersMeter{t0: time.Now(), own0: cpuSeconds()}
	m.busy0, m.known = machineBusySeconds()
	return m
}

// own returns this process's CPU seconds since the start.
func (m othersMeter) own() float64 { return cpuSeconds() - m.own0 }

// cores returns the cores other processes used since the start, less
// helpers, the CPU seconds of the span's own helper processes; -1 where
// the machine's CPU time cannot be read.
func (m othersMeter) cores(helpers float64) float64 {
	busy1, ok := machineBusySeconds()
	if !ok || !m.known {
		return -1
	}
	return max(0, (busy1-m.busy0)-m.own()-helpers) / time.Since(m.t0).Seconds()
}

// untilClean runs round(r) for r = 0, 1, … until want rounds came back
// clean, or twice want in all: a disturbed round is run again.
func untilClean(want int, round func(r int) (clean bool, err error)) error {
	for r, clean := 0, 0; clean < want && r < 2*want; r++ {
		ok, err := round(r)
		if err != nil {
			return err
		}
		if ok {
			clean++
		}
	}
	return nil
}

// turnRound is one round of a target measured in turns: slidegate's side
// (the rate limit service, the Redis store) and a reference side (a no-op
// gRPC server, redis-benchmark) each carry the same load, one after the
// other. The figures' unit is the target's.
type turnRound struct {
	Slidegate      float64 `json:"slidegate"`
	Reference      float64 `json:"reference"`
	ReferenceFirst bool    `json:"reference_first"`
	roundHealth
}

// runTurns runs a target's rounds, until want clean ones (or twice want
// in all). A round runs turn(r, false) for slidegate's side and turn(r,
// true) for the reference, the reference first in odd rounds. A turn
// returns its side's figure, its failures, and the CPU seconds of the
// helper processes it ran (left out of the other processes' share); an
// error ends the rounds.
func runTurns(want int, turn func(r int, ref bool) (figure float64, errs int, helpers float64, err error)) ([]turnRound, error) {
	var out []turnRound
	err := untilClean(want, func(r int) (bool, error) {
		rd := turnRound{ReferenceFirst: r%2 == 1}
		m := startOthers()
		helpers := 0.0
		for pass := range 2 {
			ref := (pass == 0) == rd.ReferenceFirst
			figure, errs, h, err := turn(r, ref)
			if err != nil {
				return false, err
			}
			rd.Errors += errs
			helpers += h
			if ref {
				rd.Reference = figure
			} else {
				rd.Slidegate = figure
			}
		}
		clean := rd.settle(m, helpers)
		out = append(out, rd)
		return clean, nil
	})
	return out, err
}

// roundHealth is what a timed round records beside its figures: the
// calls that failed and the cores other processes used. A round with
// either is left out of its target's judgement.
type roundHealth struct {
	Errors    int     `json:"errors"`
	Others    float64 `json:"others_cores"` // -1 where it cannot be read
	Disturbed bool    `json:"disturbed"`    // Others over engineBusy: left out
}

// settle records the cores others used over the round (m, less helpers'
// CPU seconds), and reports whether the round is clean.
func (h *roundHealth) settle(m othersMeter, helpers float64) bool {
	h.Others = m.cores(helpers)
	h.Disturbed = h.Others > engineBusy
	return !h.leftOut()
}

// leftOut reports whether the judgement leaves the round out.
func (h roundHealth) leftOut() bool { return h.Disturbed || h.Errors > 0 }

// note is the report's note on a round left out; failures names what
// failed ("calls failed").
func (h roundHealth) note(failures string) string {
	note := ""
	if h.Disturbed {
		note = fmt.Sprintf("  disturbed: other processes used %s core (over %.1f); left out", fmtCores(h.Others), engineBusy)
	}
	if h.Errors > 0 {
		note += fmt.Sprintf("  %d %s; left out", h.Errors, failures)
	}
	return note
}
