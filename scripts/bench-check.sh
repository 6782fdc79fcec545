#!/usr/bin/env bash
# bench-check: CI's performance regression check.
#
#   scripts/bench-check.sh                 benchmark the tree against BASE (default HEAD~1)
#   scripts/bench-check.sh compare OLD NEW  only compare two `go test -bench` outputs
#
# The check builds the bench package's test binary twice: from the working
# tree, and from a `git worktree` of BASE into which the working tree's
# lab/bench/*.go files are copied, so that both sides run the same benchmarks
# (and the same textbook baseline) against their own engine. It then runs
# the core set COUNT times, alternating baseline and current so that a
# machine that slows down mid-run slows both, and hands the outputs to
# lab/bench/cmd/benchgate, which prints benchstat's comparison and the in-run
# ratios to the textbook, and fails only on a slowdown above THRESHOLD %
# with p < 0.05 that the textbook of the same run did not share.
#
# Environment: BASE (git revision), COUNT (runs per side, default 6),
# THRESHOLD (percent, default 25), BENCHTIME (per benchmark, default 300ms),
# KEEP=1 keeps the outputs in the temporary directory.
set -euo pipefail

root=$(git -C "$(dirname "$0")/.." rev-parse --show-toplevel)
cd "$root"
GO=${GO:-go}
THRESHOLD=${THRESHOLD:-25}
CORE='^(HotKey|Keys1M/allowed/zipf)/slidegate$'

gate() {
	$GO run ./lab/bench/cmd/benchgate compare -threshold "$THRESHOLD" -core "$CORE" "$1" "$2"
}

if [[ ${1:-} == compare ]]; then
	[[ $# -eq 3 ]] || { echo "usage: $0 compare OLD NEW" >&2; exit 2; }
	gate "$2" "$3"
	exit
fi

BASE=${BASE:-HEAD~1}
COUNT=${COUNT:-6}
BENCHTIME=${BENCHTIME:-300ms}

tmp=$(mktemp -d)
cleanup() {
	git worktree remove --force "$tmp/base" >/dev/null 2>&1 || true
	if [[ ${KEEP:-} == 1 ]]; then echo "bench-check: outputs kept in $tmp"; else rm -rf "$tmp"; fi
}
trap cleanup EXIT

if ! rev=$(git rev-parse --verify -q "$BASE^{commit}"); then
	echo "bench-check: no baseline revision $BASE (shallow clone?); nothing to compare, passing"
	exit 0
fi
echo "bench-check: current tree vs $BASE ($rev), $COUNT runs each, benchtime $BENCHTIME"
git worktree add --detach -q "$tmp/base" "$rev"
mkdir -p "$tmp/base/lab/bench"
find "$tmp/base/lab/bench" -maxdepth 1 -name '*.go' -delete
cp lab/bench/*.go "$tmp/base/lab/bench/"
if ! (cd "$tmp/base" && $GO test -c -o "$tmp/old.test" ./lab/bench) 2>"$tmp/build.log"; then
	cat "$tmp/build.log"
	echo "bench-check: $BASE does not build with the current benchmarks (the engine API or the layout changed?); nothing to compare, passing"
	exit 0
fi
$GO test -c -o "$tmp/new.test" ./lab/bench

run() { # binary output
	"$1" -test.run '^$' -test.bench '^BenchmarkHotKey$' -test.benchtime "$BENCHTIME" -test.benchmem >>"$2"
	"$1" -test.run '^$' -test.bench '^BenchmarkKeys1M$/^allowed$/^zipf$/^(slidegate|textbook)$' \
		-test.benchtime "$BENCHTIME" -test.benchmem >>"$2"
}
for i in $(seq "$COUNT"); do
	echo "bench-check: run $i/$COUNT"
	run "$tmp/old.test" "$tmp/old.txt"
	run "$tmp/new.test" "$tmp/new.txt"
done
gate "$tmp/old.txt" "$tmp/new.txt"
