# slidegate — see README.md. Every target works on a fresh Debian machine
# with Go installed; `make test` installs and starts what the tests need.

GO        ?= go
# The repository's modules (go.work lists them; docs/design.md maps them).
# lab/bench/peers and compat/envoy have targets of their own (test-peers,
# test-envoy): they build third-party peers.
MODULES   := . cmd/slidegate deploy grpclimit internal/rls internal/server lab redisstore remote telemetry
PKGS      ?= ./... $(foreach m,$(filter-out .,$(MODULES)),./$(m)/...)
BENCHTIME ?= 1s
COUNT     ?= 1

.PHONY: all build test test-short lint fmt vet bench bench-peers bench-check test-peers

all: lint test

# bin/slidegate with version, commit and build date stamped in (slidegate
# version prints them).
VERSION ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
COMMIT  ?= $(shell git rev-parse HEAD 2>/dev/null)
DATE    ?= $(shell date -u +%Y-%m-%dT%H:%M:%SZ)
LDFLAGS := -X main.version=$(VERSION) -X main.commit=$(COMMIT) -X main.date=$(DATE)

build:
	$(GO) build $(PKGS)
	$(GO) build -ldflags '$(LDFLAGS)' -o bin/slidegate ./cmd/slidegate

# The server with the built-in configuration (docs/operations.md);
# SERVE_FLAGS adds flags, e.g. SERVE_FLAGS='--config slidegate.yaml'.
.PHONY: serve
SERVE_FLAGS ?=
serve: build
	bin/slidegate serve $(SERVE_FLAGS)

vet:
	$(GO) vet $(PKGS)

# The container image of deploy/Dockerfile (docs/integrations.md): a static
# binary on scratch, built with podman. IMAGE names it.
.PHONY: image
IMAGE ?= localhost/slidegate:latest
image:
	mkdir -p bin/image
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags '$(LDFLAGS)' -o bin/image/slidegate ./cmd/slidegate
	podman build --format docker -f deploy/Dockerfile -t $(IMAGE) bin/image

fmt:
	gofmt -w $$(git ls-files '*.go')

# staticcheck at a pinned version, fetched through the module proxy on first
# use (go run caches the build).
STATICCHECK ?= honnef.co/go/tools/cmd/staticcheck@v0.8.2

lint: vet
	@out=$$(gofmt -l $$(git ls-files '*.go')); \
	if [ -n "$$out" ]; then echo "gofmt would change:"; echo "$$out"; exit 1; fi
	$(GO) run $(STATICCHECK) $(PKGS)

# The whole suite under the race detector. scripts/redis-env.sh installs
# redis-server with apt when missing, starts a standalone server and a
# three-master cluster on free loopback ports for the redisstore tests
# (SLIDEGATE_REDIS_ADDR, SLIDEGATE_REDIS_CLUSTER_ADDRS) and stops them after.
# scripts/proxy-env.sh installs nginx, caddy, podman, prometheus and
# redis-server with apt when missing, for the deploy/ tests that run them.
# internal/testprogress prints go test's usual lines plus one when each
# package starts and one a minute naming packages still running; it exits
# with go test's status. The timeout is a hang's bound, not a speed
# target: on 2 cores beside other work the engine package alone takes
# over 10 minutes.
test: vet
	$(GO) build -o bin/testprogress ./internal/testprogress
	scripts/redis-env.sh scripts/proxy-env.sh bin/testprogress $(GO) test -race -count=1 -timeout 30m $(PKGS)

# Redis backend benchmarks (docs/distributed.md): clients at 64 callers,
# redis-benchmark on the same script, memory per entry, refusal cache hits.
.PHONY: bench-redis
bench-redis:
	scripts/redis-env.sh $(GO) test -run '^$$' -bench 'Clients|VsRedisBenchmark|MemoryPerEntry|MemoryPerKey|GroupOfTwo' -benchtime 1x ./redisstore/
	scripts/redis-env.sh $(GO) test -run '^$$' -bench RefusalCacheHit -benchtime 1s ./redisstore/

# The lock-free core on a 32-bit target (typed atomics keep 64-bit words
# aligned there), and the whole tree compiled for it.
.PHONY: test-386
test-386:
	GOARCH=386 $(GO) vet $(PKGS)
	GOARCH=386 $(GO) test -short -count=1 ./internal/shard/ ./engine/ ./internal/reference/

test-short:
	$(GO) test -short -count=1 $(PKGS)

# Engine benchmarks against the in-repo textbook log, then the in-run
# ratios. BENCH selects benchmarks.
BENCH ?= .
bench:
	GO=$(GO) BENCH='$(BENCH)' BENCHTIME=$(BENCHTIME) COUNT=$(COUNT) scripts/bench.sh

# slidegate beside its peers: one markdown table (docs/results.md, "Peers",
# holds the latest from make results).
bench-peers:
	cd lab/bench/peers && $(GO) run ./cmd/peerbench $(PEERSFLAGS)

# docs/results.md, generated: one make loadtest, one make bench-peers, one
# make bench-redis-peers and one make bench-envoy on this machine, their JSON output (out/results/), then the page (machine,
# date, tables) and README's summary table from it (lab/internal/resultspage).
# bench-envoy runs three rounds here; BENCH_ENVOY_FLAGS overrides (-rounds 1).
# The page holds this run only; older runs are in its git history.
.PHONY: results
RESULTS_OUT ?= out/results
results:
	mkdir -p $(RESULTS_OUT)
	$(LOADTEST) --out $(RESULTS_OUT)/loadtest $(LOADTEST_FLAGS)
	cd lab/bench/peers && $(GO) run ./cmd/peerbench -json $(CURDIR)/$(RESULTS_OUT)/peers.json $(PEERSFLAGS) > $(CURDIR)/$(RESULTS_OUT)/peers.md
	scripts/redis-env.sh sh -c 'cd lab/bench/redispeers && $(GO) run . -json $(CURDIR)/$(RESULTS_OUT)/redispeers.json $(REDISPEERSFLAGS) > $(CURDIR)/$(RESULTS_OUT)/redispeers.md'
	GO=$(GO) compat/envoy/peer-env.sh scripts/redis-env.sh sh -c 'cd compat/envoy && $(GO) run ./cmd/envoybench -json $(CURDIR)/$(RESULTS_OUT)/envoybench.json -rounds 3 $(BENCH_ENVOY_FLAGS) > $(CURDIR)/$(RESULTS_OUT)/envoybench.md'
	$(GO) run ./lab/internal/resultspage -loadtest $(RESULTS_OUT)/loadtest/report.json -peers $(RESULTS_OUT)/peers.json -redispeers $(RESULTS_OUT)/redispeers.json -envoy $(RESULTS_OUT)/envoybench.json -out docs/results.md -readme README.md

# slidegate's Redis store beside the Redis limiters a Go user would pick
# instead (redis_rate, ulule, throttled, a textbook sorted-set script), on
# one Redis server and a three-master Cluster that scripts/redis-env.sh
# starts: decisions/s, Redis CPU and commands per decision, and the most
# admitted in any window (lab/bench/redispeers, a module of its own).
# REDISPEERSFLAGS adds flags (-rounds 1, -duration 2s).
.PHONY: bench-redis-peers
REDISPEERSFLAGS ?=
bench-redis-peers:
	scripts/redis-env.sh sh -c 'cd lab/bench/redispeers && $(GO) run . $(REDISPEERSFLAGS)'

# The peers modules' own tests (adapter semantics, exactness, the table),
# the Redis peers' against a real Redis.
test-peers:
	cd lab/bench/peers && $(GO) vet ./... && $(GO) test -race -count=1 ./...
	scripts/redis-env.sh sh -c 'cd lab/bench/redispeers && $(GO) vet ./... && $(GO) test -race -count=1 ./...'

# slidegate's Envoy rate limit service against envoyproxy/ratelimit itself
# (compat/envoy, its own module): compat/envoy/peer-env.sh builds the peer
# at its pinned version from the Go module proxy once (cached under
# ~/.cache/slidegate), scripts/redis-env.sh gives it a Redis; the same
# configurations and request sequences go to both over loopback gRPC.
.PHONY: test-envoy
test-envoy:
	GO=$(GO) compat/envoy/peer-env.sh scripts/redis-env.sh sh -c 'cd compat/envoy && $(GO) vet ./... && $(GO) test -race -count=1 -v ./...'

# envoyproxy/ratelimit and slidegate envoy serve side by side on one Redis
# (compat/envoy/cmd/envoybench): decisions/s, p50/p99, CPU per decision of
# each service and of Redis, as ratios. BENCH_ENVOY_FLAGS adds flags
# (-duration 3s, -rounds 1).
.PHONY: bench-envoy
BENCH_ENVOY_FLAGS ?=
bench-envoy:
	GO=$(GO) compat/envoy/peer-env.sh scripts/redis-env.sh sh -c 'cd compat/envoy && $(GO) run ./cmd/envoybench $(BENCH_ENVOY_FLAGS)'

# CI's performance regression check against BASE (default HEAD~1).
bench-check:
	GO=$(GO) scripts/bench-check.sh

# The sliding window counter's error against the exact log, its worst case
# and the heap per key of both (docs/algorithms.md quotes the output).
.PHONY: counter-error
counter-error:
	$(GO) run ./lab/cmd/countererror

# The reference load test, about a minute on 2 cores: 1,000,000 Zipf
# clients; memory (engine vs textbook), engine, http (vegeta against an
# in-process server, results saved for vegeta report/plot) and capacity
# (saturation throughput in pairs of short closed-loop slices against the
# server and a no-op handler in turn), every decision verified. Each timed target is judged
# on the interval of the median of its rounds' ratios: met, missed, or
# undecided (too noisy, or the machine too busy to judge). Report, summary, vegeta results and HTML plots go to
# out/loadtest/ (git-ignored). LOADTEST_FLAGS adds flags, e.g. --strict
# (go run ./lab/cmd/slidegate-loadtest --help lists them).
.PHONY: loadtest loadtest-scale loadtest-redis loadtest-grpc profile
LOADTEST_FLAGS ?=
# The lab's own binary (lab/cmd/slidegate-loadtest, in the lab module).
LOADTEST = $(GO) run ./lab/cmd/slidegate-loadtest
loadtest:
	$(LOADTEST) --out out/loadtest $(LOADTEST_FLAGS)

# Cost against clients: heap and RSS per client after 1 and L requests,
# decisions per second and p50/p99 at 10k, 100k and 1M clients, both
# curves in out/loadtest-scale/scale.html. SCALE_MAX=10000000 adds 10M
# (about two minutes and 12 GiB of RSS: every client is filled to L).
SCALE_MAX ?= 1000000
loadtest-scale:
	$(LOADTEST) --mode scale --scale-max $(SCALE_MAX) --out out/loadtest-scale $(LOADTEST_FLAGS)

# Redis under load: scripts/redis-env.sh starts a standalone Redis and a
# three-master Redis Cluster on loopback (and stops them); engine-style and
# HTTP phases against each, every decision verified with Redis's instants,
# INFO memory and commandstats, redis-benchmark on the same command; then
# rounds of the store against redis-benchmark, its target the calls per
# second of Redis CPU of one over the other.
loadtest-redis:
	scripts/redis-env.sh $(LOADTEST) --mode redis --out out/loadtest-redis $(LOADTEST_FLAGS)

# Envoy's rate limit service: ShouldRateLimit over loopback gRPC, paced,
# every decision verified (docs/envoy.md); then rounds against a no-op
# gRPC server, its target the CPU per call of one over the other.
loadtest-grpc:
	$(LOADTEST) --mode grpc --out out/loadtest-grpc $(LOADTEST_FLAGS)

# Regenerates the committed pprof profiles of every phase in profiles/
# (the reference run, scale mode and the Redis phase) and their README
# (top functions, GC share).
profile:
	$(LOADTEST) --out out/profile --profile-dir profiles --progress off $(LOADTEST_FLAGS)
	$(LOADTEST) --mode scale --out out/profile-scale --profile-dir profiles --progress off $(LOADTEST_FLAGS)
	scripts/redis-env.sh $(LOADTEST) --mode redis --out out/profile-redis --profile-dir profiles --progress off $(LOADTEST_FLAGS)
	GO=$(GO) sh profiles/gen-readme.sh profiles out/profile/summary.txt out/profile-scale/summary.txt out/profile-redis/summary.txt > profiles/README.md.tmp
	mv profiles/README.md.tmp profiles/README.md
