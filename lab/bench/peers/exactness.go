package peers

import (
	"context"
	"fmt"
	"sync"
	"time"
)

// Exactness scenarios run in real time, because most peers read their own
// clock and offer no way to inject one. Requests go out at ticks of W/20:
//
//   - boundary burst: one request at tick 0, then from tick 10 (the middle
//     of the first window) a burst of L at every tick until 2¼ windows:
//     the first bursts fill the tail of a fixed window and the first burst
//     after its boundary fills the next, whether windows start at the
//     first request (ulule, go-limiter: boundary at tick 20) or at the
//     limiter's creation (httprate, the counter: just before tick 19);
//   - tail burst: one request every other tick (L per W, which every
//     design admits), then at tick 39, the tail of the second window, a
//     burst of L;
//   - parallel load: 4 goroutines, each sending one request at every tick
//     for 2¼ windows (80 per W against a limit of L).
//
// The count is the most admitted requests in TicksPerWindow−1 consecutive
// ticks whose real time span, from before the first request to after the
// last, is shorter than W: a window of length W in the limiter's own clock
// contains all of them, so an exact log can never exceed L here, and a
// count above L is a real over-admission. Spans of W or more (a tick made
// late by a stalled machine) are skipped and counted out of Windows.
const TicksPerWindow = 20

// ExactResult is one peer's count on one scenario.
type ExactResult struct {
	Peer        string
	Scenario    Metric
	MaxInWindow int // most admitted in a window shorter than W
	Admitted    int // admitted in the whole scenario
	Windows     int // windows with a span shorter than W (of Ticks−19)
	Ticks       int
}

type schedule struct {
	name    Metric
	ticks   int
	senders int
	// requests returns how many requests one sender sends at tick k.
	requests func(k, limit int) int
}

var schedules = []schedule{
	{Boundary, 45, 1, func(k, limit int) int {
		switch {
		case k == 0:
			return 1
		case k >= 10:
			return limit
		}
		return 0
	}},
	{TailBurst, 40, 1, func(k, limit int) int {
		switch {
		case k == 39:
			return limit
		case k%2 == 0:
			return 1
		}
		return 0
	}},
	{Parallel, 45, 4, func(k, limit int) int { return 1 }},
}

// tickRecord is what one sender saw at one tick.
type tickRecord struct {
	start, end time.Time
	sent       int
	admitted   int
}

// Exactness runs the three scenarios one after the other, each with every
// peer at the same time on its own fresh limiter (limit per window).
func Exactness(ctx context.Context, peers []Peer, limit int, window time.Duration) ([]ExactResult, error) {
	var out []ExactResult
	for _, s := range schedules {
		res := make([]ExactResult, len(peers))
		errs := make([]error, len(peers))
		var wg sync.WaitGroup
		for i, p := range peers {
			wg.Go(func() {
				res[i], errs[i] = runSchedule(ctx, p, s, limit, window)
			})
		}
		wg.Wait()
		for i, err := range errs {
			if err != nil {
				return nil, fmt.Errorf("peers: %s, %s: %w", peers[i].Name, s.name, err)
			}
		}
		out = append(out, res...)
	}
	return out, nil
}

func runSchedule(ctx context.Context, p Peer, s schedule, limit int, window time.Duration) (ExactResult, error) {
	l, err := p.New(limit, window)
	if err != nil {
		return ExactResult{}, err
	}
	defer l.Close()
	tick := window / TicksPerWindow
	recs := make([][]tickRecord, s.senders)
	t0 := time.Now().Add(tick)
	var wg sync.WaitGroup
	for g := range s.senders {
		recs[g] = make([]tickRecord, s.ticks)
		wg.Go(func() {
			timer := time.NewTimer(0)
			defer timer.Stop()
			<-timer.C
			for k := range s.ticks {
				n := s.requests(k, limit)
				if n == 0 {
					continue
				}
				timer.Reset(time.Until(t0.Add(time.Duration(k) * tick)))
				select {
				case <-ctx.Done():
					return
				case <-timer.C:
				}
				r := &recs[g][k]
				r.start, r.sent = time.Now(), n
				for range n {
					if l.Allow("x") {
						r.admitted++
					}
				}
				r.end = time.Now()
			}
		})
	}
	wg.Wait()
	if err := ctx.Err(); err != nil {
		return ExactResult{}, err
	}
	r := countWindows(recs, s.ticks, window)
	r.Peer, r.Scenario = p.Name, s.name
	return r, nil
}

// countWindows finds the most admissions in TicksPerWindow−1 consecutive
// ticks whose real span is shorter than window.
func countWindows(recs [][]tickRecord, ticks int, window time.Duration) ExactResult {
	type agg struct {
		start, end time.Time
		admitted   int
		any        bool
	}
	per := make([]agg, ticks)
	total := 0
	for _, sender := range recs {
		for k, r := range sender {
			if r.sent == 0 {
				continue
			}
			a := &per[k]
			if !a.any || r.start.Before(a.start) {
				a.start = r.start
			}
			if !a.any || r.end.After(a.end) {
				a.end = r.end
			}
			a.any = true
			a.admitted += r.admitted
			total += r.admitted
		}
	}
	res := ExactResult{Admitted: total, Ticks: ticks}
	span := TicksPerWindow - 1
	for k := 0; k+span <= ticks; k++ {
		var first, last time.Time
		count, seen := 0, false
		for _, a := range per[k : k+span] {
			if !a.any {
				continue
			}
			if !seen || a.start.Before(first) {
				first = a.start
			}
			if !seen || a.end.After(last) {
				last = a.end
			}
			seen = true
			count += a.admitted
		}
		if !seen || last.Sub(first) >= window {
			continue
		}
		res.Windows++
		res.MaxInWindow = max(res.MaxInWindow, count)
	}
	return res
}
