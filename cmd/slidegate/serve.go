package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"syscall"

	"github.com/slidegate/slidegate/server"
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
// pass a start hook to learn the bound addresses).
func serve(ctx context.Context, args []string, stdout, stderr io.Writer, extra ...server.Option) int {
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	fs.SetOutput(stderr)
	for _, a := range args {
		if a == "-h" || a == "-help" || a == "--help" {
			fs.SetOutput(stdout) // asked for: help goes to stdout, pipeable
		}
	}
	var (
		configPath  = fs.String("config", "", "YAML configuration `file` (default: the built-in configuration)")
		listen      = fs.String("listen", server.DefaultListen, "`address` of the decision API or gateway")
		admin       = fs.String("admin", server.DefaultAdmin, "`address` of /metrics, /debug/pprof/, /healthz, /readyz (\"off\" to disable)")
		upstream    = fs.String("upstream", "", "gateway mode: proxy allowed requests to this `URL`")
		store       = fs.String("store", server.DefaultStore, "where state lives: memory, or a store URL (redis://host:port/db); prefer $"+StoreEnv+" or --store-file for URLs with a password")
		storeFile   = fs.String("store-file", "", "read the store URL from this `file` (a mounted secret, say)")
		defPolicy   = fs.String("default-policy", "", "`policy` of requests that name none")
		key         = fs.String("key", server.DefaultKey, "gateway key: ip, header:NAME or const:VALUE, optionally +route")
		tierHeader  = fs.String("tier-header", "", "gateway: request `header` naming the policy")
		shutdown    = fs.Duration("shutdown-timeout", server.DefaultShutdownTimeout, "how long in-flight requests get once the listeners close")
		drain       = fs.Duration("drain-delay", server.DefaultDrainDelay, "after SIGINT/SIGTERM, how long /readyz answers 503 before the listeners close")
		printConfig = fs.Bool("print-config", false, "print the configuration in force (file, defaults and flags) and exit")
		logLevel    = fs.String("log-level", "info", "debug, info, warn or error")
		envoy       = addEnvoyFlags(fs)
	)
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), `Usage: slidegate serve [flags]

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
`)
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "slidegate serve: unexpected argument %q (flags only; see slidegate help serve)\n", fs.Arg(0))
		return 2
	}
	var level slog.Level
	if err := level.UnmarshalText([]byte(*logLevel)); err != nil {
		fmt.Fprintf(stderr, "slidegate serve: --log-level %q: want debug, info, warn or error\n", *logLevel)
		return 2
	}

	// load builds the configuration in force: the file (or the built-in
	// one), then SLIDEGATE_STORE, then the flags given explicitly. SIGHUP
	// runs it again.
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	load := func() (server.Config, error) {
		var (
			cfg server.Config
			err error
		)
		if *configPath != "" {
			cfg, err = server.ReadConfig(*configPath)
		} else {
			cfg, err = server.DecodeConfig(server.DefaultYAML())
		}
		if err != nil {
			return server.Config{}, err
		}
		if v, ok := os.LookupEnv(StoreEnv); ok && v != "" {
			cfg.Store, cfg.StoreFile = v, ""
		}
		override := func(name string, dst *string, v string) {
			if set[name] {
				*dst = v
			}
		}
		override("listen", &cfg.Listen, *listen)
		override("admin", &cfg.Admin, *admin)
		override("upstream", &cfg.Upstream, *upstream)
		if set["store"] {
			cfg.Store, cfg.StoreFile = *store, ""
		}
		if set["store-file"] {
			cfg.Store, cfg.StoreFile = "", *storeFile
		}
		override("default-policy", &cfg.DefaultPolicy, *defPolicy)
		override("key", &cfg.Key, *key)
		override("tier-header", &cfg.TierHeader, *tierHeader)
		if set["shutdown-timeout"] {
			cfg.ShutdownTimeout = *shutdown
		}
		if set["drain-delay"] {
			d := *drain
			cfg.DrainDelay = &d
		}
		if err := cfg.Validate(); err != nil {
			if *configPath != "" {
				return server.Config{}, fmt.Errorf("%s: %w", *configPath, err)
			}
			return server.Config{}, err
		}
		return cfg, nil
	}
	cfg, err := load()
	if err != nil {
		fmt.Fprintf(stderr, "slidegate serve: %v\n", err)
		return 1
	}
	envoy.merge(&cfg.GRPC, set)
	if err := envoy.check(cfg); err != nil {
		fmt.Fprintf(stderr, "slidegate serve: %v\n", err)
		return 2
	}
	v, c, d := buildInfo()
	opts := append([]server.Option{server.WithBuildInfo(server.BuildInfo{Version: v, Commit: c, Date: d})}, storeOptions...)
	opts = append(opts, extra...)
	if *printConfig {
		// The same checks as serving, short of connecting to a store.
		warnings, err := server.Check(cfg, opts...)
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

	logger := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: level}))
	opts = append([]server.Option{server.WithLogger(logger)}, opts...)
	srv, err := server.New(cfg, opts...)
	if err != nil {
		fmt.Fprintf(stderr, "slidegate serve: %v\n", err)
		return 1
	}
	// SIGINT or SIGTERM starts the drain; a second one ends the drain
	// delay, a third stops waiting for in-flight requests. SIGHUP reloads
	// the configuration.
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, os.Interrupt, syscall.SIGTERM, syscall.SIGHUP)
	defer signal.Stop(sigs)
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
					logger.Info("SIGHUP: reloading the configuration", "config", *configPath)
					_ = srv.ReloadFrom(load)
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
	stopEnvoy, err := startEnvoy(ctx, envoy, srv, logger)
	if err != nil {
		close(done)
		<-loopDone
		_ = srv.Close()
		fmt.Fprintf(stderr, "slidegate serve: %v\n", err)
		return 1
	}
	err = srv.Run(ctx)
	stopEnvoy(srv.Config().ShutdownTimeout)
	close(done)
	<-loopDone
	if err != nil {
		fmt.Fprintf(stderr, "slidegate serve: %v\n", err)
		return 1
	}
	return 0
}

// StoreEnv is the environment variable slidegate serve takes the store URL
// from, so that a password need not be in the configuration file or on
// the command line (where ps and /debug/pprof/cmdline show it). --store
// overrides it.
const StoreEnv = "SLIDEGATE_STORE"
