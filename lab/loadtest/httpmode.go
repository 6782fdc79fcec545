package loadtest

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	vegeta "github.com/tsenart/vegeta/v12/lib"
	"github.com/tsenart/vegeta/v12/lib/plot"

	"github.com/slidegate/slidegate/engine"
	"github.com/slidegate/slidegate/lab/internal/keydist"
)

// httpReport is the http phase's outcome. Requests and decisions are
// counted apart: Requests is what vegeta sent (every one has a result),
// Decisions what the server decided (recorded at its backends), and the
// responses' 200s and 429s (Allowed, Refused) must add up to the recorded
// decisions when no request failed.
type httpReport struct {
	Target     string         `json:"target"`
	InProcess  bool           `json:"in_process"`
	Pacing     string         `json:"pacing"`
	Policies   []policyReport `json:"policies"`
	TargetRate float64        `json:"target_rate"` // mean rate the pacer asked for
	DurationNs int64          `json:"duration_ns"` // vegeta's attack duration
	// Requests, Rate, Throughput and Success are vegeta's (`vegeta report`
	// on Results prints them): every request sent, the send rate, the rate
	// of 2xx/3xx responses, and their share (refusals, 429, lower it).
	Requests   uint64  `json:"requests"`
	Rate       float64 `json:"rate"`
	Throughput float64 `json:"throughput"`
	Success    float64 `json:"success"`
	// Errors counts requests that got neither an allowed decision (200)
	// nor a refusal (429): transport errors, timeouts, other statuses.
	Errors      int            `json:"errors"`
	Allowed     int64          `json:"allowed"`
	Refused     int64          `json:"refused"`
	StatusCodes map[string]int `json:"status_codes"`
	// Latency is vegeta's over every request (client side: request
	// written to response read), the numbers `vegeta report` prints.
	Latency vegetaLatencies `json:"latency"`
	// Results is the file of every result in vegeta's encoding.
	Results string `json:"results,omitempty"`
	// Decisions is how many decisions the server recorded.
	Decisions int `json:"decisions"`
	// Disagreement is set when the responses' outcomes do not add up to
	// the recorded decisions'.
	Disagreement string       `json:"disagreement,omitempty"`
	Verification verification `json:"verification"`
}

// newTargeter returns a vegeta targeter of POST base/v1/allow requests
// whose JSON bodies ({"key", "policy", "cost"}) spread over cfg.Clients
// keys drawn from cfg.Dist (cfg.ZipfS, cfg.Seed); client i belongs to tier
// tiers[i % len(tiers)] and costs are uniform in [1, cfg.MaxCost]. It is
// safe for concurrent use (vegeta calls it from every attack worker).
func newTargeter(base string, tiers []string, cfg Config) (vegeta.Targeter, error) {
	clients, dist, s, seed, maxCost := cfg.Clients, cfg.Dist, cfg.ZipfS, cfg.Seed, cfg.MaxCost
	ch, err := keydist.NewChooser(dist, clients, s, seed, 1<<32)
	if err != nil {
		return nil, err
	}
	if len(tiers) == 0 {
		return nil, fmt.Errorf("loadtest: no tiers")
	}
	u := strings.TrimSuffix(base, "/") + "/v1/allow"
	hdr := http.Header{"Content-Type": []string{"application/json"}}
	quoted := make([]string, len(tiers))
	for i, t := range tiers {
		quoted[i] = strconv.Quote(t)
	}
	var mu sync.Mutex
	return func(t *vegeta.Target) error {
		mu.Lock()
		c := ch.Next()
		cost := ch.Cost(maxCost)
		mu.Unlock()
		b := make([]byte, 0, 64)
		b = append(b, `{"key":"`...)
		b = append(b, keyPrefix...)
		b = strconv.AppendInt(b, int64(c), 10)
		b = append(b, `","policy":`...)
		b = append(b, quoted[c%len(tiers)]...)
		b = append(b, `,"cost":`...)
		b = strconv.AppendInt(b, int64(cost), 10)
		b = append(b, '}')
		*t = vegeta.Target{Method: http.MethodPost, URL: u, Body: b, Header: hdr}
		return nil
	}, nil
}

// runHTTP attacks a server with vegeta: an in-process one on 127.0.0.1,
// recording its decisions, unless cfg.Target names one. Results go to
// http-results.bin under cfg.Out.
func runHTTP(ctx context.Context, cfg Config, ui *ui, prof *profiler) (*httpReport, *plot.Plot, error) {
	rep := &httpReport{Target: cfg.Target, StatusCodes: map[string]int{}}
	policies := cfg.policies()
	for _, p := range policies {
		rep.Policies = append(rep.Policies, policyInfo(p))
	}
	rec, closeTarget, err := startHTTPTarget(ctx, cfg, policies, rep)
	if err != nil {
		return nil, nil, err
	}
	defer closeTarget()
	pacer := rep.pace(cfg)
	pl := plot.New(plot.Title("slidegate http: POST /v1/allow latency (vegeta, client side)"),
		plot.Downsample(4000), plot.Label(statusLabel))
	rep.Results = filepath.Join(cfg.Out, "http-results.bin")
	a := attack{base: rep.Target, policies: policies, pacer: pacer, dur: cfg.HTTPDuration,
		maxHits: uint64(cfg.maxHTTPRequests()), name: "http", plot: pl}
	res, err := attackToFile(ctx, cfg, a, rep.Results, ui)
	pl.Close()
	if err != nil {
		return nil, nil, err
	}
	prof.heap("http")
	res.fill(rep)
	rep.Verification, rep.Decisions, rep.Disagreement = verifyServer(ui, "http", policies, rec, res, cfg)
	return rep, pl, nil
}

// startHTTPTarget starts the in-process server, recording its decisions
// when cfg.Verify (rec is nil otherwise), and sets rep.Target to its
// address; with cfg.Target it only checks that the target is reachable.
// closeTarget stops what it started.
func startHTTPTarget(ctx context.Context, cfg Config, policies []engine.Policy, rep *httpReport) (rec *recorder, closeTarget func(), err error) {
	if cfg.Target != "" {
		return nil, func() {}, reachable(ctx, cfg.Target)
	}
	rep.InProcess = true
	if cfg.Verify {
		rec = newRecorder(cfg.Tiers, cfg.Clients, int(cfg.MaxRecords))
	}
	tg, err := startMemorySlidegate(policies, rec)
	if err != nil {
		return nil, nil, err
	}
	rep.Target = tg.base
	return rec, tg.close, nil
}

// pace returns the http phase's pacer, cfg.Rate constant or ramping
// linearly to cfg.RampTo, and describes it in r.
func (r *httpReport) pace(cfg Config) vegeta.Pacer {
	constant := vegeta.ConstantPacer{Freq: cfg.Rate, Per: time.Second}
	if cfg.RampTo <= 0 {
		r.Pacing = fmt.Sprintf("constant %d/s", cfg.Rate)
		r.TargetRate = float64(cfg.Rate)
		return constant
	}
	r.Pacing = fmt.Sprintf("ramp %d/s → %d/s", cfg.Rate, cfg.RampTo)
	r.TargetRate = float64(cfg.Rate+cfg.RampTo) / 2
	return vegeta.LinearPacer{
		StartAt: constant,
		Slope:   float64(cfg.RampTo-cfg.Rate) / cfg.HTTPDuration.Seconds(),
	}
}

// attackToFile is runAttack with a fresh attacker, saving every result to
// path in vegeta's encoding.
func attackToFile(ctx context.Context, cfg Config, a attack, path string, ui *ui) (*attackResult, error) {
	rf, err := newResultFile(path)
	if err != nil {
		return nil, err
	}
	a.results = rf
	res, err := runAttack(ctx, cfg, newAttacker(cfg), a, ui)
	if err = errors.Join(err, rf.close()); err != nil {
		return nil, err
	}
	return res, nil
}

// policies returns the run's tiers as engine policies.
func (c Config) policies() []engine.Policy {
	out := make([]engine.Policy, len(c.Tiers))
	for i := range c.Tiers {
		out[i] = c.policy(i)
	}
	return out
}

// verifyServer replays what rec recorded (nil: nothing was recorded, and
// the Verification says why) and checks that the responses the clients
// saw add up to it.
func verifyServer(ui *ui, phase string, policies []engine.Policy, rec *recorder, res *attackResult, cfg Config) (v verification, decisions int, disagreement string) {
	switch {
	case rec != nil:
		recs, err := rec.Records()
		decisions = len(recs)
		if err != nil {
			return verification{Reason: err.Error()}, decisions, ""
		}
		var groups atomic.Int64
		vbar := ui.bar(verifyBuckets, phase+": verify", &groups)
		v = verifyProgress(policies, recs, rec.keyName, &groups)
		vbar.finish()
		// What the clients saw must be what the server recorded: as many
		// 200s as accepts and 429s as refusals (when no request failed).
		if res.errors == 0 && (int64(v.Allowed) != res.allowed || int64(v.Refused) != res.refused) {
			disagreement = fmt.Sprintf("clients saw %d allowed and %d refused, the server recorded %d and %d",
				res.allowed, res.refused, v.Allowed, v.Refused)
		}
		return v, decisions, disagreement
	case cfg.Target != "" && phase == "http":
		return verification{Reason: "external target: its decisions are not visible to the harness"}, 0, ""
	default:
		return verification{Reason: "--verify=false"}, 0, ""
	}
}

// attackResult is what one vegeta attack measured.
type attackResult struct {
	metrics          vegeta.Metrics // every request, as vegeta report computes it
	allowed, refused int64
	errors           int
}

// fill copies the attack's figures into rep.
func (r *attackResult) fill(rep *httpReport) {
	m := &r.metrics
	rep.DurationNs = int64(durationOf(m))
	rep.Requests, rep.Rate, rep.Throughput, rep.Success = m.Requests, m.Rate, m.Throughput, m.Success
	rep.StatusCodes = m.StatusCodes
	rep.Latency = vegetaLatency(m)
	rep.Allowed, rep.Refused, rep.Errors = r.allowed, r.refused, r.errors
}

// newAttacker returns the harness's vegeta attacker: cfg.Connections
// keep-alive HTTP/1.1 connections per host. An attacker stops for good
// after one attack.
func newAttacker(cfg Config) *vegeta.Attacker {
	return vegeta.NewAttacker(
		vegeta.Connections(cfg.Connections),
		vegeta.MaxConnections(cfg.Connections),
		vegeta.MaxWorkers(uint64(4*cfg.Connections)),
		vegeta.Timeout(cfg.Timeout),
		vegeta.KeepAlive(true),
		vegeta.HTTP2(false),
		vegeta.MaxBody(4096),
	)
}

// attack is one vegeta attack on base/v1/allow with the run's targeter:
// at most dur and maxHits requests, paced by pacer, shown as name.
type attack struct {
	base     string
	policies []engine.Policy
	pacer    vegeta.Pacer
	dur      time.Duration
	maxHits  uint64
	name     string
	results  *resultFile // every result saved here; nil for none
	plot     *plot.Plot  // fed every result; nil for none
}

// runAttack makes attack a with atk, saving and plotting its results
// where a says. 200 and 429 are decisions; for a no-op target, 204
// counts as allowed. A cancelled ctx stops it (and returns ctx's error).
func runAttack(ctx context.Context, cfg Config, atk *vegeta.Attacker, a attack, ui *ui) (*attackResult, error) {
	base, policies, pacer, dur, maxHits, name, rf, pl := a.base, a.policies, a.pacer, a.dur, a.maxHits, a.name, a.results, a.plot
	tiers := make([]string, len(policies))
	for i, p := range policies {
		tiers[i] = p.Name
	}
	tr, err := newTargeter(base, tiers, cfg)
	if err != nil {
		return nil, err
	}
	r := &attackResult{}
	var done atomic.Int64
	bar := ui.bar(int64(maxHits), name+": requests", &done)
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
	// Bound the count as well as the time: the pacer stops at maxHits.
	for res := range atk.Attack(tr, boundedPacer{pacer, maxHits}, dur, name) {
		rf.add(res)
		r.metrics.Add(res)
		if pl != nil {
			_ = pl.Add(res)
		}
		switch res.Code { // vegeta sets Error on a 429 too: the code decides
		case http.StatusOK, http.StatusNoContent:
			r.allowed++
		case http.StatusTooManyRequests:
			r.refused++
		default:
			r.errors++
		}
		done.Add(1)
	}
	close(stopWatch)
	<-watchDone
	bar.finish()
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
		return "204 no-op"
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

// writeText writes the http section of the summary.
func (h *httpReport) writeText(p func(string, ...any)) {
	p("")
	p("http      %s, %s for %v, %d tiers (%s)", h.Target, h.Pacing, time.Duration(h.DurationNs).Round(time.Millisecond),
		len(h.Policies), tierNames(h.Policies))
	p("  requests (vegeta): %s sent at %.1f/s (target %.0f/s); throughput %.1f/s of 2xx; success %.2f%% (429s count as failures)",
		commas(int64(h.Requests)), h.Rate, h.TargetRate, h.Throughput, 100*h.Success)
	p("  responses: allowed (200) %s, refused (429) %s, errors %d; status codes: %s",
		commas(h.Allowed), commas(h.Refused), h.Errors, fmtCodes(h.StatusCodes))
	p("  latency (vegeta, every request, client side): %s", fmtVegetaLatency(h.Latency))
	if h.Results != "" {
		p("  results: %s (vegeta report %s prints these figures)", h.Results, h.Results)
	}
	p("  decisions (recorded by the server's backends): %s", commas(int64(h.Decisions)))
	p("  verify: %s", fmtVerification(h.Verification))
	if h.Disagreement != "" {
		p("  DISAGREEMENT: %s", h.Disagreement)
	}
}
