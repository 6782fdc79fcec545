package loadtest

import (
	"context"
	"fmt"
	"io"
	"math"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	vegeta "github.com/tsenart/vegeta/v12/lib"

	"github.com/slidegate/slidegate/engine"
)

// TestPairRatio: a round's ratio is slidegate's throughput over the
// no-op's, 0 when slidegate's slice held nothing in a clean round (a
// left-out round keeps the raw ratio); the round is left out
// when other processes used over capacityBusy cores on average over its
// two slices (weighted by their lengths), or when the no-op's slice held
// nothing; unknown others' CPU leaves it clean.
func TestPairRatio(t *testing.T) {
	sl := func(tput, others float64, held bool) capacitySlice {
		return capacitySlice{Throughput: tput, Others: others, Held: held, DurationNs: 300e6}
	}
	for _, tc := range []struct {
		name      string
		sg, noop  capacitySlice
		ratio     float64
		disturbed bool
	}{
		{"clean", sl(27_000, 0.05, true), sl(30_000, 0.1, true), 0.9, false},
		{"slidegate missed", sl(27_000, 0, false), sl(30_000, 0, true), 0, false},
		{"no-op missed", sl(27_000, 0, true), sl(30_000, 0, false), 0.9, true},
		{"both missed, busy: the raw ratio, left out", sl(24_000, 1.5, false), sl(30_000, 1.5, false), 0.8, true},
		{"busy on average", sl(27_000, 0.1, true), sl(30_000, 0.35, true), 0.9, true},
		{"busy in one half only, under the bound on average", sl(27_000, 0, true), sl(30_000, 0.35, true), 0.9, false},
		{"others unknown", sl(27_000, -1, true), sl(30_000, 0.5, true), 0.9, false},
	} {
		ratio, disturbed := pairRatio(tc.sg, tc.noop)
		if math.Abs(ratio-tc.ratio) > 1e-12 || disturbed != tc.disturbed {
			t.Errorf("%s: ratio %v disturbed %v; want %v %v", tc.name, ratio, disturbed, tc.ratio, tc.disturbed)
		}
	}
}

// TestCleanCPU: CPU per request counts only the clean rounds, each
// target's CPU over its own requests.
func TestCleanCPU(t *testing.T) {
	sl := func(req uint64, cpu int64) capacitySlice { return capacitySlice{Requests: req, CPUNs: cpu} }
	sg := []capacitySlice{sl(500, 10_000_000), sl(650, 13_000_000), sl(650, 99_000_000)} // 20 µs, 20 µs, left out
	noop := []capacitySlice{sl(1000, 10_000_000), sl(1300, 13_000_000), sl(100, 99_000_000)}
	clean := func(i int) bool { return i != 2 }
	a, b := cleanCPU(sg, noop, clean)
	if math.Abs(a-20_000) > 1e-9 || math.Abs(b-10_000) > 1e-9 {
		t.Errorf("cleanCPU = %v, %v; want 20000, 10000", a, b)
	}
	if a, b := cleanCPU(sg, noop, func(int) bool { return false }); a != 0 || b != 0 {
		t.Errorf("no clean round: %v, %v", a, b)
	}
}

// TestClosedLoop: a capacity slice keeps exactly --capacity-workers
// requests in flight (never more, and all of them at once), and its
// throughput is what the server answered.
func TestClosedLoop(t *testing.T) {
	const workers = 5
	var inFlight, most atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n := inFlight.Add(1)
		for {
			m := most.Load()
			if n <= m || most.CompareAndSwap(m, n) {
				break
			}
		}
		_, _ = io.Copy(io.Discard, r.Body)
		time.Sleep(2 * time.Millisecond) // long enough that every worker is waiting at once
		inFlight.Add(-1)
		w.WriteHeader(http.StatusNoContent)
	}))
	defer srv.Close()
	cfg := DefaultConfig()
	cfg.Clients, cfg.CapacityWorkers = 100, workers
	client := newLeanClient(cfg) // the slices' client
	defer client.CloseIdleConnections()
	a := attack{base: srv.URL, policies: cfg.policies(), pacer: vegeta.ConstantPacer{}, dur: 300 * time.Millisecond, maxHits: 100_000, name: "closed"}
	res, err := runAttack(context.Background(), cfg, newClosedAttacker(cfg, client), a, nil)
	if err != nil {
		t.Fatal(err)
	}
	if got := most.Load(); got != workers {
		t.Errorf("at most %d requests in flight, want %d", got, workers)
	}
	st := judgeSlice(res, time.Second)
	if !st.Held || st.Requests == 0 || res.allowed != int64(st.Requests) {
		t.Errorf("slice %+v, allowed %d", st, res.allowed)
	}
	// Each worker waits for its answer: no more than workers requests
	// per 2 ms of sleep went through.
	if limit := float64(workers) / 0.002; st.Throughput > limit {
		t.Errorf("throughput %v/s over the closed loop's bound %v/s", st.Throughput, limit)
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

// TestSummarize: each target's capacity is the median over the clean
// rounds only, the ratio the median of the clean rounds' ratios, the CPU
// per request over the clean rounds, and the others' CPU averaged over
// the slices where it was read.
func TestSummarize(t *testing.T) {
	sl := func(others float64, req uint64, cpu int64) capacitySlice {
		return capacitySlice{Others: others, Requests: req, CPUNs: cpu}
	}
	c := &capacityReport{
		Slidegate: capacityRun{Rounds: []int{9000, 3000, 8000, 100, 8500, 9500},
			Slices: []capacitySlice{sl(0.1, 100, 2e6), sl(-1, 100, 2e6), sl(0.1, 100, 2e6), sl(0.9, 100, 9e6), sl(0.1, 100, 2e6), sl(0.1, 100, 2e6)}},
		Noop: capacityRun{Rounds: []int{10000, 9000, 10000, 90000, 10000, 10000},
			Slices: []capacitySlice{sl(0.1, 100, 1e6), sl(0.1, 100, 1e6), sl(0.1, 100, 1e6), sl(0.9, 100, 1e6), sl(0.1, 100, 1e6), sl(0.1, 100, 1e6)}},
	}
	ratios, disturbed := []float64{0.9, 1 / 3.0, 0.8, 0.001, 0.85, 0.95}, []bool{false, false, false, true, false, false}
	c.summarize(ratios, disturbed)
	if c.Slidegate.Capacity != 8500 || c.Noop.Capacity != 10000 {
		t.Errorf("capacities %d %d, want the clean rounds' medians 8500 10000", c.Slidegate.Capacity, c.Noop.Capacity)
	}
	if sp := c.Judgement.Spread; math.Abs(sp.Median-0.85) > 1e-12 || sp.Clean != 5 || c.Judgement.Verdict != verdictUndecided ||
		!slices.Equal(sp.Rounds, ratios) || !slices.Equal(sp.Disturbed, disturbed) {
		t.Errorf("judgement %+v", c.Judgement)
	}
	if math.Abs(c.SlidegateCPUNs-20_000) > 1e-9 || math.Abs(c.NoopCPUNs-10_000) > 1e-9 || math.Abs(c.ExtraCPUNs-10_000) > 1e-9 || c.CPURatio != 0.5 {
		t.Errorf("CPU per request %v %v, extra %v, ratio %v", c.SlidegateCPUNs, c.NoopCPUNs, c.ExtraCPUNs, c.CPURatio)
	}
	if want := (0.1*9 + 0.9*2) / 11; math.Abs(c.OthersMean-want) > 1e-12 {
		t.Errorf("others %v, want %v", c.OthersMean, want)
	}
	c = &capacityReport{}
	c.summarize(nil, nil)
	if c.OthersMean != -1 || c.Judgement.Verdict != verdictUndecided {
		t.Errorf("no round: others %v, judgement %+v", c.OthersMean, c.Judgement)
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

// TestServerCostSummary: the server's cost is the median of the clean
// rounds' differences, with its interval; disturbed rounds are left out;
// with none clean, the line says so.
func TestServerCostSummary(t *testing.T) {
	c := &serverCost{Rounds: []costRound{
		{ExtraNs: 2500}, {ExtraNs: 9000, Disturbed: true}, {ExtraNs: 2100}, {ExtraNs: 2900}, {ExtraNs: -100, Disturbed: true},
	}}
	c.summarize()
	if c.ExtraNs != 2500 || c.Lo != 2100 || c.Hi != 2900 || c.Clean != 3 {
		t.Errorf("summary %+v", c)
	}
	if l := c.line(); !strings.Contains(l, "adds 2.50 µs") || !strings.Contains(l, "median of 3 rounds, 75% interval 2.10 µs … 2.90 µs") || !strings.Contains(l, "want ≤ 3.00 µs") {
		t.Errorf("line %q", l)
	}
	// Fifteen clean rounds: the interval is the 4th smallest and the 4th
	// largest, which cover the median 96% of the time.
	c = &serverCost{}
	for _, x := range []float64{9, 1, 14, 3, 12, 5, 7, 15, 2, 11, 4, 13, 6, 10, 8} {
		c.Rounds = append(c.Rounds, costRound{ExtraNs: x * 1000})
	}
	c.summarize()
	if c.ExtraNs != 8000 || c.Lo != 4000 || c.Hi != 12000 || c.Clean != 15 || c.Confidence < 0.96 || c.Confidence > 0.97 {
		t.Errorf("fifteen rounds: %+v", c)
	}
	if l := c.line(); !strings.Contains(l, "median of 15 rounds, 96% interval 4.00 µs … 12.00 µs") {
		t.Errorf("fifteen rounds: line %q", l)
	}
	c = &serverCost{Rounds: []costRound{{ExtraNs: 1, Disturbed: true}}}
	c.summarize()
	if c.Clean != 0 || c.ExtraNs != 0 || !strings.Contains(c.line(), "no clean round of 1") {
		t.Errorf("all disturbed: %+v %q", c, c.line())
	}
}

// TestRawClient: the cost rounds' client counts 200 and 204 as allowed
// and 429 as refused, skips each body by its length on one connection,
// and fails on any other status.
func TestRawClient(t *testing.T) {
	var n atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		switch n.Add(1) % 4 {
		case 0:
			w.WriteHeader(http.StatusTooManyRequests)
			_, _ = w.Write([]byte(`{"allowed":false}`))
		case 1:
			w.WriteHeader(http.StatusNoContent)
		case 2:
			_, _ = w.Write([]byte(`{"allowed":true}`))
		case 3:
			if r.URL.Path == "/bad" {
				w.WriteHeader(http.StatusInternalServerError)
				return
			}
			_, _ = w.Write([]byte(`{"allowed":true,"more":"` + strings.Repeat("x", 100) + `"}`))
		}
	}))
	defer srv.Close()
	ct, err := costRequests(srv.URL, []engine.Policy{{Name: "free"}}, 10)
	if err != nil {
		t.Fatal(err)
	}
	allowed, refused, err := ct.burst(40)
	if err != nil || allowed != 30 || refused != 10 || n.Load() != 40 {
		t.Fatalf("allowed %d refused %d (of %d answered), err %v; want 30 10", allowed, refused, n.Load(), err)
	}
	host := strings.TrimPrefix(srv.URL, "http://")
	bad := []byte("POST /bad HTTP/1.1\r\nHost: " + host + "\r\nContent-Length: 0\r\n\r\n")
	if _, _, err := rawClient(host, 8, func() []byte { return bad }); err == nil || !strings.Contains(err.Error(), "500") {
		t.Errorf("a 500 gave %v", err)
	}
}

// TestWriteSteps: the slice table lists both targets' slices round by
// round, the round's ratio on slidegate's line, a left-out round marked,
// and the process's cores over each slice.
func TestWriteSteps(t *testing.T) {
	c := &capacityReport{SliceNs: 3e8, Workers: 16, P99BoundNs: 1e7,
		Slidegate: capacityRun{Name: "slidegate", Slices: []capacitySlice{{Round: 1, Throughput: 27000, Held: true, DurationNs: 3e8, CPUNs: 6e8}, {Round: 2, Held: false, Why: "p99 12.00 ms > 10.00 ms"}}},
		Noop:      capacityRun{Name: "no-op", Slices: []capacitySlice{{Round: 1, Throughput: 30000, Held: true}, {Round: 2, Held: true}}},
		Judgement: judgeRounds([]float64{0.9, 0}, []bool{false, true}, capacityGoal),
	}
	path := filepath.Join(t.TempDir(), "steps.txt")
	if err := c.writeSteps(path); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(string(b), "\n")
	if len(lines) < 6 || !strings.Contains(lines[2], "slidegate") || !strings.Contains(lines[2], "27000/s") || !strings.Contains(lines[2], " 2.00 ") ||
		!strings.Contains(lines[2], "0.90  held") || !strings.Contains(lines[3], "no-op") || !strings.Contains(lines[4], "0.00*  missed: p99 12.00 ms") {
		t.Errorf("steps:\n%s", b)
	}
}

// TestMachineLine: the capacity's line among the figures shown says when
// no round was clean instead of printing zeros, and otherwise gives the
// medians, the CPU ratio and the server's own cost.
func TestMachineLine(t *testing.T) {
	ratios := []float64{0.8, 0.9}
	c := &capacityReport{Workers: 16, P99BoundNs: 1e7}
	c.Judgement = judgeRounds(ratios, []bool{true, true}, capacityGoal)
	if l := c.machineLine(); l != "capacity  no clean round of 2 (closed loop, 16 requests in flight, p99 ≤ 10.00 ms)" {
		t.Errorf("all left out: %q", l)
	}
	c.Judgement = judgeRounds(ratios, nil, capacityGoal)
	c.Slidegate.Capacity, c.Noop.Capacity, c.CPURatio = 27_000, 30_000, 0.9
	c.ServerCost = &serverCost{ExtraNs: 2500, Clean: 9}
	want := "capacity  slidegate 27,000 req/s, no-op 30,000 req/s (closed loop, 16 requests in flight, p99 ≤ 10.00 ms); CPU per request no-op / slidegate 0.900; the server adds 2.50 µs per request"
	if l := c.machineLine(); l != want {
		t.Errorf("line\n%q, want\n%q", l, want)
	}
}
