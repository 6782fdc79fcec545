#!/usr/bin/env bash
# redis-env.sh: run a command with its own Redis servers on free loopback
# ports, then stop them.
#
#   scripts/redis-env.sh go test -race ./...
#
# It installs redis-server with apt when it is missing (Debian's build has
# TLS and Sentinel, which the tests that start their own servers use),
# starts one standalone server and one three-master Redis Cluster (no
# replicas, cluster-require-full-coverage no as docs/distributed.md asks)
# in a temporary directory, exports
#
#   SLIDEGATE_REDIS_ADDR           host:port of the standalone server
#   SLIDEGATE_REDIS_CLUSTER_ADDRS  host:port,host:port,host:port of the masters
#
# runs the command, and stops every server it started when it exits (trap
# EXIT), whatever the command's outcome. The command's exit status is the
# script's. Nothing is persisted (no RDB, no AOF).
set -euo pipefail

if ! command -v redis-server >/dev/null 2>&1 || ! command -v redis-cli >/dev/null 2>&1; then
	echo "redis-env: installing redis-server with apt" >&2
	SUDO=""
	if [ "$(id -u)" != 0 ]; then SUDO="sudo"; fi
	$SUDO apt-get update -qq
	DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq redis-server redis-tools >/dev/null
fi

dir=$(mktemp -d -t slidegate-redis.XXXXXX)
pids=()

cleanup() {
	for pidfile in "$dir"/*.pid; do
		[ -e "$pidfile" ] || continue
		pid=$(cat "$pidfile" 2>/dev/null || true)
		[ -n "$pid" ] && kill "$pid" 2>/dev/null || true
	done
	# Wait for them to go, so that the ports are free when we return.
	for pidfile in "$dir"/*.pid; do
		[ -e "$pidfile" ] || continue
		pid=$(cat "$pidfile" 2>/dev/null || true)
		for _ in $(seq 50); do
			[ -n "$pid" ] && kill -0 "$pid" 2>/dev/null || break
			sleep 0.1
		done
	done
	rm -rf "$dir"
}
trap cleanup EXIT

# port_free P: nothing listens on 127.0.0.1:P nor on its cluster bus port.
port_free() {
	! (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null &&
		! (exec 3<>"/dev/tcp/127.0.0.1/$(($1 + 10000))") 2>/dev/null
}

# start NAME ARGS...: start a redis-server on a free port; prints the port.
start() {
	local name=$1
	shift
	for _ in $(seq 20); do
		local port=$((20000 + RANDOM % 30000))
		port_free "$port" || continue
		if redis-server --port "$port" --bind 127.0.0.1 --save "" --appendonly no \
			--daemonize yes --dir "$dir" --pidfile "$dir/$name.pid" \
			--logfile "$dir/$name.log" --enable-debug-command local "$@" >/dev/null 2>&1; then
			for _ in $(seq 50); do
				if redis-cli -p "$port" ping >/dev/null 2>&1; then
					echo "$port"
					return 0
				fi
				sleep 0.1
			done
		fi
	done
	echo "redis-env: could not start redis-server $name; log:" >&2
	cat "$dir/$name.log" >&2 || true
	return 1
}

standalone=$(start standalone)
cluster=()
for i in 1 2 3; do
	cluster+=("$(start "cluster$i" --cluster-enabled yes --cluster-config-file "$dir/nodes$i.conf" --cluster-node-timeout 2000 --cluster-require-full-coverage no)")
done
addrs=()
for p in "${cluster[@]}"; do addrs+=("127.0.0.1:$p"); done
redis-cli --cluster create "${addrs[@]}" --cluster-replicas 0 --cluster-yes >"$dir/create.log" 2>&1 || {
	cat "$dir/create.log" >&2
	exit 1
}
for _ in $(seq 100); do
	ok=1
	for p in "${cluster[@]}"; do
		redis-cli -p "$p" cluster info 2>/dev/null | grep -q 'cluster_state:ok' || ok=0
	done
	[ "$ok" = 1 ] && break
	sleep 0.1
done
[ "$ok" = 1 ] || { echo "redis-env: cluster did not become ready" >&2; exit 1; }

export SLIDEGATE_REDIS_ADDR="127.0.0.1:$standalone"
export SLIDEGATE_REDIS_CLUSTER_ADDRS=$(IFS=,; echo "${addrs[*]}")
echo "redis-env: standalone $SLIDEGATE_REDIS_ADDR, cluster $SLIDEGATE_REDIS_CLUSTER_ADDRS" >&2

if [ $# -eq 0 ]; then
	echo "redis-env: servers up; press Ctrl-C to stop" >&2
	sleep infinity & wait
else
	"$@"
fi
