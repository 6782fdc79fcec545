package main

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"flag"
	"fmt"
	"os"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/slidegate/slidegate/internal/rls"
	"github.com/slidegate/slidegate/internal/server/config"
)

// peerVar is a rule over envoyproxy/ratelimit's settings (its settings.go)
// that slidegate envoy has no counterpart for. One of them set to a value
// that would change what the peer does stops the start with a message
// naming it: a deployment never loses a behaviour without a word.
type peerVar struct {
	// names are the variables the rule covers, separated by spaces.
	names string
	// neutral reports whether value v (set, non-empty) asks for nothing
	// slidegate does not do, given the other variables.
	neutral func(v string, getenv func(string) string) bool
	why     string
}

// isFalse is true for the values envoyconfig reads as false.
func isFalse(v string) bool { b, err := strconv.ParseBool(v); return err == nil && !b }

func equals(want ...string) func(string, func(string) string) bool {
	return func(v string, _ func(string) string) bool { return slices.Contains(want, v) }
}

// when makes a companion variable neutral while the variable that turns
// its feature on is off (the peer reads it only then).
func when(gate string, off func(string) bool) func(string, func(string) string) bool {
	return func(_ string, getenv func(string) string) bool { return off(getenv(gate)) }
}

func anyValue(string, func(string) string) bool { return true }

func never(string, func(string) string) bool { return false }

// notTrue is true unless the gate is set to a true value.
func notTrue(v string) bool { b, err := strconv.ParseBool(v); return v == "" || err == nil && !b }

// falseValue is neutral for a value envconfig reads as false.
func falseValue(v string, _ func(string) string) bool { return isFalse(v) }

// statsdOff is neutral when the peer would send no statsd: USE_STATSD
// false, or DISABLE_STATS true.
func statsdOff(_ string, getenv func(string) string) bool {
	d, err := strconv.ParseBool(getenv("DISABLE_STATS"))
	return isFalse(getenv("USE_STATSD")) || err == nil && d
}

// peerVars are the peer's settings slidegate envoy does not honour, with
// the values that are nonetheless safe; they are checked in this order.
// The peer's settings it honours are read through peerEnv.
var peerVars = []peerVar{
	{"DEBUG_HOST DEBUG_PORT", never, "no debug (pprof) listener: unset it (profiles are on slidegate serve's admin listener)"},
	{"GRPC_UDS", equals(""), "no gRPC unix socket: use GRPC_HOST and GRPC_PORT"},
	{"CONFIG_TYPE", equals("FILE"), "only FILE: the runtime directory (no xDS)"},
	// The xDS settings are read by the peer only with CONFIG_TYPE
	// GRPC_XDS_SOTW, which is refused.
	{`FORCE_START_WITHOUT_INITIAL_CONFIG
		CONFIG_GRPC_XDS_NODE_ID CONFIG_GRPC_XDS_NODE_METADATA
		CONFIG_GRPC_XDS_SERVER_URL CONFIG_GRPC_XDS_SERVER_CONNECT_RETRY_INTERVAL
		CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS CONFIG_GRPC_XDS_SERVER_USE_TLS
		CONFIG_GRPC_XDS_CLIENT_TLS_CERT CONFIG_GRPC_XDS_CLIENT_TLS_KEY
		CONFIG_GRPC_XDS_SERVER_TLS_CACERT CONFIG_GRPC_XDS_SERVER_TLS_SAN
		XDS_CLIENT_BACKOFF_INITIAL_INTERVAL XDS_CLIENT_BACKOFF_MAX_INTERVAL
		XDS_CLIENT_BACKOFF_RANDOM_FACTOR XDS_CLIENT_BACKOFF_JITTER
		XDS_CLIENT_MAX_MSG_SIZE_IN_BYTES`, anyValue, ""},
	{"USE_STATSD", falseValue, "no statsd: metrics are Prometheus, on the HTTP port's /metrics; set USE_STATSD=false"},
	{"USE_DOG_STATSD", falseValue, "no DogStatsD: metrics are Prometheus, on the HTTP port's /metrics"},
	{"DISABLE_STATS", anyValue, ""}, // /metrics is pulled; nothing is sent either way
	{"STATSD_HOST STATSD_PORT STATS_FLUSH_INTERVAL", statsdOff, "no statsd (set USE_STATSD=false)"},
	{"EXTRA_TAGS", statsdOff, "no statsd tags (set USE_STATSD=false)"},
	{"USE_DOG_STATSD_MOGRIFIERS", when("USE_DOG_STATSD", notTrue), "no DogStatsD"},
	{"USE_PROMETHEUS", falseValue, "no separate Prometheus listener: /metrics is on the HTTP port (HOST, PORT)"},
	{"PROMETHEUS_ADDR PROMETHEUS_PATH PROMETHEUS_MAPPER_YAML", when("USE_PROMETHEUS", notTrue), ""},
	{"RUNTIME_WATCH_ROOT", anyValue, ""},            // the directory is polled: a swapped symlink and a written file are both seen
	{"EXPIRATION_JITTER_MAX_SECONDS", anyValue, ""}, // a fixed window's key TTL; a log's keys expire with their last entry
	{"LOCAL_CACHE_SIZE_IN_BYTES", equals("0"), "no local cache of over-limit keys: every request is decided by the store"},
	{"BACKEND_TYPE", equals("redis"), "the store is memory or Redis (REDIS_URL); memcache is not supported"},
	// A refused request never enters a sliding log: true is what slidegate
	// always does, false the fixed window's behaviour docs/envoy.md lists
	// as a difference.
	{"STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT", func(v string, _ func(string) string) bool { _, err := strconv.ParseBool(v); return err == nil }, "want true or false"},
	{"REDIS_POOL_SIZE", anyValue, ""},       // the client sizes its own pool
	{"REDIS_PIPELINE_WINDOW", anyValue, ""}, // the client pipelines concurrent calls by itself
	{"REDIS_PIPELINE_LIMIT", anyValue, ""},  // unused by the peer too
	{"REDIS_POOL_ON_EMPTY_BEHAVIOR", equals("WAIT"), "only WAIT (the peer refuses the others too)"},
	{"REDIS_TLS_SKIP_HOSTNAME_VERIFICATION", falseValue, "the Redis server's name is always verified: set store_options tls_server_name through --store"},
	{"REDIS_PERSECOND", falseValue, "no second Redis for per-second limits"},
	{`REDIS_PERSECOND_SOCKET_TYPE REDIS_PERSECOND_TYPE
		REDIS_PERSECOND_URL REDIS_PERSECOND_POOL_SIZE
		REDIS_PERSECOND_AUTH REDIS_PERSECOND_TLS
		REDIS_PERSECOND_SENTINEL_AUTH REDIS_PERSECOND_PIPELINE_WINDOW
		REDIS_PERSECOND_PIPELINE_LIMIT REDIS_PERSECOND_TIMEOUT
		REDIS_PERSECOND_POOL_ON_EMPTY_BEHAVIOR`, when("REDIS_PERSECOND", notTrue), ""},
	{`MEMCACHE_HOST_PORT MEMCACHE_MAX_IDLE_CONNS MEMCACHE_SRV MEMCACHE_SRV_REFRESH
		MEMCACHE_TLS MEMCACHE_TLS_CLIENT_CERT MEMCACHE_TLS_CLIENT_KEY MEMCACHE_TLS_CACERT
		MEMCACHE_TLS_SKIP_HOSTNAME_VERIFICATION`, when("BACKEND_TYPE", func(v string) bool { return v != "memcache" }), ""},
}

// checkPeerVars refuses a peer variable set to a value slidegate envoy
// would not honour, naming it.
func checkPeerVars(getenv func(string) string) error {
	for _, v := range peerVars {
		for _, name := range strings.Fields(v.names) {
			val := getenv(name)
			if val == "" || v.neutral(val, getenv) {
				continue
			}
			why := v.why
			if why == "" {
				why = "not supported"
			}
			return fmt.Errorf("%s=%q: %s (docs/envoy.md lists the variables)", name, val, why)
		}
	}
	return nil
}

// peerEnv is envoyproxy/ratelimit's environment as slidegate envoy
// honours it, read through one struct as the peer's settings.go does. Its
// sections group the variables by what they set, and the functions that
// use a section take only it. A field is one variable (its env tag), its
// default in defaultPeerEnv. A field with a flag tag is also that flag's
// default; the flag, given, wins, even over a value that does not parse.
// A help tag is that flag's help: addPeerFlags defines the flag from the
// tags. The variables slidegate envoy does not honour are in peerVars.
type peerEnv struct {
	Runtime  envRuntime
	Listen   envListen
	GRPC     envGRPC
	Redis    envRedis
	Response envResponse
	Mode     envMode
	Health   envHealth
	Log      envLog
	Tracing  envTracing
}

// envRuntime is where the configuration's files are.
type envRuntime struct {
	Root              string `env:"RUNTIME_ROOT" flag:"runtime-root" help:"the runtime root"`
	Subdirectory      string `env:"RUNTIME_SUBDIRECTORY" flag:"runtime-subdirectory" help:"the runtime subdirectory"`
	AppDirectory      string `env:"RUNTIME_APPDIRECTORY" flag:"runtime-appdirectory" help:"the directory under it holding the configuration"`
	IgnoreDotFiles    bool   `env:"RUNTIME_IGNOREDOTFILES" flag:"ignore-dot-files" help:"skip files and directories whose name starts with a dot"`
	MergeDomainConfig bool   `env:"MERGE_DOMAIN_CONFIG" flag:"merge-domain-config" help:"merge files that configure one domain"`
}

// envListen is the listeners' addresses.
type envListen struct {
	Host     string `env:"HOST" flag:"host" help:"HTTP listen host, serving /json, /healthcheck, /rlconfig, /metrics"`
	Port     string `env:"PORT" flag:"port" help:"HTTP listen port; off: no HTTP listener"`
	GRPCHost string `env:"GRPC_HOST" flag:"grpc-host" help:"gRPC listen host"`
	GRPCPort string `env:"GRPC_PORT" flag:"grpc-port" help:"gRPC listen port"`
}

// envGRPC is the gRPC connections' lifetimes and the gRPC server's TLS
// (grpcServerTLS).
type envGRPC struct {
	MaxConnectionAge      config.Duration `env:"GRPC_MAX_CONNECTION_AGE" flag:"grpc-max-connection-age"`
	MaxConnectionAgeGrace config.Duration `env:"GRPC_MAX_CONNECTION_AGE_GRACE" flag:"grpc-max-connection-age-grace"`
	ServerUseTLS          bool            `env:"GRPC_SERVER_USE_TLS"`
	ServerTLSCert         string          `env:"GRPC_SERVER_TLS_CERT"`
	ServerTLSKey          string          `env:"GRPC_SERVER_TLS_KEY"`
	ClientTLSCACert       string          `env:"GRPC_CLIENT_TLS_CACERT"`
	ClientTLSSAN          string          `env:"GRPC_CLIENT_TLS_SAN"`
}

// envRedis is the Redis store (peerRedisURL, and store options).
type envRedis struct {
	SocketType     string `env:"REDIS_SOCKET_TYPE"`
	Type           string `env:"REDIS_TYPE"`
	URL            string `env:"REDIS_URL"`
	Auth           string `env:"REDIS_AUTH"`
	TLS            bool   `env:"REDIS_TLS"`
	TLSCACert      string `env:"REDIS_TLS_CACERT"`
	TLSClientCert  string `env:"REDIS_TLS_CLIENT_CERT"`
	TLSClientKey   string `env:"REDIS_TLS_CLIENT_KEY"`
	Timeout        string `env:"REDIS_TIMEOUT"`
	SentinelAuth   string `env:"REDIS_SENTINEL_AUTH"`
	CacheKeyPrefix string `env:"CACHE_KEY_PREFIX"`
}

// envResponse is what a response carries besides its codes.
type envResponse struct {
	HeadersEnabled  bool    `env:"LIMIT_RESPONSE_HEADERS_ENABLED" flag:"limit-response-headers" help:"add RateLimit-Limit, -Remaining, -Reset"`
	LimitHeader     string  `env:"LIMIT_LIMIT_HEADER" flag:"limit-header" help:"the limit header's name"`
	RemainingHeader string  `env:"LIMIT_REMAINING_HEADER" flag:"remaining-header" help:"the remaining header's name"`
	ResetHeader     string  `env:"LIMIT_RESET_HEADER" flag:"reset-header" help:"the reset header's name"`
	DynamicMetadata bool    `env:"RESPONSE_DYNAMIC_METADATA" flag:"dynamic-metadata" help:"add dynamic_metadata to responses"`
	NearLimitRatio  float64 `env:"NEAR_LIMIT_RATIO" flag:"near-limit-ratio" help:"share of a limit above which an allowed request counts as near it"`
}

// envMode is how the service decides: shadow (always OK) or quota.
type envMode struct {
	Shadow bool `env:"SHADOW_MODE"`
	Quota  bool `env:"QUOTA_MODE"`
}

// envHealth is what the health check follows.
type envHealth struct {
	WithAtLeastOneConfigLoaded bool `env:"HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED"`
	RedisActiveConnection      bool `env:"REDIS_HEALTH_CHECK_ACTIVE_CONNECTION"`
}

// envLog is the log's level and format.
type envLog struct {
	Level  string `env:"LOG_LEVEL" flag:"log-level" help:"debug, info, warn or error"`
	Format string `env:"LOG_FORMAT" flag:"log-format" help:"text or json"`
}

// envTracing is the tracing variables (peerTracing).
type envTracing struct {
	Enabled           bool   `env:"TRACING_ENABLED"`
	ServiceName       string `env:"TRACING_SERVICE_NAME"`
	ServiceNamespace  string `env:"TRACING_SERVICE_NAMESPACE"`
	ServiceInstanceID string `env:"TRACING_SERVICE_INSTANCE_ID"`
	ExporterProtocol  string `env:"TRACING_EXPORTER_PROTOCOL"`
	SamplingRate      string `env:"TRACING_SAMPLING_RATE"` // read by peerTracing, which clamps it
}

// defaultPeerEnv is the peer's defaults, and slidegate's where the peer
// has no such setting.
func defaultPeerEnv() peerEnv {
	return peerEnv{
		Runtime: envRuntime{Root: "/srv/runtime_data/current", AppDirectory: "config"},
		Listen:  envListen{Host: "0.0.0.0", Port: "8080", GRPCHost: "0.0.0.0", GRPCPort: "8081"},
		GRPC: envGRPC{MaxConnectionAge: config.Duration(rls.DefaultMaxConnectionAge),
			MaxConnectionAgeGrace: config.Duration(rls.DefaultMaxConnectionAgeGrace)},
		Response: envResponse{LimitHeader: rls.DefaultLimitHeader, RemainingHeader: rls.DefaultRemainingHeader,
			ResetHeader: rls.DefaultResetHeader, NearLimitRatio: rls.DefaultNearLimitRatio},
		Log:     envLog{Level: "warn", Format: "text"},
		Tracing: envTracing{ServiceName: "RateLimit"},
	}
}

// peerFields calls visit with each variable's field of the struct type
// t at index (peerEnv's sections walked in order), its Index the path
// from there.
func peerFields(t reflect.Type, index []int, visit func(reflect.StructField)) {
	for i := range t.NumField() {
		f := t.Field(i)
		f.Index = append(slices.Clip(index), i)
		if f.Type.Kind() == reflect.Struct {
			peerFields(f.Type, f.Index, visit)
		} else {
			visit(f)
		}
	}
}

// envError is a variable whose value does not parse; flag, when not
// empty, names the flag that overrides the variable.
type envError struct {
	flag string
	err  error
}

// readPeerEnv reads the variables set (non-empty) over defaultPeerEnv,
// as the peer's envconfig does: booleans by strconv.ParseBool, numbers
// by strconv.ParseFloat, durations with a unit.
func readPeerEnv(getenv func(string) string) (peerEnv, []envError) {
	p := defaultPeerEnv()
	var errs []envError
	v := reflect.ValueOf(&p).Elem()
	peerFields(v.Type(), nil, func(f reflect.StructField) {
		name, val := f.Tag.Get("env"), getenv(f.Tag.Get("env"))
		if val == "" {
			return
		}
		var err error
		switch dst := v.FieldByIndex(f.Index).Addr().Interface().(type) {
		case *string:
			*dst = val
		case *bool:
			if *dst, err = strconv.ParseBool(val); err != nil {
				err = fmt.Errorf("%s=%q: want true or false", name, val)
			}
		case *float64:
			if *dst, err = strconv.ParseFloat(val, 64); err != nil {
				err = fmt.Errorf("%s=%q: want a number", name, val)
			}
		case *config.Duration:
			if err = dst.Set(val); err != nil {
				err = fmt.Errorf("%s: %v", name, err)
			}
		default:
			err = fmt.Errorf("%s: no reader for a %s", name, f.Type)
		}
		if err != nil {
			errs = append(errs, envError{f.Tag.Get("flag"), err})
		}
	})
	return p, errs
}

// addPeerFlags defines a flag over each field of e with a help tag: its
// flag tag names it, its value is its default, and the help names the
// variable. The fields with a flag tag but no help tag get their flags
// elsewhere (connLifetimes.addFlags).
func addPeerFlags(fs *flag.FlagSet, e *peerEnv) {
	v := reflect.ValueOf(e).Elem()
	peerFields(v.Type(), nil, func(f reflect.StructField) {
		help := f.Tag.Get("help")
		if help == "" {
			return
		}
		name, help := f.Tag.Get("flag"), help+" ("+f.Tag.Get("env")+")"
		switch p := v.FieldByIndex(f.Index).Addr().Interface().(type) {
		case *string:
			fs.StringVar(p, name, *p, help)
		case *bool:
			fs.BoolVar(p, name, *p, help)
		case *float64:
			fs.Float64Var(p, name, *p, help)
		default:
			panic(fmt.Sprintf("peerEnv %s: no flag for a %s", f.Tag.Get("env"), f.Type))
		}
	})
}

// firstError is the first of errs whose flag is not in given.
func firstError(errs []envError, given map[string]bool) error {
	for _, e := range errs {
		if e.flag == "" || !given[e.flag] {
			return e.err
		}
	}
	return nil
}

// grpcServerTLS is the peer's gRPC server TLS: GRPC_SERVER_USE_TLS serves
// TLS with GRPC_SERVER_TLS_CERT and GRPC_SERVER_TLS_KEY (read again when
// they change, as the peer's certificate provider does);
// GRPC_CLIENT_TLS_CACERT requires a client certificate signed by that CA;
// GRPC_CLIENT_TLS_SAN requires the client certificate to name that SAN
// (and be for client authentication). A companion set without
// GRPC_SERVER_USE_TLS is refused rather than ignored.
func grpcServerTLS(g envGRPC) (*tls.Config, error) {
	cert, key, ca, san := g.ServerTLSCert, g.ServerTLSKey, g.ClientTLSCACert, g.ClientTLSSAN
	if !g.ServerUseTLS {
		for _, v := range []struct{ name, val string }{{"GRPC_SERVER_TLS_CERT", cert}, {"GRPC_SERVER_TLS_KEY", key}, {"GRPC_CLIENT_TLS_CACERT", ca}, {"GRPC_CLIENT_TLS_SAN", san}} {
			if v.val != "" {
				return nil, fmt.Errorf("%s is set but GRPC_SERVER_USE_TLS is not true: the gRPC port would serve plaintext", v.name)
			}
		}
		return nil, nil
	}
	if cert == "" || key == "" {
		return nil, errors.New("GRPC_SERVER_USE_TLS: GRPC_SERVER_TLS_CERT and GRPC_SERVER_TLS_KEY must name the certificate and its key")
	}
	kp := &keyPair{cert: cert, key: key}
	if _, err := kp.get(nil); err != nil {
		return nil, err
	}
	cfg := &tls.Config{MinVersion: tls.VersionTLS12, GetCertificate: kp.get, ClientAuth: tls.NoClientCert}
	if ca != "" {
		pem, err := os.ReadFile(ca)
		if err != nil {
			return nil, fmt.Errorf("GRPC_CLIENT_TLS_CACERT: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("GRPC_CLIENT_TLS_CACERT: %s holds no PEM certificate", ca)
		}
		cfg.ClientCAs, cfg.ClientAuth = pool, tls.RequireAndVerifyClientCert
	}
	if san != "" {
		if ca == "" {
			return nil, errors.New("GRPC_CLIENT_TLS_SAN needs GRPC_CLIENT_TLS_CACERT: without a client CA no client certificate is asked for")
		}
		cfg.VerifyPeerCertificate = verifyClientSAN(cfg.ClientCAs, san)
	}
	return cfg, nil
}

// verifyClientSAN checks, as the peer does, that the client's verified
// certificate names san and is for client authentication.
func verifyClientSAN(pool *x509.CertPool, san string) func([][]byte, [][]*x509.Certificate) error {
	return func(_ [][]byte, chains [][]*x509.Certificate) error {
		if len(chains) == 0 {
			return errors.New("tls: no verified client certificate")
		}
		for _, certs := range chains {
			if len(certs) == 0 {
				return errors.New("tls: missing client certificate")
			}
			opts := x509.VerifyOptions{Roots: pool, Intermediates: x509.NewCertPool(), DNSName: san,
				KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}
			for _, c := range certs[1:] {
				opts.Intermediates.AddCert(c)
			}
			if _, err := certs[0].Verify(opts); err != nil {
				return err
			}
		}
		return nil
	}
}

// keyPair serves a certificate and key from files, read again when
// either file's modification time changes (a rotated certificate is used
// from the next handshake on).
type keyPair struct {
	cert, key string
	mu        sync.Mutex
	mods      [2]time.Time
	c         *tls.Certificate
}

func (k *keyPair) get(*tls.ClientHelloInfo) (*tls.Certificate, error) {
	var mods [2]time.Time
	for i, f := range []string{k.cert, k.key} {
		fi, err := os.Stat(f)
		if err != nil {
			return nil, fmt.Errorf("GRPC_SERVER_TLS_CERT/KEY: %w", err)
		}
		mods[i] = fi.ModTime()
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.c != nil && mods == k.mods {
		return k.c, nil
	}
	c, err := tls.LoadX509KeyPair(k.cert, k.key)
	if err != nil {
		if k.c != nil {
			return k.c, nil // a half-written rotation: the previous pair stays
		}
		return nil, fmt.Errorf("GRPC_SERVER_TLS_CERT/KEY: %s", strings.TrimPrefix(err.Error(), "tls: "))
	}
	k.c, k.mods = &c, mods
	return k.c, nil
}
