// Package loadtest is slidegate's load-test harness: the proof of its
// claims on memory, decision latency and correctness under parallel load.
// `slidegate-loadtest` and `make loadtest` run it.
//
// The API is small: [Main] is the subcommand (flags in, exit status out);
// [Run] runs a [Config] (start from [DefaultConfig], the reference
// scenario) and returns a [Report], the verdict and the files written.
// Every figure is in report.json, which Run writes under Config.Out.
//
// A run has up to seven phases, reported in one format; the default (`make
// loadtest`) runs the first four:
//
//   - memory: N clients (default 1,000,000) each send k requests, first to
//     an engine.Limiter and then to a bench.Textbook (a mutex over a
//     map[string]*deque, the log as textbooks write it). Each is measured
//     by the live heap after a full GC minus the same before (keys
//     included, as a server would hold them) and by RSS growth, and
//     compared with 8 bytes (one int64) per stored instant.
//   - engine: an engine.Limiter driven by many goroutines at full speed
//     over N clients drawn uniformly or from a Zipf law. One decision in
//     --engine-sample per goroutine is timed with time.Now and time.Since
//     into a log-linear histogram (p50 … p99.9, max); the bracket's own
//     cost is measured in the same run and reported beside it. Key
//     streams are drawn before the timed phase, so it times decisions, not
//     random numbers. The phase runs in --engine-rounds rounds: in each,
//     every goroutine's next slice of its stream goes, in --engine-parts
//     parts, through the engine and through the floor in turn (the order
//     alternating part by part), so that each round gives the two tails
//     side by side and a collection or another process's burst falls on
//     both.
//   - http: slidegate's server (package server, as `slidegate serve` runs
//     it) started on 127.0.0.1:0, or an external one given by --target,
//     attacked by vegeta used as a library (Attacker, ConstantPacer or
//     LinearPacer, Metrics, the plot package) with a targeter of POST
//     /v1/allow bodies spread over N clients and the tiers. Every result is saved in vegeta's encoding
//     (http-results.bin), and the report's figures are vegeta.Metrics over
//     them in the saved order: `vegeta report` on the file prints them.
//   - capacity: the server's saturation throughput against the harness's
//     no-op handler's (served the same way on its own listener), in
//     rounds. A round is a pair of closed-loop slices of --capacity-slice,
//     one per target, back to back (which goes first alternates): vegeta
//     at an unbounded rate with --capacity-workers workers, so that that
//     many requests are in flight at all times. vegeta's client runs on a
//     lean HTTP/1.1 transport (leanclient.go) for both targets: it sends
//     the bytes net/http sends and reads an answer's status and length
//     only, since the decisions are recorded at the server. A slice holds its
//     throughput (answers per second) when its p99 is within
//     --capacity-p99 and no request failed; a round's ratio is
//     slidegate's throughput over the no-op's. A closed loop, because a
//     stall of the collector or the scheduler then delays only the few
//     requests in flight and costs both targets the same share of a
//     slice, where the open-loop ramp it replaced put any step's p99 over
//     the bound and drew its answer from the stalls; saturated, the
//     ratio follows the two targets' CPU per request whatever share of
//     the cores the run got. Short slices in pairs, so that both halves
//     of a round see the same machine; each after a full collection, so
//     that neither pays for the other's garbage. A round during which other
//     processes took over 0.2 core on average, or whose no-op slice
//     held nothing, is left out and run again. The first look is at
//     --capacity-rounds clean rounds (below). The report gives every round's
//     ratio, each target's median throughput, and this process's CPU
//     per request for each target and their difference. Then the cost
//     rounds: a minimal client (pre-rendered requests, answers read to
//     their length) sends --capacity-cost-burst requests to each target
//     in eight alternating parts a side (ABBA); slidegate's CPU per
//     request less the no-op's is what its server adds (the decision path
//     and net/http's cost of the longer answer), shown as the median of
//     15 clean rounds with its interval beside a 3 µs goal, not judged.
//   - scale: at 10k, 100k, 1M (and, by --scale-max, 10M) clients, heap
//     and RSS per client after 1 and L requests, decisions per second and
//     sampled latency; both curves in scale.html.
//   - redis: engine-style and HTTP phases against a standalone Redis and a
//     Redis Cluster through redisstore, with Redis's memory per key and
//     entry (INFO memory), the script's server time (INFO commandstats)
//     and redis-benchmark on the same command at the same concurrency.
//     Its target's rounds: a quarter of --redis-requests decisions
//     through the store and as many commands from redis-benchmark, in
//     turn; a round's ratio is the store's decisions per second of Redis
//     CPU (INFO cpu) over redis-benchmark's.
//   - grpc: ShouldRateLimit calls to Envoy's rate limit service (package
//     rls) on loopback, one descriptor per client, paced at --http-rate
//     for --http-duration over --http-connections gRPC connections;
//     decisions per second, client-side p50/p99/p99.9, and every decision
//     the service's group made replayed through the reference. Then its
//     target's rounds: --grpc-round-calls calls at full speed to a fresh
//     service and to a no-op gRPC server (the same service answered OK,
//     on a gRPC server with the service's options) in turn; a round's
//     ratio is the no-op's CPU per call over the service's.
//
// Correctness: every decision (key, cost, At, outcome and fields) is kept
// as a 40-byte record, bounded by --max-records, and replayed offline
// through reference.VerifyLog (or VerifyCounter), which counts
// mismatches, over-admissions and under-admissions. The server's decisions
// are recorded from the harness's side: its backends come from a store
// factory of the harness that wraps each one (it uses no hook or test
// route of the server). Any such count, a failed request, or responses that
// do not add up to the recorded decisions make Main exit 1. Performance
// targets are reported as met or missed apart from correctness; --strict
// makes a missed or undecided one fail the run too. Every target is a
// ratio of two figures measured in the same run, so that a machine's speed
// cancels out: the engine's heap against the textbook log's, the
// engine's p99 and p99.9 against the floor's (the same key streams through
// a clock read, an xsync lookup and one load), and the server's capacity
// against a no-op handler's. A machine's pauses do not cancel out: a
// decision meets one with a chance of about its length times their rate,
// so the engine's slowest thousandth holds more of them than the floor's
// once that chance nears a thousandth. The engine phase probes the pauses
// first (200 ms of one goroutine per core spinning on the clock, gaps of
// 10 µs or more) and reports, per round, the timed decisions of 10 µs or
// more on each side. A timed target is judged on its rounds: a
// distribution-free interval of the median of the rounds' ratios (the
// k-th smallest to the k-th largest). It is met when the whole interval
// is on the good side of the bound, missed when it is wholly on the bad
// side, and otherwise undecided: too noisy, or, with too few rounds left
// once those other processes disturbed are left out, the machine too
// busy to judge.
//
// The capacity rounds are sequential, so that a ratio near its bound
// gets the rounds it needs and one far from it does not wait for them.
// The target is looked at first after --capacity-rounds clean rounds.
// Undecided there, it is measured on, to six times as many clean
// rounds or until its rounds have run --capacity-budget, and looked at
// once more over every round. Each look may end the rounds, so the looks
// share the error: each look's interval covers the median with
// probability at least 95%, and the judged interval misses it at most
// 10% of the time (a Bonferroni split; the looks' counts are fixed
// beforehand and the budget is time, blind to the ratios). A wrong met,
// or a wrong missed, thus comes at most 5% of the time, and two runs of
// one machine give opposite verdicts only when one of them is wrong. A
// median on the bound stays undecided, as it should. The engine's
// targets are judged once, on their --engine-rounds rounds at 90%: those
// rounds run one recorded stream in order and the engine fills as they
// go, so rounds added later would measure a fuller engine and move the
// median. The report shows every round's ratio, the look that judged
// each target and the time the capacity rounds took against their
// budget. Absolute figures (rates, latencies) are shown beside them and
// not judged.
//
// Reports: a summary on stdout (and summary.txt) that ends with the
// targets and the verdict, report.json, capacity-steps.txt (every slice
// of the capacity phase), vegeta's results files, vegeta's HTML
// latency-over-time plots (engine-plot.html, http-plot.html) and
// scale.html under --out; CPU, heap and mutex profiles on request
// (--cpuprofile, --memprofile, --mutexprofile, --profile-dir). On a
// terminal a long step redraws one status line (count, share, rate,
// elapsed time); off a terminal each step prints one line when it ends.
//
// Every phase is bounded in time and count, and load goes to loopback
// unless --target names another address (Redis addresses must be
// loopback).
//
// A run measures the whole process (its heap, RSS and CPU profiles), so
// run one at a time. A minimal program:
//
//	func main() {
//		os.Exit(loadtest.Main(context.Background(), os.Args[1:], os.Stdout, os.Stderr))
//	}
package loadtest
