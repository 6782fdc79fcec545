package main

import (
	"context"
	"crypto/tls"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/slidegate/slidegate/engine"
	"github.com/slidegate/slidegate/internal/connlimit"
	"github.com/slidegate/slidegate/internal/redact"
	"github.com/slidegate/slidegate/internal/topk"
	"github.com/slidegate/slidegate/rls"
	"github.com/slidegate/slidegate/server"
	"github.com/slidegate/slidegate/telemetry"
)

func init() {
	register(command{name: "envoy", summary: "Envoy's rate limit service alone, configured as envoyproxy/ratelimit is: slidegate envoy serve | check DIR", run: runEnvoy})
}

func runEnvoy(args []string) int {
	return envoyMain(context.Background(), args, os.Getenv, os.Stdout, os.Stderr, nil)
}

const envoyUsage = `Usage:
  slidegate envoy serve [flags]     the rate limit service (gRPC) and its HTTP port
  slidegate envoy check [flags] DIR refuse what serve would refuse, offline

Both read envoyproxy/ratelimit's environment variables (RUNTIME_ROOT,
RUNTIME_SUBDIRECTORY, RUNTIME_APPDIRECTORY, RUNTIME_IGNOREDOTFILES,
MERGE_DOMAIN_CONFIG, GRPC_HOST, GRPC_PORT, GRPC_MAX_CONNECTION_AGE,
GRPC_MAX_CONNECTION_AGE_GRACE, HOST, PORT, REDIS_SOCKET_TYPE,
REDIS_TYPE, REDIS_URL, REDIS_AUTH, REDIS_TLS, REDIS_TLS_CACERT,
REDIS_TLS_CLIENT_CERT, REDIS_TLS_CLIENT_KEY, REDIS_TIMEOUT, REDIS_SENTINEL_AUTH,
CACHE_KEY_PREFIX, LIMIT_RESPONSE_HEADERS_ENABLED, LIMIT_LIMIT_HEADER,
LIMIT_REMAINING_HEADER, LIMIT_RESET_HEADER, RESPONSE_DYNAMIC_METADATA,
NEAR_LIMIT_RATIO, SHADOW_MODE, QUOTA_MODE, HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED,
GRPC_SERVER_USE_TLS, GRPC_SERVER_TLS_CERT, GRPC_SERVER_TLS_KEY,
GRPC_CLIENT_TLS_CACERT, GRPC_CLIENT_TLS_SAN, LOG_LEVEL, LOG_FORMAT); a flag
given explicitly wins. The peer's other variables, set to a value that asks
for what slidegate does not do, stop the start. docs/envoy.md lists them.
`

// envoySettings are slidegate envoy's settings, from the environment and
// flags.
type envoySettings struct {
	configDir                    string
	load                         rls.LoadOptions
	grpcAddr, httpAddr           string
	store                        string
	storeOptions                 map[string]any
	peerHeaders                  bool
	limitH, remainingH, resetH   string
	metadata, draftHeaders       bool
	near                         float64
	maxConns, maxKeys            int
	maxKeysSet                   bool // --max-keys given, not the default
	conns                        connLifetimes
	calls                        callBounds
	http                         httpBounds
	clusterTag, logLevel, logFmt string
	watch                        server.Duration
	shutdown                     server.Duration
	peer                         peerSettings      // SHADOW_MODE, QUOTA_MODE, health, gRPC TLS
	tracing                      *telemetry.Config // nil: off (tracing.go)
}

// envoyCmdFlags defines the flags of both subcommands over defaults from
// getenv, the peer's variable names.
func envoyCmdFlags(name string, getenv func(string) string, stderr io.Writer) (*flag.FlagSet, *envoySettings, func() error) {
	env := func(k, def string) string {
		if v := getenv(k); v != "" {
			return v
		}
		return def
	}
	s := &envoySettings{storeOptions: map[string]any{}}
	fs := flag.NewFlagSet("slidegate envoy "+name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	var root, sub, app string
	fs.StringVar(&root, "runtime-root", env("RUNTIME_ROOT", "/srv/runtime_data/current"), "the runtime root (RUNTIME_ROOT)")
	fs.StringVar(&sub, "runtime-subdirectory", env("RUNTIME_SUBDIRECTORY", ""), "the runtime subdirectory (RUNTIME_SUBDIRECTORY)")
	fs.StringVar(&app, "runtime-appdirectory", env("RUNTIME_APPDIRECTORY", "config"), "the directory under it holding the configuration (RUNTIME_APPDIRECTORY)")
	fs.StringVar(&s.configDir, "config", "", "read this `directory` (every file under it) instead of ROOT/SUBDIRECTORY/APPDIRECTORY")
	fs.BoolVar(&s.load.IgnoreDotFiles, "ignore-dot-files", env("RUNTIME_IGNOREDOTFILES", "false") == "true", "skip files and directories whose name starts with a dot (RUNTIME_IGNOREDOTFILES)")
	fs.BoolVar(&s.load.Merge, "merge-domain-config", env("MERGE_DOMAIN_CONFIG", "false") == "true", "merge files that configure one domain (MERGE_DOMAIN_CONFIG)")
	var grpcHost, grpcPort, httpHost, httpPort string
	fs.StringVar(&grpcHost, "grpc-host", env("GRPC_HOST", "0.0.0.0"), "gRPC listen host (GRPC_HOST)")
	fs.StringVar(&grpcPort, "grpc-port", env("GRPC_PORT", "8081"), "gRPC listen port (GRPC_PORT)")
	fs.StringVar(&httpHost, "host", env("HOST", "0.0.0.0"), "HTTP listen host (HOST): /json, /healthcheck, /rlconfig, /metrics")
	fs.StringVar(&httpPort, "port", env("PORT", "8080"), "HTTP listen port (PORT); off: no HTTP listener")
	fs.StringVar(&s.store, "store", "", "the store: memory, or a slidegate store URL (redis://…); default: from REDIS_URL when set, else memory")
	fs.BoolVar(&s.peerHeaders, "limit-response-headers", env("LIMIT_RESPONSE_HEADERS_ENABLED", "false") == "true", "add RateLimit-Limit, -Remaining, -Reset (LIMIT_RESPONSE_HEADERS_ENABLED)")
	fs.StringVar(&s.limitH, "limit-header", env("LIMIT_LIMIT_HEADER", rls.DefaultLimitHeader), "the limit header's name (LIMIT_LIMIT_HEADER)")
	fs.StringVar(&s.remainingH, "remaining-header", env("LIMIT_REMAINING_HEADER", rls.DefaultRemainingHeader), "the remaining header's name (LIMIT_REMAINING_HEADER)")
	fs.StringVar(&s.resetH, "reset-header", env("LIMIT_RESET_HEADER", rls.DefaultResetHeader), "the reset header's name (LIMIT_RESET_HEADER)")
	fs.BoolVar(&s.draftHeaders, "draft-headers", false, "add the IETF draft RateLimit and RateLimit-Policy (and Retry-After on refusals)")
	fs.BoolVar(&s.metadata, "dynamic-metadata", env("RESPONSE_DYNAMIC_METADATA", "false") == "true", "add dynamic_metadata to responses (RESPONSE_DYNAMIC_METADATA)")
	near := env("NEAR_LIMIT_RATIO", strconv.FormatFloat(rls.DefaultNearLimitRatio, 'g', -1, 64))
	fs.Func("near-limit-ratio", "share of a limit above which an allowed request counts as near it (NEAR_LIMIT_RATIO, default 0.8)", func(v string) error { near = v; return nil })
	fs.IntVar(&s.maxConns, "grpc-max-connections", DefaultGRPCMaxConnections, "most gRPC connections served at once")
	fs.IntVar(&s.maxKeys, "max-keys", server.DefaultMaxKeys, "memory store: most keys each rule tracks; a new key beyond it is OVER_LIMIT (idle keys are swept)")
	s.conns = defaultConnLifetimes()
	envErrs := map[string]error{} // by flag: a variable's bad value, unless the flag is given
	for _, v := range []struct {
		name, flag string
		dst        *server.Duration
	}{{"GRPC_MAX_CONNECTION_AGE", "grpc-max-connection-age", &s.conns.age}, {"GRPC_MAX_CONNECTION_AGE_GRACE", "grpc-max-connection-age-grace", &s.conns.grace}} {
		if e := getenv(v.name); e != "" {
			if err := v.dst.Set(e); err != nil {
				envErrs[v.flag] = fmt.Errorf("%s: %v", v.name, err)
			}
		}
	}
	s.conns.addFlags(fs, "grpc-", [3]string{"", "GRPC_MAX_CONNECTION_AGE", "GRPC_MAX_CONNECTION_AGE_GRACE"})
	s.calls = defaultCallBounds()
	s.calls.addFlags(fs, "grpc-")
	s.http = defaultHTTPBounds()
	s.http.addFlags(fs)
	fs.StringVar(&s.clusterTag, "cluster-tag", "", "on Redis Cluster: the descriptor entry `key` whose value places a request's keys in one slot")
	fs.StringVar(&s.logLevel, "log-level", strings.ToLower(env("LOG_LEVEL", "warn")), "debug, info, warn or error (LOG_LEVEL)")
	fs.StringVar(&s.logFmt, "log-format", strings.ToLower(env("LOG_FORMAT", "text")), "text or json (LOG_FORMAT)")
	s.watch, s.shutdown = server.Duration(rls.DefaultWatchInterval), server.Duration(10*time.Second)
	fs.Var(&s.watch, "watch-interval", "how often the configuration's files are looked at, a `duration` (SIGHUP reloads at once)")
	fs.Var(&s.shutdown, "shutdown-timeout", "how long calls in flight may finish after SIGTERM (a `duration`)")
	finish := func() error {
		set := map[string]bool{}
		fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
		s.maxKeysSet = set["max-keys"]
		for _, f := range []string{"grpc-max-connection-age", "grpc-max-connection-age-grace"} {
			if err := envErrs[f]; err != nil && !set[f] {
				return err
			}
		}
		if err := s.conns.check("grpc-"); err != nil {
			return err
		}
		if err := s.calls.check("grpc-"); err != nil {
			return err
		}
		if err := s.http.check(); err != nil {
			return err
		}
		if s.configDir == "" {
			s.configDir = filepath.Join(root, sub, app)
		}
		s.load.AllFiles = true
		s.grpcAddr = net.JoinHostPort(grpcHost, grpcPort)
		if httpPort != "off" {
			s.httpAddr = net.JoinHostPort(httpHost, httpPort)
		}
		v, err := strconv.ParseFloat(near, 64)
		if err != nil || !(v > 0 && v < 1) {
			return fmt.Errorf("NEAR_LIMIT_RATIO %q: want a number between 0 and 1", near)
		}
		s.near = v
		if s.peer, err = envoyPeerSettings(getenv); err != nil {
			return err
		}
		if s.store == "" && getenv("REDIS_URL") != "" {
			u, err := peerRedisURL(getenv)
			if err != nil {
				return err
			}
			s.store = u
			for k, o := range map[string]string{"REDIS_TLS_CACERT": "tls_ca_file", "REDIS_TLS_CLIENT_CERT": "tls_cert_file", "REDIS_TLS_CLIENT_KEY": "tls_key_file", "REDIS_TIMEOUT": "timeout",
				"REDIS_SENTINEL_AUTH": "sentinel_password", "CACHE_KEY_PREFIX": "key_prefix"} {
				if v := getenv(k); v != "" {
					s.storeOptions[o] = v
				}
			}
		}
		if s.store == "" {
			s.store = server.DefaultStore
		}
		if s.maxKeys < 1 || s.maxConns < 1 {
			return errors.New("--max-keys and --grpc-max-connections must be at least 1")
		}
		return nil
	}
	return fs, s, finish
}

// DefaultEnvoyHTTPMaxConns bounds the connections of envoy serve's HTTP
// port: it serves health checks, metrics and /json, not Envoy's calls.
const DefaultEnvoyHTTPMaxConns = 1024

// httpBounds bound envoy serve's HTTP port as serve bounds its listeners.
type httpBounds struct {
	maxConns, perAddr int
	read              server.Duration
}

func defaultHTTPBounds() httpBounds {
	return httpBounds{maxConns: DefaultEnvoyHTTPMaxConns, perAddr: server.DefaultMaxConnsPerIP, read: server.Duration(server.DefaultReadTimeout)}
}

func (b *httpBounds) addFlags(fs *flag.FlagSet) {
	fs.IntVar(&b.maxConns, "http-max-connections", b.maxConns, "most connections the HTTP port serves at once")
	fs.IntVar(&b.perAddr, "http-max-connections-per-address", b.perAddr, "most HTTP connections of one client address (at most half of --http-max-connections); more wait without a slot, as many again, then are closed")
	fs.Var(&b.read, "http-read-timeout", "the longest reading one HTTP request, headers and body, may take (a `duration`); headers alone get at most 5s")
}

func (b httpBounds) check() error {
	if b.maxConns < 1 || b.perAddr < 1 {
		return errors.New("--http-max-connections and --http-max-connections-per-address must be at least 1")
	}
	if b.read <= 0 {
		return fmt.Errorf("--http-read-timeout %v must be positive", b.read)
	}
	return nil
}

// peerRedisURL turns the peer's REDIS_* variables into a store URL.
func peerRedisURL(getenv func(string) string) (string, error) {
	raw := getenv("REDIS_URL")
	scheme := "redis"
	if getenv("REDIS_TLS") == "true" {
		scheme = "rediss"
	}
	var user *url.Userinfo
	if a := getenv("REDIS_AUTH"); a != "" {
		if u, p, ok := strings.Cut(a, ":"); ok {
			user = url.UserPassword(u, p)
		} else {
			user = url.UserPassword("", a)
		}
	}
	u := &url.URL{User: user}
	switch strings.ToUpper(cmpOr(getenv("REDIS_TYPE"), "SINGLE")) {
	case "SINGLE":
		if strings.EqualFold(getenv("REDIS_SOCKET_TYPE"), "unix") || strings.HasPrefix(raw, "/") {
			u.Scheme, u.Path = "unix", raw
			if scheme == "rediss" {
				return "", errors.New("REDIS_TLS over a unix socket is not supported")
			}
		} else {
			u.Scheme, u.Host = scheme, raw
		}
	case "CLUSTER":
		u.Scheme, u.Host = scheme+"-cluster", raw
	case "SENTINEL":
		master, hosts, ok := strings.Cut(raw, ",")
		if !ok {
			return "", errors.New("REDIS_TYPE=SENTINEL: REDIS_URL must be MASTER_NAME,host:port[,host:port…]")
		}
		u.Scheme, u.Host, u.RawQuery = scheme+"-sentinel", hosts, "master_set="+url.QueryEscape(master)
	default:
		return "", fmt.Errorf("REDIS_TYPE %q: want SINGLE, CLUSTER or SENTINEL", getenv("REDIS_TYPE"))
	}
	return u.String(), nil
}

func cmpOr(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

// envoyMain runs slidegate envoy; started, when not nil, learns the
// bound gRPC and HTTP addresses (tests).
func envoyMain(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer, started func(grpcAddr, httpAddr string)) int {
	switch {
	case len(args) == 0:
		fmt.Fprint(stderr, envoyUsage)
		return 2
	case args[0] == "-h" || args[0] == "-help" || args[0] == "--help" || args[0] == "help":
		fmt.Fprint(stdout, envoyUsage)
		return 0
	case args[0] != "serve" && args[0] != "check":
		msg := fmt.Sprintf("slidegate envoy: unknown command %q", args[0])
		if s := nearest(args[0], []string{"serve", "check"}); s != "" {
			msg += fmt.Sprintf("; did you mean %q?", s)
		}
		fmt.Fprintf(stderr, "%s\nRun 'slidegate envoy --help' for the commands.\n", msg)
		return 2
	}
	cmd := "slidegate envoy " + args[0]
	fs, s, finish := envoyCmdFlags(args[0], getenv, stderr)
	usage := func(w io.Writer) {
		fmt.Fprint(w, envoyUsage)
		fmt.Fprintf(w, "\nFlags of %s:\n", cmd)
		fs.PrintDefaults()
	}
	if ok, code := parseFlags(fs, cmd, usage, args[1:], stdout, stderr); !ok {
		return code
	}
	badArgs := ""
	if args[0] == "check" {
		if fs.NArg() > 1 {
			badArgs = fmt.Sprintf("one directory, not %d arguments", fs.NArg())
		}
		if fs.NArg() == 1 {
			s.configDir = fs.Arg(0)
		}
	} else if fs.NArg() > 0 {
		badArgs = fmt.Sprintf("unexpected argument %q", fs.Arg(0))
	}
	if badArgs != "" {
		fmt.Fprintf(stderr, "%s: %s\nRun '%s --help' for the flags.\n", cmd, badArgs, cmd)
		return 2
	}
	if err := finish(); err != nil {
		fmt.Fprintf(stderr, "%s: %v\n", cmd, err)
		return 2
	}
	var err error
	if s.tracing, err = peerTracing(getenv); err != nil {
		fmt.Fprintf(stderr, "%s: %v\n", cmd, err)
		return 2
	}
	if args[0] == "check" {
		return envoyCheck(s, stdout, stderr)
	}
	return envoyServe(ctx, s, stderr, started)
}

// envoyCheck loads the configuration as serve does, and prints its
// warnings and what it holds.
func envoyCheck(s *envoySettings, stdout, stderr io.Writer) int {
	cfg, err := rls.LoadDir(s.configDir, s.load)
	if err != nil {
		fmt.Fprintf(stderr, "slidegate envoy check: %v\n", err)
		return 1
	}
	for _, w := range cfg.Warnings() {
		fmt.Fprintf(stdout, "warning: %s\n", w)
	}
	fmt.Fprintf(stdout, "ok: %s: %d files, domains %s, %d rules\n", s.configDir, len(cfg.Files()), strings.Join(cfg.Domains(), ", "), len(cfg.Rules()))
	return 0
}

func envoyLogger(s *envoySettings, stderr io.Writer) (*slog.Logger, error) {
	var level slog.Level
	lv := s.logLevel
	if lv == "warning" {
		lv = "warn"
	}
	if err := level.UnmarshalText([]byte(lv)); err != nil {
		return nil, fmt.Errorf("LOG_LEVEL %q: want debug, info, warn or error", s.logLevel)
	}
	o := &slog.HandlerOptions{Level: level}
	switch s.logFmt {
	case "text":
		return slog.New(slog.NewTextHandler(stderr, o)), nil
	case "json":
		return slog.New(slog.NewJSONHandler(stderr, o)), nil
	}
	return nil, fmt.Errorf("LOG_FORMAT %q: want text or json", s.logFmt)
}

// envoyServe runs the rate limit service until SIGINT or SIGTERM (or ctx
// ends); SIGHUP reloads the configuration at once.
func envoyServe(ctx context.Context, s *envoySettings, stderr io.Writer, started func(string, string)) int {
	logger, err := envoyLogger(s, stderr)
	if err != nil {
		fmt.Fprintf(stderr, "slidegate envoy serve: %v\n", err)
		return 2
	}
	fail := func(err error) int {
		fmt.Fprintf(stderr, "slidegate envoy serve: %s\n", redact.URLs(err.Error()))
		return 1
	}
	tr, stopTracing, err := startTracing(ctx, s.tracing, logger)
	if err != nil {
		return fail(err)
	}
	defer stopTracing()
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	var factory rls.BackendFactory
	if s.store == server.DefaultStore {
		mb := rls.NewMemoryBackends(engine.WithMaxKeys(s.maxKeys)) // a new key beyond it is refused: OVER_LIMIT
		defer mb.Close()
		factory = mb.Factory
	} else {
		if s.maxKeysSet {
			return fail(errors.New("--max-keys caps the memory store; bound Redis with maxmemory"))
		}
		storeMetrics := &latestCollector{}
		reg.MustRegister(storeMetrics)
		factory = func(cfg *rls.Config) (engine.GroupBackend, func(), error) {
			if len(cfg.Policies()) == 0 {
				return nil, nil, nil
			}
			st, err := tracedRedis(tr)(ctx, server.StoreSpec{URL: s.store, Options: s.storeOptions, Policies: cfg.Policies(), Logger: logger, Registerer: storeMetrics})
			if err != nil {
				return nil, nil, fmt.Errorf("store: %s", redact.URLs(err.Error()))
			}
			return rls.WithPeek(st.Group, st.Backends), func() { _ = st.Close() }, nil
		}
	}
	opts := []rls.Option{rls.WithHeaders(s.draftHeaders), rls.WithDynamicMetadata(s.metadata), rls.WithNearLimitRatio(s.near), rls.WithClusterTag(s.clusterTag),
		rls.WithShadowMode(s.peer.shadow), rls.WithQuotaMode(s.peer.quota)}
	if s.peerHeaders {
		opts = append(opts, rls.WithRateLimitHeaders(s.limitH, s.remainingH, s.resetH))
	}
	top := topk.New(topk.DefaultCounters, topk.DefaultEpoch, topk.DefaultEpochs, engine.NewMonotonicClock().Now)
	defer top.Close()
	opts = append(opts, rls.WithRefusals(top.Record))
	r, err := rls.NewReloader(rls.LoadFunc(s.configDir, s.load), factory, reg, logger, opts...)
	if err != nil {
		return fail(err)
	}
	defer r.Close()
	// Set before the HTTP port starts: its health check reads ctx.
	ctx, stop := signal.NotifyContext(ctx, os.Interrupt, syscall.SIGTERM)
	defer stop()
	lis, err := net.Listen("tcp", s.grpcAddr)
	if err != nil {
		return fail(err)
	}
	gopts := append(append(tracingServerOptions(tr), s.calls.serverOptions(0)...), s.conns.serverOption())
	gs, hs := rls.NewReloaderGRPCServer(r, gopts...)
	// HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED, as the peer: unhealthy
	// (gRPC NOT_SERVING, /healthcheck 500) while no domain is configured.
	var configHealthy atomic.Bool
	var stopping atomic.Bool // set when shutdown begins: /healthcheck answers 500
	r.OnChange(func(cfg *rls.Config) {
		ok := !s.peer.healthyWithConfig || len(cfg.Domains()) > 0
		configHealthy.Store(ok)
		st := healthpb.HealthCheckResponse_SERVING
		if !ok {
			st = healthpb.HealthCheckResponse_NOT_SERVING
		}
		hs.SetServingStatus(rls.ServiceName, st)
		hs.SetServingStatus(rls.PeerHealthName, st)
	})
	served := make(chan error, 1)
	// One address holds at most half the connections (server's default
	// per-address cap); gRPC has no ConnState, so none is closed for
	// another, but each closes after --grpc-max-connection-idle.
	glis := connlimit.New(lis, connlimit.Config{MaxConns: s.maxConns, MaxPerAddr: server.DefaultMaxConnsPerIP})
	var tlis net.Listener = glis
	if s.peer.tls != nil {
		// TLS on the listener, not as gRPC credentials, so that the guard
		// counts and throttles failed handshakes as serve --grpc's does.
		tc := s.peer.tls.Clone()
		tc.NextProtos = []string{"h2"} // gRPC's credentials would set it
		tlis = tls.NewListener(glis, tc)
	}
	go func() { served <- gs.Serve(rls.GuardListener(tlis, reg, logger)) }()
	var hsrv *http.Server
	httpDone := make(chan error, 1)
	httpAddr := ""
	if s.httpAddr != "" {
		hl, err := net.Listen("tcp", s.httpAddr)
		if err != nil {
			gs.Stop()
			<-served
			return fail(err)
		}
		httpAddr = hl.Addr().String()
		mux := http.NewServeMux()
		healthy := func() bool { return !stopping.Load() && configHealthy.Load() }
		mux.Handle("/", rls.HTTPHandler(r, healthy))
		mux.Handle("/metrics", promhttp.HandlerFor(prometheus.Gatherers{reg, r}, promhttp.HandlerOpts{}))
		// Keys are shown as the logs show them: this port is not an admin one.
		mux.Handle("GET /admin/top", topk.Handler(top, "rule", func(string) bool { return true }, redact.Key,
			func(w http.ResponseWriter, _ *http.Request, status int, err error) {
				http.Error(w, err.Error(), status)
			}))
		// serve's bounds: connections in all and per address, and time to
		// read a request, so that unfinished bodies cannot hold the port.
		cl := connlimit.New(hl, connlimit.Config{MaxConns: s.http.maxConns, MaxPerAddr: s.http.perAddr})
		hsrv = &http.Server{Handler: mux, ReadHeaderTimeout: min(server.DefaultReadHeaderTimeout, time.Duration(s.http.read)),
			ReadTimeout: time.Duration(s.http.read), WriteTimeout: server.DefaultWriteTimeout, IdleTimeout: server.DefaultIdleTimeout,
			MaxHeaderBytes: server.DefaultMaxHeaderBytes, ConnState: cl.ConnState}
		go func() { httpDone <- hsrv.Serve(cl) }()
	} else {
		httpDone <- nil
	}
	cfg := r.Config()
	logger.Warn("slidegate envoy rate limit service", "grpc", lis.Addr().String(), "http", httpAddr, "config", s.configDir,
		"store", redact.URLs(s.store), "domains", cfg.Domains(), "rules", len(cfg.Rules()))
	if started != nil {
		started(lis.Addr().String(), httpAddr)
	}
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)
	watchDone := make(chan struct{})
	go func() { r.Watch(ctx, time.Duration(s.watch)); close(watchDone) }()
loop:
	for {
		select {
		case <-ctx.Done():
			break loop
		case <-hup:
			if changed, err := r.Reload(); err == nil {
				logger.Info("SIGHUP: envoy configuration read", "changed", changed)
			}
		case err := <-served:
			stop()
			<-watchDone
			return fail(err)
		}
	}
	<-watchDone
	stopping.Store(true)
	hs.Shutdown()
	drained := make(chan struct{})
	go func() { gs.GracefulStop(); close(drained) }()
	t := time.NewTimer(time.Duration(s.shutdown))
	select {
	case <-drained:
		t.Stop()
	case <-t.C:
		gs.Stop()
		<-drained
	}
	<-served
	if hsrv != nil {
		sctx, cancel := context.WithTimeout(context.Background(), time.Duration(s.shutdown))
		_ = hsrv.Shutdown(sctx)
		cancel()
	}
	if err := <-httpDone; err != nil && !errors.Is(err, http.ErrServerClosed) {
		logger.Error("http", "err", err)
	}
	return 0
}

// latestCollector is a prometheus.Registerer that keeps only the last
// collector registered on it, and a Collector that collects it: each
// configuration's Redis store registers its metrics here, and /metrics
// shows the store in force.
type latestCollector struct {
	mu sync.Mutex
	c  prometheus.Collector
}

func (l *latestCollector) Register(c prometheus.Collector) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.c = c
	return nil
}

func (l *latestCollector) MustRegister(cs ...prometheus.Collector) {
	for _, c := range cs {
		_ = l.Register(c)
	}
}

func (l *latestCollector) Unregister(prometheus.Collector) bool { return false }

// Describe sends nothing: the collector is unchecked, its metrics those of
// the store in force.
func (l *latestCollector) Describe(chan<- *prometheus.Desc) {}

func (l *latestCollector) Collect(ch chan<- prometheus.Metric) {
	l.mu.Lock()
	c := l.c
	l.mu.Unlock()
	if c != nil {
		c.Collect(ch)
	}
}
