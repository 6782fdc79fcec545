package main

import (
	"cmp"
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
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/slidegate/slidegate/engine"
	"github.com/slidegate/slidegate/internal/connlimit"
	"github.com/slidegate/slidegate/internal/redact"
	"github.com/slidegate/slidegate/internal/rls"
	"github.com/slidegate/slidegate/internal/server/config"
	"github.com/slidegate/slidegate/internal/topk"
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

// envoySettings are slidegate envoy's settings: the peer's environment
// (env), the flags over it, and what is derived from both.
type envoySettings struct {
	env                peerEnv
	configDir          string
	load               rls.LoadOptions
	grpcAddr, httpAddr string
	store              string
	storeOptions       map[string]any
	draftHeaders       bool
	maxConns, maxKeys  int
	maxKeysSet         bool // --max-keys given, not the default
	conns              connLifetimes
	calls              callBounds
	http               httpBounds
	clusterTag         string
	watch              config.Duration
	shutdown           config.Duration
	tls                *tls.Config       // nil: plaintext gRPC (GRPC_SERVER_USE_TLS)
	tracing            *telemetry.Config // nil: off (tracing.go)
}

// envoyCmdFlags defines the flags of both subcommands over the peer's
// environment read through getenv (readPeerEnv); finish checks them once
// parsed.
func envoyCmdFlags(name string, getenv func(string) string, stderr io.Writer) (*flag.FlagSet, *envoySettings, func() error) {
	env, envErrs := readPeerEnv(getenv)
	s := &envoySettings{env: env, storeOptions: map[string]any{}}
	e := &s.env
	fs := flag.NewFlagSet("slidegate envoy "+name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	addPeerFlags(fs, e)
	fs.StringVar(&s.configDir, "config", "", "read this `directory` (every file under it) instead of ROOT/SUBDIRECTORY/APPDIRECTORY")
	fs.StringVar(&s.store, "store", "", "the store: memory, or a slidegate store URL (redis://…); default: from REDIS_URL when set, else memory")
	fs.BoolVar(&s.draftHeaders, "draft-headers", false, "add the IETF draft RateLimit and RateLimit-Policy (and Retry-After on refusals)")
	fs.IntVar(&s.maxConns, "grpc-max-connections", DefaultGRPCMaxConnections, "most gRPC connections served at once")
	fs.IntVar(&s.maxKeys, "max-keys", config.DefaultMaxKeys, "memory store: most keys each rule tracks; a new key beyond it is OVER_LIMIT (idle keys are swept)")
	s.conns = defaultConnLifetimes()
	s.conns.age, s.conns.grace = e.GRPC.MaxConnectionAge, e.GRPC.MaxConnectionAgeGrace
	s.conns.addFlags(fs, "grpc-", [3]string{"", "GRPC_MAX_CONNECTION_AGE", "GRPC_MAX_CONNECTION_AGE_GRACE"})
	s.calls = defaultCallBounds()
	s.calls.addFlags(fs, "grpc-")
	s.http = defaultHTTPBounds()
	s.http.addFlags(fs)
	fs.StringVar(&s.clusterTag, "cluster-tag", "", "on Redis Cluster: the descriptor entry `key` whose value places a request's keys in one slot")
	s.watch, s.shutdown = config.Duration(rls.DefaultWatchInterval), config.Duration(10*time.Second)
	fs.Var(&s.watch, "watch-interval", "how often the configuration's files are looked at, a `duration` (SIGHUP reloads at once)")
	fs.Var(&s.shutdown, "shutdown-timeout", "how long calls in flight may finish after SIGTERM (a `duration`)")
	finish := func() error {
		set := map[string]bool{}
		fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
		s.maxKeysSet = set["max-keys"]
		if err := firstError(envErrs, set); err != nil {
			return err
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
			s.configDir = filepath.Join(e.Runtime.Root, e.Runtime.Subdirectory, e.Runtime.AppDirectory)
		}
		s.load = rls.LoadOptions{AllFiles: true, IgnoreDotFiles: e.Runtime.IgnoreDotFiles, Merge: e.Runtime.MergeDomainConfig}
		s.grpcAddr = net.JoinHostPort(e.Listen.GRPCHost, e.Listen.GRPCPort)
		if e.Listen.Port != "off" {
			s.httpAddr = net.JoinHostPort(e.Listen.Host, e.Listen.Port)
		}
		e.Log.Level, e.Log.Format = strings.ToLower(e.Log.Level), strings.ToLower(e.Log.Format)
		if v := e.Response.NearLimitRatio; !(v > 0 && v < 1) {
			return fmt.Errorf("NEAR_LIMIT_RATIO %v: want a number between 0 and 1", v)
		}
		if err := checkPeerVars(getenv); err != nil {
			return err
		}
		var err error
		if s.tls, err = grpcServerTLS(e.GRPC); err != nil {
			return err
		}
		if s.store == "" && e.Redis.URL != "" {
			if s.store, err = peerRedisURL(e.Redis); err != nil {
				return err
			}
			for o, v := range map[string]string{"tls_ca_file": e.Redis.TLSCACert, "tls_cert_file": e.Redis.TLSClientCert, "tls_key_file": e.Redis.TLSClientKey,
				"timeout": e.Redis.Timeout, "sentinel_password": e.Redis.SentinelAuth, "key_prefix": e.Redis.CacheKeyPrefix} {
				if v != "" {
					s.storeOptions[o] = v
				}
			}
		}
		if s.store == "" {
			s.store = config.DefaultStore
		}
		if e.Health.RedisActiveConnection && s.store == config.DefaultStore {
			return errors.New("REDIS_HEALTH_CHECK_ACTIVE_CONNECTION=true: the store is memory, there is no Redis connection to follow (set REDIS_URL)")
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
	read              config.Duration
}

func defaultHTTPBounds() httpBounds {
	return httpBounds{maxConns: DefaultEnvoyHTTPMaxConns, perAddr: config.DefaultMaxConnsPerIP, read: config.Duration(config.DefaultReadTimeout)}
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
func peerRedisURL(r envRedis) (string, error) {
	raw := r.URL
	scheme := "redis"
	if r.TLS {
		scheme = "rediss"
	}
	var user *url.Userinfo
	if a := r.Auth; a != "" {
		if u, pw, ok := strings.Cut(a, ":"); ok {
			user = url.UserPassword(u, pw)
		} else {
			user = url.UserPassword("", a)
		}
	}
	u := &url.URL{User: user}
	switch strings.ToUpper(cmp.Or(r.Type, "SINGLE")) {
	case "SINGLE":
		if strings.EqualFold(r.SocketType, "unix") || strings.HasPrefix(raw, "/") {
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
		return "", fmt.Errorf("REDIS_TYPE %q: want SINGLE, CLUSTER or SENTINEL", r.Type)
	}
	return u.String(), nil
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
	if s.tracing, err = peerTracing(s.env.Tracing); err != nil {
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
	lv := s.env.Log.Level
	if lv == "warning" {
		lv = "warn"
	}
	if err := level.UnmarshalText([]byte(lv)); err != nil {
		return nil, fmt.Errorf("LOG_LEVEL %q: want debug, info, warn or error", s.env.Log.Level)
	}
	o := &slog.HandlerOptions{Level: level}
	switch s.env.Log.Format {
	case "text":
		return slog.New(slog.NewTextHandler(stderr, o)), nil
	case "json":
		return slog.New(slog.NewJSONHandler(stderr, o)), nil
	}
	return nil, fmt.Errorf("LOG_FORMAT %q: want text or json", s.env.Log.Format)
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
	if s.store != config.DefaultStore && s.maxKeysSet {
		return fail(errors.New("--max-keys caps the memory store; bound Redis with maxmemory"))
	}
	factory, closeBackends := envoyBackends(ctx, envoyStore{s.store, s.storeOptions, s.maxKeys}, tr, reg, logger)
	defer closeBackends()
	e := s.env
	opts := []rls.Option{rls.WithHeaders(s.draftHeaders), rls.WithDynamicMetadata(e.Response.DynamicMetadata), rls.WithNearLimitRatio(e.Response.NearLimitRatio),
		rls.WithClusterTag(s.clusterTag), rls.WithShadowMode(e.Mode.Shadow), rls.WithQuotaMode(e.Mode.Quota)}
	if e.Response.HeadersEnabled {
		opts = append(opts, rls.WithRateLimitHeaders(e.Response.LimitHeader, e.Response.RemainingHeader, e.Response.ResetHeader))
	}
	top := topk.New(topk.DefaultCounters, topk.DefaultEpoch, topk.DefaultEpochs, engine.NewMonotonicClock().Now)
	defer top.Close()
	opts = append(opts, rls.WithRefusals(top))
	// Set before the runner and the HTTP port start: both read ctx.
	ctx, stop := signal.NotifyContext(ctx, os.Interrupt, syscall.SIGTERM)
	defer stop()
	er, err := startRunner(ctx, runnerSpec{
		config: s.configDir, load: s.load, factory: factory, opts: opts, reg: reg, logger: logger, addr: s.grpcAddr,
		// One address holds at most half the connections (server's
		// default per-address cap).
		conns: connlimit.Config{MaxConns: s.maxConns, MaxPerAddr: config.DefaultMaxConnsPerIP},
		tls:   s.tls,
		grpc:  append(append(tracingServerOptions(tr), s.calls.serverOptions(0)...), s.conns.serverOption()),
		watch: time.Duration(s.watch),
		// HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED, as the peer: unhealthy
		// (gRPC NOT_SERVING, /healthcheck 500) while no domain is
		// configured.
		healthyWithConfig: e.Health.WithAtLeastOneConfigLoaded,
	})
	if err != nil {
		return fail(err)
	}
	defer er.close()
	if e.Health.RedisActiveConnection {
		stopRedisHealth, err := er.health.watchRedis(ctx, s, logger)
		if err != nil {
			er.stop(0)
			return fail(err)
		}
		defer stopRedisHealth()
	}
	var stopping atomic.Bool // set when shutdown begins: /healthcheck answers 500
	var hsrv *http.Server
	httpDone := make(chan error, 1)
	httpAddr := ""
	if s.httpAddr != "" {
		hl, err := net.Listen("tcp", s.httpAddr)
		if err != nil {
			er.stop(0)
			return fail(err)
		}
		httpAddr = hl.Addr().String()
		mux := http.NewServeMux()
		healthy := func() bool { return !stopping.Load() && er.healthy() }
		mux.Handle("/", rls.HTTPHandler(er.r, healthy))
		mux.Handle("/metrics", promhttp.HandlerFor(prometheus.Gatherers{reg, er.r}, promhttp.HandlerOpts{}))
		// Keys are shown as the logs show them: this port is not an admin one.
		mux.Handle("GET /admin/top", topk.Handler(top, "rule", func(string) bool { return true }, redact.Key,
			func(w http.ResponseWriter, _ *http.Request, status int, err error) {
				http.Error(w, err.Error(), status)
			}))
		// serve's bounds: connections in all and per address, and time to
		// read a request, so that unfinished bodies cannot hold the port.
		cl := connlimit.New(hl, connlimit.Config{MaxConns: s.http.maxConns, MaxPerAddr: s.http.perAddr})
		hsrv = &http.Server{Handler: mux, ReadHeaderTimeout: min(config.DefaultReadHeaderTimeout, time.Duration(s.http.read)),
			ReadTimeout: time.Duration(s.http.read), WriteTimeout: config.DefaultWriteTimeout, IdleTimeout: config.DefaultIdleTimeout,
			MaxHeaderBytes: config.DefaultMaxHeaderBytes, ConnState: cl.ConnState}
		go func() { httpDone <- hsrv.Serve(cl) }()
	} else {
		httpDone <- nil
	}
	cfg := er.r.Config()
	logger.Warn("slidegate envoy rate limit service", "grpc", er.addr, "http", httpAddr, "config", s.configDir,
		"store", redact.URLs(s.store), "domains", cfg.Domains(), "rules", len(cfg.Rules()))
	if started != nil {
		started(er.addr, httpAddr)
	}
	code := 0
	select {
	case <-ctx.Done():
	case <-er.failed():
		code = fail(er.err())
	}
	stopping.Store(true)
	er.stop(time.Duration(s.shutdown))
	if hsrv != nil {
		sctx, cancel := context.WithTimeout(context.Background(), time.Duration(s.shutdown))
		_ = hsrv.Shutdown(sctx)
		cancel()
	}
	if err := <-httpDone; err != nil && !errors.Is(err, http.ErrServerClosed) {
		logger.Error("http", "err", err)
	}
	return code
}
