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
