package redisstore

import (
	"context"
	"crypto/tls"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/slidegate/slidegate/engine"
	"github.com/slidegate/slidegate/internal/clientcore"
)

// Defaults. Each has an option to change it.
const (
	// DefaultKeyPrefix starts every key the store writes.
	DefaultKeyPrefix = "slidegate:"
	// DefaultTimeout bounds each decision's round trip to Redis. A call
	// that misses it is not decided locally while the node answers a
	// liveness probe (see Limiter.Decide).
	DefaultTimeout = 50 * time.Millisecond
	// DefaultDialTimeout bounds connecting (and each reconnection).
	DefaultDialTimeout = 2 * time.Second
	// DefaultBreakerThreshold is how many consecutive store failures
	// (errors and lost connections; a timeout is not one) open the circuit
	// breaker.
	DefaultBreakerThreshold = 5
	// DefaultBreakerCooldown is how long the breaker stays open before it
	// lets one probe through.
	DefaultBreakerCooldown = time.Second
	// DefaultHealthInterval is how often the store re-reads a cluster's
	// slot map and checks every master (restarts, evictions).
	DefaultHealthInterval = time.Second
	// DefaultRefusalCacheSize bounds the local refusal cache (entries per
	// limiter).
	DefaultRefusalCacheSize = 10000
	// CallerClockTTL is the least TTL of keys when the caller supplies the
	// clock: Redis expires keys on its own clock, which cannot be related
	// to the caller's, so keys are kept at least this long (or 2W) after
	// their last accepted request. The script evicts expired entries by
	// itself; the TTL only reclaims memory.
	CallerClockTTL = time.Hour
)

// FailurePolicy says what a limiter does when Redis cannot decide (it is
// unreachable, hung, or the breaker is open). A call that missed its
// deadline while the node still answers is not handed to FailLocal: see
// Limiter.Decide. Its String
// method returns "local", "open" or "closed", the configuration names;
// remote.FailurePolicy is the same type.
type FailurePolicy = clientcore.Policy

const (
	// FailLocal decides with an in-memory engine.Limiter of the same
	// policy, the default: each replica then enforces the limit alone, so
	// a fleet of k replicas admits up to (k+1)·L in a window spanning an
	// outage (L from Redis before or after it, L per replica during it),
	// (k+2)·L if Redis also lost its data. A busy host or a slow Redis is
	// not an outage: requests whose calls time out while the node answers
	// probes are refused, and the bound stays L.
	FailLocal = clientcore.Local
	// FailOpen allows every request.
	FailOpen = clientcore.Open
	// FailClosed refuses every request, and returns an error wrapping
	// ErrUnavailable alongside the refusal.
	FailClosed = clientcore.Closed
)

type config struct {
	prefix      string
	clock       engine.Clock // nil: Redis TIME
	timeout     time.Duration
	dialTimeout time.Duration
	failure     FailurePolicy
	threshold   int
	cooldown    time.Duration
	cacheSize   int
	logger      *slog.Logger
	// allowEviction accepts a maxmemory-policy that may evict keys.
	allowEviction  bool
	healthInterval time.Duration
	onFallback     func(key string, cause error)
	callHook       func(ctx context.Context, store, node, policy string) (context.Context, func(allowed bool, err error))
	tls            tlsConfig
	sentinelUser   string
	sentinelPass   string
	conn           conn // WithClient, or tests: another client
}

func defaultConfig() config {
	return config{
		prefix:      DefaultKeyPrefix,
		timeout:     DefaultTimeout,
		dialTimeout: DefaultDialTimeout,
		failure:     FailLocal,
		threshold:   DefaultBreakerThreshold,
		cooldown:    DefaultBreakerCooldown,
		cacheSize:   DefaultRefusalCacheSize,
		logger:      slog.Default(),

		healthInterval: DefaultHealthInterval,
	}
}

// Option configures a Store (and the limiters it makes).
type Option func(*config) error

// WithKeyPrefix sets the prefix of every key (default DefaultKeyPrefix).
// Keys are prefix + policy name + ":{" + slot tag + "}" + client key (see
// Limiter.Key); a brace in the prefix would change the hash tag, so it is
// an error.
func WithKeyPrefix(p string) Option {
	return func(c *config) error {
		if strings.ContainsAny(p, "{}") {
			return fmt.Errorf("%w: key prefix %q contains a brace, which would change the hash tag", ErrInvalidOption, p)
		}
		c.prefix = p
		return nil
	}
}

// WithClock makes decisions use the caller's clock instead of Redis TIME,
// for tests and deterministic replays. Instants are truncated to whole
// microseconds (Redis scripts compute in doubles, exact to 2^53). With a
// caller clock, replicas share one timeline only if their clocks agree.
func WithClock(clk engine.Clock) Option {
	return func(c *config) error { return clientcore.NonZero(&c.clock, clk, "nil clock", ErrInvalidOption) }
}

// WithTimeout sets the deadline of each decision's round trip (default
// DefaultTimeout). When observed round trips are slow the deadline grows
// to four times their smoothed value, up to the liveness probe's grace
// (five timeouts, at least 250 ms, at most the dial timeout). A caller's
// earlier context deadline wins.
func WithTimeout(d time.Duration) Option {
	return func(c *config) error { return clientcore.Positive(&c.timeout, d, "timeout", ErrInvalidOption) }
}

// WithDialTimeout bounds connecting to Redis (default DefaultDialTimeout).
func WithDialTimeout(d time.Duration) Option {
	return func(c *config) error { return clientcore.Positive(&c.dialTimeout, d, "dial timeout", ErrInvalidOption) }
}

// WithFailurePolicy sets what happens when Redis cannot decide (default
// FailLocal).
func WithFailurePolicy(f FailurePolicy) Option {
	return func(c *config) error { return clientcore.SetPolicy(&c.failure, f, ErrInvalidOption) }
}

// WithBreaker sets the circuit breaker: it opens after threshold
// consecutive store failures (errors and lost connections; a timed-out
// call counts only if the node then fails its liveness probe, which opens
// the breaker at once), after which requests go straight to the failure
// policy; after cooldown one probe request goes to Redis, and its
// success closes the breaker. threshold 0 disables the breaker.
func WithBreaker(threshold int, cooldown time.Duration) Option {
	return func(c *config) error {
		return clientcore.SetBreaker(&c.threshold, &c.cooldown, threshold, cooldown, ErrInvalidOption)
	}
}

// WithRefusalCache bounds the local refusal cache to about size keys per
// limiter (default DefaultRefusalCacheSize); 0 turns it off.
func WithRefusalCache(size int) Option {
	return func(c *config) error {
		return clientcore.AtLeast(&c.cacheSize, size, 0, "refusal cache size", ErrInvalidOption)
	}
}

// WithLogger sets where breaker transitions are logged (default
// slog.Default()).
func WithLogger(l *slog.Logger) Option {
	return func(c *config) error { return clientcore.NonZero(&c.logger, l, "nil logger", ErrInvalidOption) }
}

// WithEvictionAllowed lets Open accept a server whose maxmemory-policy
// may evict the limiter's keys (anything but noeviction; the keys have
// TTLs, so volatile-* policies evict them too). An evicted key is a
// forgotten limit: its client is admitted again. Open then logs a warning,
// and the store counts the evictions it sees
// (slidegate_redis_evicted_keys_total). Without this option Open fails
// with ErrEvictionPolicy on such a server.
func WithEvictionAllowed() Option {
	return func(c *config) error { c.allowEviction = true; return nil }
}

// WithHealthInterval sets how often the store re-reads a cluster's slot
// map and checks every master for restarts and evictions (default
// DefaultHealthInterval); a failed call also triggers an early slot-map
// read, at most one per 100 ms.
func WithHealthInterval(d time.Duration) Option {
	return func(c *config) error {
		return clientcore.Positive(&c.healthInterval, d, "health interval", ErrInvalidOption)
	}
}

// WithFallbackHook calls f for every decision the failure policy makes,
// with the client key and why Redis did not decide (ErrBreakerOpen, a
// timeout, a connection error...), and for every request refused because
// Redis answered too late (a cause wrapping ErrSlow). f runs on the deciding goroutine and
// must be fast and safe for concurrent use.
func WithFallbackHook(f func(key string, cause error)) Option {
	return func(c *config) error { return clientcore.SetHook(&c.onFallback, f, ErrInvalidOption) }
}

// WithCallHook sets a hook around every decision's script call to Redis
// (tracing; the refusal cache's answers and failure-policy decisions make
// none). h is called before the call with the call's context, the store's
// kind ("redis" or "redis-cluster"), the address of the master the call
// goes to, and the policy (a group's policies joined by commas). It
// returns the context to make the call with and a function the store
// calls after it with the outcome. It never sees a key. Nil, the default,
// costs nothing. A decision that waits for a call in flight and goes in
// a batch with others (batch.go) still has its own hook: its span covers
// the wait and the shared call, and its context does not reach the call.
func WithCallHook(h func(ctx context.Context, store, node, policy string) (context.Context, func(allowed bool, err error))) Option {
	return func(c *config) error { c.callHook = h; return nil }
}

// withConn makes the store use cn instead of dialing (tests compare
// clients through it).
func withConn(cn conn) Option {
	return func(c *config) error { c.conn = cn; return nil }
}

// WithTLSConfig sets the TLS configuration of a rediss:// store: RootCAs
// to trust, Certificates for mutual TLS, ServerName to expect (default:
// the host dialled). The store_options TLS keys (OptionsFromMap) refine a
// clone of it. Without it the system's
// roots verify the server (SSL_CERT_FILE and SSL_CERT_DIR are honoured).
func WithTLSConfig(tc *tls.Config) Option {
	return func(c *config) error { return clientcore.NonZero(&c.tls.base, tc, "nil TLS config", ErrInvalidOption) }
}

// withTLSCAFile (store_options tls_ca_file) makes a rediss:// store trust the certificates of the PEM
// file at path instead of the system's roots.
func withTLSCAFile(path string) Option {
	return func(c *config) error {
		return clientcore.NonZero(&c.tls.caFile, path, "empty TLS CA file name", ErrInvalidOption)
	}
}

// withTLSClientCert (tls_cert_file, tls_key_file) makes a rediss:// store present the certificate and
// key of the PEM files certFile and keyFile (mutual TLS, tls-auth-clients
// on the server).
func withTLSClientCert(certFile, keyFile string) Option {
	return func(c *config) error {
		if certFile == "" || keyFile == "" {
			return fmt.Errorf("%w: a TLS client certificate needs both its certificate and its key file", ErrInvalidOption)
		}
		c.tls.certFile, c.tls.keyFile = certFile, keyFile
		return nil
	}
}

// withTLSServerName (tls_server_name) sets the name a rediss:// store expects in the
// servers' certificates (default: the host it dials).
func withTLSServerName(name string) Option {
	return func(c *config) error {
		return clientcore.NonZero(&c.tls.serverName, name, "empty TLS server name", ErrInvalidOption)
	}
}

// WithSentinelAuth sets the credentials of the sentinels of a
// redis-sentinel:// store (the URL's credentials are the master's); an
// empty user is the default user.
func WithSentinelAuth(user, password string) Option {
	return func(c *config) error {
		if password == "" {
			return fmt.Errorf("%w: empty sentinel password", ErrInvalidOption)
		}
		c.sentinelUser, c.sentinelPass = user, password
		return nil
	}
}
