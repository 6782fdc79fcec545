package loadtest

import (
	"testing"
	"time"

	"github.com/slidegate/slidegate/lab/internal/latency"
)

// TestSpinPausesCountsGaps drives spinPauses with a clock that advances
// 100 ns a read and jumps now and then: it counts the jumps of at least
// pauseNs, not the shorter ones.
func TestSpinPausesCountsGaps(t *testing.T) {
	var clock int64
	reads := 0
	jumps := map[int]int64{1000: 30_000, 2000: pauseNs - 1, 3000: pauseNs, 4000: 5_000_000}
	now := func() int64 {
		reads++
		if j, ok := jumps[reads]; ok {
			clock += j
		} else {
			clock += 100
		}
		return clock
	}
	var h latency.Histogram
	spinPauses(now, 10_000_000, &h)
	if h.Count() != 3 {
		t.Fatalf("counted %d pauses, want 3 (30 µs, %d ns, 5 ms)", h.Count(), pauseNs)
	}
	if got := h.Max(); got != 5*time.Millisecond {
		t.Errorf("longest %v, want 5ms", got)
	}
	if clock < 10_000_000 {
		t.Errorf("stopped at %d, before until", clock)
	}
}

// TestProbePausesStops runs the probe for real: it ends on its own after
// its duration and reports a rate consistent with its count.
func TestProbePausesStops(t *testing.T) {
	start := time.Now()
	p := probePauses(20*time.Millisecond, 2)
	if el := time.Since(start); el < 20*time.Millisecond {
		t.Fatalf("returned after %v, before its 20ms", el)
	}
	if p.Goroutines != 2 || p.DurationNs != int64(20*time.Millisecond) || p.ThresholdNs != pauseNs {
		t.Fatalf("probe %+v", p)
	}
	want := float64(p.Pauses) / 0.02 / 2
	if p.PerCoreSecond != want {
		t.Errorf("per core second %v, want %v from %d pauses", p.PerCoreSecond, want, p.Pauses)
	}
	if p.Pauses > 0 && p.MedianNs < pauseNs*63/64 {
		t.Errorf("median pause %d ns, under the %d ns bound", p.MedianNs, pauseNs)
	}
	if got := p.hitShare(1000); got != want*1000/1e9 {
		t.Errorf("hit share %v", got)
	}
}
