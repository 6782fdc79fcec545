package loadtest

import (
	"fmt"
	"os"
	"strings"
	"time"
)

// line is a step's progress line: the rate asked and sent, p99, the CPU
// other processes took, and whether it was held.
func (s capacityStep) line() string {
	return fmt.Sprintf("%7s/s: sent %.0f/s, p50 %s, p99 %s, others %s cores: %s",
		commas(int64(s.Rate)), s.Achieved, fmtNs(s.P50Ns), fmtNs(s.P99Ns), fmtCores(s.Others), s.mark())
}

// mark is held, or missed and why, marked when the step was a retry.
func (s capacityStep) mark() string {
	mark := "held"
	if !s.Held {
		mark = "missed: " + s.Why
	}
	if s.Retry {
		mark = "retry, " + mark
	}
	return mark
}

// writeSteps writes the table of every step of both targets' ramps, in
// the order each target ran them, to path.
func (c *capacityReport) writeSteps(path string) error {
	var b strings.Builder
	fmt.Fprintf(&b, "capacity steps: %d rounds, steps of %v ×%.2g; held = p99 ≤ %s, no error, ≥ %.0f%% of the rate sent\n",
		len(c.RoundRatios), time.Duration(c.StepNs), c.Factor, fmtNs(c.P99BoundNs), 100*capacityMinShare)
	for _, r := range []*capacityRun{&c.Slidegate, &c.Noop} {
		fmt.Fprintf(&b, "%-9s %5s %9s %10s %10s %10s %7s  %s\n", r.Name, "round", "rate", "sent", "p50", "p99", "others", "step")
		for _, s := range r.Steps {
			fmt.Fprintf(&b, "%-9s %5d %7s/s %8.0f/s %10s %10s %7s  %s\n", "", s.Round, commas(int64(s.Rate)), s.Achieved,
				fmtNs(s.P50Ns), fmtNs(s.P99Ns), fmtCores(s.Others), s.mark())
		}
	}
	if err := os.WriteFile(path, []byte(b.String()), 0o644); err != nil {
		return fmt.Errorf("writing capacity steps: %w", err)
	}
	return nil
}
