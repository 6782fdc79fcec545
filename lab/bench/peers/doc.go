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
// (100/min, every key holding SteadyPrefill requests) and mostly refused
// (10/min, every key full); a million keys holding one request each that
// receive one to three more (few reqs), and the same beside a big live
// heap of other pointer-holding objects; retained heap per key after one
// request and after L requests; decision-latency percentiles at a million
// Zipf keys; a core sweep (the uniform allowed scenario at 1, 2, 4, …
// cores); allocations per decision of every throughput scenario; and an
// exactness column (Exactness): the most requests each limiter admitted in
// any window of length W on a boundary burst, a tail burst and steady
// parallel load, in real time.
//
// Beside the peers, every round measures the floor (Floor): one clock
// read, a bare xsync.MapOf Load of the same key stream on a map of the
// same size, and one load from the value's memory. It is what a design of
// slidegate's shape cannot go below, and the table gives slidegate's time
// over it per column, and each column's fastest peer (slidegate's own
// modes left out). With -diag (Config.Diagnostics) three more rows that
// are not limiters (Diagnostics) show steps between the floor and
// slidegate: the floor with its clock read after the lookup, the floor
// plus a write, and slidegate's key layout read without a decision.
//
// Run it with `make bench-peers` (cmd/peerbench). Rounds interleave the
// limiters (each round a different order) and the table shows medians.
package peers
