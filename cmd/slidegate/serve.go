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
		store       = fs.String("store", server.DefaultStore, "where state lives: memory, or a store URL (redis://host:port/db)")
		defPolicy   = fs.String("default-policy", "", "`policy` of requests that name none")
		key         = fs.String("key", server.DefaultKey, "gateway key: ip, header:NAME, optionally +route")
		tierHeader  = fs.String("tier-header", "", "gateway: request `header` naming the policy")
		shutdown    = fs.Duration("shutdown-timeout", server.DefaultShutdownTimeout, "how long in-flight requests get after SIGINT/SIGTERM")
		printConfig = fs.Bool("print-config", false, "print the configuration in force (file, defaults and flags) and exit")
		logLevel    = fs.String("log-level", "info", "debug, info, warn or error")
		envoy       = addEnvoyFlags(fs)
	)
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), `Usage: slidegate serve [flags]

Runs the slidegate server. Without --upstream it serves the decision API:

  POST /v1/allow        {"key": "alice", "policy": "free", "cost": 1}
                        -> 200 allowed / 429 refused, JSON decision, rate-limit headers
  POST /v1/allow/batch  [{...}, {...}] -> [{...}, {...}]

With --upstream URL every request is decided (keyed by --key, tier chosen by
--tier-header) and, when allowed, proxied to URL; refused requests get 429.

With --grpc ADDR --envoy-config FILE it also serves Envoy's rate limit service
(envoy.service.ratelimit.v3, configured as for envoyproxy/ratelimit; see
docs/envoy.md), gRPC health and reflection.

The admin listener serves /metrics (Prometheus), /debug/pprof/, /healthz and
/readyz. SIGINT or SIGTERM stops accepting, lets in-flight requests finish
within --shutdown-timeout, and exits 0.

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

	var (
		cfg server.Config
		err error
	)
	if *configPath != "" {
		cfg, err = server.LoadConfig(*configPath)
	} else {
		cfg, err = server.ParseConfig(server.DefaultYAML())
	}
	if err != nil {
		fmt.Fprintf(stderr, "slidegate serve: %v\n", err)
		return 1
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	override := func(name string, dst *string, v string) {
		if set[name] {
			*dst = v
		}
	}
	override("listen", &cfg.Listen, *listen)
	override("admin", &cfg.Admin, *admin)
	override("upstream", &cfg.Upstream, *upstream)
	override("store", &cfg.Store, *store)
	override("default-policy", &cfg.DefaultPolicy, *defPolicy)
	override("key", &cfg.Key, *key)
	override("tier-header", &cfg.TierHeader, *tierHeader)
	if set["shutdown-timeout"] {
		cfg.ShutdownTimeout = *shutdown
	}
	if err := cfg.Validate(); err != nil {
		fmt.Fprintf(stderr, "slidegate serve: %v\n", err)
		return 1
	}
	if err := envoy.check(cfg); err != nil {
		fmt.Fprintf(stderr, "slidegate serve: %v\n", err)
		return 2
	}
	if *printConfig {
		out, err := cfg.Marshal()
		if err != nil {
			fmt.Fprintf(stderr, "slidegate serve: %v\n", err)
			return 1
		}
		_, _ = stdout.Write(out)
		return 0
	}

	logger := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: level}))
	opts := append([]server.Option{server.WithLogger(logger)}, storeOptions...)
	opts = append(opts, extra...)
	srv, err := server.New(cfg, opts...)
	if err != nil {
		fmt.Fprintf(stderr, "slidegate serve: %v\n", err)
		return 1
	}
	stopEnvoy, err := startEnvoy(envoy, srv, logger)
	if err != nil {
		_ = srv.Close()
		fmt.Fprintf(stderr, "slidegate serve: %v\n", err)
		return 1
	}
	ctx, stop := signal.NotifyContext(ctx, os.Interrupt, syscall.SIGTERM)
	defer stop()
	err = srv.Run(ctx)
	stopEnvoy(srv.Config().ShutdownTimeout)
	if err != nil {
		fmt.Fprintf(stderr, "slidegate serve: %v\n", err)
		return 1
	}
	return 0
}
