package loadtest

import (
	"context"
	"fmt"
	"math"
	"runtime"
	"runtime/metrics"
	"runtime/pprof"
	"slices"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	vegeta "github.com/tsenart/vegeta/v12/lib"
	"github.com/tsenart/vegeta/v12/lib/plot"

	"github.com/slidegate/slidegate/engine"
	"github.com/slidegate/slidegate/lab/internal/floor"
	"github.com/slidegate/slidegate/lab/internal/keydist"
	"github.com/slidegate/slidegate/lab/internal/latency"
)

// policyReport describes a policy in reports.
type policyReport struct {
	Name      string `json:"name"`
	Limit     int    `json:"limit"`
	WindowNs  int64  `json:"window_ns"`
	Algorithm string `json:"algorithm"`
}

func policyInfo(p engine.Policy) policyReport {
	return policyReport{Name: p.Name, Limit: p.Limit, WindowNs: int64(p.Window), Algorithm: p.Algorithm.String()}
}

// engineReport is the engine phase's outcome.
type engineReport struct {
	Policy    policyReport `json:"policy"`
	Workers   int          `json:"workers"`
	Decisions int64        `json:"decisions"`
	Allowed   int64        `json:"allowed"`
	Refused   int64        `json:"refused"`
	// Stopped is set when the time bound ended the phase before Requests.
	Stopped    bool    `json:"stopped_by_time"`
	DurationNs int64   `json:"duration_ns"`
	Throughput float64 `json:"decisions_per_sec"`
	// Latency is over the sampled decisions: one in SampleEvery, per
	// goroutine, is bracketed by time.Now and time.Since, which adds about
	// TimerOverheadNs (measured in the same run) to each sample.
	SampleEvery int             `json:"sample_every"`
	Latency     latency.Summary `json:"latency"`
	// LatencyAllowed and LatencyRefused split the samples by outcome: an
	// accept writes the key's ring (and may grow it), a refusal only
	// reads it.
	LatencyAllowed  latency.Summary `json:"latency_allowed"`
	LatencyRefused  latency.Summary `json:"latency_refused"`
	TimerOverheadNs int64           `json:"timer_overhead_ns"`
	// Pauses is the machine's pauses, probed just before the phase: what
	// a timed decision may meet that is neither the engine's work nor the
	// floor's (pauses.go).
	Pauses *pauseProbe `json:"machine_pauses,omitempty"`
	// Keys and StoredInstants are the limiter's state after the phase.
	Keys           int          `json:"keys"`
	StoredInstants int64        `json:"stored_instants"`
	HotKeyShare    float64      `json:"hot_key_share"` // fraction of decisions on client 0
	Verification   verification `json:"verification"`
	// Floor is the same workload through the floor, measured in the same
	// run: what the decision's latency is judged against. Rounds are the
	// phase's rounds, engine and floor side by side in each: the targets
	// are judged on their ratios.
	Floor  *floorReport  `json:"floor,omitempty"`
	Rounds []engineRound `json:"rounds,omitempty"`
	Parts  int           `json:"parts"` // parts per round (--engine-parts)
}

// enginePlotPoints bounds the latency-over-time plot of the engine phase.
const enginePlotPoints = 100_000

type plotPoint struct {
	at      time.Duration // since the phase began
	lat     time.Duration
	allowed bool
}

// runEngine drives one engine.Limiter from cfg.Workers goroutines at full
// speed over cfg.Clients keys, cfg.Requests decisions in all (or until
// cfg.Duration), recording every decision when cfg.Verify.
func runEngine(ctx context.Context, cfg Config, ui *ui, prof *profiler) (*engineReport, *plot.Plot, error) {
	pol := cfg.policy(0)
	rep := &engineReport{Policy: policyInfo(pol), Workers: cfg.Workers, SampleEvery: cfg.SampleEvery, Parts: cfg.EngineParts}
	rep.TimerOverheadNs = timerOverhead()
	keys, workers, recs := engineWorkload(cfg)
	pp := probePauses(pauseProbeFor, runtime.GOMAXPROCS(0))
	rep.Pauses = &pp

	// Sized for the client population up front, as an operator who knows
	// it would: key creation then never waits for a table resize.
	lim, err := engine.New(pol, engine.WithPresize(cfg.Clients))
	if err != nil {
		return nil, nil, err
	}
	defer lim.Close()
	d := &engineDrive{lim: lim, fl: floor.New(keys), keys: keys, sampleEvery: cfg.SampleEvery}
	start, elapsed, floor, rounds := driveEngine(ctx, cfg, ui, prof, d, workers)
	if err := ctx.Err(); err != nil {
		return nil, nil, err
	}
	rep.Floor, rep.Rounds = floor, rounds

	points := rep.tally(workers, cfg.Requests, elapsed)
	prof.heap("engine")
	st := lim.Stats()
	rep.Keys, rep.StoredInstants = st.Keys, st.StoredInstants
	rep.Verification = verifyEngine(cfg, ui, pol, keys, recs, workers)
	pl := enginePlot(start, points)
	return rep, pl, nil
}

// engineWorker is one goroutine of the engine phase: its stream of
// decisions, and what it measured.
type engineWorker struct {
	seq   []uint32 // client indices
	costs []uint32 // request costs; nil when every cost is 1
	recs  []record // its range of the phase's records; nil without --verify

	countdown int               // decisions to the next timed one (0 before the first)
	round     latency.Histogram // this round's sampled latencies, both outcomes
	floor     latency.Histogram // this round's floor samples
	floorMade int64             // decisions through the floor
	sampled   int64             // decisions timed so far

	allowed, refused latency.Histogram // sampled latencies by outcome
	made, nAllowed   int64             // decisions made, and accepts among them
	hot              int64             // decisions on client 0
	points           []plotPoint       // samples kept for the plot
	touch            byte              // keeps the key touches live
}

// engineWorkload prepares the engine phase outside its timed part: the
// keys, each worker's stream of client indices (and costs) drawn from the
// distribution, and, with --verify, the records every decision is written
// to, each worker owning a range of them.
func engineWorkload(cfg Config) (keys []string, workers []engineWorker, recs []record) {
	keys = make([]string, cfg.Clients)
	for i := range keys {
		keys[i] = clientKey(i)
	}
	per := splitCount(cfg.Requests, cfg.Workers)
	workers = make([]engineWorker, cfg.Workers)
	var setup sync.WaitGroup
	for w := range workers {
		setup.Go(func() {
			ch, _ := keydist.NewChooser(cfg.Dist, cfg.Clients, cfg.ZipfS, cfg.Seed, uint64(w))
			seq := make([]uint32, per[w])
			for i := range seq {
				seq[i] = uint32(ch.Next())
			}
			workers[w].seq = seq
			if cfg.MaxCost > 1 {
				costs := make([]uint32, per[w])
				for i := range costs {
					costs[i] = uint32(ch.Cost(cfg.MaxCost))
				}
				workers[w].costs = costs
			}
		})
	}
	setup.Wait()
	if !cfg.Verify {
		return keys, workers, nil
	}
	recs = make([]record, cfg.Requests)
	// Fault the pages in now: the OS maps a fresh allocation lazily, and a
	// page fault per 100 records would otherwise be paid inside the timed
	// phase.
	for i := 0; i < len(recs); i += 4096 / int(unsafe.Sizeof(record{})) {
		recs[i].Cost = 1
	}
	var off int64
	for w := range workers {
		workers[w].recs = recs[off : off+per[w]]
		off += per[w]
	}
	return keys, workers, recs
}

// engineDrive is what the engine phase's workers share while they run:
// the limiter and the floor they decide on, the keys, how often a decision
// is timed and plotted, and the phase's start, stop flag and progress.
type engineDrive struct {
	lim         *engine.Limiter
	fl          *floor.Map
	keys        []string
	sampleEvery int
	plotEvery   int64
	start       time.Time
	stop        atomic.Bool
	done        atomic.Int64
}

// driveEngine runs the workers against d.lim in cfg.EngineRounds rounds
// until their streams end or cfg.Duration passes, and returns when the
// timed phase began and how long the engine's decisions took. In each
// round every worker runs its next slice of its stream through the engine
// and the same slice through the floor d.fl, the two in turn (which goes
// first alternates), so that each round gives the engine's tails and the
// floor's side by side on the same machine. The phase's CPU profile
// covers these rounds only (the floor's goroutines are labelled
// target=floor), not the setup before or the verification after.
func driveEngine(ctx context.Context, cfg Config, ui *ui, prof *profiler, d *engineDrive,
	workers []engineWorker) (start time.Time, elapsed time.Duration, floor *floorReport, rounds []engineRound) {
	stop, done := &d.stop, &d.done
	expectedSamples := cfg.Requests / int64(cfg.SampleEvery)
	d.plotEvery = max(1, expectedSamples/enginePlotPoints)
	d.presizePoints(workers)
	// The bound covers the engine's decisions and the floor's.
	tctx, cancel := context.WithTimeout(ctx, 2*cfg.Duration)
	defer cancel()
	watch := make(chan struct{})
	go func() {
		defer close(watch)
		<-tctx.Done()
		stop.Store(true)
	}()
	bar := ui.bar(2*cfg.Requests, "engine: decisions and floor", done)
	var floorH latency.Histogram
	floor = &floorReport{}
	var floorElapsed time.Duration

	prof.beginPhase(ModeEngine)
	start = time.Now()
	d.start = start
	for r := range cfg.EngineRounds {
		if stop.Load() {
			break
		}
		var rd engineRound
		rd.FloorFirst = r%2 == 1
		m := startOthers()
		// The round's slice in cfg.EngineParts parts, each through the
		// engine and the floor in turn, the order alternating part by
		// part: a collection or another process's burst within the
		// round then falls on both.
		for part := range cfg.EngineParts {
			floorFirst := (r+part)%2 == 1
			for pass := range 2 {
				gc0 := gcCycles()
				if (pass == 0) != floorFirst {
					elapsed += runWorkers(workers, func(w *engineWorker) {
						lo, hi := partRange(len(w.seq), r, cfg.EngineRounds, part, cfg.EngineParts)
						w.run(d, lo, hi)
					})
					rd.EngineGCs += gcCycles() - gc0
					continue
				}
				pprof.Do(ctx, pprof.Labels("target", "floor"), func(context.Context) {
					floorElapsed += runWorkers(workers, func(w *engineWorker) {
						lo, hi := partRange(len(w.seq), r, cfg.EngineRounds, part, cfg.EngineParts)
						w.floorMade += floorWorker(d, w.seq[lo:hi], &w.floor)
					})
				})
				rd.FloorGCs += gcCycles() - gc0
			}
		}
		rd.Others = m.cores(0)
		rd.Disturbed = rd.Others > engineBusy
		var eh, fh latency.Histogram
		for w := range workers {
			eh.Merge(&workers[w].round)
			fh.Merge(&workers[w].floor)
			workers[w].round, workers[w].floor = latency.Histogram{}, latency.Histogram{}
		}
		floorH.Merge(&fh)
		if eh.Count() == 0 || fh.Count() == 0 {
			// The time bound stopped the phase before this round timed
			// both: it has no ratio.
			break
		}
		rd.Samples = eh.Count()
		rd.EngineP99Ns, rd.EngineP999Ns = int64(eh.Quantile(0.99)), int64(eh.Quantile(0.999))
		rd.FloorP99Ns, rd.FloorP999Ns = int64(fh.Quantile(0.99)), int64(fh.Quantile(0.999))
		rd.EnginePaused, rd.FloorPaused = eh.AtLeast(pauseNs), fh.AtLeast(pauseNs)
		rounds = append(rounds, rd)
	}
	prof.endPhase(ModeEngine)
	cancel()
	<-watch
	bar.finish()
	for w := range workers {
		floor.Decisions += workers[w].floorMade
	}
	floor.DurationNs = int64(floorElapsed)
	floor.Latency = floorH.Summary()
	if s := floorElapsed.Seconds(); s > 0 {
		floor.Throughput = float64(floor.Decisions) / s
	}
	return start, elapsed, floor, rounds
}

// presizePoints gives each worker's plot samples the room its whole
// stream needs. Growing them by append would allocate (up to hundreds of
// KiB, zeroed) between the engine's timed decisions, where the floor's
// workers allocate nothing. A stream of n decisions times at most
// n/sampleEvery + 1 of them, and keeps one in plotEvery of those.
func (d *engineDrive) presizePoints(workers []engineWorker) {
	for w := range workers {
		n := int64(len(workers[w].seq))/int64(d.sampleEvery)/d.plotEvery + 2
		workers[w].points = make([]plotPoint, 0, n)
	}
}

// runWorkers runs f on every worker, each on its own goroutine, and
// returns how long they took together.
func runWorkers(workers []engineWorker, f func(*engineWorker)) time.Duration {
	var wg sync.WaitGroup
	t0 := time.Now()
	for w := range workers {
		wg.Go(func() { f(&workers[w]) })
	}
	wg.Wait()
	return time.Since(t0)
}

// roundRange is the slice [lo, hi) of a stream of n decisions that round
// r of rounds runs.
func roundRange(n, r, rounds int) (lo, hi int) {
	return n * r / rounds, n * (r + 1) / rounds
}

// partRange is the slice [lo, hi) of a stream of n decisions that part
// (of parts) of round r (of rounds) runs.
func partRange(n, r, rounds, part, parts int) (lo, hi int) {
	rlo, rhi := roundRange(n, r, rounds)
	plo, phi := roundRange(rhi-rlo, part, parts)
	return rlo + plo, rlo + phi
}

// engineBusy is the CPU other processes may use during an engine round,
// in cores, before the round is left out of the judgement: the engine
// runs both cores flat out, so any other work takes its place.
const engineBusy = 0.2

// engineRound is one round of the engine phase: the tails of the
// engine's and the floor's sampled latencies over the same slice of the
// streams, and the CPU other processes used during the round.
type engineRound struct {
	Samples      uint64  `json:"samples"` // the engine's
	EngineP99Ns  int64   `json:"engine_p99_ns"`
	EngineP999Ns int64   `json:"engine_p999_ns"`
	FloorP99Ns   int64   `json:"floor_p99_ns"`
	FloorP999Ns  int64   `json:"floor_p999_ns"`
	FloorFirst   bool    `json:"floor_first"`
	Others       float64 `json:"others_cores"` // -1 where it cannot be read
	Disturbed    bool    `json:"disturbed"`    // Others over engineBusy: left out of the judgement
	// EngineGCs and FloorGCs count the collections that ended while the
	// round's engine parts and floor parts ran: a collection overlapping
	// one side's timed decisions would be a cause the other side lacks.
	EngineGCs uint64 `json:"engine_gc_cycles"`
	FloorGCs  uint64 `json:"floor_gc_cycles"`
	// EnginePaused and FloorPaused count the round's timed decisions of
	// pauseNs or more: those that met a pause of the machine. A round's
	// p99.9 is one of them once they pass a thousandth of its samples.
	EnginePaused uint64 `json:"engine_paused"`
	FloorPaused  uint64 `json:"floor_paused"`
}

// gcCycles is the number of collections completed so far.
func gcCycles() uint64 {
	s := [1]metrics.Sample{{Name: "/gc/cycles/total:gc-cycles"}}
	metrics.Read(s[:])
	if s[0].Value.Kind() != metrics.KindUint64 {
		return 0
	}
	return s[0].Value.Uint64()
}

// judgements are the p99 and p99.9 targets judged on the rounds' ratios;
// nil when the floor was not measured. A report without rounds is judged
// on the phase's figures as one round.
func (e *engineReport) judgements() (p99, p999 *judgement) {
	rounds := e.Rounds
	if len(rounds) == 0 {
		f := e.Floor
		if f == nil || f.Latency.P99Ns <= 0 || f.Latency.P999Ns <= 0 {
			return nil, nil
		}
		rounds = []engineRound{{EngineP99Ns: e.Latency.P99Ns, EngineP999Ns: e.Latency.P999Ns, FloorP99Ns: f.Latency.P99Ns, FloorP999Ns: f.Latency.P999Ns}}
	}
	var r99, r999 []float64
	var disturbed []bool
	for _, rd := range rounds {
		r99 = append(r99, ratioNs(rd.EngineP99Ns, rd.FloorP99Ns))
		r999 = append(r999, ratioNs(rd.EngineP999Ns, rd.FloorP999Ns))
		disturbed = append(disturbed, rd.Disturbed)
	}
	a, b := judgeRounds(r99, disturbed, p99Goal), judgeRounds(r999, disturbed, p999Goal)
	return &a, &b
}

// ratioNs is a / b, NaN when b is not positive (judgeRounds leaves it out).
func ratioNs(a, b int64) float64 {
	if b <= 0 {
		return math.NaN()
	}
	return float64(a) / float64(b)
}

// run makes the worker's decisions lo to hi of its stream at full speed:
// the first and then one in sampleEvery timed (one in plotEvery of those
// kept for the plot), every one recorded when w.recs is not nil. Every
// 4096 decisions it adds to done, and stops when stop is set; w.made is
// then where it stopped, so that the decisions made are the stream's
// first w.made. Once stop is set, it makes no decision.
func (w *engineWorker) run(dr *engineDrive, lo, hi int) {
	if dr.stop.Load() {
		// Stopped in an earlier part: w.made stays where that part
		// stopped, so that the decisions made stay the stream's prefix.
		return
	}
	lim, keys, sampleEvery, plotEvery, start := dr.lim, dr.keys, dr.sampleEvery, dr.plotEvery, dr.start
	stop, done := &dr.stop, &dr.done
	seq, cs, wrecs := w.seq, w.costs, w.recs
	hAllowed, hRefused, hRound := &w.allowed, &w.refused, &w.round
	nAllowed, nHot := w.nAllowed, w.hot
	pts := w.points
	sampled := w.sampled
	touch := w.touch
	var counted int64
	countdown := w.countdown
	if lo == 0 {
		countdown = 1 // time the first decision, then one in sampleEvery
	}
	i := lo
	for ; i < hi; i++ {
		if (i-lo)&4095 == 0 && i > lo {
			done.Add(4096)
			counted += 4096
			if stop.Load() {
				break
			}
		}
		k := seq[i]
		cost := 1
		if cs != nil {
			cost = int(cs[i])
		}
		var d engine.Decision
		if countdown--; countdown == 0 {
			countdown = sampleEvery
			// A server has the key it just parsed in cache; the harness's
			// table of a million keys does not. Touch the key's bytes first
			// so that the sample times the engine, not the harness's key
			// table.
			key := keys[k]
			touch += key[0] + key[len(key)-1]
			t0 := time.Now()
			d, _ = lim.AllowN(key, cost)
			lat := time.Since(t0)
			hRound.Record(int64(lat))
			if d.Allowed {
				hAllowed.Record(int64(lat))
			} else {
				hRefused.Record(int64(lat))
			}
			if sampled%plotEvery == 0 {
				pts = append(pts, plotPoint{t0.Sub(start), lat, d.Allowed})
			}
			sampled++
		} else {
			d, _ = lim.AllowN(keys[k], cost)
		}
		if d.Allowed {
			nAllowed++
		}
		if k == 0 {
			nHot++
		}
		if wrecs != nil {
			wrecs[i] = makeRecord(0, k, cost, d)
		}
	}
	done.Add(int64(i-lo) - counted)
	w.made, w.nAllowed, w.hot, w.points, w.touch, w.countdown, w.sampled = int64(i), nAllowed, nHot, pts, touch, countdown, sampled
}

// tally adds the workers' counts and latencies up into r (requests is the
// count bound: fewer decisions mean the time bound stopped the phase), and
// returns their plot samples.
func (r *engineReport) tally(workers []engineWorker, requests int64, elapsed time.Duration) [][]plotPoint {
	var h, ha, hr latency.Histogram
	points := make([][]plotPoint, len(workers))
	for i := range workers {
		w := &workers[i]
		ha.Merge(&w.allowed)
		hr.Merge(&w.refused)
		h.Merge(&w.allowed)
		h.Merge(&w.refused)
		r.Decisions += w.made
		r.Allowed += w.nAllowed
		r.HotKeyShare += float64(w.hot)
		points[i] = w.points
	}
	r.Refused = r.Decisions - r.Allowed
	r.Stopped = r.Decisions < requests
	r.DurationNs = int64(elapsed)
	if s := elapsed.Seconds(); s > 0 {
		// The time bound may stop the phase before its first round
		// (elapsed 0); the report's JSON cannot hold 0/0.
		r.Throughput = float64(r.Decisions) / s
	}
	r.Latency = h.Summary()
	r.LatencyAllowed, r.LatencyRefused = ha.Summary(), hr.Summary()
	if r.Decisions > 0 {
		r.HotKeyShare /= float64(r.Decisions)
	}
	return points
}

// verifyEngine replays the decisions the workers recorded in recs, first
// closing the gaps a time stop left between their ranges.
func verifyEngine(cfg Config, ui *ui, pol engine.Policy, keys []string, recs []record, workers []engineWorker) verification {
	if !cfg.Verify {
		return verification{Reason: "--verify=false"}
	}
	var n int64
	for i := range workers {
		n += int64(copy(recs[n:], workers[i].recs[:workers[i].made]))
	}
	recs = recs[:n]
	var groups atomic.Int64
	vbar := ui.bar(verifyBuckets, "engine: verify", &groups)
	v := verifyProgress([]engine.Policy{pol}, recs, func(i uint32) string { return keys[i] }, &groups)
	vbar.finish()
	return v
}

// enginePlot turns the sampled latencies into vegeta's latency-over-time
// plot (one series, in time order).
func enginePlot(start time.Time, points [][]plotPoint) *plot.Plot {
	var all []plotPoint
	for _, p := range points {
		all = append(all, p...)
	}
	slices.SortFunc(all, func(a, b plotPoint) int { return int(a.at - b.at) })
	p := plot.New(plot.Title("slidegate engine: sampled decision latency (axis in ms: 0.001 = 1 µs)"),
		plot.Downsample(4000), plot.Label(outcomeLabel))
	for i, pt := range all {
		r := &vegeta.Result{Attack: "engine", Seq: uint64(i), Timestamp: start.Add(pt.at), Latency: pt.lat}
		if pt.allowed {
			r.Code = 1
		}
		_ = p.Add(r)
	}
	p.Close()
	return p
}

// outcomeLabel splits the engine plot into accepts (Code 1) and refusals.
func outcomeLabel(r *vegeta.Result) string {
	if r.Code == 1 {
		return "allowed"
	}
	return "refused"
}

// splitCount splits n into k near-equal parts.
func splitCount(n int64, k int) []int64 {
	out := make([]int64, k)
	for i := range out {
		out[i] = n / int64(k)
		if int64(i) < n%int64(k) {
			out[i]++
		}
	}
	return out
}

// timerOverhead returns the median cost of the bracket the engine phase
// puts around a sampled decision (time.Now, then time.Since), measured
// with nothing inside it.
func timerOverhead() int64 {
	runtime.Gosched()
	var h latency.Histogram
	for range 100_000 {
		t0 := time.Now()
		h.Record(int64(time.Since(t0)))
	}
	return int64(h.Quantile(0.5))
}

// writePauses writes what the pause probe saw and what the timed
// decisions met of it: the p99.9 target compares the slowest thousandth
// of each side's decisions, and a machine that pauses often puts its
// pauses there.
func (e *engineReport) writePauses(p func(string, ...any)) {
	pp := e.Pauses
	if pp == nil {
		return
	}
	p("  machine pauses (%v of %d goroutines spinning on the clock, before the phase): %s per second per core of %s or more, median %s",
		time.Duration(pp.DurationNs), pp.Goroutines, commas(int64(math.Round(pp.PerCoreSecond))), fmtNs(pauseNs), fmtNs(pp.MedianNs))
	var eng, fl, n uint64
	for _, rd := range e.Rounds {
		eng, fl, n = eng+rd.EnginePaused, fl+rd.FloorPaused, n+rd.Samples
	}
	if e.Floor == nil || n == 0 {
		return
	}
	p("    a timed decision meets one with a chance of about its length × that rate: %.3f%% at the engine's mean (%s), %.3f%% at the floor's (%s);",
		100*pp.hitShare(e.Latency.MeanNs), fmtNs(e.Latency.MeanNs), 100*pp.hitShare(e.Floor.Latency.MeanNs), fmtNs(e.Floor.Latency.MeanNs))
	p("    timed decisions of %s or more in the rounds: engine %.3f%%, floor %.3f%% (\"paused\" below; a round's p99.9 is a pause once they pass 0.1%%)",
		fmtNs(pauseNs), 100*float64(eng)/float64(n), 100*float64(fl)/float64(n))
}

// writeText writes the engine section of the summary.
func (e *engineReport) writeText(p func(string, ...any)) {
	p("")
	stop := ""
	if e.Stopped {
		stop = " (stopped by --engine-duration)"
	}
	p("engine    policy %s: %d per %v (%s); %d goroutines%s", e.Policy.Name, e.Policy.Limit,
		time.Duration(e.Policy.WindowNs), e.Policy.Algorithm, e.Workers, stop)
	p("  %s decisions in %.2f s = %s decisions/s; allowed %s, refused %s; hottest key had %.1f%%",
		commas(e.Decisions), time.Duration(e.DurationNs).Seconds(), si(e.Throughput), commas(e.Allowed), commas(e.Refused), 100*e.HotKeyShare)
	p("  latency of 1 in %d decisions (%s samples; time.Now/time.Since bracket adds ~%d ns):", e.SampleEvery, commas(int64(e.Latency.Samples)), e.TimerOverheadNs)
	p("    all      %s", fmtLatency(e.Latency))
	p("    allowed  %s", fmtLatency(e.LatencyAllowed))
	p("    refused  %s", fmtLatency(e.LatencyRefused))
	if f := e.Floor; f != nil {
		p("    floor    %s  (the same streams through a clock read, an xsync lookup and one load: %s decisions/s)", fmtLatency(f.Latency), si(f.Throughput))
	}
	e.writePauses(p)
	if len(e.Rounds) > 0 {
		p("  %d rounds, each a slice of the streams in %d part(s), each part through the engine and the floor in turn (the order alternating part by part):", len(e.Rounds), e.Parts)
		for i, rd := range e.Rounds {
			note := ""
			if rd.Disturbed {
				note = fmt.Sprintf("  disturbed: other processes used %s core (over %.1f); left out", fmtCores(rd.Others), engineBusy)
			}
			if rd.EngineGCs+rd.FloorGCs > 0 {
				note = fmt.Sprintf("  collections: engine %d, floor %d", rd.EngineGCs, rd.FloorGCs) + note
			}
			p("    round %d: p99 %s / floor %s = %s×, p99.9 %s / floor %s = %s×; paused %d / %d of %s%s", i+1,
				fmtNs(rd.EngineP99Ns), fmtNs(rd.FloorP99Ns), fmtRatio(ratioNs(rd.EngineP99Ns, rd.FloorP99Ns), targetP99OverFloor),
				fmtNs(rd.EngineP999Ns), fmtNs(rd.FloorP999Ns), fmtRatio(ratioNs(rd.EngineP999Ns, rd.FloorP999Ns), targetP999OverFloor),
				rd.EnginePaused, rd.FloorPaused, commas(int64(rd.Samples)), note)
		}
	}
	p("  state after: %s keys, %s stored instants", commas(int64(e.Keys)), commas(e.StoredInstants))
	p("  verify: %s", fmtVerification(e.Verification))
}
