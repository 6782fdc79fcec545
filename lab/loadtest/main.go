package loadtest

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/tsenart/vegeta/v12/lib/plot"
)

// Exit statuses of Main (its doc says what each means).
const (
	exitOK     = 0 // every verified phase is correct (and, with --strict, every target met)
	exitFailed = 1 // a verification found a problem, a request failed, a target was missed under --strict, or the run failed
	exitUsage  = 2 // bad flags
)

// Main is the lab binary's body (lab/cmd/slidegate-loadtest): it parses args (the flags
// its --help lists), runs, prints the summary to stdout and returns the
// exit status: 0 when every verified phase is correct (and, with --strict,
// every target met), 1 when a verification found a problem, a request
// failed, a target was missed under --strict or the run could not be
// completed, and 2 for bad flags. Errors are one line on stderr.
func Main(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	cfg, err := parseFlags(args, stdout)
	if errors.Is(err, flag.ErrHelp) {
		return exitOK
	}
	if err != nil {
		fmt.Fprintf(stderr, "slidegate-loadtest: %v\n", err)
		return exitUsage
	}
	rep, err := Run(ctx, cfg, stdout)
	if err != nil {
		fmt.Fprintf(stderr, "slidegate-loadtest: %v\n", oneLine(err))
		return exitFailed
	}
	if !rep.OK {
		return exitFailed
	}
	return exitOK
}

// Report is the outcome of a completed run: its verdict, and the files it
// wrote. Every figure the run measured is in report.json (Files["report"]),
// one section per phase; summary.txt (Files["summary"]) and WriteText give
// the same figures in words.
type Report struct {
	// Correct is true when every verified phase found no mismatch, over-
	// or under-admission, no request failed, and no phase was left
	// unverified while Config.Verify asked for it (an external target
	// cannot be verified and does not count against it). Failures lists
	// what was wrong.
	Correct  bool
	Failures []string
	// TargetsMet is true when every performance target was met.
	TargetsMet bool
	// OK decides Main's exit status: Correct, and under Config.Strict
	// TargetsMet too.
	OK bool
	// Verdict says the above in words, as the summary ends.
	Verdict string
	// Files maps what was written to its path: "report" (report.json),
	// "summary" (summary.txt), vegeta's results files (such as
	// "http-results", which `vegeta report` reads), the HTML plots and the
	// profiles asked for.
	Files map[string]string

	doc *report
}

// WriteText writes the run's summary, as summary.txt holds it.
func (r *Report) WriteText(w io.Writer) { r.doc.writeText(w) }

// Run runs the phases cfg asks for (in the order memory, engine, http,
// capacity, scale, redis, grpc), writes report.json, summary.txt, vegeta's
// results and the HTML plots under cfg.Out, prints the summary to stdout
// and returns the report. An error means the run could not be completed
// (bad configuration, a phase that failed to run, a cancelled ctx); a
// completed run whose verification failed returns a Report with Correct
// and OK false.
func Run(ctx context.Context, cfg Config, stdout io.Writer) (*Report, error) {
	doc, err := run(ctx, cfg, stdout)
	if err != nil {
		return nil, err
	}
	return &Report{Correct: doc.Correct, Failures: doc.Failures, TargetsMet: doc.TargetsMet, OK: doc.OK,
		Verdict: doc.Verdict, Files: doc.Files, doc: doc}, nil
}

func oneLine(err error) string { return strings.ReplaceAll(err.Error(), "\n", "; ") }

// run is Run, returning the whole report (what report.json holds).
func run(ctx context.Context, cfg Config, stdout io.Writer) (*report, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if err := os.MkdirAll(cfg.Out, 0o755); err != nil {
		return nil, fmt.Errorf("--out: %w", err)
	}
	u := newUI(cfg.Progress, stdout)
	prof, err := startProfiler(cfg)
	if err != nil {
		return nil, err
	}
	stopped := false
	defer func() {
		if !stopped {
			_ = prof.stop()
		}
	}()
	cpu0 := cpuSeconds()
	rep := &report{Title: cfg.Title, Started: time.Now(), Machine: machine(), Config: cfg, Files: map[string]string{}}
	plots := map[string]*plot.Plot{}
	if err := rep.runPhases(ctx, cfg, stdout, u, prof, plots); err != nil {
		return nil, err
	}
	rep.DurationNs = int64(time.Since(rep.Started))
	rep.Machine.LoadAfter, rep.Machine.CPUSeconds = loadAverage(), cpuSeconds()-cpu0
	stopped = true
	if err := prof.stop(); err != nil {
		return nil, err
	}
	if err := rep.writeOutputs(cfg, prof, plots, stdout); err != nil {
		return nil, err
	}
	return rep, nil
}

// runPhases runs the phases cfg asks for, in order, announcing each on
// stdout, into r (and the HTML plots they draw into plots).
func (r *report) runPhases(ctx context.Context, cfg Config, stdout io.Writer, u *ui, prof *profiler, plots map[string]*plot.Plot) error {
	var err error
	say := func(format string, args ...any) { fmt.Fprintf(stdout, "→ "+format+"\n", args...) }

	if cfg.has(ModeMemory) {
		say("memory: %s clients × %d request(s), engine then textbook", commas(int64(cfg.Clients)), cfg.PerClient)
		prof.beginPhase(ModeMemory)
		r.Memory, err = runMemory(ctx, cfg, u, prof)
		prof.endPhase(ModeMemory)
		if err != nil {
			return fmt.Errorf("memory phase: %w", err)
		}
	}
	if cfg.has(ModeEngine) {
		say("engine: %s decisions over %s %s clients from %d goroutines", commas(cfg.Requests), commas(int64(cfg.Clients)), cfg.Dist, cfg.Workers)
		r.Engine, plots["engine-plot"], err = runEngine(ctx, cfg, u, prof)
		if err != nil {
			return fmt.Errorf("engine phase: %w", err)
		}
	}
	if cfg.has(ModeHTTP) {
		where := cfg.Target
		if where == "" {
			where = "an in-process server on 127.0.0.1"
		}
		say("http: vegeta against %s, %d/s for %v", where, cfg.Rate, cfg.HTTPDuration)
		prof.beginPhase(ModeHTTP)
		r.HTTP, plots["http-plot"], err = runHTTP(ctx, cfg, u, prof)
		prof.endPhase(ModeHTTP)
		if err != nil {
			return fmt.Errorf("http phase: %w", err)
		}
		r.Files["http-results"] = r.HTTP.Results
	}
	if cfg.has(ModeCapacity) {
		say("capacity: up to %d rounds, each a pair of closed-loop slices of %v (%d requests in flight) against the server and a no-op handler in turn, p99 bound %v",
			2*cfg.CapacityRounds, cfg.CapacitySlice, cfg.CapacityWorkers, cfg.CapacityP99)
		prof.beginPhase(ModeCapacity)
		r.Capacity, err = runCapacity(ctx, cfg, u)
		prof.endPhase(ModeCapacity)
		if err != nil {
			return fmt.Errorf("capacity phase: %w", err)
		}
		prof.heap(ModeCapacity)
		r.Files["capacity-slidegate"], r.Files["capacity-noop"] = r.Capacity.Slidegate.Results, r.Capacity.Noop.Results
		r.Capacity.CPUProfile = prof.files["capacity-cpu"]
		r.Capacity.StepsFile = filepath.Join(cfg.Out, "capacity-steps.txt")
		if err := r.Capacity.writeSteps(r.Capacity.StepsFile); err != nil {
			return err
		}
		r.Files["capacity-steps"] = r.Capacity.StepsFile
	}
	if cfg.has(ModeScale) {
		say("scale: memory and decision cost at 10k … %s clients", commas(int64(cfg.ScaleMax)))
		prof.beginPhase(ModeScale)
		r.Scale, err = runScale(ctx, cfg, u)
		prof.endPhase(ModeScale)
		if err != nil {
			return fmt.Errorf("scale phase: %w", err)
		}
		var svg string
		r.Scale.Plot, svg, err = writeScalePlots(cfg.Out, r.Scale, "slidegate: cost against clients")
		if err != nil {
			return fmt.Errorf("scale phase: %w", err)
		}
		r.Files["scale-plot"], r.Files["scale-svg"] = r.Scale.Plot, svg
	}
	if cfg.has(ModeRedis) {
		say("redis: engine-style and http phases against %s", redisTargets(cfg))
		prof.beginPhase(ModeRedis)
		r.Redis, err = runRedis(ctx, cfg, u, prof)
		prof.endPhase(ModeRedis)
		if err != nil {
			return fmt.Errorf("redis phase: %w", err)
		}
		for _, d := range r.Redis.Deployments {
			if d.HTTP != nil {
				r.Files["redis-"+d.Name+"-http-results"] = d.HTTP.Results
			}
		}
	}
	if cfg.has(ModeGRPC) {
		say("grpc: ShouldRateLimit against the Envoy rate limit service on 127.0.0.1, %d/s for %v", cfg.Rate, cfg.HTTPDuration)
		prof.beginPhase(ModeGRPC)
		r.GRPC, err = runGRPC(ctx, cfg, u)
		prof.endPhase(ModeGRPC)
		if err != nil {
			return fmt.Errorf("grpc phase: %w", err)
		}
	}
	return nil
}

// writeOutputs judges the run and writes what it produced under cfg.Out:
// the plots, report.json and summary.txt (the summary also on stdout),
// listing every file written, profiles included, in r.Files.
func (r *report) writeOutputs(cfg Config, prof *profiler, plots map[string]*plot.Plot, stdout io.Writer) error {
	for k, v := range prof.files {
		r.Files[k] = v
	}
	for name, pl := range plots {
		path := filepath.Join(cfg.Out, name+".html")
		if err := writePlot(path, pl); err != nil {
			return err
		}
		r.Files[name] = path
	}
	r.Files["report"] = filepath.Join(cfg.Out, "report.json")
	r.Files["summary"] = filepath.Join(cfg.Out, "summary.txt")
	r.judge()
	if err := r.writeJSON(r.Files["report"]); err != nil {
		return fmt.Errorf("writing report: %w", err)
	}
	var sb strings.Builder
	r.writeText(&sb)
	if err := os.WriteFile(r.Files["summary"], []byte(sb.String()), 0o644); err != nil {
		return fmt.Errorf("writing summary: %w", err)
	}
	fmt.Fprintln(stdout)
	_, _ = io.WriteString(stdout, sb.String())
	return nil
}

func writePlot(path string, pl *plot.Plot) error {
	f, err := os.Create(path)
	if err != nil {
		return fmt.Errorf("writing plot: %w", err)
	}
	_, err = pl.WriteTo(f)
	return errors.Join(err, f.Close())
}
