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

// Exit statuses of Main.
const (
	ExitOK     = 0 // every verified phase is correct (and, with --strict, every target met)
	ExitFailed = 1 // a verification found a problem, a request failed, a target was missed under --strict, or the run failed
	ExitUsage  = 2 // bad flags
)

// Main runs the loadtest subcommand: it parses args, runs, prints the
// summary to stdout and returns the exit status. Errors are one line on
// stderr.
func Main(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	cfg, err := ParseFlags(args, stdout)
	if errors.Is(err, flag.ErrHelp) {
		return ExitOK
	}
	if err != nil {
		fmt.Fprintf(stderr, "slidegate loadtest: %v\n", err)
		return ExitUsage
	}
	rep, err := Run(ctx, cfg, stdout)
	if err != nil {
		fmt.Fprintf(stderr, "slidegate loadtest: %v\n", oneLine(err))
		return ExitFailed
	}
	if !rep.OK {
		return ExitFailed
	}
	return ExitOK
}

func oneLine(err error) string { return strings.ReplaceAll(err.Error(), "\n", "; ") }

// Run runs the phases cfg asks for (in the order memory, engine, http,
// capacity, scale, redis),
// writes report.json, summary.txt and the HTML latency plots under
// cfg.Out, prints the summary to stdout and returns the report. An error
// means the run could not be completed; a completed run whose verification
// failed returns a report with OK false.
func Run(ctx context.Context, cfg Config, stdout io.Writer) (*Report, error) {
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
	rep := &Report{Title: cfg.Title, Started: time.Now(), Machine: machine(), Config: cfg, Files: map[string]string{}}
	plots := map[string]*plot.Plot{}
	say := func(format string, args ...any) { fmt.Fprintf(stdout, "→ "+format+"\n", args...) }

	if cfg.has(ModeMemory) {
		say("memory: %s clients × %d request(s), engine then textbook", commas(int64(cfg.Clients)), cfg.PerClient)
		prof.beginPhase(ModeMemory)
		rep.Memory, err = runMemory(ctx, cfg, u, prof)
		prof.endPhase(ModeMemory)
		if err != nil {
			return nil, fmt.Errorf("memory phase: %w", err)
		}
	}
	if cfg.has(ModeEngine) {
		say("engine: %s decisions over %s %s clients from %d goroutines", commas(cfg.Requests), commas(int64(cfg.Clients)), cfg.Dist, cfg.Workers)
		rep.Engine, plots["engine-plot"], err = runEngine(ctx, cfg, u, prof)
		if err != nil {
			return nil, fmt.Errorf("engine phase: %w", err)
		}
	}
	if cfg.has(ModeHTTP) {
		where := cfg.Target
		if where == "" {
			where = "an in-process server on 127.0.0.1"
		}
		say("http: vegeta against %s, %d/s for %v", where, cfg.Rate, cfg.HTTPDuration)
		prof.beginPhase(ModeHTTP)
		rep.HTTP, plots["http-plot"], err = runHTTP(ctx, cfg, u, prof)
		prof.endPhase(ModeHTTP)
		if err != nil {
			return nil, fmt.Errorf("http phase: %w", err)
		}
		rep.Files["http-results"] = rep.HTTP.Results
	}
	if cfg.has(ModeCapacity) {
		say("capacity: %d rounds of vegeta ramps from %d/s (×%.2g per %v step) against the server and a no-op handler in turn, p99 bound %v",
			cfg.CapacityRounds, cfg.CapacityStart, cfg.CapacityFactor, cfg.CapacityStep, cfg.CapacityP99)
		prof.beginPhase(ModeCapacity)
		rep.Capacity, err = runCapacity(ctx, cfg, u)
		prof.endPhase(ModeCapacity)
		if err != nil {
			return nil, fmt.Errorf("capacity phase: %w", err)
		}
		prof.heap(ModeCapacity)
		rep.Files["capacity-slidegate"], rep.Files["capacity-noop"] = rep.Capacity.Slidegate.Results, rep.Capacity.Noop.Results
	}
	if cfg.has(ModeScale) {
		say("scale: memory and decision cost at 10k … %s clients", commas(int64(cfg.ScaleMax)))
		prof.beginPhase(ModeScale)
		rep.Scale, err = runScale(ctx, cfg, u)
		prof.endPhase(ModeScale)
		if err != nil {
			return nil, fmt.Errorf("scale phase: %w", err)
		}
		var svg string
		rep.Scale.Plot, svg, err = writeScalePlots(cfg.Out, rep.Scale, "slidegate: cost against clients")
		if err != nil {
			return nil, fmt.Errorf("scale phase: %w", err)
		}
		rep.Files["scale-plot"], rep.Files["scale-svg"] = rep.Scale.Plot, svg
	}
	if cfg.has(ModeRedis) {
		say("redis: engine-style and http phases against %s", redisTargets(cfg))
		prof.beginPhase(ModeRedis)
		rep.Redis, err = runRedis(ctx, cfg, u, prof)
		prof.endPhase(ModeRedis)
		if err != nil {
			return nil, fmt.Errorf("redis phase: %w", err)
		}
		for _, d := range rep.Redis.Deployments {
			if d.HTTP != nil {
				rep.Files["redis-"+d.Name+"-http-results"] = d.HTTP.Results
			}
		}
	}
	if cfg.has(ModeGRPC) {
		say("grpc: ShouldRateLimit against the Envoy rate limit service on 127.0.0.1, %d/s for %v", cfg.Rate, cfg.HTTPDuration)
		prof.beginPhase(ModeGRPC)
		rep.GRPC, err = runGRPC(ctx, cfg, u)
		prof.endPhase(ModeGRPC)
		if err != nil {
			return nil, fmt.Errorf("grpc phase: %w", err)
		}
	}
	rep.DurationNs = int64(time.Since(rep.Started))
	rep.Machine.LoadAfter, rep.Machine.CPUSeconds = loadAverage(), cpuSeconds()-cpu0
	stopped = true
	if err := prof.stop(); err != nil {
		return nil, err
	}
	for k, v := range prof.files {
		rep.Files[k] = v
	}
	for name, pl := range plots {
		path := filepath.Join(cfg.Out, name+".html")
		if err := writePlot(path, pl); err != nil {
			return nil, err
		}
		rep.Files[name] = path
	}
	rep.Files["report"] = filepath.Join(cfg.Out, "report.json")
	rep.Files["summary"] = filepath.Join(cfg.Out, "summary.txt")
	rep.judge()
	if err := rep.writeJSON(rep.Files["report"]); err != nil {
		return nil, fmt.Errorf("writing report: %w", err)
	}
	var sb strings.Builder
	rep.WriteText(&sb)
	if err := os.WriteFile(rep.Files["summary"], []byte(sb.String()), 0o644); err != nil {
		return nil, fmt.Errorf("writing summary: %w", err)
	}
	fmt.Fprintln(stdout)
	_, _ = io.WriteString(stdout, sb.String())
	return rep, nil
}

func writePlot(path string, pl *plot.Plot) error {
	f, err := os.Create(path)
	if err != nil {
		return fmt.Errorf("writing plot: %w", err)
	}
	_, err = pl.WriteTo(f)
	return errors.Join(err, f.Close())
}
