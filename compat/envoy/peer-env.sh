#!/usr/bin/env bash
# peer-env.sh: run a command with envoyproxy/ratelimit installed at the
# pinned version, once per machine, from the Go module proxy.
#
#   compat/envoy/peer-env.sh go test ./...
#
# It builds the peer's service (src/service_cmd) and its offline checker
# (src/config_check_cmd) into a cache directory shared by every checkout
# ($SLIDEGATE_CACHE, default ~/.cache/slidegate), downloads the module's
# source (its example and fixture configurations) into the module cache,
# and exports
#
#   SLIDEGATE_ENVOY_PEER_BIN   directory holding service_cmd and config_check_cmd
#   SLIDEGATE_ENVOY_PEER_SRC   the peer module's source directory
#   SLIDEGATE_ENVOY_PEER_VERSION
#
# before running the command. Nothing of the peer is kept in this
# repository. It installs memcached (Debian's package) when missing: the
# peer's memcached tests run against it.
set -euo pipefail

version=v1.4.1-0.20260122083618-3fb702589d36
module=github.com/envoyproxy/ratelimit
cache=${SLIDEGATE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/slidegate}
bin=$cache/envoy-ratelimit/$version
GO=${GO:-go}

if [ ! -x "$bin/service_cmd" ] || [ ! -x "$bin/config_check_cmd" ]; then
	echo "peer-env: building $module@$version into $bin (once)" >&2
	mkdir -p "$bin.tmp"
	(cd "$bin.tmp" && GOFLAGS=-mod=mod GOBIN="$bin.tmp" "$GO" install \
		"$module/src/service_cmd@$version" "$module/src/config_check_cmd@$version")
	rm -rf "$bin"
	mv "$bin.tmp" "$bin"
fi
# The peer's memcached tests need memcached (Debian's package).
if ! command -v memcached >/dev/null; then
	SUDO=""
	if [ "$(id -u)" != 0 ]; then SUDO="sudo"; fi
	$SUDO apt-get update -qq
	DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq memcached >/dev/null
fi
src=$(cd "$cache" && GOFLAGS=-mod=mod "$GO" mod download -json "$module@$version" | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')
if [ -z "$src" ] || [ ! -d "$src" ]; then
	echo "peer-env: could not download $module@$version" >&2
	exit 1
fi
export SLIDEGATE_ENVOY_PEER_BIN=$bin SLIDEGATE_ENVOY_PEER_SRC=$src SLIDEGATE_ENVOY_PEER_VERSION=$version
exec "$@"
