package countererror

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"
)

// Defaults of the heap measurement flags.
const (
	DefaultMemKeys     = 1_000_000
	DefaultMemFullKeys = 100_000
)

// Main is cmd/countererror: it parses args (without the program name),
// prints the error table, the worst case and the heap per key as markdown
// to stdout, and returns the exit status (0 ok, 1 failure, 2 usage).
func Main(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("countererror", flag.ContinueOnError)
	fs.SetOutput(stderr)
	def := DefaultConfig()
	c := def
	fs.IntVar(&c.Limit, "limit", def.Limit, "limit L per window")
	fs.DurationVar(&c.Window, "window", def.Window, "window W")
	fs.IntVar(&c.Keys, "keys", def.Keys, "independent keys per scenario")
	fs.IntVar(&c.Windows, "windows", def.Windows, "windows of traffic per key")
	fs.Uint64Var(&c.Seed, "seed", def.Seed, "random seed; the output is a pure function of the flags")
	memKeys := fs.Int("mem-keys", DefaultMemKeys, "keys for the heap measurement at one request per key (0 skips it)")
	memFull := fs.Int("mem-full-keys", DefaultMemFullKeys, "keys for the heap measurement at L requests per key (0 skips it)")
	fs.Usage = func() {
		fmt.Fprintf(stderr, "usage: countererror [flags]\n\nMeasures the sliding window counter's error against the exact log, its worst\ncase, and the heap per key of both (markdown on stdout).\n\n")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "countererror: unexpected arguments: %s\n", strings.Join(fs.Args(), " "))
		return 2
	}
	if *memKeys < 0 || *memFull < 0 {
		fmt.Fprintln(stderr, "countererror: -mem-keys and -mem-full-keys must be ≥ 0")
		return 2
	}
	if err := c.Validate(); err != nil {
		fmt.Fprintln(stderr, err)
		return 2
	}
	if err := report(stdout, c, *memKeys, *memFull); err != nil {
		fmt.Fprintln(stderr, err)
		return 1
	}
	return 0
}

func report(w io.Writer, c Config, memKeys, memFull int) error {
	fmt.Fprintf(w, "## Sliding window counter vs exact log\n\nL = %d, W = %v, %d keys × %d windows per scenario, seed %d.\n\n", c.Limit, c.Window, c.Keys, c.Windows, c.Seed)
	results, err := Run(c)
	if err != nil {
		return err
	}
	if err := WriteTable(w, results); err != nil {
		return err
	}
	fmt.Fprintln(w)
	for _, sc := range Scenarios() {
		fmt.Fprintf(w, "- %s: %s\n", sc.Name, sc.Description)
	}

	wc, err := WorstCase(c.Limit, c.Window)
	if err != nil {
		return err
	}
	fmt.Fprintf(w, "\n## Worst case\n\n%d unit requests at %d ns and %d at %d ns (one key): the counter admits %d of them in the one trailing window (%d, %d] ns, the log %d; the bound is 2L − 1 = %d.\n",
		c.Limit, wc.Trace[0].At, c.Limit, wc.To, wc.CounterAdmitted, wc.From, wc.To, wc.LogAdmitted, wc.Bound)

	if memKeys == 0 && memFull == 0 {
		return nil
	}
	fmt.Fprintf(w, "\n## Retained heap per key\n\nThe caller's key strings excluded (the engine's own copy counted); L = %d, W = %v.\n\n", c.Limit, c.Window)
	type run struct{ keys, per int }
	runs := []run{{memKeys, 1}}
	// Fill levels past a few of the log's ring growths (it starts at the
	// first request's cost and doubles), then a full ring of L.
	for _, per := range []int{2, 6, 14, c.Limit} {
		if per <= c.Limit && per > runs[len(runs)-1].per {
			runs = append(runs, run{memFull, per})
		}
	}
	var reports []HeapReport
	for _, m := range runs {
		if m.keys == 0 {
			continue
		}
		h, err := MeasureHeap(m.keys, m.per, c.Limit, c.Window)
		if err != nil {
			return err
		}
		reports = append(reports, h)
	}
	if err := WriteHeap(w, reports); err != nil {
		return err
	}
	return nil
}
