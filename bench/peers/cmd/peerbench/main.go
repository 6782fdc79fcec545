// Command peerbench runs slidegate's benchmark scenarios through its peers
// and prints one markdown table (see package peers). `make bench-peers`
// runs it with the defaults; progress goes to stderr, the table to stdout.
package main

import (
	"bufio"
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"runtime"
	"strings"
	"time"

	"github.com/slidegate/slidegate/bench/peers"
)

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

func run(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("peerbench", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var cfg peers.Config
	fs.IntVar(&cfg.Keys, "keys", peers.DefaultKeys, "key population of the many-key scenarios")
	fs.IntVar(&cfg.Rounds, "rounds", peers.DefaultRounds, "rounds; the table shows medians")
	fs.DurationVar(&cfg.Duration, "duration", peers.DefaultDuration, "timed phase of each scenario per round")
	fs.BoolVar(&cfg.SkipExact, "skip-exact", false, "skip the real-time exactness scenarios")
	fs.IntVar(&cfg.HeapObjects, "heap-objects", peers.DefaultHeapObjects, "live objects beside the limiter in the big-heap scenario")
	fs.BoolVar(&cfg.Diagnostics, "diag", false, "also measure the diagnostic rows (not limiters) between the floor and slidegate")
	fs.BoolVar(&cfg.CachedKeys, "cached-keys", false, "take the timed loops' keys from a copy of their sequence laid out in order, so that choosing a key costs no cache miss")
	only := fs.String("peers", "", "comma-separated peer names (slidegate is always included)")
	quiet := fs.Bool("q", false, "no progress on stderr")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if *only != "" {
		sel := []peers.Peer{}
		names := append([]string{peers.Baseline}, strings.Split(*only, ",")...)
		seen := map[string]bool{}
		for _, n := range names {
			n = strings.TrimSpace(n)
			if n == "" || seen[n] {
				continue
			}
			seen[n] = true
			p, err := peers.Find(n)
			if err != nil {
				fmt.Fprintln(stderr, err)
				return 2
			}
			sel = append(sel, p)
		}
		cfg.Peers = sel
	}
	if !*quiet {
		cfg.Progress = stderr
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	start := time.Now()
	res, err := peers.Run(ctx, cfg)
	if err != nil {
		fmt.Fprintln(stderr, "peerbench:", err)
		return 1
	}
	fmt.Fprintf(stdout, "Machine: %s, %d cores (GOMAXPROCS %d), %s/%s; %s; %s UTC; command: `%s`; took %v.\n\n",
		cpuModel(), runtime.NumCPU(), runtime.GOMAXPROCS(0), runtime.GOOS, runtime.GOARCH, runtime.Version(),
		start.UTC().Format("2006-01-02 15:04"), commandLine(args), time.Since(start).Round(time.Second))
	if err := res.WriteTable(stdout); err != nil {
		fmt.Fprintln(stderr, "peerbench:", err)
		return 1
	}
	return 0
}

func commandLine(args []string) string {
	if len(args) == 0 {
		return "make bench-peers"
	}
	return "cd bench/peers && go run ./cmd/peerbench " + strings.Join(args, " ")
}

// cpuModel reads the CPU model from /proc/cpuinfo where there is one.
func cpuModel() string {
	f, err := os.Open("/proc/cpuinfo")
	if err != nil {
		return "unknown CPU"
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if k, v, ok := strings.Cut(sc.Text(), ":"); ok && strings.TrimSpace(k) == "model name" {
			return strings.TrimSpace(v)
		}
	}
	return "unknown CPU"
}
