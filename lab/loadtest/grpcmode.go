package loadtest

import (
	"context"
	"fmt"
	"net"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/slidegate/slidegate/engine"
	"github.com/slidegate/slidegate/internal/rls"
	"github.com/slidegate/slidegate/lab/internal/keydist"
	"github.com/slidegate/slidegate/lab/internal/latency"
)

// ModeGRPC drives Envoy's rate limit service (ShouldRateLimit) over gRPC
// on loopback, paced at Rate for HTTPDuration.
const ModeGRPC = "grpc"

// grpcReport is the grpc phase's outcome.
type grpcReport struct {
	Target      string       `json:"target"`
	Policy      policyReport `json:"policy"`
	Connections int          `json:"connections"`
	TargetRate  float64      `json:"target_rate"`
	DurationNs  int64        `json:"duration_ns"`
	Requests    uint64       `json:"requests"`
	Rate        float64      `json:"rate"` // achieved decisions per second
	Allowed     int64        `json:"allowed"`
	Refused     int64        `json:"refused"`
	// Errors counts calls that ended with a gRPC error (a timeout, say).
	Errors int `json:"errors"`
	// Late counts calls sent more than lateAfter after their scheduled
	// instant (every caller busy, or the pacer itself delayed): the rate
	// was not held there.
	Late int64 `json:"late"`
	// Latency is per call, client side: the request sent to the response
	// read.
	Latency         latency.Summary `json:"latency"`
	ServerDecisions int             `json:"server_decisions"`
	// Rounds are the target's rounds: the service against a no-op gRPC
	// server, CPU per call (grpcrounds.go).
	Rounds       []turnRound  `json:"rounds,omitempty"`
	RoundCalls   int          `json:"round_calls,omitempty"`
	Disagreement string       `json:"disagreement,omitempty"`
	Verification verification `json:"verification"`
}

// lateAfter is how far behind its schedule a call may start before it
// counts as late: the pacer releases calls in 1 ms batches, and a loaded
// machine delays its ticks by a few more.
const lateAfter = 10 * time.Millisecond

// grpcDomain and grpcKey are the domain and descriptor key of the
// configuration the phase serves: one rule, the first tier's policy,
// counted per client.
const (
	grpcDomain = "loadtest"
	grpcKey    = "client"
)

// grpcConfig renders p as an envoyproxy/ratelimit configuration.
func grpcConfig(p engine.Policy) string {
	return fmt.Sprintf("domain: %s\ndescriptors:\n  - key: %s\n    rate_limit:\n      name: %s\n      unit: second\n      requests_per_unit: %d\n      window: %s\n      algorithm: %s\n",
		grpcDomain, grpcKey, p.Name, p.Limit, p.Window, p.Algorithm)
}

// grpcRecorder is the group the service decides with, recording every
// decision (when rec is not nil).
type grpcRecorder struct {
	engine.GroupBackend
	rec    *recorder
	policy string
	n      atomic.Int64
}

// grpcKeyPrefix is how the service's key for the one entry (client, value)
// begins: the entries length-prefixed (rls builds "6:client9:c00000042").
var grpcKeyPrefix = strconv.Itoa(len(grpcKey)) + ":" + grpcKey

func (g *grpcRecorder) DecideGroup(ctx context.Context, dst []engine.Decision, req engine.GroupRequest) (engine.GroupDecision, error) {
	gd, err := g.GroupBackend.DecideGroup(ctx, dst, req)
	refs, n := req.Refs, req.N // the service decides one descriptor at one cost
	if err != nil {
		return gd, err
	}
	g.n.Add(1)
	if g.rec != nil {
		for i, r := range refs {
			key := r.Key
			if rest, ok := strings.CutPrefix(key, grpcKeyPrefix); ok {
				if _, v, ok := strings.Cut(rest, ":"); ok {
					key = v
				}
			}
			g.rec.Add(g.policy, key, n, gd.Limits[i])
		}
	}
	return gd, nil
}

// runGRPC serves the rate limit service on loopback and drives it.
func runGRPC(ctx context.Context, cfg Config, u *ui) (*grpcReport, error) {
	p := cfg.policy(0)
	rc, err := rls.ParseConfig("loadtest", []byte(grpcConfig(p)))
	if err != nil {
		return nil, err
	}
	group, err := rc.NewGroup(engine.WithPresize(cfg.Clients))
	if err != nil {
		return nil, err
	}
	defer group.Close()
	backend := &grpcRecorder{GroupBackend: group, policy: p.Name}
	rep := &grpcReport{Policy: policyReport{Name: p.Name, Limit: p.Limit, WindowNs: int64(p.Window), Algorithm: p.Algorithm.String()},
		Connections: cfg.Connections, TargetRate: float64(cfg.Rate)}
	expected := int64(float64(cfg.Rate)*cfg.HTTPDuration.Seconds()) + 1
	if cfg.Verify {
		backend.rec = newRecorder([]string{p.Name}, cfg.Clients, int(min(expected*2, int64(cfg.MaxRecords))))
	}
	addr, stopService, err := startRLS(rc, backend)
	if err != nil {
		return nil, err
	}
	defer stopService()
	rep.Target = "in-process rate limit service on " + addr
	conns, err := dialRLS(addr, cfg.Connections)
	defer func() {
		for _, c := range conns {
			_ = c.Close()
		}
	}()
	if err != nil {
		return nil, err
	}

	// Callers take scheduled instants from the pacer; each has its own key
	// stream and histogram.
	callers := make([]grpcCaller, 4*cfg.Connections)
	ticks := make(chan time.Time, len(callers))
	var errs grpcFirstError
	var wg sync.WaitGroup
	for c := range callers {
		ch, err := keydist.NewChooser(cfg.Dist, cfg.Clients, cfg.ZipfS, cfg.Seed, uint64(1000+c))
		if err != nil {
			close(ticks)
			wg.Wait()
			return nil, err
		}
		client := rlsv3.NewRateLimitServiceClient(conns[c%len(conns)])
		wg.Go(func() { callers[c].run(ctx, cfg, client, ch, ticks, &errs) })
	}
	var sent atomic.Int64
	bar := u.bar(expected-1, "grpc: ShouldRateLimit", &sent)
	start := time.Now()
	paceGRPC(ctx, cfg.Rate, expected, start, ticks, &sent)
	wg.Wait()
	bar.finish()
	rep.tally(callers, time.Since(start), int(backend.n.Load()), errs.err)
	rep.verifyRecorded(backend, p)
	rep.RoundCalls = cfg.GRPCRoundCalls
	if rep.Rounds, err = runGRPCRounds(ctx, cfg, rc, p, grpcRounds); err != nil {
		return nil, err
	}
	return rep, nil
}

// startRLS serves the rate limit service of rc, deciding with backend, over
// gRPC on 127.0.0.1:0, and returns its address and how to stop it.
func startRLS(rc *rls.Config, backend *grpcRecorder) (addr string, stop func(), err error) {
	svc, err := rls.New(rc, backend)
	if err != nil {
		return "", nil, err
	}
	gs, _ := rls.NewGRPCServer(svc)
	return serveLoopback(gs)
}

// serveLoopback serves gs on 127.0.0.1:0 and returns its address and how
// to stop it.
func serveLoopback(gs *grpc.Server) (addr string, stop func(), err error) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", nil, err
	}
	served := make(chan error, 1)
	go func() { served <- gs.Serve(lis) }()
	return lis.Addr().String(), func() {
		gs.GracefulStop()
		<-served
	}, nil
}

// dialRLS opens n client connections to addr; on an error, the ones opened
// so far are returned for the caller to close.
func dialRLS(addr string, n int) ([]*grpc.ClientConn, error) {
	conns := make([]*grpc.ClientConn, 0, n)
	for range n {
		c, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			return conns, err
		}
		conns = append(conns, c)
	}
	return conns, nil
}

// grpcFirstError keeps the first error any caller saw.
type grpcFirstError struct {
	once sync.Once
	err  error
}

// grpcCaller is one caller of the grpc phase, and what it measured.
type grpcCaller struct {
	hist             latency.Histogram
	allowed, refused int64
	errs             int
	late             int64
}

// run calls ShouldRateLimit once per scheduled instant from ticks, for a
// client (and cost) drawn from ch, until ticks is closed; a call that
// starts more than lateAfter behind its instant counts as late.
func (r *grpcCaller) run(ctx context.Context, cfg Config, client rlsv3.RateLimitServiceClient, ch *keydist.Chooser, ticks <-chan time.Time, errs *grpcFirstError) {
	entry := &ratelimitv3.RateLimitDescriptor_Entry{Key: grpcKey}
	req := &rlsv3.RateLimitRequest{Domain: grpcDomain, Descriptors: []*ratelimitv3.RateLimitDescriptor{{
		Entries: []*ratelimitv3.RateLimitDescriptor_Entry{entry}}}}
	for at := range ticks {
		entry.Value = clientKey(ch.Next())
		req.HitsAddend = uint32(ch.Cost(cfg.MaxCost))
		start := time.Now()
		if start.Sub(at) > lateAfter {
			r.late++
		}
		cctx, cancel := context.WithTimeout(ctx, cfg.Timeout)
		resp, err := client.ShouldRateLimit(cctx, req)
		cancel()
		r.hist.Record(int64(time.Since(start)))
		switch {
		case err != nil:
			r.errs++
			errs.once.Do(func() { errs.err = err })
		case resp.OverallCode == rlsv3.RateLimitResponse_OK:
			r.allowed++
		default:
			r.refused++
		}
	}
}

// paceGRPC is the pacer: every millisecond from start, it hands the
// callers the instants of the calls that have come due, rate per second,
// expected-1 in all (or until ctx ends), counting them in sentN; then it
// closes ticks.
func paceGRPC(ctx context.Context, rate int, expected int64, start time.Time, ticks chan<- time.Time, sentN *atomic.Int64) {
	var sent int64
	tk := time.NewTicker(time.Millisecond)
	for sent < expected-1 && ctx.Err() == nil {
		now := <-tk.C
		due := min(int64(now.Sub(start).Seconds()*float64(rate)), expected-1)
		for ; sent < due; sent++ {
			ticks <- start.Add(time.Duration(float64(sent) / float64(rate) * float64(time.Second)))
		}
		sentN.Store(sent)
	}
	tk.Stop()
	close(ticks)
}

// tally adds up the callers' counts and latencies, and notes in
// Disagreement the first error and answers that do not add up to the
// decisions the service made.
func (rep *grpcReport) tally(callers []grpcCaller, elapsed time.Duration, serverDecisions int, firstErr error) {
	rep.DurationNs = int64(elapsed)
	var hist latency.Histogram
	for i := range callers {
		r := &callers[i]
		hist.Merge(&r.hist)
		rep.Allowed += r.allowed
		rep.Refused += r.refused
		rep.Errors += r.errs
		rep.Late += r.late
	}
	rep.Requests = hist.Count()
	rep.Rate = float64(rep.Requests) / elapsed.Seconds()
	rep.Latency = hist.Summary()
	rep.ServerDecisions = serverDecisions
	if rep.Errors > 0 && firstErr != nil {
		rep.Disagreement = "first error: " + firstErr.Error()
	}
	if got := rep.Allowed + rep.Refused; got != int64(rep.ServerDecisions) {
		rep.Disagreement = strings.TrimPrefix(rep.Disagreement+"; ", "; ") +
			fmt.Sprintf("%d answered decisions, %d made by the service", got, rep.ServerDecisions)
	}
}

// verifyRecorded replays what backend recorded, and notes in Disagreement
// responses that do not add up to it.
func (rep *grpcReport) verifyRecorded(backend *grpcRecorder, p engine.Policy) {
	if backend.rec == nil {
		rep.Verification = verification{Reason: "--verify is off"}
		return
	}
	recs, err := backend.rec.Records()
	if err != nil {
		rep.Verification = verification{Reason: err.Error()}
		return
	}
	rep.Verification = verify([]engine.Policy{p}, recs, backend.rec.keyName)
	if rep.Verification.Allowed != int(rep.Allowed) || rep.Verification.Refused != int(rep.Refused) {
		rep.Disagreement = strings.TrimPrefix(rep.Disagreement+"; ", "; ") + fmt.Sprintf("responses: %d OK, %d OVER_LIMIT; recorded: %d allowed, %d refused",
			rep.Allowed, rep.Refused, rep.Verification.Allowed, rep.Verification.Refused)
	}
}

func (g *grpcReport) writeText(p func(string, ...any)) {
	p("grpc      %s, %d connections, paced at %.0f/s for %v; policy %s (%d per %v, %s)", g.Target, g.Connections, g.TargetRate,
		time.Duration(g.DurationNs).Round(time.Millisecond), g.Policy.Name, g.Policy.Limit, time.Duration(g.Policy.WindowNs), g.Policy.Algorithm)
	p("  ShouldRateLimit: %s calls at %.1f decisions/s (target %.0f/s), %s sent late; OK %s, OVER_LIMIT %s, errors %d",
		commas(int64(g.Requests)), g.Rate, g.TargetRate, commas(g.Late), commas(g.Allowed), commas(g.Refused), g.Errors)
	p("  latency (client side, per call): p50 %s, p99 %s, p99.9 %s, max %s",
		fmtNs(g.Latency.P50Ns), fmtNs(g.Latency.P99Ns), fmtNs(g.Latency.P999Ns), fmtNs(g.Latency.MaxNs))
	p("  decisions (made by the service's group): %s", commas(int64(g.ServerDecisions)))
	g.writeRounds(p)
	p("  verify: %s", fmtVerification(g.Verification))
	if g.Disagreement != "" {
		p("  DISAGREEMENT: %s", g.Disagreement)
	}
}
