package loadtest

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/slidegate/slidegate/lab/internal/keydist"
	"github.com/slidegate/slidegate/lab/internal/latency"
)

// TestEndToEnd runs every phase briefly, small, on real components (the
// engine, a server on 127.0.0.1, vegeta), and checks that verification
// passes and every report file is written.
func TestEndToEnd(t *testing.T) {
	for _, dist := range []string{keydist.Zipf, keydist.Uniform} {
		t.Run(dist, func(t *testing.T) {
			dir := t.TempDir()
			prof := filepath.Join(dir, "profiles")
			args := []string{
				"--clients", "2000", "--dist", dist, "--limit", "5", "--window", "200ms", "--max-cost", "2",
				"--memory-per-client", "3", "--engine-requests", "40000", "--engine-workers", "4", "--engine-sample", "2",
				"--http-rate", "300", "--http-duration", "1s", "--http-ramp-to", "400", "--tiers", "free,pro,team",
				"--capacity-workers", "4", "--capacity-slice", "100ms", "--capacity-rounds", "5", "--capacity-p99", "1s",
				"--capacity-cost-burst", "200", "--capacity-budget", "3s",
				"--out", dir, "--profile-dir", prof, "--progress", "off",
			}
			var out, errb bytes.Buffer
			code := Main(context.Background(), args, &out, &errb)
			if code != 0 {
				t.Fatalf("exit %d, stderr %q\n%s", code, errb.String(), out.String())
			}
			if !strings.Contains(out.String(), "correctness PASS") || !strings.Contains(out.String(), "report.json") ||
				!strings.Contains(out.String(), "time budget of the rounds: capacity 3 s (ran ") {
				t.Errorf("summary:\n%s", out.String())
			}
			// Every file the output names exists.
			named := 0
			for _, tok := range strings.Fields(out.String()) {
				tok = strings.Trim(tok, ",;:()")
				if !strings.HasPrefix(tok, dir) {
					continue
				}
				named++
				if _, err := os.Stat(tok); err != nil {
					t.Errorf("the output names %s: %v", tok, err)
				}
			}
			if named < 10 {
				t.Errorf("the output names %d files under %s:\n%s", named, dir, out.String())
			}
			for _, f := range []string{"report.json", "summary.txt", "engine-plot.html", "http-plot.html", "http-results.bin",
				"capacity-slidegate.bin", "capacity-noop.bin"} {
				st, err := os.Stat(filepath.Join(dir, f))
				if err != nil || st.Size() == 0 {
					t.Errorf("%s: %v", f, err)
				}
			}
			for _, ph := range []string{"memory", "engine", "http", "capacity"} {
				for _, kind := range []string{"cpu", "heap", "mutex"} {
					if _, err := os.Stat(filepath.Join(prof, ph+"-"+kind+".pprof")); err != nil {
						t.Errorf("profile: %v", err)
					}
				}
			}
			b, err := os.ReadFile(filepath.Join(dir, "report.json"))
			if err != nil {
				t.Fatal(err)
			}
			var rep report
			if err := json.Unmarshal(b, &rep); err != nil {
				t.Fatal(err)
			}
			if !rep.OK || !rep.Correct || rep.Memory == nil || rep.Engine == nil || rep.HTTP == nil || rep.Capacity == nil {
				t.Fatalf("report: ok=%v %s", rep.OK, rep.Verdict)
			}
			m, e, h := rep.Memory, rep.Engine, rep.HTTP
			if m.Engine.StoredInstants != 6000 || m.Textbook.StoredInstants != 6000 || m.Engine.HeapBytes <= 0 || m.Textbook.HeapBytes <= 0 {
				t.Errorf("memory %+v", m)
			}
			if e.Decisions != 40000 || e.Verification.Records != 40000 || !e.Verification.OK() || e.Allowed == 0 || e.Refused == 0 {
				t.Errorf("engine %+v", e)
			}
			if e.Latency.Samples != 20000 || e.Latency.P50Ns <= 0 || e.Latency.P999Ns < e.Latency.P50Ns {
				t.Errorf("engine latency %+v", e.Latency)
			}
			// The engine and the floor ran the same streams, round by
			// round, the floor first in every other round.
			var samples uint64
			for i, rd := range e.Rounds {
				samples += rd.Samples
				if rd.FloorFirst != (i%2 == 1) || rd.EngineP99Ns <= 0 || rd.FloorP99Ns <= 0 {
					t.Errorf("engine round %d: %+v", i+1, rd)
				}
			}
			if len(e.Rounds) != defaultEngineRounds || e.Floor == nil || e.Floor.Decisions != e.Decisions || samples != uint64(e.Latency.Samples) {
				t.Errorf("engine rounds %+v, floor %+v", e.Rounds, e.Floor)
			}
			if h.Requests == 0 || h.Errors != 0 || h.Allowed+h.Refused != int64(h.Requests) || !h.Verification.OK() {
				t.Errorf("http %+v", h)
			}
			if h.Decisions != int(h.Requests) || h.Verification.Records != h.Decisions {
				t.Errorf("server recorded %d decisions, verified %d, for %d requests", h.Decisions, h.Verification.Records, h.Requests)
			}
			// The report's HTTP figures are what vegeta report computes
			// on the saved results.
			f, err := os.Open(h.Results)
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			vm, err := readMetrics(f)
			if err != nil {
				t.Fatal(err)
			}
			if vm.Requests != h.Requests || vm.Rate != h.Rate || vm.Throughput != h.Throughput || vegetaLatency(&vm) != h.Latency {
				t.Errorf("saved results give %d requests at %v/s (throughput %v), latency %+v; the report %d at %v/s (%v), %+v",
					vm.Requests, vm.Rate, vm.Throughput, vegetaLatency(&vm), h.Requests, h.Rate, h.Throughput, h.Latency)
			}
			c := rep.Capacity
			// Every round is a pair of slices; the rounds stopped where
			// the plan says (disturbed ones run again); a target's
			// capacity is the median of its clean rounds.
			sp := c.Judgement.Spread
			n := len(sp.Rounds)
			disturbed := make([]bool, n)
			for i := range disturbed {
				disturbed[i] = sp.left(i)
			}
			cplan := seqPlan{First: 5, Last: capacityGrowth * 5, Budget: 3 * time.Second}
			capDecided := func(k int) bool {
				return judgeSequence(sp.Rounds[:k], disturbed[:k], capacityGoal, cplan).decided()
			}
			if c.Plan != cplan || n < 5 || cplan.more(disturbed, time.Duration(c.RoundsNs), capDecided) ||
				!cplan.more(disturbed[:n-1], 0, capDecided) {
				t.Errorf("capacity: plan %+v, rounds %v (disturbed %v) in %v", c.Plan, sp.Rounds, disturbed, time.Duration(c.RoundsNs))
			}
			for _, r := range []capacityRun{c.Slidegate, c.Noop} {
				var clean []int
				for i, x := range r.Rounds {
					if !disturbed[i] {
						clean = append(clean, x)
					}
				}
				if len(r.Rounds) != n || len(r.Slices) != n || r.Capacity != medianInt(clean) ||
					r.Slices[0].Round != 1 || r.Slices[n-1].Round != n || c.Workers != 4 {
					t.Errorf("capacity %s: rounds %v, capacity %d, slices %+v", r.Name, r.Rounds, r.Capacity, r.Slices)
				}
			}
			var clean []float64
			for i, x := range sp.Rounds {
				if !disturbed[i] {
					clean = append(clean, x)
				}
			}
			if (sp.Disturbed != nil && len(sp.Disturbed) != n) || sp.Median != latency.Median(clean) || sp.Clean != len(clean) {
				t.Errorf("capacity ratios %v (disturbed %v), judgement %+v", sp.Rounds, disturbed, c.Judgement)
			}
			// The cost rounds ran (their decisions are among those
			// verified: the answers must add up to the records).
			if sc := c.ServerCost; sc == nil || len(sc.Rounds) < costRounds || len(sc.Rounds) > 2*costRounds || sc.Burst != 200 {
				t.Errorf("capacity: server cost %+v", sc)
			}
			if !c.Verification.OK() || c.Decisions == 0 || c.Decisions != c.Verification.Records {
				t.Errorf("capacity: %d decisions, verification %+v", c.Decisions, c.Verification)
			}
			if len(h.Policies) != 3 || h.Policies[2].Limit != 500 {
				t.Errorf("tiers %+v", h.Policies)
			}
		})
	}
}

// TestEngineStopsByTime: the time bound ends the phase early, and the
// decisions made are still verified (gaps between workers closed).
func TestEngineStopsByTime(t *testing.T) {
	cfg := DefaultConfig()
	cfg.Modes = []string{ModeEngine}
	cfg.Clients, cfg.Requests, cfg.Workers = 100, 2_000_000, 3
	cfg.MaxRecords = cfg.Requests
	cfg.Duration = time.Millisecond
	cfg.Out, cfg.Progress = t.TempDir(), "off"
	rep, err := run(context.Background(), cfg, &bytes.Buffer{})
	if err != nil {
		t.Fatal(err)
	}
	e := rep.Engine
	if !e.Stopped || e.Decisions >= cfg.Requests || e.Verification.Records != int(e.Decisions) || !rep.OK {
		t.Fatalf("stopped=%v decisions=%d verified=%d ok=%v %s", e.Stopped, e.Decisions, e.Verification.Records, rep.OK, rep.Verdict)
	}
}

func TestRunCancelled(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	cfg := DefaultConfig()
	cfg.Modes = []string{ModeMemory}
	cfg.Clients, cfg.Out, cfg.Progress = 100_000, t.TempDir(), "off"
	if _, err := run(ctx, cfg, &bytes.Buffer{}); err == nil {
		t.Fatal("cancelled run succeeded")
	}
}

// TestCounterAlgorithm: the counter's decisions are replayed through the
// counter model, and the report says the verification was approximate.
func TestCounterAlgorithm(t *testing.T) {
	cfg := DefaultConfig()
	cfg.Modes = []string{ModeEngine, ModeHTTP}
	cfg.Algorithm, cfg.MaxCost = "counter", 3
	cfg.Clients, cfg.Requests, cfg.Workers = 500, 20_000, 4
	cfg.Rate, cfg.HTTPDuration = 200, 500*time.Millisecond
	cfg.Window = 100 * time.Millisecond
	cfg.Out, cfg.Progress = t.TempDir(), "off"
	var out bytes.Buffer
	rep, err := run(context.Background(), cfg, &out)
	if err != nil {
		t.Fatal(err)
	}
	if !rep.OK || !rep.Engine.Verification.Approximate || !rep.HTTP.Verification.Approximate || rep.Engine.Policy.Algorithm != "counter" {
		t.Fatalf("ok=%v %s; engine %+v", rep.OK, rep.Verdict, rep.Engine.Verification)
	}
	if !strings.Contains(out.String(), "over- and under-admissions are not counted") {
		t.Errorf("summary does not say the check was approximate:\n%s", out.String())
	}
}

// TestStrictExit: a target not met (here capacity: every slice misses a
// p99 bound of 1 ns, the no-op's too, so no round can be judged) leaves
// the exit status 0 without --strict and makes it 1 with it; the summary
// says which.
func TestStrictExit(t *testing.T) {
	args := []string{"--mode", "capacity", "--clients", "100", "--capacity-workers", "2", "--capacity-rounds", "5", "--capacity-cost-burst", "0",
		"--capacity-slice", "100ms", "--capacity-p99", "1ns", "--progress", "off"}
	for _, strict := range []bool{false, true} {
		var out, errb bytes.Buffer
		a := append(args, "--out", t.TempDir())
		if strict {
			a = append(a, "--strict")
		}
		code := Main(context.Background(), a, &out, &errb)
		want, verdict := 0, "not enforced without --strict"
		if strict {
			want, verdict = 1, "targets FAIL (--strict)"
		}
		if code != want || !strings.Contains(out.String(), verdict) || !strings.Contains(out.String(), "correctness PASS") {
			t.Errorf("strict=%v: exit %d (want %d), stderr %q\n%s", strict, code, want, errb.String(), out.String())
		}
	}
}

// TestRunReport: Run's Report carries the verdict and the files as
// report.json has them, and WriteText writes what summary.txt holds.
func TestRunReport(t *testing.T) {
	cfg := DefaultConfig()
	cfg.Modes = []string{ModeEngine}
	cfg.Clients, cfg.Requests, cfg.Workers = 100, 10_000, 2
	cfg.Out, cfg.Progress = t.TempDir(), "off"
	rep, err := Run(context.Background(), cfg, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(rep.Files["report"])
	if err != nil {
		t.Fatal(err)
	}
	var doc report
	if err := json.Unmarshal(b, &doc); err != nil {
		t.Fatal(err)
	}
	if !rep.Correct || rep.OK != doc.OK || rep.Correct != doc.Correct || rep.TargetsMet != doc.TargetsMet ||
		rep.Verdict != doc.Verdict || !slices.Equal(rep.Failures, doc.Failures) || !maps.Equal(rep.Files, doc.Files) {
		t.Errorf("Report %+v, report.json ok=%v correct=%v targets=%v verdict %q failures %v files %v",
			rep, doc.OK, doc.Correct, doc.TargetsMet, doc.Verdict, doc.Failures, doc.Files)
	}
	summary, err := os.ReadFile(rep.Files["summary"])
	if err != nil {
		t.Fatal(err)
	}
	var sb strings.Builder
	rep.WriteText(&sb)
	if sb.String() != string(summary) {
		t.Errorf("WriteText:\n%s\nsummary.txt:\n%s", sb.String(), summary)
	}
}

// TestEngineStoppedBeforeFirstRound: a phase the time bound stopped
// before any round ran (a busy machine can take the whole bound to set
// up) still makes a report that encodes, and judges nothing.
func TestEngineStoppedBeforeFirstRound(t *testing.T) {
	r := &report{Engine: &engineReport{Floor: &floorReport{}}}
	r.Engine.tally(make([]engineWorker, 3), 100, 0)
	if !r.Engine.Stopped || r.Engine.Decisions != 0 {
		t.Fatalf("stopped=%v decisions=%d", r.Engine.Stopped, r.Engine.Decisions)
	}
	r.judge()
	if err := r.writeJSON(filepath.Join(t.TempDir(), "report.json")); err != nil {
		t.Fatal(err)
	}
	for _, tr := range r.Targets {
		if tr.Verdict == verdictMet || tr.Verdict == verdictMissed {
			t.Errorf("%s judged %s with no round", tr.Name, tr.Verdict)
		}
	}
}
