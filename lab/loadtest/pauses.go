package loadtest

import (
	"sync"
	"time"

	"github.com/slidegate/slidegate/lab/internal/latency"
)

// pauseNs is the shortest gap between two clock reads of a spinning
// goroutine that counts as a pause of the machine: no decision of the
// engine or of the floor comes near it on its own, so a timed decision
// of at least this long met a pause (or a preemption) rather than the
// engine's own work.
const pauseNs = 10_000

// pauseProbeFor is how long the pause probe spins on every core.
const pauseProbeFor = 200 * time.Millisecond

// pauseProbe is what goroutines spinning on the clock, one per core, saw
// of the machine's pauses: gaps of pauseNs or more between consecutive
// reads, which the guest kernel may not count anywhere (a virtual
// machine's host taking the core back, its interrupts, another process).
// A timed decision of length d meets one with probability about
// d × PerCoreSecond / 1e9: when that passes 0.1%, its p99.9 is a pause.
type pauseProbe struct {
	ThresholdNs   int64   `json:"threshold_ns"` // pauseNs
	DurationNs    int64   `json:"duration_ns"`
	Goroutines    int     `json:"goroutines"`
	Pauses        uint64  `json:"pauses"`
	PerCoreSecond float64 `json:"per_core_second"`
	MedianNs      int64   `json:"median_ns"`
}

// probePauses spins goroutines goroutines on the monotonic clock for d
// and counts the gaps of at least pauseNs between consecutive reads.
func probePauses(d time.Duration, goroutines int) pauseProbe {
	epoch := time.Now()
	now := func() int64 { return int64(time.Since(epoch)) }
	hs := make([]latency.Histogram, goroutines)
	var wg sync.WaitGroup
	until := now() + int64(d)
	for g := range hs {
		wg.Go(func() { spinPauses(now, until, &hs[g]) })
	}
	wg.Wait()
	var h latency.Histogram
	for g := range hs {
		h.Merge(&hs[g])
	}
	p := pauseProbe{ThresholdNs: pauseNs, DurationNs: int64(d), Goroutines: goroutines, Pauses: h.Count(), MedianNs: int64(h.Quantile(0.5))}
	if d > 0 && goroutines > 0 {
		p.PerCoreSecond = float64(h.Count()) / d.Seconds() / float64(goroutines)
	}
	return p
}

// spinPauses reads now until it reaches until, and records in h each gap
// of at least pauseNs between two consecutive reads.
func spinPauses(now func() int64, until int64, h *latency.Histogram) {
	last := now()
	for last < until {
		t := now()
		if t-last >= pauseNs {
			h.Record(t - last)
		}
		last = t
	}
}

// hitShare is the share of timed decisions of mean length meanNs that
// meet a pause, at p's rate: a decision is hit when a pause begins while
// it runs.
func (p pauseProbe) hitShare(meanNs int64) float64 {
	return p.PerCoreSecond * float64(meanNs) / 1e9
}
