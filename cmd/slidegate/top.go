package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/slidegate/slidegate/internal/redact"
	"github.com/slidegate/slidegate/internal/server/config"
	"github.com/slidegate/slidegate/internal/topk"
)

// Defaults of slidegate top.
const (
	DefaultTopInterval = 2 * time.Second
	DefaultTopTimeout  = 2 * time.Second
)

func init() {
	register(command{name: "top", summary: "the keys refused most, per policy, refreshed like top (the admin listener's /admin/top)", run: func(args []string) int {
		ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
		defer stop()
		return runTop(ctx, args, os.Stdout, os.Stderr, isTerminal(os.Stdout))
	}})
}

// isTerminal reports whether f is a character device: a terminal gets
// each frame drawn over the last one.
func isTerminal(f *os.File) bool {
	fi, err := f.Stat()
	return err == nil && fi.Mode()&os.ModeCharDevice != 0
}

// runTop is slidegate top: it asks the admin listener for the keys refused
// most and prints them, again every interval until ctx ends (or once).
// Exit 0 when it ends by a signal or after --once, 1 when the admin
// listener does not answer, 2 on bad arguments.
func runTop(ctx context.Context, args []string, stdout, stderr io.Writer, redraw bool) int {
	fs := flag.NewFlagSet("top", flag.ContinueOnError)
	admin := fs.String("admin", "http://"+config.DefaultAdmin, "the admin listener's `URL`")
	policy := fs.String("policy", "", "one policy's keys (default: every policy)")
	rule := fs.String("rule", "", "slidegate envoy serve: one rule's keys, as domain/descriptor (default: every rule)")
	n := fs.Int("n", topk.DefaultEntries, "how many keys (1.."+strconv.Itoa(topk.MaxEntries)+")")
	interval := config.Duration(DefaultTopInterval)
	fs.Var(&interval, "interval", "time between refreshes (a `duration` with a unit)")
	timeout := config.Duration(DefaultTopTimeout)
	fs.Var(&timeout, "timeout", "bound on each request (a `duration` with a unit)")
	tokenFile := fs.String("token-file", "", "a `file` holding the admin bearer token (admin_token_file)")
	once := fs.Bool("once", false, "print once and exit")
	usage := func(w io.Writer) {
		fmt.Fprint(w, "Usage: slidegate top [flags]\n\nThe keys refused most in the last minutes, per policy, from the admin\nlistener's GET /admin/top, refreshed every --interval until interrupted.\n\nFlags:\n")
		fs.PrintDefaults()
	}
	if ok, code := parseFlags(fs, "slidegate top", usage, args, stdout, stderr); !ok {
		return code
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "slidegate top: unexpected argument %q\n", fs.Arg(0))
		return 2
	}
	base, err := url.Parse(*admin)
	if err != nil || (base.Scheme != "http" && base.Scheme != "https") || base.Host == "" {
		fmt.Fprintf(stderr, "slidegate top: --admin %q is not an http:// or https:// URL\n", redact.URLs(*admin))
		return 2
	}
	switch {
	case *n < 1 || *n > topk.MaxEntries:
		fmt.Fprintf(stderr, "slidegate top: -n %d is outside 1..%d\n", *n, topk.MaxEntries)
		return 2
	case interval <= 0 || timeout <= 0:
		fmt.Fprintln(stderr, "slidegate top: --interval and --timeout must be positive")
		return 2
	}
	var token string
	if *tokenFile != "" {
		b, err := os.ReadFile(*tokenFile)
		if err != nil {
			fmt.Fprintf(stderr, "slidegate top: --token-file: %v\n", err)
			return 2
		}
		token = strings.TrimSpace(string(b))
	}
	q := url.Values{"n": {strconv.Itoa(*n)}}
	scope := "every policy"
	switch {
	case *policy != "" && *rule != "":
		fmt.Fprintln(stderr, "slidegate top: --policy or --rule, not both")
		return 2
	case *policy != "":
		q.Set("policy", *policy)
		scope = "policy " + *policy
	case *rule != "":
		q.Set("rule", *rule)
		scope = "rule " + *rule
	}
	target := base.JoinPath("/admin/top")
	target.RawQuery = q.Encode()
	tr := &http.Transport{}
	defer tr.CloseIdleConnections()
	client := &http.Client{Transport: tr, Timeout: time.Duration(timeout)}
	tick := time.NewTicker(time.Duration(interval))
	defer tick.Stop()
	for {
		a, err := fetchTop(ctx, client, target.String(), token)
		if err != nil {
			if ctx.Err() != nil {
				return 0
			}
			fmt.Fprintf(stderr, "slidegate top: %s: %s\n", redact.URLs(base.String()), redact.URLs(err.Error()))
			return 1
		}
		if redraw {
			fmt.Fprint(stdout, "\x1b[H\x1b[2J")
		}
		printTop(stdout, redact.URLs(base.String()), scope, a)
		if *once {
			return 0
		}
		select {
		case <-ctx.Done():
			return 0
		case <-tick.C:
		}
	}
}

func fetchTop(ctx context.Context, client *http.Client, target, token string) (topk.Report, error) {
	var a topk.Report
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, target, nil)
	if err != nil {
		return a, err
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := client.Do(req)
	if err != nil {
		return a, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 4<<20))
	if err != nil {
		return a, err
	}
	if resp.StatusCode != http.StatusOK {
		var p struct {
			Detail string `json:"detail"`
		}
		_ = json.Unmarshal(body, &p)
		if p.Detail != "" {
			return a, fmt.Errorf("%s: %s", resp.Status, p.Detail)
		}
		return a, errors.New(resp.Status)
	}
	if err := json.Unmarshal(body, &a); err != nil {
		return a, fmt.Errorf("not an /admin/top answer: %w", err)
	}
	return a, nil
}

func printTop(w io.Writer, admin, scope string, a topk.Report) {
	fmt.Fprintf(w, "slidegate top: %s, %s: keys refused most in the last %s (%d counters a minute, keys %s)\n\n", admin, scope, a.Window, a.Counters, a.Keys)
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "#\tPOLICY OR RULE\tREFUSED\t±\tKEY")
	for i, e := range a.Entries {
		fmt.Fprintf(tw, "%d\t%s\t%d\t%d\t%s\n", i+1, e.Name, e.Count, e.Error, printable(e.Key))
	}
	tw.Flush()
	if len(a.Entries) == 0 {
		fmt.Fprintln(w, "(no refusals)")
	}
}

// printable is s with control characters escaped, so that a raw key
// cannot move the terminal's cursor.
func printable(s string) string {
	q := strconv.QuoteToGraphic(s)
	return q[1 : len(q)-1]
}
