// Command countererror measures the sliding window counter's error against
// the exact sliding window log on deterministic traces, constructs the
// counter's worst case, and measures the heap both retain per key. It
// prints markdown; docs/algorithms.md quotes its output.
//
//	go run ./cmd/countererror            # the documented table (a few seconds)
//	go run ./cmd/countererror -mem-keys 0 -mem-full-keys 0 -limit 1000
//
// The work is done by internal/countererror, which the tests share.
package main

import (
	"os"

	"github.com/slidegate/slidegate/lab/internal/countererror"
)

func main() {
	os.Exit(countererror.Main(os.Args[1:], os.Stdout, os.Stderr))
}
