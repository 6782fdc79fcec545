package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"time"

	"github.com/slidegate/slidegate/internal/redact"
	"github.com/slidegate/slidegate/internal/server/config"
)

// DefaultHealthTimeout bounds slidegate health's whole request.
const DefaultHealthTimeout = 2 * time.Second

// defaultHealthURL is the admin listener's readiness check at its default
// address.
const defaultHealthURL = "http://" + config.DefaultAdmin + "/readyz"

func init() {
	register(command{name: "health", summary: "exit 0 if a URL (default the admin /readyz) answers 2xx: a container's health check", run: func(args []string) int {
		return runHealth(args, os.Stdout, os.Stderr)
	}})
}

// runHealth is slidegate health: one GET, exit 0 on a 2xx answer, 1 on
// anything else (the answer's status, or why there was none), 2 on bad
// arguments. It exists because an image FROM scratch has no shell or
// curl to run a health check with.
func runHealth(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("health", flag.ContinueOnError)
	timeout := config.Duration(DefaultHealthTimeout)
	fs.Var(&timeout, "timeout", "bound on the whole request (a `duration` with a unit)")
	usage := func(w io.Writer) {
		fmt.Fprintf(w, "Usage: slidegate health [--timeout D] [URL]\n\nGET URL (default %s); exit 0 on a 2xx answer, 1 otherwise.\n\nFlags:\n", defaultHealthURL)
		fs.PrintDefaults()
	}
	if ok, code := parseFlags(fs, "slidegate health", usage, args, stdout, stderr); !ok {
		return code
	}
	target := defaultHealthURL
	switch fs.NArg() {
	case 0:
	case 1:
		target = fs.Arg(0)
	default:
		fmt.Fprintln(stderr, "slidegate health: at most one URL")
		return 2
	}
	shown := redact.URLs(target)
	if u, err := url.Parse(target); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		fmt.Fprintf(stderr, "slidegate health: %q is not an http:// or https:// URL\n", shown)
		return 2
	}
	if timeout <= 0 {
		fmt.Fprintln(stderr, "slidegate health: --timeout must be positive")
		return 2
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Duration(timeout))
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, target, nil)
	if err != nil {
		fmt.Fprintf(stderr, "slidegate health: %s: %s\n", shown, redact.URLs(err.Error()))
		return 2
	}
	tr := &http.Transport{}
	defer tr.CloseIdleConnections()
	resp, err := (&http.Client{Transport: tr}).Do(req)
	if err != nil {
		fmt.Fprintf(stderr, "slidegate health: %s: %s\n", shown, redact.URLs(err.Error()))
		return 1
	}
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
	resp.Body.Close()
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		fmt.Fprintf(stderr, "slidegate health: %s: %s\n", shown, resp.Status)
		return 1
	}
	fmt.Fprintf(stdout, "%s: %s\n", shown, resp.Status)
	return 0
}
