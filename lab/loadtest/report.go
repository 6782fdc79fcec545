package loadtest

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/slidegate/slidegate/internal/numfmt"
	"github.com/slidegate/slidegate/lab/internal/keydist"
	"github.com/slidegate/slidegate/lab/internal/latency"
)

// machineInfo describes where a run ran.
type machineInfo struct {
	CPUModel   string `json:"cpu_model,omitempty"` // from /proc/cpuinfo (Linux)
	GoVersion  string `json:"go_version"`
	OS         string `json:"os"`
	Arch       string `json:"arch"`
	NumCPU     int    `json:"num_cpu"`
	GOMAXPROCS int    `json:"gomaxprocs"`
	// LoadBefore and LoadAfter are the 1-minute load averages when the
	// run began and ended (Linux): a load well above NumCPU means other
	// work shared the machine and the timings are pessimistic.
	LoadBefore float64 `json:"load_before"`
	LoadAfter  float64 `json:"load_after"`
	// CPUSeconds is the CPU time the process used (user + system).
	CPUSeconds float64 `json:"cpu_seconds"`
}

// The performance targets. Each is a ratio of two figures measured in the
// same run (the engine against the textbook log or the floor, the server
// against the no-op handler), so that a machine's speed cancels out (its
// pauses do not: pauses.go); the absolute figures are reported beside
// them and not judged.
const (
	targetMemoryRatio   = 0.5  // engine heap / textbook log heap, at most
	targetP99OverFloor  = 2.0  // engine p99 / the floor's p99, at most
	targetP999OverFloor = 2.0  // engine p99.9 / the floor's p99.9, at most
	targetCapacityRatio = 0.90 // slidegate's capacity / the no-op's, at least
)

// targetResult is one of the performance targets, checked against the run. A
// missed target fails the run only under --strict; correctness always
// decides.
type targetResult struct {
	Name string `json:"name"`
	Want string `json:"want"`
	Got  string `json:"got"`
	Met  bool   `json:"met"`
	// Verdict is met, missed or undecided; Why says why a target was
	// undecided (too noisy, or the machine too busy to judge).
	Verdict string `json:"verdict"`
	Why     string `json:"why,omitempty"`
	// Spread is what the target was judged from: every round's ratio
	// and the interval of the median.
	Spread spread  `json:"spread"`
	Bound  float64 `json:"bound"`
}

// report is everything a run measured. It is written as report.json and
// summarized as summary.txt and on the terminal.
type report struct {
	Title      string          `json:"title,omitempty"`
	Started    time.Time       `json:"started"`
	DurationNs int64           `json:"duration_ns"`
	Machine    machineInfo     `json:"machine"`
	Config     Config          `json:"config"`
	Memory     *memoryReport   `json:"memory,omitempty"`
	Engine     *engineReport   `json:"engine,omitempty"`
	HTTP       *httpReport     `json:"http,omitempty"`
	Capacity   *capacityReport `json:"capacity,omitempty"`
	Scale      *scaleReport    `json:"scale,omitempty"`
	Redis      *redisReport    `json:"redis,omitempty"`
	GRPC       *grpcReport     `json:"grpc,omitempty"`
	Targets    []targetResult  `json:"targets"`
	// Correct is true when every verified phase found no mismatch, over-
	// or under-admission, no request failed, and no phase was left
	// unverified while --verify asked for it (an external target cannot be
	// verified and does not count against it). Failures lists what was
	// wrong.
	Correct  bool     `json:"correct"`
	Failures []string `json:"failures,omitempty"`
	// TargetsMet is true when every target was met.
	TargetsMet bool `json:"targets_met"`
	// OK decides the exit status: Correct, and under --strict TargetsMet.
	OK      bool              `json:"ok"`
	Verdict string            `json:"verdict"`
	Files   map[string]string `json:"files"`
}

func machine() machineInfo {
	return machineInfo{CPUModel: cpuModel(), GoVersion: runtime.Version(), OS: runtime.GOOS, Arch: runtime.GOARCH,
		NumCPU: runtime.NumCPU(), GOMAXPROCS: runtime.GOMAXPROCS(0), LoadBefore: loadAverage()}
}

// loadAverage returns the 1-minute load average (Linux; 0 elsewhere).
func loadAverage() float64 {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return 0
	}
	f := strings.Fields(string(b))
	if len(f) == 0 {
		return 0
	}
	v, _ := strconv.ParseFloat(f[0], 64)
	return v
}

// judge fills Targets, Correct, TargetsMet, OK and Verdict.
func (r *report) judge() {
	r.Correct, r.Failures = true, nil
	fail := func(msg string) {
		r.Correct = false
		r.Failures = append(r.Failures, msg)
	}
	verified := 0
	check := func(phase string, v verification) {
		if v.Verified {
			verified++
		}
		switch {
		case v.Verified && !v.OK():
			fail(fmt.Sprintf("%s: %d mismatches, %d over-admissions, %d under-admissions",
				phase, v.Mismatches, v.OverAdmissions, v.UnderAdmissions))
		case !v.Verified && r.Config.Verify && v.Reason != "" && !strings.HasPrefix(v.Reason, "external") && !strings.HasPrefix(v.Reason, "--verify"):
			fail(phase + ": not verified: " + v.Reason)
		}
	}
	server := func(phase string, errs int, v verification, disagreement string) {
		if errs > 0 {
			fail(fmt.Sprintf("%s: %d requests failed", phase, errs))
		}
		check(phase, v)
		if disagreement != "" {
			fail(phase + ": " + disagreement)
		}
	}
	r.Targets = nil
	add := func(name string, g goal, unit string, j judgement) {
		r.Targets = append(r.Targets, targetResult{Name: name, Want: g.want(unit), Got: j.describe(g, unit),
			Met: j.Verdict == verdictMet, Verdict: j.Verdict, Why: j.Why, Spread: j.Spread, Bound: g.Bound})
	}
	if m := r.Memory; m != nil {
		add("memory: engine heap / textbook log", memoryGoal, "×", judgeOnce(m.Ratio, memoryGoal))
	}
	if e := r.Engine; e != nil {
		if p99, p999 := e.judgements(); p99 != nil {
			add("engine: p99 / the floor's p99", p99Goal, "×", *p99)
			add("engine: p99.9 / the floor's p99.9", p999Goal, "×", *p999)
		}
		check("engine", e.Verification)
	}
	if h := r.HTTP; h != nil {
		server("http", h.Errors, h.Verification, h.Disagreement)
	}
	if c := r.Capacity; c != nil {
		add("capacity: slidegate / no-op", capacityGoal, "", c.Judgement)
		// A failed request makes its slice hold nothing: capacity
		// slices judge errors; only the decisions must be right.
		check("capacity", c.Verification)
		if c.Disagreement != "" {
			fail("capacity: " + c.Disagreement)
		}
	}
	if g := r.GRPC; g != nil {
		if len(g.Rounds) > 0 {
			add("grpc: no-op CPU/call / the service's", grpcTarget.goal, "", grpcTarget.judge(g.Rounds))
		}
		server("grpc", g.Errors, g.Verification, g.Disagreement)
	}
	if rd := r.Redis; rd != nil {
		for _, d := range rd.Deployments {
			if len(d.Rounds) > 0 {
				add("redis "+d.Name+": store / redis-benchmark per Redis core", redisTarget.goal, "", redisTarget.judge(d.Rounds))
			}
			check("redis "+d.Name+" engine-style", d.Engine.Verification)
			if d.Engine.Errors > 0 {
				fail(fmt.Sprintf("redis %s engine-style: %d decisions failed", d.Name, d.Engine.Errors))
			}
			if d.HTTP != nil {
				server("redis "+d.Name+" http", d.HTTP.Errors, d.HTTP.Verification, d.HTTP.Disagreement)
			}
		}
	}
	r.TargetsMet = true
	var missed, undecided []string
	for _, t := range r.Targets {
		switch t.Verdict {
		case verdictMet:
		case verdictMissed:
			missed = append(missed, t.Name)
		default:
			undecided = append(undecided, t.Name)
		}
		r.TargetsMet = r.TargetsMet && t.Met
	}
	r.OK = r.Correct && (r.TargetsMet || !r.Config.Strict)
	var v []string
	switch {
	case r.Correct && verified == 0:
		v = append(v, "correctness: no decision to verify in these phases")
	case r.Correct:
		v = append(v, "correctness PASS: every verified decision matches the reference model")
	default:
		v = append(v, "correctness FAIL: "+strings.Join(r.Failures, "; "))
	}
	if len(r.Targets) > 0 {
		v = append(v, targetsLine(len(r.Targets), missed, undecided, r.Config.Strict))
	}
	r.Verdict = strings.Join(v, "\n")
}

// targetsLine is the verdict's line on the targets: all met, or which
// were missed and which could not be judged.
func targetsLine(n int, missed, undecided []string, strict bool) string {
	if len(missed) == 0 && len(undecided) == 0 {
		return fmt.Sprintf("targets: all %d met", n)
	}
	var parts []string
	if len(missed) > 0 {
		parts = append(parts, fmt.Sprintf("%d of %d missed (%s)", len(missed), n, strings.Join(missed, ", ")))
	}
	if len(undecided) > 0 {
		parts = append(parts, fmt.Sprintf("%d of %d undecided, too noisy or the machine too busy to judge (%s)", len(undecided), n, strings.Join(undecided, ", ")))
	}
	if strict {
		return "targets FAIL (--strict): " + strings.Join(parts, "; ")
	}
	return "targets: " + strings.Join(parts, "; ") + "; reported, not enforced without --strict"
}

// The targets' goals.
var (
	memoryGoal = goal{Bound: targetMemoryRatio, AtMost: true}
	p99Goal    = goal{Bound: targetP99OverFloor, AtMost: true}
	p999Goal   = goal{Bound: targetP999OverFloor, AtMost: true}
)

// judgeOnce judges a figure measured once that does not depend on timing
// (heap bytes): met or missed on the figure itself.
func judgeOnce(x float64, g goal) judgement {
	j := judgement{Spread: spread{Rounds: []float64{x}, Clean: 1, Median: x, Lo: x, Hi: x, Confidence: 1}}
	switch {
	case !(x > 0):
		j.Verdict, j.Why = verdictUndecided, "not measured"
	case g.good(x):
		j.Verdict = verdictMet
	default:
		j.Verdict = verdictMissed
	}
	return j
}

// writeJSON writes the report as indented JSON.
func (r *report) writeJSON(path string) error {
	b, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(path, append(b, '\n'), 0o644)
}

// writeText writes the human summary: the run's header, a section per
// phase, the targets and the verdict, and the files written.
func (r *report) writeText(w io.Writer) {
	p := func(format string, args ...any) { fmt.Fprintf(w, format+"\n", args...) }
	r.writeHeader(p)
	section(p, r.Memory)
	section(p, r.Engine)
	section(p, r.HTTP)
	section(p, r.Capacity)
	section(p, r.Scale)
	section(p, r.GRPC)
	section(p, r.Redis)
	r.writeFiles(p)
	r.writeVerdict(p)
}

// section writes a phase's section of the summary, when the phase ran.
func section[T any, P interface {
	*T
	writeText(func(string, ...any))
}](p func(string, ...any), phase P) {
	if phase != nil {
		phase.writeText(p)
	}
}

// writeHeader writes the summary's first lines: the run, the machine and
// the client population.
func (r *report) writeHeader(p func(string, ...any)) {
	c := r.Config
	title := "slidegate load test"
	if r.Title != "" {
		title += ": " + r.Title
	}
	cpu := ""
	if r.Machine.CPUModel != "" {
		cpu = r.Machine.CPUModel + ", "
	}
	p("%s — %s, %s%s %s/%s, %d CPUs (GOMAXPROCS %d), %.1f s",
		title, r.Started.UTC().Format("2006-01-02 15:04 UTC"), cpu, r.Machine.GoVersion, r.Machine.OS, r.Machine.Arch,
		r.Machine.NumCPU, r.Machine.GOMAXPROCS, time.Duration(r.DurationNs).Seconds())
	dist := c.Dist
	if dist == keydist.Zipf {
		dist = fmt.Sprintf("zipf (s=%g)", c.ZipfS)
	}
	p("clients %s, keys %s; load average %.2f before, %.2f after; the process used %.1f CPU-seconds in %.1f s",
		commas(int64(c.Clients)), dist, r.Machine.LoadBefore, r.Machine.LoadAfter, r.Machine.CPUSeconds, time.Duration(r.DurationNs).Seconds())
}

// writeVerdict writes the run's last lines: the targets, met or missed,
// the absolute figures (shown, not judged), and the verdict.
func (r *report) writeVerdict(p func(string, ...any)) {
	if len(r.Targets) > 0 {
		p("")
		p("targets: ratios of figures measured side by side in this run, judged on the interval of their median over the rounds")
		p("(met or missed only when the whole interval is on one side of the bound; they fail the run only with --strict)")
		if b := r.budgetLine(); b != "" {
			p("(capacity, undecided at its first look, is measured on and looked at once more; the looks share a 10%% chance")
			p("that the judged interval misses the median, so a run's met or missed is wrong at most 5%% of the time)")
			p("%s", b)
		}
		for _, t := range r.Targets {
			mark := t.Verdict
			switch t.Verdict {
			case verdictMissed:
				mark = "MISSED"
			case verdictUndecided:
				mark = "UNDECIDED: " + t.Why
			}
			p("  %-36s want %-8s %s", t.Name, t.Want, mark)
			p("  %-36s got %s", "", t.Got)
			if len(t.Spread.Rounds) > 1 {
				p("  %-36s rounds %s", "", t.Spread.roundsList(t.Bound))
			}
		}
	}
	if fig := r.figures(); len(fig) > 0 {
		p("on this machine (shown, not judged; load average %.2f before, %.2f after):", r.Machine.LoadBefore, r.Machine.LoadAfter)
		for _, f := range fig {
			p("  %s", f)
		}
	}
	p("")
	p("%s", r.Verdict)
	if !r.OK {
		p("exit status 1")
	}
}

// budgetLine is the time budget of the timed targets' rounds and how
// long they ran.
func (r *report) budgetLine() string {
	var parts []string
	if c := r.Capacity; c != nil && c.Plan.looks() > 1 {
		parts = append(parts, fmt.Sprintf("capacity %.0f s (ran %.1f s, %d rounds)", c.Plan.Budget.Seconds(), time.Duration(c.RoundsNs).Seconds(), len(c.Judgement.Spread.Rounds)))
	}
	if len(parts) == 0 {
		return ""
	}
	return "time budget of the rounds: " + strings.Join(parts, ", ")
}

// figures are the run's absolute figures, one line per phase: they
// depend on the machine and its other load, so they are not judged.
func (r *report) figures() []string {
	var out []string
	if m := r.Memory; m != nil {
		out = append(out, fmt.Sprintf("memory    %.1f B of heap per client (textbook log %.1f B)", m.Engine.HeapPerClient, m.Textbook.HeapPerClient))
	}
	if e := r.Engine; e != nil {
		s := fmt.Sprintf("engine    %s decisions/s, p50 %s, p99 %s, p99.9 %s", si(e.Throughput), fmtNs(e.Latency.P50Ns), fmtNs(e.Latency.P99Ns), fmtNs(e.Latency.P999Ns))
		if f := e.Floor; f != nil {
			s += fmt.Sprintf(" (floor: %s/s, p99 %s, p99.9 %s)", si(f.Throughput), fmtNs(f.Latency.P99Ns), fmtNs(f.Latency.P999Ns))
		}
		out = append(out, s)
	}
	if h := r.HTTP; h != nil {
		out = append(out, fmt.Sprintf("http      %.0f of %.0f req/s sent, p50 %s, p99 %s (vegeta, client side)", h.Rate, h.TargetRate, fmtNs(h.Latency.P50Ns), fmtNs(h.Latency.P99Ns)))
	}
	if c := r.Capacity; c != nil {
		out = append(out, c.machineLine())
	}
	if g := r.GRPC; g != nil {
		out = append(out, fmt.Sprintf("grpc      %.0f of %.0f req/s sent", g.Rate, g.TargetRate))
	}
	return out
}

// writeFiles lists the files written, by name.
func (r *report) writeFiles(p func(string, ...any)) {
	if len(r.Files) == 0 {
		return
	}
	names := make([]string, 0, len(r.Files))
	for k := range r.Files {
		names = append(names, k)
	}
	sort.Strings(names)
	p("files:")
	for _, k := range names {
		p("  %-14s %s", k, r.Files[k])
	}
}

func tierNames(ps []policyReport) string {
	var s []string
	for _, p := range ps {
		s = append(s, fmt.Sprintf("%s %d/%v", p.Name, p.Limit, time.Duration(p.WindowNs)))
	}
	return strings.Join(s, ", ")
}

func fmtCodes(m map[string]int) string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var s []string
	for _, k := range keys {
		s = append(s, fmt.Sprintf("%s: %s", k, commas(int64(m[k]))))
	}
	return strings.Join(s, ", ")
}

func fmtVerification(v verification) string {
	if !v.Verified {
		return "not verified: " + v.Reason
	}
	s := fmt.Sprintf("%s decisions replayed through the reference model: %d mismatches, %d over-admissions, %d under-admissions",
		commas(int64(v.Records)), v.Mismatches, v.OverAdmissions, v.UnderAdmissions)
	if v.Approximate {
		s += " (counter: replayed through its own model; over- and under-admissions are not counted)"
	}
	if v.OK() {
		return s + " — OK"
	}
	for _, e := range v.Examples {
		s += "\n    " + e
	}
	return s
}

func fmtLatency(l latency.Summary) string {
	return fmt.Sprintf("p50 %s  p90 %s  p99 %s  p99.9 %s  max %s  mean %s",
		fmtNs(l.P50Ns), fmtNs(l.P90Ns), fmtNs(l.P99Ns), fmtNs(l.P999Ns), fmtNs(l.MaxNs), fmtNs(l.MeanNs))
}

func fmtBytes(b int64) string {
	switch {
	case b < 0:
		return "-" + fmtBytes(-b)
	case b < 10<<10:
		return fmt.Sprintf("%d B", b)
	case b < 10<<20:
		return fmt.Sprintf("%.1f KiB", float64(b)/(1<<10))
	default:
		return fmt.Sprintf("%.1f MiB", float64(b)/(1<<20))
	}
}

// The report formats its figures as the results page does.
var (
	fmtNs  = numfmt.Ns
	si     = numfmt.SI
	commas = numfmt.Commas
)
