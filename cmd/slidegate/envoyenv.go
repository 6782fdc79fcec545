package main

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
)

// peerVar is one of envoyproxy/ratelimit's settings (its settings.go)
// that slidegate envoy has no counterpart for. Set to a value that would
// change what the peer does, it stops the start with a message naming
// it: a deployment never loses a behaviour without a word.
type peerVar struct {
	name string
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

// statsdOff reports whether the peer would send no statsd: USE_STATSD
// false, or DISABLE_STATS true.
func statsdOff(getenv func(string) string) bool {
	d, err := strconv.ParseBool(getenv("DISABLE_STATS"))
	return isFalse(getenv("USE_STATSD")) || err == nil && d
}

// peerVars are the peer's settings slidegate envoy does not honour, with
// the values that are nonetheless safe. The peer's settings it honours
// are read in envoyCmdFlags and envoyPeerSettings.
var peerVars = []peerVar{
	{"DEBUG_HOST", never, "no debug (pprof) listener: unset it (profiles are on slidegate serve's admin listener)"},
	{"DEBUG_PORT", never, "no debug (pprof) listener: unset it (profiles are on slidegate serve's admin listener)"},
	{"GRPC_UDS", equals(""), "no gRPC unix socket: use GRPC_HOST and GRPC_PORT"},
	{"CONFIG_TYPE", equals("FILE"), "only FILE: the runtime directory (no xDS)"},
	// The xDS settings are read by the peer only with CONFIG_TYPE
	// GRPC_XDS_SOTW, which is refused.
	{"FORCE_START_WITHOUT_INITIAL_CONFIG", anyValue, ""},
	{"CONFIG_GRPC_XDS_NODE_ID", anyValue, ""}, {"CONFIG_GRPC_XDS_NODE_METADATA", anyValue, ""},
	{"CONFIG_GRPC_XDS_SERVER_URL", anyValue, ""}, {"CONFIG_GRPC_XDS_SERVER_CONNECT_RETRY_INTERVAL", anyValue, ""},
	{"CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS", anyValue, ""}, {"CONFIG_GRPC_XDS_SERVER_USE_TLS", anyValue, ""},
	{"CONFIG_GRPC_XDS_CLIENT_TLS_CERT", anyValue, ""}, {"CONFIG_GRPC_XDS_CLIENT_TLS_KEY", anyValue, ""},
	{"CONFIG_GRPC_XDS_SERVER_TLS_CACERT", anyValue, ""}, {"CONFIG_GRPC_XDS_SERVER_TLS_SAN", anyValue, ""},
	{"XDS_CLIENT_BACKOFF_INITIAL_INTERVAL", anyValue, ""}, {"XDS_CLIENT_BACKOFF_MAX_INTERVAL", anyValue, ""},
	{"XDS_CLIENT_BACKOFF_RANDOM_FACTOR", anyValue, ""}, {"XDS_CLIENT_BACKOFF_JITTER", anyValue, ""},
	{"XDS_CLIENT_MAX_MSG_SIZE_IN_BYTES", anyValue, ""},
	{"USE_STATSD", func(v string, _ func(string) string) bool { return isFalse(v) }, "no statsd: metrics are Prometheus, on the HTTP port's /metrics; set USE_STATSD=false"},
	{"USE_DOG_STATSD", func(v string, _ func(string) string) bool { return isFalse(v) }, "no DogStatsD: metrics are Prometheus, on the HTTP port's /metrics"},
	{"DISABLE_STATS", anyValue, ""}, // /metrics is pulled; nothing is sent either way
	{"STATSD_HOST", func(_ string, g func(string) string) bool { return statsdOff(g) }, "no statsd (set USE_STATSD=false)"},
	{"STATSD_PORT", func(_ string, g func(string) string) bool { return statsdOff(g) }, "no statsd (set USE_STATSD=false)"},
	{"STATS_FLUSH_INTERVAL", func(_ string, g func(string) string) bool { return statsdOff(g) }, "no statsd (set USE_STATSD=false)"},
	{"EXTRA_TAGS", func(_ string, g func(string) string) bool { return statsdOff(g) }, "no statsd tags (set USE_STATSD=false)"},
	{"USE_DOG_STATSD_MOGRIFIERS", when("USE_DOG_STATSD", notTrue), "no DogStatsD"},
	{"USE_PROMETHEUS", func(v string, _ func(string) string) bool { return isFalse(v) }, "no separate Prometheus listener: /metrics is on the HTTP port (HOST, PORT)"},
	{"PROMETHEUS_ADDR", when("USE_PROMETHEUS", notTrue), ""}, {"PROMETHEUS_PATH", when("USE_PROMETHEUS", notTrue), ""},
	{"PROMETHEUS_MAPPER_YAML", when("USE_PROMETHEUS", notTrue), ""},
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
	{"REDIS_TLS_SKIP_HOSTNAME_VERIFICATION", func(v string, _ func(string) string) bool { return isFalse(v) }, "the Redis server's name is always verified: set store_options tls_server_name through --store"},
	{"REDIS_PERSECOND", func(v string, _ func(string) string) bool { return isFalse(v) }, "no second Redis for per-second limits"},
	{"REDIS_PERSECOND_SOCKET_TYPE", when("REDIS_PERSECOND", notTrue), ""}, {"REDIS_PERSECOND_TYPE", when("REDIS_PERSECOND", notTrue), ""},
	{"REDIS_PERSECOND_URL", when("REDIS_PERSECOND", notTrue), ""}, {"REDIS_PERSECOND_POOL_SIZE", when("REDIS_PERSECOND", notTrue), ""},
	{"REDIS_PERSECOND_AUTH", when("REDIS_PERSECOND", notTrue), ""}, {"REDIS_PERSECOND_TLS", when("REDIS_PERSECOND", notTrue), ""},
	{"REDIS_PERSECOND_SENTINEL_AUTH", when("REDIS_PERSECOND", notTrue), ""}, {"REDIS_PERSECOND_PIPELINE_WINDOW", when("REDIS_PERSECOND", notTrue), ""},
	{"REDIS_PERSECOND_PIPELINE_LIMIT", when("REDIS_PERSECOND", notTrue), ""}, {"REDIS_PERSECOND_TIMEOUT", when("REDIS_PERSECOND", notTrue), ""},
	{"REDIS_PERSECOND_POOL_ON_EMPTY_BEHAVIOR", when("REDIS_PERSECOND", notTrue), ""},
	{"MEMCACHE_HOST_PORT", when("BACKEND_TYPE", func(v string) bool { return v != "memcache" }), ""},
	{"MEMCACHE_MAX_IDLE_CONNS", when("BACKEND_TYPE", func(v string) bool { return v != "memcache" }), ""},
	{"MEMCACHE_SRV", when("BACKEND_TYPE", func(v string) bool { return v != "memcache" }), ""},
	{"MEMCACHE_SRV_REFRESH", when("BACKEND_TYPE", func(v string) bool { return v != "memcache" }), ""},
	{"MEMCACHE_TLS", when("BACKEND_TYPE", func(v string) bool { return v != "memcache" }), ""},
	{"MEMCACHE_TLS_CLIENT_CERT", when("BACKEND_TYPE", func(v string) bool { return v != "memcache" }), ""},
	{"MEMCACHE_TLS_CLIENT_KEY", when("BACKEND_TYPE", func(v string) bool { return v != "memcache" }), ""},
	{"MEMCACHE_TLS_CACERT", when("BACKEND_TYPE", func(v string) bool { return v != "memcache" }), ""},
	{"MEMCACHE_TLS_SKIP_HOSTNAME_VERIFICATION", when("BACKEND_TYPE", func(v string) bool { return v != "memcache" }), ""},
}

// checkPeerVars refuses a peer variable set to a value slidegate envoy
// would not honour, naming it.
func checkPeerVars(getenv func(string) string) error {
	for _, v := range peerVars {
		val := getenv(v.name)
		if val == "" || v.neutral(val, getenv) {
			continue
		}
		why := v.why
		if why == "" {
			why = "not supported"
		}
		return fmt.Errorf("%s=%q: %s (docs/envoy.md lists the variables)", v.name, val, why)
	}
	return nil
}

// envBool reads one of the peer's boolean variables as its envconfig
// does (strconv.ParseBool); unset is def.
func envBool(getenv func(string) string, name string, def bool) (bool, error) {
	v := getenv(name)
	if v == "" {
		return def, nil
	}
	b, err := strconv.ParseBool(v)
	if err != nil {
		return false, fmt.Errorf("%s=%q: want true or false", name, v)
	}
	return b, nil
}

// peerSettings are the peer's variables read beside the flags.
type peerSettings struct {
	shadow, quota, healthyWithConfig bool
	redisHealth                      bool        // REDIS_HEALTH_CHECK_ACTIVE_CONNECTION
	tls                              *tls.Config // nil: plaintext gRPC
}

// envoyPeerSettings reads SHADOW_MODE, QUOTA_MODE,
// HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED,
// REDIS_HEALTH_CHECK_ACTIVE_CONNECTION and the gRPC server's TLS
// (GRPC_SERVER_USE_TLS and its companions), and refuses the peer's
// variables slidegate does not honour.
func envoyPeerSettings(getenv func(string) string) (peerSettings, error) {
	var p peerSettings
	if err := checkPeerVars(getenv); err != nil {
		return p, err
	}
	var err error
	for _, b := range []struct {
		name string
		dst  *bool
	}{{"SHADOW_MODE", &p.shadow}, {"QUOTA_MODE", &p.quota}, {"HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED", &p.healthyWithConfig},
		{"REDIS_HEALTH_CHECK_ACTIVE_CONNECTION", &p.redisHealth}} {
		if *b.dst, err = envBool(getenv, b.name, false); err != nil {
			return p, err
		}
	}
	p.tls, err = grpcServerTLS(getenv)
	return p, err
}

// grpcServerTLS is the peer's gRPC server TLS: GRPC_SERVER_USE_TLS serves
// TLS with GRPC_SERVER_TLS_CERT and GRPC_SERVER_TLS_KEY (read again when
// they change, as the peer's certificate provider does);
// GRPC_CLIENT_TLS_CACERT requires a client certificate signed by that CA;
// GRPC_CLIENT_TLS_SAN requires the client certificate to name that SAN
// (and be for client authentication). A companion set without
// GRPC_SERVER_USE_TLS is refused rather than ignored.
func grpcServerTLS(getenv func(string) string) (*tls.Config, error) {
	on, err := envBool(getenv, "GRPC_SERVER_USE_TLS", false)
	if err != nil {
		return nil, err
	}
	cert, key, ca, san := getenv("GRPC_SERVER_TLS_CERT"), getenv("GRPC_SERVER_TLS_KEY"), getenv("GRPC_CLIENT_TLS_CACERT"), getenv("GRPC_CLIENT_TLS_SAN")
	if !on {
		for _, v := range []string{"GRPC_SERVER_TLS_CERT", "GRPC_SERVER_TLS_KEY", "GRPC_CLIENT_TLS_CACERT", "GRPC_CLIENT_TLS_SAN"} {
			if getenv(v) != "" {
				return nil, fmt.Errorf("%s is set but GRPC_SERVER_USE_TLS is not true: the gRPC port would serve plaintext", v)
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
