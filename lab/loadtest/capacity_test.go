package loadtest

import (
	"fmt"
	"math"
	"strings"
	"testing"
)

// TestMissAbove: the bisection's upper end is the lowest rate missed above
// the highest held; none when nothing above it was missed.
func TestMissAbove(t *testing.T) {
	s := rampState{lastHeld: 5000, missed: []int{3000, 8450, 6500}}
	if got := s.missAbove(); got != 6500 {
		t.Errorf("missAbove = %d, want 6500", got)
	}
	s.missed = []int{3000}
	if got := s.missAbove(); got != 0 {
		t.Errorf("missAbove = %d, want 0", got)
	}
}

// TestPairedCPU: CPU per request counts only the rates both targets ran
// in the same round, first tries only.
func TestPairedCPU(t *testing.T) {
	step := func(round, rate int, retry bool, req uint64, cpu int64) capacityStep {
		return capacityStep{Round: round, Rate: rate, Retry: retry, Requests: req, CPUNs: cpu}
	}
	sg := []capacityStep{
		step(1, 1000, false, 500, 10_000_000), // paired: 20 µs
		step(1, 1300, false, 650, 13_000_000), // paired: 20 µs
		step(1, 1300, true, 650, 99_000_000),  // a retry: left out
		step(2, 1000, false, 500, 99_000_000), // the no-op ran no round 2
	}
	noop := []capacityStep{
		step(1, 1000, false, 500, 5_000_000), // 10 µs
		step(1, 1300, false, 650, 6_500_000), // 10 µs
		step(1, 1690, false, 845, 99_000_000),
	}
	a, b := pairedCPU(sg, noop)
	if math.Abs(a-20_000) > 1e-9 || math.Abs(b-10_000) > 1e-9 {
		t.Errorf("pairedCPU = %v, %v; want 20000, 10000", a, b)
	}
	if a, b := pairedCPU(sg[3:], noop); a != 0 || b != 0 {
		t.Errorf("no pair: %v, %v", a, b)
	}
}

// TestSharedNote: the capacity target is marked when other processes took
// over half of capacityBusy on average, and not when that is unknown.
func TestSharedNote(t *testing.T) {
	for _, tc := range []struct {
		others float64
		want   string
	}{{-1, ""}, {0, ""}, {capacityBusy / 2, ""}, {capacityBusy/2 + 0.01, " (shared)"}, {1.8, " (shared)"}} {
		c := &capacityReport{OthersMean: tc.others}
		if got := c.sharedNote(); got != tc.want {
			t.Errorf("others %.2f: %q, want %q", tc.others, got, tc.want)
		}
	}
}

// TestSummarize: medians of the rounds, the median ratio, and the others'
// CPU averaged over the steps where it was read.
func TestSummarize(t *testing.T) {
	c := &capacityReport{
		Slidegate:   capacityRun{Rounds: []int{9000, 3000, 8000}, Steps: []capacityStep{{Others: 0.1}, {Others: -1}, {Others: 0.5}}},
		Noop:        capacityRun{Rounds: []int{10000, 9000, 100000}, Steps: []capacityStep{{Others: 0.3}}},
		RoundRatios: []float64{0.9, 1 / 3.0, 0.08},
	}
	c.summarize(100000)
	if c.Slidegate.Capacity != 8000 || c.Noop.Capacity != 10000 || c.Slidegate.AtMax || c.Noop.AtMax {
		t.Errorf("capacities %+v %+v", c.Slidegate, c.Noop)
	}
	if math.Abs(c.Ratio-1/3.0) > 1e-12 || math.Abs(c.OthersMean-0.3) > 1e-12 || c.BusySteps != 2 {
		t.Errorf("ratio %v, others %v, busy steps %d", c.Ratio, c.OthersMean, c.BusySteps)
	}
	if len(c.Slidegate.Steps) != 3 || len(c.Noop.Steps) != 1 {
		t.Errorf("steps changed: %d, %d", len(c.Slidegate.Steps), len(c.Noop.Steps))
	}
	c = &capacityReport{Noop: capacityRun{Rounds: []int{100000}}, Slidegate: capacityRun{Rounds: []int{100000}}}
	c.summarize(100000)
	if !c.Noop.AtMax || c.OthersMean != -1 {
		t.Errorf("at max %v, others %v", c.Noop.AtMax, c.OthersMean)
	}
}

// TestRecordingShareShown: the capacity section shows what recording a
// decision costs and its share of slidegate's CPU per request, measured
// in the run.
func TestRecordingShareShown(t *testing.T) {
	if ns := recordingCost("free"); !(ns > 0) {
		t.Errorf("recordingCost = %v", ns)
	}
	var sb strings.Builder
	p := func(f string, a ...any) { fmt.Fprintf(&sb, f+"\n", a...) }
	c := &capacityReport{SlidegateCPUNs: 20_000, NoopCPUNs: 16_000, RecordingCPUNs: 100}
	c.writeText(p)
	if !strings.Contains(sb.String(), "recording each decision") || !strings.Contains(sb.String(), "0.5% of slidegate's CPU per request") {
		t.Errorf("no recording share:\n%s", sb.String())
	}
}

// TestMedianInt: the capacity phase's median of rates, odd and even
// counts (an even count's mean rounded half away from zero).
func TestMedianInt(t *testing.T) {
	if got := medianInt([]int{6997, 14432, 5246}); got != 6997 {
		t.Errorf("medianInt = %d", got)
	}
	if got := medianInt([]int{4000, 4001}); got != 4001 { // 4000.5 rounds half away from zero
		t.Errorf("medianInt of two = %d", got)
	}
}
