package loadtest

import (
	"context"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	vegeta "github.com/tsenart/vegeta/v12/lib"
	"github.com/tsenart/vegeta/v12/lib/plot"

	"github.com/slidegate/slidegate/engine"
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
	// Keys and StoredInstants are the limiter's state after the phase.
	Keys           int          `json:"keys"`
	StoredInstants int64        `json:"stored_instants"`
	HotKeyShare    float64      `json:"hot_key_share"` // fraction of decisions on client 0
	Verification   verification `json:"verification"`
	// Floor is the same workload through the floor, measured in the same
	// run: what the decision's latency is judged against.
	Floor *floorReport `json:"floor,omitempty"`
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
	rep := &engineReport{Policy: policyInfo(pol), Workers: cfg.Workers, SampleEvery: cfg.SampleEvery}
	rep.TimerOverheadNs = timerOverhead()
	keys, workers, recs := engineWorkload(cfg)

	// Sized for the client population up front, as an operator who knows
	// it would: key creation then never waits for a table resize.
	lim, err := engine.New(pol, engine.WithPresize(cfg.Clients))
	if err != nil {
		return nil, nil, err
	}
	defer lim.Close()
	start, elapsed := driveEngine(ctx, cfg, ui, prof, lim, keys, workers)
	if err := ctx.Err(); err != nil {
		return nil, nil, err
	}

	points := rep.tally(workers, cfg.Requests, elapsed)
	prof.heap("engine")
	st := lim.Stats()
	rep.Keys, rep.StoredInstants = st.Keys, st.StoredInstants
	rep.Verification = verifyEngine(cfg, ui, pol, keys, recs, workers)
	pl := enginePlot(start, points)
	lim.Close()
	for w := range workers {
		workers[w].recs = nil
	}
	rep.Floor = runFloor(ctx, cfg, ui, keys, workers)
	if err := ctx.Err(); err != nil {
		return nil, nil, err
	}
	return rep, pl, nil
}

// engineWorker is one goroutine of the engine phase: its stream of
// decisions, and what it measured.
type engineWorker struct {
	seq   []uint32 // client indices
	costs []uint32 // request costs; nil when every cost is 1
	recs  []record // its range of the phase's records; nil without --verify

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

// driveEngine runs the workers against lim until their streams end or
// cfg.Duration passes, and returns when the timed phase began and how long
// it took. The phase's CPU profile covers these decisions only, not the
// setup before or the verification after.
func driveEngine(ctx context.Context, cfg Config, ui *ui, prof *profiler, lim *engine.Limiter, keys []string, workers []engineWorker) (start time.Time, elapsed time.Duration) {
	var (
		stop atomic.Bool
		done atomic.Int64
		wg   sync.WaitGroup
	)
	expectedSamples := cfg.Requests / int64(cfg.SampleEvery)
	plotEvery := max(1, expectedSamples/enginePlotPoints)
	tctx, cancel := context.WithTimeout(ctx, cfg.Duration)
	defer cancel()
	watch := make(chan struct{})
	go func() {
		defer close(watch)
		<-tctx.Done()
		stop.Store(true)
	}()
	bar := ui.bar(cfg.Requests, "engine: decisions", &done)

	prof.beginPhase(ModeEngine)
	start = time.Now()
	for w := range workers {
		wg.Go(func() { workers[w].run(lim, keys, cfg.SampleEvery, plotEvery, start, &stop, &done) })
	}
	wg.Wait()
	elapsed = time.Since(start)
	prof.endPhase(ModeEngine)
	cancel()
	<-watch
	bar.finish()
	return start, elapsed
}

// run makes the worker's decisions at full speed: the first and then one
// in sampleEvery timed (one in plotEvery of those kept for the plot),
// every one recorded when w.recs is not nil. Every 4096 decisions it adds
// to done, and stops when stop is set.
func (w *engineWorker) run(lim *engine.Limiter, keys []string, sampleEvery int, plotEvery int64, start time.Time, stop *atomic.Bool, done *atomic.Int64) {
	seq, cs, wrecs := w.seq, w.costs, w.recs
	hAllowed, hRefused := &w.allowed, &w.refused
	var nAllowed, nHot int64
	var pts []plotPoint
	var sampled int64
	var touch byte
	var counted int64
	countdown := 1 // time the first decision, then one in sampleEvery
	i := 0
	for ; i < len(seq); i++ {
		if i&4095 == 0 && i > 0 {
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
	done.Add(int64(i) - counted)
	w.made, w.nAllowed, w.hot, w.points, w.touch = int64(i), nAllowed, nHot, pts, touch
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
	r.Throughput = float64(r.Decisions) / elapsed.Seconds()
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
	p("  state after: %s keys, %s stored instants", commas(int64(e.Keys)), commas(e.StoredInstants))
	p("  verify: %s", fmtVerification(e.Verification))
}
