#!/usr/bin/env bash
# bench: the engine benchmarks against the in-repo textbook log (package
# lab/bench), saved to out/bench.txt, then the in-run ratios and a markdown
# table of them.
# Environment: BENCH (regexp, default .), BENCHTIME (default 1s), COUNT
# (default 1), GO.
set -euo pipefail
cd "$(git -C "$(dirname "$0")/.." rev-parse --show-toplevel)"
GO=${GO:-go}
mkdir -p out
$GO test -run '^$' -bench "${BENCH:-.}" -benchmem -benchtime "${BENCHTIME:-1s}" -count "${COUNT:-1}" \
	-timeout 30m ./lab/bench | tee out/bench.txt
$GO run ./lab/bench/cmd/benchgate ratios out/bench.txt
echo
$GO run ./lab/bench/cmd/benchgate table out/bench.txt
