#!/bin/sh
# Writes profiles/README.md from the profiles of every phase and the runs'
# summaries. Run by `make profile`; usage: gen-readme.sh PROFILE_DIR SUMMARY...
set -eu
dir=${1:-profiles}
shift || true
GO=${GO:-go}

# pct FILE FUNC: FUNC's cumulative share of the CPU profile, e.g. 4.51%.
pct() {
	$GO tool pprof -top -cum -nodecount=1000 "$1" 2>/dev/null |
		awk -v f="$2" '$6 == f { print $5; found=1; exit } END { if (!found) print "0%" }'
}

# gcshare FILE: background mark workers + mark assists + background sweep.
gcshare() {
	a=$(pct "$1" runtime.gcBgMarkWorker); b=$(pct "$1" runtime.gcAssistAlloc); c=$(pct "$1" runtime.bgsweep)
	echo "$a $b $c" | awk '{ gsub("%", ""); printf "%.1f%% (mark workers %s%%, mark assists %s%%, sweep %s%%)", $1 + $2 + $3, $1, $2, $3 }'
}

# http_breakdown FILE: where an HTTP phase's CPU goes, by cumulative share.
http_breakdown() {
	echo "Where the process's CPU goes (cumulative shares, overlapping): the server's connections"
	echo "\`net/http.(*conn).serve\` $(pct "$1" 'net/http.(*conn).serve'), of which the decision API's handler"
	echo "\`server.(*Server).handleAllow\` $(pct "$1" 'github.com/slidegate/slidegate/internal/server.(*Server).handleAllow')"
	echo "and the decision itself \`server.(*Server).decide\` $(pct "$1" 'github.com/slidegate/slidegate/internal/server.(*Server).decide');"
	echo "vegeta's client \`(*Attacker).attack\` $(pct "$1" 'github.com/tsenart/vegeta/v12/lib.(*Attacker).attack')"
	if [ "${2:-}" = capacity ]; then
		echo "with its lean transport \`(*leanTransport).RoundTrip\` $(pct "$1" 'github.com/slidegate/slidegate/lab/loadtest.(*leanTransport).RoundTrip');"
	else
		echo "plus its connections' \`(*persistConn).writeLoop\` $(pct "$1" 'net/http.(*persistConn).writeLoop') and \`readLoop\` $(pct "$1" 'net/http.(*persistConn).readLoop');"
	fi
	echo "system calls \`syscall.Syscall6\` $(pct "$1" 'internal/runtime/syscall/linux.Syscall6'); the scheduler \`runtime.schedule\` $(pct "$1" 'runtime.schedule');"
	echo "allocation \`runtime.mallocgc\` $(pct "$1" 'runtime.mallocgc')."
}

commit=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)
cat <<HDR
# profiles

pprof profiles of every load-test phase, committed so that changes to the
hot path can be compared with \`go tool pprof -diff_base\`: the reference
run (\`make loadtest\`'s scenario: 1,000,000 Zipf clients; memory, engine,
http and capacity phases), scale mode (10k, 100k, 1M clients) and the
Redis phase (standalone and cluster).

## How they were made

\`make profile\` runs

    go run ./lab/cmd/slidegate-loadtest --out out/profile --profile-dir profiles
    go run ./lab/cmd/slidegate-loadtest --mode scale --out out/profile-scale --profile-dir profiles
    scripts/redis-env.sh go run ./lab/cmd/slidegate-loadtest --mode redis --out out/profile-redis --profile-dir profiles

and then \`profiles/gen-readme.sh\`, which wrote this file. Made at commit
\`$commit\` on $(date -u +%Y-%m-%d), $(nproc) CPUs, $($GO env GOVERSION).
The machine was shared with other work, so absolute times are noisy.

| file | what |
|---|---|
| \`memory-cpu.pprof\` | CPU while populating 1,000,000 clients, engine then textbook |
| \`memory-heap.pprof\` | heap while the engine holds the 1,000,000 clients (\`-sample_index=inuse_space\`) |
| \`engine-cpu.pprof\` | CPU of the timed engine phase: its rounds of engine decisions from 8 goroutines and the floor's (label target=floor); no setup, no verification |
| \`engine-heap.pprof\` | heap at the end of the engine phase, records and limiter alive |
| \`http-cpu.pprof\` | CPU of the http phase: the in-process server and vegeta share the process |
| \`http-heap.pprof\` | heap at the end of the http phase |
| \`capacity-cpu.pprof\` | CPU of the capacity phase's slices and cost rounds: server, no-op handler, vegeta and the minimal client in one process |
| \`capacity-heap.pprof\` | heap after the capacity phase |
| \`scale-cpu.pprof\` | CPU of scale mode: populating and deciding at 10k, 100k and 1M clients |
| \`redis-cpu.pprof\` | CPU of the harness's process in the Redis phase (redisstore's client side, the in-process server, vegeta); Redis's own time is in the summary (INFO commandstats) |
| \`redis-heap.pprof\` | heap after the Redis phase |
| \`*-mutex.pprof\` | mutex contention, cumulative from the start of each run (the runtime cannot reset it) |

Read one with \`go tool pprof -top profiles/engine-cpu.pprof\` or
\`go tool pprof -http=: profiles/engine-cpu.pprof\`.

Reading notes: "Total samples" as a share of "Duration" is the CPU the
process got (200% is both cores); well under that, other work shared the
machine. \`runtime.asyncPreempt\` is the runtime preempting goroutines
(the engine phase runs 4 per core); its share swings between runs with the
machine's load (from about 6% to over 20% on the shared 2-core machine)
and is not engine work. The GC share counts the background mark workers,
mark assists and the background sweeper.

HDR

for phase in memory engine http capacity scale redis; do
	f="$dir/$phase-cpu.pprof"
	[ -f "$f" ] || continue
	echo "## $phase phase"
	echo
	top3=$($GO tool pprof -top -nodecount=3 "$f" 2>/dev/null | sed -n '/flat%/,$p' | tail -n +2 |
		awk '{ name=$6; printf "%s%s (%s flat)", sep, name, $2; sep=", " }')
	echo "In short: the top functions by own CPU are $top3; the GC share of CPU samples is $(gcshare "$f")."
	echo
	case $phase in
	http | capacity | redis)
		http_breakdown "$f" "$phase"
		echo
		;;
	esac
	if [ "$phase" = capacity ]; then
		echo "CPU by pprof label (\`go tool pprof -tags $f\`): each server's connections carry"
		echo "target=slidegate|no-op, side=server; each slice's vegeta workers and client connections,"
		echo "and each cost round's minimal client, side=client. Divide by the requests each target"
		echo "served (slices and cost rounds: report.json) for CPU per request. The summary's cost"
		echo "rounds give the server's own CPU per request over the no-op's without a profile."
		echo
		echo '```'
		$GO tool pprof -tags "$f" 2>/dev/null
		echo
		for t in slidegate no-op; do
			for side in server client; do
				other=client
				[ $side = client ] && other=server
				printf '%s %s: ' "$t" "$side"
				$GO tool pprof -tagfocus=target=$t -tagignore=side=$other -top -nodecount=100000 "$f" 2>/dev/null |
					awk '/^Showing nodes accounting for/ { sub(",", "", $5); print $5; exit }'
			done
		done
		echo '```'
		echo
	fi
	echo "Top functions by flat CPU (\`go tool pprof -top -nodecount=15 $f\`):"
	echo
	echo '```'
	$GO tool pprof -top -nodecount=15 "$f" 2>/dev/null | sed -n '/^Duration/,$p' | grep -v '^Showing\|^Dropped'
	echo '```'
	echo
	echo "Top by cumulative CPU:"
	echo
	echo '```'
	$GO tool pprof -top -cum -nodecount=12 "$f" 2>/dev/null | sed -n '/flat%/,$p'
	echo '```'
	echo
	h="$dir/$phase-heap.pprof"
	if [ -f "$h" ]; then
		echo "Heap in use at the end of the phase (\`go tool pprof -sample_index=inuse_space -top -nodecount=8 $h\`):"
		echo
		echo '```'
		$GO tool pprof -sample_index=inuse_space -top -nodecount=8 "$h" 2>/dev/null | sed -n '/flat%/,$p'
		echo '```'
		echo
	fi
done

for summary in "$@"; do
	[ -f "$summary" ] || continue
	echo "## Summary: $summary"
	echo
	echo '```'
	cat "$summary"
	echo '```'
	echo
done
