package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/keepalive"

	"github.com/slidegate/slidegate/engine"
	"github.com/slidegate/slidegate/internal/connlimit"
	"github.com/slidegate/slidegate/internal/rls"
	"github.com/slidegate/slidegate/internal/server"
	"github.com/slidegate/slidegate/internal/server/config"
	"github.com/slidegate/slidegate/telemetry"
)

// DefaultGRPCMaxConnections bounds the connections the Envoy rate limit
// service accepts at once. Envoy keeps a few long-lived HTTP/2 connections
// per worker thread, so a fleet of proxies needs far fewer.
const DefaultGRPCMaxConnections = 1024

// envoyFlags are serve's flags for the Envoy rate limit service.
type envoyFlags struct {
	addr, config string
	headers      bool
	maxConns     int
	maxKeys      int
	maxKeysSet   bool // given by flag or configuration, not the default
	clusterTag   string
	conns        connLifetimes
	calls        callBounds
	tracing      *telemetry.Tracing // set by runServer; nil: off
}

// callBounds bound what one client holds on a gRPC listener: calls in
// flight per address, and how long a unary call may take.
type callBounds struct {
	perAddr int
	timeout config.Duration
}

func defaultCallBounds() callBounds {
	return callBounds{perAddr: rls.DefaultMaxCallsPerAddr, timeout: config.Duration(rls.DefaultCallTimeout)}
}

// addFlags defines prefix+"max-calls-per-address" and prefix+"call-timeout".
func (b *callBounds) addFlags(fs *flag.FlagSet, prefix string) {
	fs.IntVar(&b.perAddr, prefix+"max-calls-per-address", b.perAddr, "most gRPC calls in flight from one client address, streams included; one more is refused (ResourceExhausted)")
	fs.Var(&b.timeout, prefix+"call-timeout", "the longest a unary gRPC call may take from its headers to its answer, a `duration`; a call whose request has not come by then ends DeadlineExceeded")
}

func (b callBounds) check(prefix string) error {
	if b.perAddr < 1 {
		return fmt.Errorf("--%smax-calls-per-address %d must be at least 1", prefix, b.perAddr)
	}
	if b.timeout <= 0 {
		return fmt.Errorf("--%scall-timeout %v must be positive", prefix, b.timeout)
	}
	return nil
}

// serverOptions are b as rls server options; IPv6 clients share a cap per
// network of ipv6Prefix bits (0: 64).
func (b callBounds) serverOptions(ipv6Prefix int) []grpc.ServerOption {
	opts := []grpc.ServerOption{rls.MaxCallsPerAddr(b.perAddr), rls.CallTimeout(time.Duration(b.timeout))}
	if ipv6Prefix > 0 {
		opts = append(opts, rls.CallsIPv6Prefix(ipv6Prefix))
	}
	return opts
}

// connLifetimes bound how long a gRPC connection lives: idle (no call in
// flight), in all, and after it is asked to go away.
type connLifetimes struct{ idle, age, grace config.Duration }

func defaultConnLifetimes() connLifetimes {
	return connLifetimes{config.Duration(rls.DefaultMaxConnectionIdle), config.Duration(rls.DefaultMaxConnectionAge),
		config.Duration(rls.DefaultMaxConnectionAgeGrace)}
}

// addFlags defines the flags of l, named prefix+"max-connection-idle" and
// so on, with l's values as defaults and env's names in their help.
func (l *connLifetimes) addFlags(fs *flag.FlagSet, prefix string, env [3]string) {
	note := func(i int) string {
		if env[i] == "" {
			return ""
		}
		return " (" + env[i] + ")"
	}
	fs.Var(&l.idle, prefix+"max-connection-idle", "close a gRPC connection that has had no call in flight for this `duration`"+note(0))
	fs.Var(&l.age, prefix+"max-connection-age", "ask every gRPC connection to go away (GOAWAY) after this `duration`, so that proxies spread over replicas added since"+note(1))
	fs.Var(&l.grace, prefix+"max-connection-age-grace", "how long calls in flight on a connection asked to go away may still take (a `duration`)"+note(2))
}

// check refuses lifetimes that are not positive; flag names the flags.
func (l connLifetimes) check(prefix string) error {
	for _, v := range []struct {
		name string
		d    config.Duration
	}{{"max-connection-idle", l.idle}, {"max-connection-age", l.age}, {"max-connection-age-grace", l.grace}} {
		if v.d <= 0 {
			return fmt.Errorf("--%s%s %v must be positive (a long one, such as 8760h, for practically never)", prefix, v.name, v.d)
		}
	}
	return nil
}

// serverOption is l as the gRPC server's keepalive parameters.
func (l connLifetimes) serverOption() grpc.ServerOption {
	return grpc.KeepaliveParams(keepalive.ServerParameters{MaxConnectionIdle: time.Duration(l.idle),
		MaxConnectionAge: time.Duration(l.age), MaxConnectionAgeGrace: time.Duration(l.grace)})
}

func addEnvoyFlags(fs *flag.FlagSet) *envoyFlags {
	ef := &envoyFlags{conns: defaultConnLifetimes(), calls: defaultCallBounds()}
	fs.StringVar(&ef.addr, "grpc", "", "serve the Envoy rate limit service (RLS v3), health and reflection on this gRPC `address` (needs --envoy-config)")
	fs.StringVar(&ef.config, "envoy-config", "", "envoyproxy/ratelimit YAML configuration: a `file`, or a directory of .yaml files")
	fs.BoolVar(&ef.headers, "envoy-headers", false, "add RateLimit and RateLimit-Policy (and Retry-After on refusals) to Envoy's responses")
	fs.IntVar(&ef.maxConns, "grpc-max-connections", DefaultGRPCMaxConnections, "most gRPC connections served at once")
	fs.IntVar(&ef.maxKeys, "envoy-max-keys", config.DefaultMaxKeys, "most keys each Envoy rule tracks on the memory store; a new key beyond it is OVER_LIMIT (idle keys are swept)")
	ef.conns.addFlags(fs, "grpc-", [3]string{})
	ef.calls.addFlags(fs, "grpc-")
	fs.StringVar(&ef.clusterTag, "envoy-cluster-tag", "", "on Redis Cluster: the descriptor entry `key` whose value places every key of a request in one slot (e.g. user_id)")
	return ef
}

// merge combines the configuration's grpc section and the flags: a flag
// given explicitly wins, else the section's value, else the flag's
// default. g is updated to what is in force, for --print-config.
func (ef *envoyFlags) merge(g *config.GRPCConfig, set map[string]bool) {
	str := func(flag string, dst *string, v string) {
		if !set[flag] && v != "" {
			*dst = v
		}
	}
	str("grpc", &ef.addr, g.Listen)
	str("envoy-config", &ef.config, g.EnvoyConfig)
	str("envoy-cluster-tag", &ef.clusterTag, g.ClusterTag)
	if !set["envoy-headers"] && bool(g.EnvoyHeaders) {
		ef.headers = true
	}
	if !set["grpc-max-connections"] && g.MaxConnections > 0 {
		ef.maxConns = int(g.MaxConnections)
	}
	if !set["envoy-max-keys"] && g.MaxKeys > 0 {
		ef.maxKeys = int(g.MaxKeys)
	}
	ef.maxKeysSet = set["envoy-max-keys"] || g.MaxKeys > 0
	dur := func(flag string, dst *config.Duration, v config.Duration) {
		if !set[flag] && v > 0 {
			*dst = v
		}
	}
	dur("grpc-max-connection-idle", &ef.conns.idle, g.MaxConnectionIdle)
	dur("grpc-max-connection-age", &ef.conns.age, g.MaxConnectionAge)
	dur("grpc-max-connection-age-grace", &ef.conns.grace, g.MaxConnectionAgeGrace)
	dur("grpc-call-timeout", &ef.calls.timeout, g.CallTimeout)
	if !set["grpc-max-calls-per-address"] && g.MaxCallsPerAddress > 0 {
		ef.calls.perAddr = int(g.MaxCallsPerAddress)
	}
	maxKeys := 0 // the default is written out by check, on the memory store only
	if ef.maxKeysSet {
		maxKeys = ef.maxKeys
	}
	*g = config.GRPCConfig{Listen: ef.addr, EnvoyConfig: ef.config, EnvoyHeaders: config.Bool(ef.headers),
		MaxConnections: config.Int(ef.maxConns), MaxKeys: config.Int(maxKeys), ClusterTag: ef.clusterTag,
		MaxConnectionIdle: ef.conns.idle, MaxConnectionAge: ef.conns.age, MaxConnectionAgeGrace: ef.conns.grace,
		MaxCallsPerAddress: config.Int(ef.calls.perAddr), CallTimeout: ef.calls.timeout}
	if ef.addr == "" && ef.config == "" {
		*g = config.GRPCConfig{} // off: print nothing
	}
}

// check validates the flags before anything starts, and writes the
// memory store's default key cap into cfg's grpc section (--print-config
// shows it).
func (ef *envoyFlags) check(cfg *config.Config) error {
	memory := cfg.StoreFile == "" && (cfg.Store == "" || cfg.Store == config.DefaultStore)
	switch {
	case ef.addr == "" && ef.config == "" && cfg.Listen == "off":
		return errors.New("--listen off needs --grpc ADDR (nothing else would serve)")
	case ef.addr == "" && ef.config == "":
		return nil
	case ef.addr == "":
		return errors.New("--envoy-config needs --grpc ADDR")
	case ef.config == "":
		return errors.New("--grpc needs --envoy-config FILE")
	case ef.maxConns < 1:
		return fmt.Errorf("--grpc-max-connections %d must be at least 1", ef.maxConns)
	case ef.maxKeys < 1:
		return fmt.Errorf("--envoy-max-keys %d must be at least 1", ef.maxKeys)
	case ef.maxKeysSet && !memory:
		return errors.New("--envoy-max-keys caps the memory store; the Redis store has no key cap (bound it with maxmemory)")
	}
	if err := ef.conns.check("grpc-"); err != nil {
		return err
	}
	if err := ef.calls.check("grpc-"); err != nil {
		return err
	}
	if memory {
		cfg.GRPC.MaxKeys = config.Int(ef.maxKeys)
	}
	return nil
}

// checkEnvoy reads ef's Envoy rules and builds the service on the memory
// store, for --print-config: it refuses what openEnvoy would, short of
// connecting to another store.
func checkEnvoy(ef *envoyFlags) error {
	if ef.addr == "" {
		return nil
	}
	cfg, err := rls.LoadConfig(ef.config)
	if err != nil {
		return err
	}
	var backend engine.GroupBackend
	if len(cfg.Policies()) > 0 {
		g, err := cfg.NewGroup(engine.WithMaxKeys(ef.maxKeys))
		if err != nil {
			return err
		}
		defer g.Close()
		backend = g
	}
	_, err = rls.New(cfg, backend, rls.WithHeaders(ef.headers), rls.WithClusterTag(ef.clusterTag))
	return err
}

// startEnvoy starts the Envoy rate limit service when --grpc is given
// (an envoyRunner), on srv's store, with its metrics on srv's registry
// and srv's connection bounds and TLS. When ctx ends (the drain begins)
// its health turns NOT_SERVING, so that Envoy's health checks move away
// while it still answers. SIGHUP and a change to --envoy-config's files
// reload the rules. The returned stop lets in-flight calls finish within
// timeout (then cuts them) and closes the limits; it is never nil.
func startEnvoy(ctx context.Context, ef *envoyFlags, srv *server.Server, logger *slog.Logger) (stop func(timeout time.Duration), err error) {
	if ef.addr == "" {
		return func(time.Duration) {}, nil
	}
	sc := srv.Config() // the store URL resolved (store_file read)
	factory, closeBackends := envoyBackends(ctx, envoyStore{sc.Store, sc.StoreOptions, ef.maxKeys}, ef.tracing, srv.Registry(), logger)
	er, err := startRunner(ctx, runnerSpec{
		config: ef.config, factory: factory, reg: srv.Registry(), logger: logger, addr: ef.addr,
		opts: []rls.Option{rls.WithHeaders(ef.headers), rls.WithClusterTag(ef.clusterTag)},
		// One address holds at most max_conns_per_ip (half the listener
		// at most).
		conns: connlimit.Config{MaxConns: ef.maxConns, MaxPerAddr: int(sc.MaxConnsPerIP), IPv6Prefix: int(sc.IPv6Prefix)},
		// The configuration's tls section covers this listener too.
		tls:   srv.TLSConfig("h2"),
		grpc:  append(append(tracingServerOptions(ef.tracing), ef.calls.serverOptions(int(sc.IPv6Prefix))...), ef.conns.serverOption()),
		watch: rls.DefaultWatchInterval,
	})
	if err != nil {
		closeBackends()
		if isListenErr(err) {
			return nil, fmt.Errorf("--grpc: %w", err)
		}
		return nil, err
	}
	// Its metrics are those of the configuration in force.
	if err := srv.Registry().Register(gatherCollector{er.r}); err != nil {
		er.stop(0)
		er.close()
		closeBackends()
		return nil, err
	}
	cfg := er.r.Config()
	logger.Info("slidegate envoy rate limit service", "grpc", er.addr, "config", ef.config,
		"domains", cfg.Domains(), "rules", len(cfg.Rules()))
	return func(timeout time.Duration) {
		er.stop(timeout)
		er.close()
		closeBackends()
	}, nil
}

// isListenErr reports whether err is the listener's (a net.OpError from
// listen).
func isListenErr(err error) bool {
	var oe *net.OpError
	return errors.As(err, &oe) && oe.Op == "listen"
}
