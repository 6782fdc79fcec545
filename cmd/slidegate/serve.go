package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/slidegate/slidegate/internal/server"
	"github.com/slidegate/slidegate/internal/server/config"
)

func init() {
	register(command{name: "serve", summary: "run the decision API or gateway, with metrics and pprof", run: runServe})
}

// storeOptions are the store factories this build knows beyond memory; the
// Redis backend adds itself here (server.WithStore).
var storeOptions []server.Option

func runServe(args []string) int {
	return serve(context.Background(), args, os.Stdout, os.Stderr)
}

// serve is slidegate serve; extra options come after the build's own (tests
// pass a start hook to learn the bound addresses). It parses the flags,
// builds the configuration in force, and either prints it (--print-config)
// or serves until a signal ends the drain.
func serve(ctx context.Context, args []string, stdout, stderr io.Writer, extra ...server.Option) int {
	f, code := parseServeFlags(args, stdout, stderr)
	if f == nil {
		return code
	}
	cfg, err := f.load()
	if err != nil {
		fmt.Fprintf(stderr, "slidegate serve: %v\n", err)
		return 1
	}
	f.envoy.merge(&cfg.GRPC, f.set)
	if err := f.envoy.check(&cfg); err != nil {
		fmt.Fprintf(stderr, "slidegate serve: %v\n", err)
		return 2
	}
	v, c, d := buildInfo()
	opts := append([]server.Option{server.WithBuildInfo(server.BuildInfo{Version: v, Commit: c, Date: d})}, storeOptions...)
	opts = append(opts, extra...)
	if f.printConfig {
		return printConfig(cfg, f.envoy, opts, stdout, stderr)
	}
	return runServer(ctx, cfg, f, opts, stderr)
}

// serveFlags are slidegate serve's flags, parsed.
type serveFlags struct {
	configPath, listen, admin, upstream  string
	store, storeFile                     string
	defPolicy, key, tierHeader, logLevel string
	logFormat                            string
	tlsCert, tlsKey, tlsClientCA         string
	shutdown, drain                      config.Duration
	printConfig                          bool
	level                                slog.Level
	envoy                                *envoyFlags
	set                                  map[string]bool // the flags given explicitly
}

const serveUsage = `Usage: slidegate serve [flags]

Runs the slidegate server. Without --upstream it serves the decision API:

  POST /v1/allow        {"key": "alice", "policy": "free", "cost": 1}
                        -> 200 allowed / 429 refused, JSON decision, rate-limit headers
  POST /v1/allow        {"limits": [{"policy": "per_second", "key": "alice"},
                                    {"policy": "per_hour", "key": "alice"}]}
                        -> several limits at once, all or nothing
  POST /v1/allow/batch  [{...}, {...}] -> [{...}, {...}]

With --upstream URL every request is decided (keyed by --key, tier chosen by
--tier-header, or by the limits of its route: the configuration's routes)
and, when allowed, proxied to URL; refused requests get 429.

With --grpc ADDR --envoy-config FILE (or the configuration's grpc section) it
also serves Envoy's rate limit service (envoy.service.ratelimit.v3, configured
as for envoyproxy/ratelimit; see docs/envoy.md), gRPC health and reflection.

The admin listener serves /metrics (Prometheus), /debug/pprof/, /healthz and
/readyz. SIGINT or SIGTERM turns /readyz to 503 for --drain-delay while
requests are still served, then stops accepting, lets in-flight requests
finish within --shutdown-timeout, and exits 0. A second signal ends the
drain delay at once; one after the listeners closed cuts off the requests
still in flight (exit 1). SIGHUP reloads --config, routes included: unchanged
policies keep their state, and a bad file is logged while the old
configuration keeps serving.

The store URL may come from $SLIDEGATE_STORE or --store-file instead of the
command line; passwords in it are never logged.

Configuration comes from --config (YAML; see --print-config for the built-in
one, docs/operations.md for every key); flags given explicitly override it.

Flags:
`

// parseServeFlags parses args. On -h it prints the usage to stdout and
// returns nil and 0; on a bad flag or argument, nil and the usage status 2
// (the error on stderr).
func parseServeFlags(args []string, stdout, stderr io.Writer) (*serveFlags, int) {
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	f := &serveFlags{}
	fs.StringVar(&f.configPath, "config", "", "YAML configuration `file` (default: the built-in configuration)")
	fs.StringVar(&f.listen, "listen", config.DefaultListen, "`address` of the decision API or gateway (\"off\" with --grpc: the Envoy rate limit service alone)")
	fs.StringVar(&f.admin, "admin", config.DefaultAdmin, "`address` of /metrics, /debug/pprof/, /healthz, /readyz (\"off\" to disable)")
	fs.StringVar(&f.upstream, "upstream", "", "gateway mode: proxy allowed requests to this `URL`")
	fs.StringVar(&f.store, "store", config.DefaultStore, "where state lives: memory, or a store URL (redis://host:port/db); prefer $"+StoreEnv+" or --store-file for URLs with a password")
	fs.StringVar(&f.storeFile, "store-file", "", "read the store URL from this `file` (a mounted secret, say)")
	fs.StringVar(&f.defPolicy, "default-policy", "", "`policy` of requests that name none")
	fs.StringVar(&f.key, "key", config.DefaultKey, "gateway key: ip, header:NAME or const:VALUE, optionally +route")
	fs.StringVar(&f.tierHeader, "tier-header", "", "gateway: request `header` naming the policy")
	f.shutdown, f.drain = config.Duration(config.DefaultShutdownTimeout), config.Duration(config.DefaultDrainDelay)
	fs.Var(&f.shutdown, "shutdown-timeout", "how long in-flight requests get once the listeners close (a `duration` with a unit: 10s)")
	fs.Var(&f.drain, "drain-delay", "after SIGINT/SIGTERM, how long /readyz answers 503 before the listeners close (a `duration` with a unit: 5s)")
	fs.BoolVar(&f.printConfig, "print-config", false, "print the configuration in force (file, defaults and flags) and exit")
	fs.StringVar(&f.logLevel, "log-level", "info", "debug, info, warn or error")
	fs.StringVar(&f.logFormat, "log-format", "text", "text (logfmt) or json, one object a line")
	fs.StringVar(&f.tlsCert, "tls-cert", "", "serve the main and gRPC listeners over TLS with this PEM certificate `file` (with --tls-key; reread on SIGHUP)")
	fs.StringVar(&f.tlsKey, "tls-key", "", "the PEM key `file` of --tls-cert")
	fs.StringVar(&f.tlsClientCA, "tls-client-ca", "", "require client certificates signed by the CAs of this PEM `file` (mutual TLS)")
	f.envoy = addEnvoyFlags(fs)
	usage := func(w io.Writer) {
		fmt.Fprint(w, serveUsage)
		fs.PrintDefaults()
	}
	if ok, code := parseFlags(fs, "slidegate serve", usage, args, stdout, stderr); !ok {
		return nil, code
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "slidegate serve: unexpected argument %q (flags only)\nRun 'slidegate serve --help' for the flags.\n", fs.Arg(0))
		return nil, 2
	}
	if f.logFormat != "text" && f.logFormat != "json" {
		fmt.Fprintf(stderr, "slidegate serve: --log-format %q: want text or json\n", f.logFormat)
		return nil, 2
	}
	if err := f.level.UnmarshalText([]byte(f.logLevel)); err != nil {
		fmt.Fprintf(stderr, "slidegate serve: --log-level %q: want debug, info, warn or error\n", f.logLevel)
		return nil, 2
	}
	f.set = map[string]bool{}
	fs.Visit(func(fl *flag.Flag) { f.set[fl.Name] = true })
	if f.set["store"] && f.set["store-file"] {
		// As in the configuration file (store and store_file): two
		// sources of one URL, and no telling which was meant.
		fmt.Fprintf(stderr, "slidegate serve: --store and --store-file both give the store URL: give one of them\n")
		return nil, 2
	}
	return f, 0
}

// load builds the configuration in force: the file (or the built-in one),
// then SLIDEGATE_STORE, then the flags given explicitly, validated as a
// whole. SIGHUP runs it again.
func (f *serveFlags) load() (config.Config, error) {
	if f.configPath != "" {
		return config.LoadConfig(f.configPath, f.apply)
	}
	cfg := config.DefaultConfig()
	f.apply(&cfg)
	if err := cfg.Validate(); err != nil {
		return config.Config{}, err
	}
	return cfg, nil
}

// apply overrides cfg with SLIDEGATE_STORE and the flags given explicitly.
func (f *serveFlags) apply(cfg *config.Config) {
	if v, ok := os.LookupEnv(StoreEnv); ok && v != "" {
		cfg.Store, cfg.StoreFile = v, ""
	}
	override := func(name string, dst *string, v string) {
		if f.set[name] {
			*dst = v
		}
	}
	override("listen", &cfg.Listen, f.listen)
	override("admin", &cfg.Admin, f.admin)
	if f.set["upstream"] {
		cfg.Upstream = config.UpstreamURL(f.upstream)
	}
	if f.set["store"] {
		cfg.Store, cfg.StoreFile = f.store, ""
	}
	if f.set["store-file"] {
		cfg.Store, cfg.StoreFile = "", f.storeFile
	}
	if f.set["default-policy"] {
		cfg.DefaultPolicy = config.PolicyName(f.defPolicy)
	}
	override("key", &cfg.Key, f.key)
	override("tier-header", &cfg.TierHeader, f.tierHeader)
	override("tls-cert", &cfg.TLS.CertFile, f.tlsCert)
	override("tls-key", &cfg.TLS.KeyFile, f.tlsKey)
	override("tls-client-ca", &cfg.TLS.ClientCAFile, f.tlsClientCA)
	if f.set["shutdown-timeout"] {
		cfg.ShutdownTimeout = f.shutdown
	}
	if f.set["drain-delay"] {
		d := f.drain
		cfg.DrainDelay = &d
	}
}

// printConfig is --print-config: serve's checks short of connecting to a
// store or listening (the Envoy rules are built on the memory store), then
// the configuration serve would run on stdout, the store URL read from
// --store-file and its password redacted.
func printConfig(cfg config.Config, ef *envoyFlags, opts []server.Option, stdout, stderr io.Writer) int {
	cfg, warnings, err := server.Check(cfg, opts...)
	if err == nil {
		err = checkEnvoy(ef)
	}
	if err != nil {
		fmt.Fprintf(stderr, "slidegate serve: %v\n", err)
		return 1
	}
	for _, w := range warnings {
		fmt.Fprintf(stderr, "slidegate serve: warning: %s\n", w)
	}
	out, err := cfg.Marshal()
	if err != nil {
		fmt.Fprintf(stderr, "slidegate serve: %v\n", err)
		return 1
	}
	_, _ = stdout.Write(out)
	return 0
}

// runServer serves cfg (and Envoy's rate limit service when configured)
// until ctx is cancelled or a signal starts the drain, and returns the exit
// status.
func runServer(ctx context.Context, cfg config.Config, f *serveFlags, opts []server.Option, stderr io.Writer) int {
	logger := newLogger(stderr, f.logFormat, f.level)
	tr, stopTracing, err := startTracing(ctx, serveTracing(cfg.Tracing), logger)
	if err != nil {
		fmt.Fprintf(stderr, "slidegate serve: tracing: %v\n", err)
		return 1
	}
	defer stopTracing()
	f.envoy.tracing = tr
	opts = append(append([]server.Option{server.WithLogger(logger)}, opts...), serveTracingOptions(tr)...)
	srv, err := server.New(cfg, opts...)
	if err != nil {
		fmt.Fprintf(stderr, "slidegate serve: %v\n", err)
		return 1
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stopSignals := handleSignals(srv, logger, f, cancel)
	stopEnvoy, err := startEnvoy(ctx, f.envoy, srv, logger)
	if err != nil {
		stopSignals()
		_ = srv.Close()
		fmt.Fprintf(stderr, "slidegate serve: %v\n", err)
		return 1
	}
	err = srv.Run(ctx)
	stopEnvoy(time.Duration(srv.Config().ShutdownTimeout))
	stopSignals()
	if err != nil {
		fmt.Fprintf(stderr, "slidegate serve: %v\n", err)
		return 1
	}
	return 0
}

// handleSignals runs the signal loop until stop is called (stop waits for
// it to end): SIGINT or SIGTERM starts the drain (cancel), a second one ends
// the drain delay, a third stops waiting for in-flight requests
// (srv.Hurry); SIGHUP reloads the configuration (f.load).
func handleSignals(srv *server.Server, logger *slog.Logger, f *serveFlags, cancel context.CancelFunc) (stop func()) {
	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, os.Interrupt, syscall.SIGTERM, syscall.SIGHUP)
	done := make(chan struct{})
	loopDone := make(chan struct{})
	go func() {
		defer close(loopDone)
		stopping := false
		for {
			select {
			case <-done:
				return
			case sig := <-sigs:
				switch {
				case sig == syscall.SIGHUP:
					logger.Info("SIGHUP: reloading the configuration", "config", f.configPath)
					_ = srv.ReloadFrom(f.load)
				case !stopping:
					stopping = true
					logger.Info("signal received: draining (a second one ends the drain delay, a third cuts off in-flight requests)", "signal", sig.String())
					cancel()
				default:
					logger.Info("another signal: ending the drain's current stage now", "signal", sig.String())
					srv.Hurry()
				}
			}
		}
	}()
	return func() {
		close(done)
		<-loopDone
		signal.Stop(sigs)
	}
}

// StoreEnv is the environment variable slidegate serve takes the store URL
// from, so that a password need not be in the configuration file or on
// the command line (where ps and /debug/pprof/cmdline show it). --store
// overrides it.
const StoreEnv = "SLIDEGATE_STORE"
