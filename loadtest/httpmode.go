package loadtest

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	vegeta "github.com/tsenart/vegeta/v12/lib"
	"github.com/tsenart/vegeta/v12/lib/plot"

	"github.com/slidegate/slidegate/engine"
	"github.com/slidegate/slidegate/server"
)

// HTTPReport is the http phase's outcome.
type HTTPReport struct {
	Target     string       `json:"target"`
	InProcess  bool         `json:"in_process"`
	Pacing     string       `json:"pacing"`
	Policies   []PolicyInfo `json:"policies"`
	TargetRate float64      `json:"target_rate"` // mean rate the pacer asked for
	DurationNs int64        `json:"duration_ns"`
	Requests   uint64       `json:"requests"`
	Rate       float64      `json:"rate"` // achieved send rate
	Success    float64      `json:"success"`
	// Errors counts requests that got neither an allowed decision (200)
	// nor a refusal (429): transport errors, timeouts, other statuses.
	// Success is vegeta's share of 2xx/3xx, so refusals lower it.
	Errors      int            `json:"errors"`
	Allowed     int64          `json:"allowed"`
	Refused     int64          `json:"refused"`
	StatusCodes map[string]int `json:"status_codes"`
	// Latency is over every response, measured by vegeta on the client
	// side (request written to response read).
	Latency Latency `json:"latency"`
	// ServerDecisions is how many decisions the server recorded.
	ServerDecisions int `json:"server_decisions"`
	// Disagreement is set when the responses' outcomes do not add up to
	// the recorded decisions'.
	Disagreement string `json:"disagreement,omitempty"`
	// Baseline is the interleaved /v1/noop requests (in-process runs with
	// --baseline): the HTTP stack's cost without a decision. Requests,
	// Latency and Errors above count the decision requests only; Rate
	// counts both.
	Baseline     *Baseline      `json:"baseline,omitempty"`
	Verification Verification   `json:"verification"`
	Vegeta       vegeta.Metrics `json:"vegeta"`
}

// Baseline is the requests of an attack sent to an endpoint of the same
// server that decides nothing, one in Every, interleaved with the
// decisions.
type Baseline struct {
	Path     string  `json:"path"`
	Every    int     `json:"every"`
	Requests uint64  `json:"requests"`
	Errors   int     `json:"errors"`
	Latency  Latency `json:"latency"`
}

// NewTargeter returns a vegeta targeter of POST base/v1/allow requests
// whose JSON bodies ({"key", "policy", "cost"}) spread over clients keys
// drawn from dist; client i belongs to tier tiers[i % len(tiers)] and
// costs are uniform in [1, maxCost]. It is safe for concurrent use (vegeta
// calls it from every attack worker).
func NewTargeter(base string, tiers []string, clients int, dist string, s float64, seed uint64, maxCost int) (vegeta.Targeter, error) {
	return newTargeter(base, tiers, clients, dist, s, seed, maxCost, 0)
}

// newTargeter is NewTargeter that sends one target in noopEvery (none
// when 0) to /v1/noop instead, with the same kind of body.
func newTargeter(base string, tiers []string, clients int, dist string, s float64, seed uint64, maxCost, noopEvery int) (vegeta.Targeter, error) {
	ch, err := NewChooser(dist, clients, s, seed, 1<<32)
	if err != nil {
		return nil, err
	}
	if len(tiers) == 0 {
		return nil, fmt.Errorf("loadtest: no tiers")
	}
	u := strings.TrimSuffix(base, "/") + "/v1/allow"
	noop := strings.TrimSuffix(base, "/") + noopPath
	hdr := http.Header{"Content-Type": []string{"application/json"}}
	quoted := make([]string, len(tiers))
	for i, t := range tiers {
		quoted[i] = strconv.Quote(t)
	}
	var (
		mu sync.Mutex
		n  int
	)
	return func(t *vegeta.Target) error {
		mu.Lock()
		c := ch.Next()
		cost := ch.Cost(maxCost)
		n++
		to := u
		if noopEvery > 0 && n%noopEvery == 0 {
			to = noop
		}
		mu.Unlock()
		b := make([]byte, 0, 64)
		b = append(b, `{"key":"`...)
		b = append(b, KeyPrefix...)
		b = strconv.AppendInt(b, int64(c), 10)
		b = append(b, `","policy":`...)
		b = append(b, quoted[c%len(tiers)]...)
		b = append(b, `,"cost":`...)
		b = strconv.AppendInt(b, int64(cost), 10)
		b = append(b, '}')
		*t = vegeta.Target{Method: http.MethodPost, URL: to, Body: b, Header: hdr}
		return nil
	}, nil
}

// serverRecorder adapts Recorder to server.WithRecorder.
type serverRecorder struct{ *Recorder }

func (r serverRecorder) Record(rec server.Record) { r.Add(rec.Policy, rec.Key, rec.Cost, rec.Decision) }

// runHTTP attacks a server with vegeta: an in-process one on 127.0.0.1,
// recording its decisions, unless cfg.Target names one.
func runHTTP(ctx context.Context, cfg Config, ui *ui, prof *profiler) (*HTTPReport, *plot.Plot, error) {
	rep := &HTTPReport{Target: cfg.Target, StatusCodes: map[string]int{}}
	policies := make([]engine.Policy, len(cfg.Tiers))
	for i := range cfg.Tiers {
		policies[i] = cfg.Policy(i)
		rep.Policies = append(rep.Policies, policyInfo(policies[i]))
	}
	var rec *Recorder
	if cfg.Target == "" {
		rep.InProcess = true
		scfg := server.DefaultConfig()
		scfg.Listen, scfg.Admin = "127.0.0.1:0", "off"
		scfg.Policies = nil
		for _, p := range policies {
			scfg.Policies = append(scfg.Policies, server.PolicyConfig{Name: p.Name, Limit: p.Limit, Window: p.Window, Algorithm: p.Algorithm.String()})
		}
		scfg.DefaultPolicy = policies[0].Name
		opts := []server.Option{server.WithLogger(slog.New(slog.NewTextHandler(io.Discard, nil)))}
		if cfg.Verify {
			rec = NewRecorder(cfg.Tiers, cfg.Clients, int(cfg.MaxRecords))
			opts = append(opts, server.WithRecorder(serverRecorder{rec}))
		}
		srv, err := server.New(scfg, opts...)
		if err != nil {
			return nil, nil, fmt.Errorf("loadtest: in-process server: %w", err)
		}
		if err := srv.Start(); err != nil {
			_ = srv.Close()
			return nil, nil, fmt.Errorf("loadtest: in-process server: %w", err)
		}
		defer func() {
			sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			_ = srv.Shutdown(sctx)
		}()
		rep.Target = "http://" + srv.Addr()
	} else if err := reachable(ctx, cfg.Target); err != nil {
		return nil, nil, err
	}

	noopEvery := 0
	if rep.InProcess && cfg.Baseline {
		noopEvery = baselineEvery
	}
	tr, err := newTargeter(rep.Target, cfg.Tiers, cfg.Clients, cfg.Dist, cfg.ZipfS, cfg.Seed, cfg.MaxCost, noopEvery)
	if err != nil {
		return nil, nil, err
	}
	maxHits := uint64(cfg.maxHTTPRequests())
	var pacer vegeta.Pacer = vegeta.ConstantPacer{Freq: cfg.Rate, Per: time.Second}
	rep.Pacing = fmt.Sprintf("constant %d/s", cfg.Rate)
	rep.TargetRate = float64(cfg.Rate)
	if cfg.RampTo > 0 {
		pacer = vegeta.LinearPacer{
			StartAt: vegeta.ConstantPacer{Freq: cfg.Rate, Per: time.Second},
			Slope:   float64(cfg.RampTo-cfg.Rate) / cfg.HTTPDuration.Seconds(),
		}
		rep.Pacing = fmt.Sprintf("ramp %d/s → %d/s", cfg.Rate, cfg.RampTo)
		rep.TargetRate = float64(cfg.Rate+cfg.RampTo) / 2
	}
	pl := plot.New(plot.Title("slidegate http: POST /v1/allow latency, and /v1/noop on the same server"),
		plot.Downsample(4000), plot.Label(statusLabel))
	res, err := attack(ctx, cfg, tr, pacer, cfg.HTTPDuration, maxHits, ui, pl)
	pl.Close()
	if err != nil {
		return nil, nil, err
	}
	rep.DurationNs = int64(res.duration)
	rep.Allowed, rep.Refused, rep.Errors = res.allowed, res.refused, res.errors
	m := res.metrics
	if noopEvery > 0 {
		rep.Baseline = &Baseline{Path: noopPath, Every: noopEvery, Requests: res.base.Count(), Errors: res.baseErrors, Latency: res.base.Summary()}
	}
	prof.heap("http")
	rep.Requests, rep.Success = m.Requests, m.Success
	rep.Rate = res.all.Rate
	rep.StatusCodes = m.StatusCodes
	rep.Latency = res.hist.Summary()
	rep.Vegeta = m

	switch {
	case rec != nil:
		recs, err := rec.Records()
		rep.ServerDecisions = len(recs)
		if err != nil {
			rep.Verification = Verification{Reason: err.Error()}
			break
		}
		var groups atomic.Int64
		vbar := ui.bar(verifyBuckets, "http: verify", &groups)
		rep.Verification = verifyProgress(policies, recs, rec.keyName, &groups)
		vbar.finish()
		// What the clients saw must be what the server recorded: as many
		// 200s as accepts and 429s as refusals (when no request failed).
		if rep.Errors == 0 && (int64(rep.Verification.Allowed) != rep.Allowed || int64(rep.Verification.Refused) != rep.Refused) {
			rep.Disagreement = fmt.Sprintf("clients saw %d allowed and %d refused, the server recorded %d and %d",
				rep.Allowed, rep.Refused, rep.Verification.Allowed, rep.Verification.Refused)
		}
	case cfg.Target != "":
		rep.Verification = Verification{Reason: "external target: its decisions are not visible to the harness"}
	default:
		rep.Verification = Verification{Reason: "--verify=false"}
	}
	return rep, pl, nil
}

// The baseline: one request in baselineEvery goes to noopPath, which the
// server answers 204 without deciding. Interleaved with the decisions, it
// sees the same machine, connections and moment, so the difference in
// latency is what the decision costs over HTTP.
const (
	baselineEvery = 10
	noopPath      = "/v1/noop"
)

// attackResult is what one vegeta attack measured.
type attackResult struct {
	all              vegeta.Metrics // every request (the achieved rate)
	metrics          vegeta.Metrics // decision requests only
	hist             Histogram      // decision requests' latency
	allowed, refused int64
	errors           int
	base             Histogram // baseline requests' latency
	baseErrors       int
	duration         time.Duration
}

// attack runs one vegeta attack of at most dur and maxHits requests,
// feeding every result to the metrics, the histograms and the plot. A
// cancelled ctx stops it (and returns ctx's error).
func attack(ctx context.Context, cfg Config, tr vegeta.Targeter, pacer vegeta.Pacer, dur time.Duration, maxHits uint64, ui *ui, pl *plot.Plot) (*attackResult, error) {
	atk := vegeta.NewAttacker(
		vegeta.Connections(cfg.Connections),
		vegeta.MaxConnections(cfg.Connections),
		vegeta.MaxWorkers(uint64(4*cfg.Connections)),
		vegeta.Timeout(cfg.Timeout),
		vegeta.KeepAlive(true),
		vegeta.HTTP2(false),
		vegeta.MaxBody(4096),
	)
	r := &attackResult{}
	var done atomic.Int64
	bar := ui.bar(int64(maxHits), "http: requests", &done)
	stopWatch := make(chan struct{})
	watchDone := make(chan struct{})
	go func() {
		defer close(watchDone)
		select {
		case <-ctx.Done():
			atk.Stop()
		case <-stopWatch:
		}
	}()
	start := time.Now()
	// Bound the count as well as the time: the pacer stops at maxHits.
	for res := range atk.Attack(tr, boundedPacer{pacer, maxHits}, dur, "http") {
		r.all.Add(res)
		_ = pl.Add(res)
		if strings.HasSuffix(res.URL, noopPath) {
			r.base.Record(int64(res.Latency))
			if res.Code != http.StatusNoContent {
				r.baseErrors++
			}
		} else {
			r.metrics.Add(res)
			r.hist.Record(int64(res.Latency))
			switch res.Code { // vegeta sets Error on a 429 too: the code decides
			case http.StatusOK:
				r.allowed++
			case http.StatusTooManyRequests:
				r.refused++
			default:
				r.errors++
			}
		}
		done.Add(1)
	}
	r.duration = time.Since(start)
	close(stopWatch)
	<-watchDone
	bar.finish()
	r.all.Close()
	r.metrics.Close()
	return r, ctx.Err()
}

// boundedPacer stops an attack after max hits.
type boundedPacer struct {
	vegeta.Pacer
	max uint64
}

var _ vegeta.Pacer = boundedPacer{}

// Pace implements vegeta.Pacer.
func (p boundedPacer) Pace(elapsed time.Duration, hits uint64) (time.Duration, bool) {
	if hits >= p.max {
		return 0, true
	}
	return p.Pacer.Pace(elapsed, hits)
}

// statusLabel splits the plot into allowed (200), refused (429) and
// errors.
func statusLabel(r *vegeta.Result) string {
	switch r.Code {
	case http.StatusNoContent:
		return "204 noop"
	case http.StatusOK:
		return "200 allowed"
	case http.StatusTooManyRequests:
		return "429 refused"
	}
	return "error"
}

// reachable dials the target's host, so that a wrong address fails at
// once with one line instead of a flood of errors.
func reachable(ctx context.Context, target string) error {
	u, err := url.Parse(target)
	if err != nil {
		return fmt.Errorf("--target %q: %v", target, err)
	}
	host := u.Host
	if u.Port() == "" {
		port := "80"
		if u.Scheme == "https" {
			port = "443"
		}
		host = net.JoinHostPort(u.Hostname(), port)
	}
	d := net.Dialer{Timeout: 3 * time.Second}
	c, err := d.DialContext(ctx, "tcp", host)
	if err != nil {
		return fmt.Errorf("--target %s: unreachable: %v", target, err)
	}
	return c.Close()
}
