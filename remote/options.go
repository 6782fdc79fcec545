package remote

import (
	"errors"
	"net/http"
	"time"

	"github.com/slidegate/slidegate/internal/clientcore"
)

// Defaults. Each has an option to change it.
const (
	// DefaultTimeout bounds each decision's round trip, connecting
	// included. A decision on the same network is well under a
	// millisecond; the bound leaves room for a loaded server.
	DefaultTimeout = 100 * time.Millisecond
	// DefaultBreakerThreshold is how many consecutive failed calls open
	// the circuit breaker (redisstore's default); so do as many failed
	// calls of the last one to two seconds that are half of its calls or
	// more.
	DefaultBreakerThreshold = 5
	// DefaultBreakerCooldown is how long the breaker stays open before it
	// lets one probe through.
	DefaultBreakerCooldown = time.Second
)

// Errors returned by the package.
var (
	// ErrInvalidOption is wrapped by errors about options and policies.
	ErrInvalidOption = errors.New("remote: invalid option")
	// ErrUnavailable is wrapped by the error a decision returns under
	// FailClosed when the server could not decide.
	ErrUnavailable = errors.New("remote: slidegate server unavailable")
	// ErrRejected is wrapped by the error a decision returns when the
	// server refused the request itself (a 4xx other than 429): unknown
	// policy, a key the server does not accept. It is not a failure of
	// the server, so no failure policy applies.
	ErrRejected = errors.New("remote: request rejected by the server")
	// ErrPolicyMismatch is wrapped when the server's answer shows a limit
	// other than the policy the Limiter or Group was made with.
	ErrPolicyMismatch = errors.New("remote: server policy differs")
	// ErrClosed is returned by decisions after Close.
	ErrClosed = errors.New("remote: closed")
	// ErrBreakerOpen is the cause given to the failure policy while the
	// circuit breaker is open (see WithBreaker): decisions skip the server
	// until a probe succeeds.
	ErrBreakerOpen = errors.New("remote: circuit breaker open")
)

// FailurePolicy says what a decision does when the server cannot decide.
// The names and meanings are redisstore's (it is the same type); its
// String method returns "local", "open" or "closed", the configuration
// names.
type FailurePolicy = clientcore.Policy

const (
	// FailLocal decides with an in-memory engine limiter of the same
	// policy, the default: each client process then enforces the limit
	// alone while the server is away.
	FailLocal = clientcore.Local
	// FailOpen allows every request.
	FailOpen = clientcore.Open
	// FailClosed refuses every request, and returns an error wrapping
	// ErrUnavailable alongside the refusal.
	FailClosed = clientcore.Closed
)

// maxIdleConns is how many idle keep-alive connections the default
// transport keeps to the server for reuse.
const maxIdleConns = 64

type config struct {
	timeout    time.Duration
	idle       int
	failure    FailurePolicy
	retryAfter time.Duration
	prefix     string
	transport  http.RoundTripper
	onFallback func(key string, cause error)
	threshold  int
	cooldown   time.Duration
}

func defaultConfig() config {
	return config{timeout: DefaultTimeout, idle: maxIdleConns, failure: FailLocal, retryAfter: time.Second,
		threshold: DefaultBreakerThreshold, cooldown: DefaultBreakerCooldown}
}

// Option configures a Client.
type Option func(*config) error

// WithTimeout sets the deadline of each decision's round trip (default
// DefaultTimeout). A caller's earlier context deadline wins.
func WithTimeout(d time.Duration) Option {
	return func(c *config) error { return clientcore.Positive(&c.timeout, d, "timeout", ErrInvalidOption) }
}

// WithFailurePolicy sets what happens when the server cannot decide
// (default FailLocal).
func WithFailurePolicy(f FailurePolicy) Option {
	return func(c *config) error { return clientcore.SetPolicy(&c.failure, f, ErrInvalidOption) }
}

// WithClosedRetryAfter sets the RetryAfter of FailClosed's refusals
// (default one second).
func WithClosedRetryAfter(d time.Duration) Option {
	return func(c *config) error { return clientcore.Positive(&c.retryAfter, d, "retry-after", ErrInvalidOption) }
}

// WithBreaker sets the circuit breaker, redisstore's: it opens after
// threshold consecutive failed calls, or when at least threshold calls of
// the last one to two seconds failed and they were half of its calls or
// more. Decisions then go straight to the failure policy (cause
// ErrBreakerOpen) rather than each waiting out the timeout. After
// cooldown one probe goes to the server; its success closes the breaker.
// threshold 0 disables it. Defaults: DefaultBreakerThreshold,
// DefaultBreakerCooldown.
func WithBreaker(threshold int, cooldown time.Duration) Option {
	return func(c *config) error {
		return clientcore.SetBreaker(&c.threshold, &c.cooldown, threshold, cooldown, ErrInvalidOption)
	}
}

// WithKeyPrefix prepends p to every key sent, so that services sharing
// one server keep apart keys they name alike (default none).
func WithKeyPrefix(p string) Option {
	return func(c *config) error { c.prefix = p; return nil }
}

// WithTransport sets the HTTP transport (for TLS settings or a proxy);
// the default is a clone of http.DefaultTransport with
// 64 idle connections per host. The caller keeps ownership
// of a transport it passes.
func WithTransport(rt http.RoundTripper) Option {
	return func(c *config) error { return clientcore.NonZero(&c.transport, rt, "nil transport", ErrInvalidOption) }
}

// WithFallbackHook calls f for every decision the failure policy makes,
// with the client key and why the server did not decide. f runs on the
// deciding goroutine and must be fast and safe for concurrent use.
func WithFallbackHook(f func(key string, cause error)) Option {
	return func(c *config) error { return clientcore.SetHook(&c.onFallback, f, ErrInvalidOption) }
}
