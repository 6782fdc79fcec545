package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"

	"github.com/slidegate/slidegate/loadtest"
)

func init() {
	register(command{
		name:    "loadtest",
		summary: "load-test memory, decision latency, HTTP capacity and Redis, verifying every decision (vegeta over HTTP)",
		run:     runLoadtest,
	})
}

// runLoadtest runs the harness until it ends or SIGINT/SIGTERM cancels it
// (a cancelled run writes no report and exits 1).
func runLoadtest(args []string) int {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	return loadtest.Main(ctx, args, os.Stdout, os.Stderr)
}
