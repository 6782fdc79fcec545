// Package bench holds slidegate's engine benchmarks and the in-repo
// baselines they are measured against in the same run.
//
// The baseline is the textbook design done well: a map from key to a
// ring-buffer deque of accepted instants, behind one mutex, with a
// monotonic clock (Textbook), and the same split into 64 mutex-guarded
// shards (ShardedTextbook). Both return the engine's Decision with every
// field computed, so a benchmark compares equal work.
//
// The workload helpers (Keys, Stream, Cursor) precompute
// everything a benchmark loop needs, so that loops measure decisions and
// not key formatting or random number generation. The peers module
// (lab/bench/peers, its own go.mod) reuses them to run the same scenarios
// through other rate limiters.
//
// Run the benchmarks with `make bench`, which prints slidegate's ratios to
// the textbook log measured in the same run.
package bench
