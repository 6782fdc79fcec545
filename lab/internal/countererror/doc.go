// Package countererror measures how far the sliding window counter
// (engine.SlidingCounter) strays from the exact sliding window log
// (engine.SlidingLog) on the same traffic, constructs the counter's worst
// case, and measures the heap each algorithm retains per key.
//
// It is the library behind cmd/countererror and its tests; the numbers it
// prints are the ones docs/algorithms.md quotes.
//
// # Two ways to compare
//
// Once the two algorithms disagree on one request their states differ, so
// "the error" needs a definition. Compare uses two:
//
//   - Side by side (FalseAllows, FalseRefusals): every request of a trace is
//     decided by both limiters, each keeping its own state. A false allow is
//     a request the counter allowed and the log refused; a false refusal the
//     reverse. This is what a user switching algorithms sees request by
//     request.
//   - Counterfactual (OverAdmissions, UnderAdmissions): the counter's own
//     decisions are checked against the exact guarantee, using only the
//     counter's accepted set (reference.VerifyLog): an over-admission is an
//     accepted request after which more than L accepted requests fall in
//     (t−W, t]; an under-admission a refusal although fewer than L−n+1 were
//     there. This is the exactness the counter gives up.
//
// # Traces
//
// Scenarios builds deterministic traces (seeded math/rand/v2 PCG): Poisson
// traffic below, at and above the limit, bursts at the end and at the start
// of every window, an attacker straddling every window boundary, and the
// constructed worst case repeated. Every key gets its own independent
// arrivals; keys never interact, so more keys only add samples.
//
// # Concurrent use
//
// The functions are safe for concurrent use; each call builds its own
// limiters. MeasureHeap reads process-wide heap statistics and is only
// meaningful when nothing else allocates meanwhile.
package countererror
