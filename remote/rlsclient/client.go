// Package rlsclient asks an Envoy rate limit service (RLS v3) for
// decisions over gRPC: slidegate's own (slidegate envoy serve) or
// envoyproxy/ratelimit. It is remote's gRPC counterpart, in a package of
// its own so that remote's HTTP users do not compile gRPC.
//
// Dial makes a Client that sends a domain and descriptors, as Envoy does,
// over one gRPC connection, with a timeout per call (WithTimeout, default
// remote.DefaultTimeout), optional TLS or mutual TLS (WithTLS), and the
// failure policies remote.FailOpen (the default, as Envoy's) and
// remote.FailClosed (its error wraps remote.ErrUnavailable). The server's
// descriptor rules decide; the client knows none of them, so
// remote.FailLocal is not offered.
//
// A Client is not an engine.Backend. An RLS answer carries no decision
// instant, and it gives an allowed request no RetryAfter, only a duration
// until reset from an unknown instant. An engine.Decision built from it
// could not be replayed or compared exactly.
package rlsclient

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"math"
	"sync/atomic"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/slidegate/slidegate/internal/clientcore"
	"github.com/slidegate/slidegate/remote"
)

// Entry is one key and value of a rate limit descriptor, as Envoy sends it.
type Entry struct{ Key, Value string }

// Descriptor is one rate limit descriptor: its entries, in order.
type Descriptor struct{ Entries []Entry }

// DescriptorStatus is the server's answer for one descriptor.
type DescriptorStatus struct {
	// OverLimit is true when this descriptor refused the request.
	OverLimit bool
	// Name is the rule's name, if it has one.
	Name string
	// Limit and Window are the matching rule's limit; Limit is 0 when no
	// rule limits the descriptor.
	Limit  uint32
	Window time.Duration
	// Remaining is what the rule still allows in its window.
	Remaining uint32
	// Reset is the server's duration until reset: for a refused
	// descriptor, how long until the request would fit.
	Reset time.Duration
}

// Decision is the answer to one ShouldRateLimit call. The client
// trusts it no further than it can check: Allowed is false when the
// overall code or any status says over limit, statuses beyond the
// descriptors sent are dropped (missing ones are zero), and each status is
// clamped (Remaining to Limit, Reset to 0..2×Window, a refusal's Reset
// never 0 when the window is known).
type Decision struct {
	// Allowed is false when any descriptor is over its limit.
	Allowed bool
	// Statuses has one entry per descriptor sent, in order; it is empty
	// when the failure policy decided.
	Statuses []DescriptorStatus
	// Fallback is true when the failure policy decided, not the server.
	Fallback bool
}

type config struct {
	timeout time.Duration
	failure remote.FailurePolicy
	tls     *tls.Config
	dial    []grpc.DialOption
}

// Option configures an Client.
type Option func(*config) error

// WithTimeout sets the deadline of each call (default remote.DefaultTimeout).
// A caller's earlier context deadline wins.
func WithTimeout(d time.Duration) Option {
	return func(c *config) error { return clientcore.Positive(&c.timeout, d, "timeout", remote.ErrInvalidOption) }
}

// WithFailurePolicy sets what a call answers when the server cannot
// decide: remote.FailOpen (the default, as Envoy's failure_mode_deny false)
// allows, remote.FailClosed refuses and returns an error wrapping
// remote.ErrUnavailable. remote.FailLocal is invalid here: the client does not know the
// server's rules.
func WithFailurePolicy(f remote.FailurePolicy) Option {
	return func(c *config) error {
		if f != remote.FailOpen && f != remote.FailClosed {
			return fmt.Errorf("%w: failure policy %v: the RLS client takes open or closed", remote.ErrInvalidOption, f)
		}
		c.failure = f
		return nil
	}
}

// WithTLS connects with TLS using cfg (its Certificates for mutual
// TLS); the default is plaintext, as slidegate serve --grpc without
// certificates. The client keeps cfg; do not change it afterwards.
func WithTLS(cfg *tls.Config) Option {
	return func(c *config) error {
		return clientcore.NonZero(&c.tls, cfg, "nil TLS configuration", remote.ErrInvalidOption)
	}
}

// WithDialOptions adds gRPC dial options (after the client's own).
func WithDialOptions(opts ...grpc.DialOption) Option {
	return func(c *config) error { c.dial = append(c.dial, opts...); return nil }
}

// Client calls Envoy's rate limit service (v3) of a slidegate serve
// --grpc or slidegate envoy serve over one gRPC connection. Make it with
// Dial; it is safe for concurrent use.
type Client struct {
	cfg    config
	target string
	conn   *grpc.ClientConn
	rls    rlsv3.RateLimitServiceClient
	closed atomic.Bool
}

// Dial returns a client for the rate limit service at target (a gRPC
// target such as "host:port"). It does not connect: the first call does.
func Dial(target string, opts ...Option) (*Client, error) {
	cfg := config{timeout: remote.DefaultTimeout, failure: remote.FailOpen}
	if err := clientcore.Apply(&cfg, opts); err != nil {
		return nil, err
	}
	if target == "" {
		return nil, fmt.Errorf("%w: empty RLS target", remote.ErrInvalidOption)
	}
	creds := insecure.NewCredentials()
	if cfg.tls != nil {
		creds = credentials.NewTLS(cfg.tls)
	}
	conn, err := grpc.NewClient(target, append([]grpc.DialOption{grpc.WithTransportCredentials(creds)}, cfg.dial...)...)
	if err != nil {
		return nil, fmt.Errorf("%w: RLS target %q: %w", remote.ErrInvalidOption, target, err)
	}
	return &Client{cfg: cfg, target: target, conn: conn, rls: rlsv3.NewRateLimitServiceClient(conn)}, nil
}

// Close closes the connection; calls after Close fail with remote.ErrClosed.
func (c *Client) Close() error {
	if c.closed.Swap(true) {
		return nil
	}
	return c.conn.Close()
}

// ShouldRateLimit asks whether a request described by descriptors in
// domain may pass, charging hits (0 means 1, as in Envoy). When the server
// cannot decide (unreachable, slower than the timeout, an Unavailable or
// Internal answer), the failure policy does and Fallback is set; under
// remote.FailClosed the error wraps remote.ErrUnavailable and says so. An
// InvalidArgument answer is an error wrapping remote.ErrRejected; a caller's
// cancelled context returns its error.
func (c *Client) ShouldRateLimit(ctx context.Context, domain string, descriptors []Descriptor, hits uint32) (Decision, error) {
	if c.closed.Load() {
		return Decision{}, remote.ErrClosed
	}
	req := &rlsv3.RateLimitRequest{Domain: domain, HitsAddend: hits, Descriptors: make([]*ratelimitv3.RateLimitDescriptor, len(descriptors))}
	for i, d := range descriptors {
		pd := &ratelimitv3.RateLimitDescriptor{Entries: make([]*ratelimitv3.RateLimitDescriptor_Entry, len(d.Entries))}
		for j, e := range d.Entries {
			pd.Entries[j] = &ratelimitv3.RateLimitDescriptor_Entry{Key: e.Key, Value: e.Value}
		}
		req.Descriptors[i] = pd
	}
	cctx, cancel := context.WithTimeout(ctx, c.cfg.timeout)
	defer cancel()
	resp, err := c.rls.ShouldRateLimit(cctx, req)
	if err != nil {
		if ctx.Err() != nil {
			return Decision{}, ctx.Err()
		}
		switch status.Code(err) {
		case codes.InvalidArgument, codes.FailedPrecondition, codes.OutOfRange:
			return Decision{}, fmt.Errorf("%w: %s: %s", remote.ErrRejected, c.target, status.Convert(err).Message())
		}
		if c.closed.Load() {
			return Decision{}, remote.ErrClosed
		}
		return c.fail(c.unavailable(err))
	}
	if resp.GetOverallCode() == rlsv3.RateLimitResponse_UNKNOWN {
		return c.fail(c.unavailable(errors.New("answer without an overall code")))
	}
	out := Decision{Allowed: resp.GetOverallCode() != rlsv3.RateLimitResponse_OVER_LIMIT,
		Statuses: make([]DescriptorStatus, len(descriptors))}
	for i, st := range resp.GetStatuses() {
		if i == len(out.Statuses) {
			break // more statuses than descriptors: the extra ones answer nothing sent
		}
		ds := DescriptorStatus{OverLimit: st.GetCode() == rlsv3.RateLimitResponse_OVER_LIMIT,
			Remaining: st.GetLimitRemaining(), Reset: st.GetDurationUntilReset().AsDuration()}
		if cl := st.GetCurrentLimit(); cl != nil {
			ds.Name, ds.Limit = cl.GetName(), cl.GetRequestsPerUnit()
			mult := int64(1)
			if m := cl.GetUnitMultiplier(); m != nil {
				mult = int64(m.GetValue())
			}
			ds.Window = window(unitDuration[cl.GetUnit()], mult)
		}
		out.Statuses[i] = ds.clamped()
		if ds.OverLimit {
			out.Allowed = false // the stricter of the overall code and the statuses
		}
	}
	return out, nil
}

// window is unit × mult, saturated at the longest time.Duration.
func window(unit time.Duration, mult int64) time.Duration {
	if unit > 0 && mult > int64(math.MaxInt64/unit) {
		return math.MaxInt64
	}
	return unit * time.Duration(mult)
}

// clamped returns ds within what the client can check, since a server is
// trusted no further: Remaining at most Limit (0 when over the limit), and
// Reset within 0..2×Window when the window is known (the longest a sliding
// window counter's refusal lasts). A refused descriptor whose Reset is 0
// or less waits the whole window, never 0.
func (ds DescriptorStatus) clamped() DescriptorStatus {
	if ds.OverLimit {
		ds.Remaining = 0
	} else if ds.Limit > 0 && ds.Remaining > ds.Limit {
		ds.Remaining = ds.Limit
	}
	ds.Reset = max(ds.Reset, 0)
	if ds.Window > 0 {
		bound := ds.Window
		if bound <= math.MaxInt64/2 {
			bound *= 2
		}
		ds.Reset = min(ds.Reset, bound)
		if ds.OverLimit && ds.Reset == 0 {
			ds.Reset = ds.Window
		}
	}
	return ds
}

// unitDuration is a rate limit unit's length; months and years have none.
var unitDuration = map[rlsv3.RateLimitResponse_RateLimit_Unit]time.Duration{
	rlsv3.RateLimitResponse_RateLimit_SECOND: time.Second,
	rlsv3.RateLimitResponse_RateLimit_MINUTE: time.Minute,
	rlsv3.RateLimitResponse_RateLimit_HOUR:   time.Hour,
	rlsv3.RateLimitResponse_RateLimit_DAY:    24 * time.Hour,
	rlsv3.RateLimitResponse_RateLimit_WEEK:   7 * 24 * time.Hour,
}

// fail decides by the failure policy; cause is why the server did not.
func (c *Client) fail(cause error) (Decision, error) {
	if c.cfg.failure == remote.FailClosed {
		return Decision{Fallback: true}, fmt.Errorf("%w (failure policy closed): %w", remote.ErrUnavailable, cause)
	}
	return Decision{Allowed: true, Fallback: true}, nil
}

// unavailable is why the server did not decide: it says which server
// and what happened, never the request's descriptors.
func (c *Client) unavailable(cause error) error {
	return &clientcore.Unavailable{Backend: "rate limit service", Server: c.target, Cause: cause}
}
