package remote

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

// RLSDecision is the answer to one ShouldRateLimit call. The client
// trusts it no further than it can check: Allowed is false when the
// overall code or any status says over limit, statuses beyond the
// descriptors sent are dropped (missing ones are zero), and each status is
// clamped (Remaining to Limit, Reset to 0..2×Window, a refusal's Reset
// never 0 when the window is known).
type RLSDecision struct {
	// Allowed is false when any descriptor is over its limit.
	Allowed bool
	// Statuses has one entry per descriptor sent, in order; it is empty
	// when the failure policy decided.
	Statuses []DescriptorStatus
	// Fallback is true when the failure policy decided, not the server.
	Fallback bool
}

type rlsConfig struct {
	timeout time.Duration
	failure FailurePolicy
	tls     *tls.Config
	dial    []grpc.DialOption
}

// RLSOption configures an RLSClient.
type RLSOption func(*rlsConfig) error

// WithRLSTimeout sets the deadline of each call (default DefaultTimeout).
// A caller's earlier context deadline wins.
func WithRLSTimeout(d time.Duration) RLSOption {
	return func(c *rlsConfig) error {
		if d <= 0 {
			return fmt.Errorf("%w: timeout %v must be positive", ErrInvalidOption, d)
		}
		c.timeout = d
		return nil
	}
}

// WithRLSFailurePolicy sets what a call answers when the server cannot
// decide: FailOpen (the default, as Envoy's failure_mode_deny false)
// allows, FailClosed refuses and returns an error wrapping
// ErrUnavailable. FailLocal is invalid here: the client does not know the
// server's rules.
func WithRLSFailurePolicy(f FailurePolicy) RLSOption {
	return func(c *rlsConfig) error {
		if f != FailOpen && f != FailClosed {
			return fmt.Errorf("%w: failure policy %v: the RLS client takes open or closed", ErrInvalidOption, f)
		}
		c.failure = f
		return nil
	}
}

// WithRLSTLS connects with TLS using cfg (its Certificates for mutual
// TLS); the default is plaintext, as slidegate serve --grpc without
// certificates. The client keeps cfg; do not change it afterwards.
func WithRLSTLS(cfg *tls.Config) RLSOption {
	return func(c *rlsConfig) error {
		if cfg == nil {
			return fmt.Errorf("%w: nil TLS configuration", ErrInvalidOption)
		}
		c.tls = cfg
		return nil
	}
}

// WithRLSDialOptions adds gRPC dial options (after the client's own).
func WithRLSDialOptions(opts ...grpc.DialOption) RLSOption {
	return func(c *rlsConfig) error { c.dial = append(c.dial, opts...); return nil }
}

// RLSClient calls Envoy's rate limit service (v3) of a slidegate serve
// --grpc or slidegate envoy serve over one gRPC connection. Make it with
// DialRLS; it is safe for concurrent use.
type RLSClient struct {
	cfg    rlsConfig
	target string
	conn   *grpc.ClientConn
	rls    rlsv3.RateLimitServiceClient
	closed atomic.Bool
}

// DialRLS returns a client for the rate limit service at target (a gRPC
// target such as "host:port"). It does not connect: the first call does.
func DialRLS(target string, opts ...RLSOption) (*RLSClient, error) {
	cfg := rlsConfig{timeout: DefaultTimeout, failure: FailOpen}
	for _, o := range opts {
		if o == nil {
			continue
		}
		if err := o(&cfg); err != nil {
			return nil, err
		}
	}
	if target == "" {
		return nil, fmt.Errorf("%w: empty RLS target", ErrInvalidOption)
	}
	creds := insecure.NewCredentials()
	if cfg.tls != nil {
		creds = credentials.NewTLS(cfg.tls)
	}
	conn, err := grpc.NewClient(target, append([]grpc.DialOption{grpc.WithTransportCredentials(creds)}, cfg.dial...)...)
	if err != nil {
		return nil, fmt.Errorf("%w: RLS target %q: %w", ErrInvalidOption, target, err)
	}
	return &RLSClient{cfg: cfg, target: target, conn: conn, rls: rlsv3.NewRateLimitServiceClient(conn)}, nil
}

// Close closes the connection; calls after Close fail with ErrClosed.
func (c *RLSClient) Close() error {
	if c.closed.Swap(true) {
		return nil
	}
	return c.conn.Close()
}

// ShouldRateLimit asks whether a request described by descriptors in
// domain may pass, charging hits (0 means 1, as in Envoy). When the server
// cannot decide (unreachable, slower than the timeout, an Unavailable or
// Internal answer), the failure policy does and Fallback is set; under
// FailClosed the error wraps ErrUnavailable and says so. An
// InvalidArgument answer is an error wrapping ErrRejected; a caller's
// cancelled context returns its error.
func (c *RLSClient) ShouldRateLimit(ctx context.Context, domain string, descriptors []Descriptor, hits uint32) (RLSDecision, error) {
	if c.closed.Load() {
		return RLSDecision{}, ErrClosed
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
			return RLSDecision{}, ctx.Err()
		}
		switch status.Code(err) {
		case codes.InvalidArgument, codes.FailedPrecondition, codes.OutOfRange:
			return RLSDecision{}, fmt.Errorf("%w: %s: %s", ErrRejected, c.target, status.Convert(err).Message())
		}
		if c.closed.Load() {
			return RLSDecision{}, ErrClosed
		}
		return c.fail(&unavailableError{c.target, err})
	}
	if resp.GetOverallCode() == rlsv3.RateLimitResponse_UNKNOWN {
		return c.fail(&unavailableError{c.target, errors.New("answer without an overall code")})
	}
	out := RLSDecision{Allowed: resp.GetOverallCode() != rlsv3.RateLimitResponse_OVER_LIMIT,
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
func (c *RLSClient) fail(cause error) (RLSDecision, error) {
	if c.cfg.failure == FailClosed {
		return RLSDecision{Fallback: true}, fmt.Errorf("%w (failure policy closed): %w", ErrUnavailable, cause)
	}
	return RLSDecision{Allowed: true, Fallback: true}, nil
}
