// Command slidegate-loadtest is the load-test lab's binary: memory at a
// million clients, decision latency, HTTP capacity, the Envoy service and
// Redis, every decision verified (see lab/loadtest and docs/loadtest.md).
// Run "slidegate-loadtest --help" for its flags. It stops on SIGINT or
// SIGTERM; a cancelled run writes no report and exits 1.
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"

	"github.com/slidegate/slidegate/lab/loadtest"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := loadtest.Main(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}
