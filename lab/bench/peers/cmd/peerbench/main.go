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
	"runtime/pprof"
	"strings"
	"time"

	"github.com/slidegate/slidegate/lab/bench/peers"
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
	cpuProfile := fs.String("cpuprofile", "", "also write a CPU profile of the whole run (every peer and scenario; pprof's -focus picks one limiter) to this file")
	jsonOut := fs.String("json", "", "also write the run (machine, date, command, the table and every measured value) as JSON to this file")
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
	if *cpuProfile != "" {
		f, err := os.Create(*cpuProfile)
		if err != nil {
			fmt.Fprintln(stderr, "peerbench:", err)
			return 1
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			fmt.Fprintln(stderr, "peerbench:", err)
			return 1
		}
		defer pprof.StopCPUProfile()
	}
	start := time.Now()
	res, err := peers.Run(ctx, cfg)
	if err != nil {
		fmt.Fprintln(stderr, "peerbench:", err)
		return 1
	}
	took := time.Since(start)
	m := thisMachine()
	fmt.Fprintf(stdout, "Machine: %s, %d cores (GOMAXPROCS %d), %s/%s; %s; %s UTC; command: `%s`; took %v.\n\n",
		m.CPUModel, m.Cores, m.GOMAXPROCS, m.OS, m.Arch, m.GoVersion,
		start.UTC().Format("2006-01-02 15:04"), commandLine(args), took.Round(time.Second))
	var table strings.Builder
	if err := res.WriteTable(&table); err != nil {
		fmt.Fprintln(stderr, "peerbench:", err)
		return 1
	}
	io.WriteString(stdout, table.String())
	if *jsonOut != "" {
		doc := runDoc{Machine: m, Started: start.UTC(), Command: commandLine(args), DurationNs: int64(took),
			Table: table.String(), Results: docOf(res)}
		if err := writeJSON(*jsonOut, doc); err != nil {
			fmt.Fprintln(stderr, "peerbench:", err)
			return 1
		}
	}
	return 0
}

// commandLine is the command that makes the same table: -q, -json and -cpuprofile
// change only where the output goes, so they are left out.
func commandLine(args []string) string {
	var kept []string
	for i := 0; i < len(args); i++ {
		switch a := args[i]; {
		case a == "-q" || a == "--q" || strings.HasPrefix(a, "-json=") || strings.HasPrefix(a, "--json="):
		case strings.HasPrefix(a, "-cpuprofile=") || strings.HasPrefix(a, "--cpuprofile="):
		case a == "-json" || a == "--json" || a == "-cpuprofile" || a == "--cpuprofile":
			i++
		default:
			kept = append(kept, a)
		}
	}
	if len(kept) == 0 {
		return "make bench-peers"
	}
	return "cd lab/bench/peers && go run ./cmd/peerbench " + strings.Join(kept, " ")
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
