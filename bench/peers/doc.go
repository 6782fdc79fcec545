// Package peers runs slidegate's benchmark scenarios through the rate
// limiters users would pick instead, side by side, and prints one markdown
// table of ratios to slidegate measured in the same run.
//
// It is its own Go module (bench/peers/go.mod, with a replace directive
// pointing at the repository root), so that slidegate's main module never
// depends on its peers.
//
// Each peer gets one small adapter (adapters.go) with a single method,
// Allow(key) bool, built the way that library's documentation shows, with
// its defaults. The scenarios (Run) are: one hot key on one goroutine; a
// million keys, uniform and Zipf (s = 1.1), on all cores, mostly allowed
// (100/min, every key holding one request) and mostly refused (10/min,
// every key full); retained heap per key after one request and after L
// requests; decision-latency percentiles at a million Zipf keys; and an
// exactness column (Exactness): the most requests each limiter admitted in
// any window of length W on a boundary burst, a tail burst and steady
// parallel load, in real time.
//
// Run it with `make bench-peers` (cmd/peerbench). Rounds interleave the
// limiters (each round a different order) and the table shows medians.
package peers
