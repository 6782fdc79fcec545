#!/usr/bin/env bash
# proxy-env.sh: run a command with the tools the deploy/ tests drive for
# real: nginx and Caddy (in front of an app, with slidegate as their check
# service), podman (building the container image), and prometheus with
# promtool and redis-server (the dashboard's and alerts' queries against
# live servers).
#
#   scripts/proxy-env.sh go test -race ./deploy/
#
# It installs what is missing with apt, once (Debian's nginx-light, which
# has auth_request, caddy, podman, prometheus and redis-server), exports SLIDEGATE_PROXY_ENV=1 so
# that the tests fail rather than skip when a tool is missing, and runs the
# command. It starts nothing itself: each test starts its own nginx or
# Caddy on free loopback ports with its own temporary configuration and
# stops it. The command's exit status is the script's.
set -euo pipefail

missing=()
command -v nginx >/dev/null 2>&1 || missing+=(nginx-light)
command -v caddy >/dev/null 2>&1 || missing+=(caddy)
command -v podman >/dev/null 2>&1 || missing+=(podman)
command -v prometheus >/dev/null 2>&1 || missing+=(prometheus)
command -v promtool >/dev/null 2>&1 || missing+=(prometheus)
command -v redis-server >/dev/null 2>&1 || missing+=(redis-server)
if [ ${#missing[@]} -gt 0 ]; then
	echo "proxy-env: installing ${missing[*]} with apt" >&2
	SUDO=""
	if [ "$(id -u)" != 0 ]; then SUDO="sudo"; fi
	$SUDO apt-get update -qq
	# Installing must not start the packages' own services (port 80, 9090, 6379).
	DEBIAN_FRONTEND=noninteractive RUNLEVEL=1 $SUDO apt-get install -y -qq "${missing[@]}" >/dev/null
fi

export SLIDEGATE_PROXY_ENV=1
if [ $# -eq 0 ]; then
	echo "proxy-env: nginx, caddy, podman, prometheus and redis-server are installed" >&2
else
	"$@"
fi
