package loadtest

import (
	"fmt"
	"os"
	"strings"
	"time"
)

// line is a slice's progress line: its throughput, p50 and p99, the CPU
// other processes took, and whether it held.
func (s capacitySlice) line() string {
	return fmt.Sprintf("%9.0f/s (%s requests), p50 %s, p99 %s, this process %.2f cores, others %s cores: %s",
		s.Throughput, commas(int64(s.Requests)), fmtNs(s.P50Ns), fmtNs(s.P99Ns), s.cores(), fmtCores(s.Others), s.mark())
}

// mark is held, or missed and why.
func (s capacitySlice) mark() string {
	if s.Held {
		return "held"
	}
	return "missed: " + s.Why
}

// writeSteps writes the table of every slice of both targets, round by
// round, to path.
func (c *capacityReport) writeSteps(path string) error {
	var b strings.Builder
	fmt.Fprintf(&b, "capacity slices: %d rounds, closed-loop slices of %v with %d requests in flight; held = p99 ≤ %s, no error\n",
		len(c.Judgement.Spread.Rounds), time.Duration(c.SliceNs), c.Workers, fmtNs(c.P99BoundNs))
	fmt.Fprintf(&b, "%5s %-9s %12s %9s %10s %10s %7s %7s %9s  %s\n", "round", "target", "throughput", "requests", "p50", "p99", "cores", "others", "ratio", "slice")
	sp := c.Judgement.Spread
	for i := range sp.Rounds {
		for _, r := range []*capacityRun{&c.Slidegate, &c.Noop} {
			if i >= len(r.Slices) {
				continue
			}
			s := r.Slices[i]
			ratio := ""
			if r == &c.Slidegate {
				ratio = fmtRatio(sp.Rounds[i], targetCapacityRatio)
				if sp.left(i) {
					ratio += "*"
				}
			}
			fmt.Fprintf(&b, "%5d %-9s %10.0f/s %9d %10s %10s %7.2f %7s %9s  %s\n", s.Round, r.Name, s.Throughput, s.Requests,
				fmtNs(s.P50Ns), fmtNs(s.P99Ns), s.cores(), fmtCores(s.Others), ratio, s.mark())
		}
	}
	b.WriteString("cores: this process's CPU over the slice's length (near the machine's cores when the closed loop saturates them)\n")
	b.WriteString("* left out of the judgement (other processes used over the bound, or the no-op's slice held nothing)\n")
	if err := os.WriteFile(path, []byte(b.String()), 0o644); err != nil {
		return fmt.Errorf("writing capacity steps: %w", err)
	}
	return nil
}
