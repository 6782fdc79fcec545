package grpclimit

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/slidegate/slidegate/engine"
	"github.com/slidegate/slidegate/httplimit"
	"github.com/slidegate/slidegate/internal/clientcore"
	"github.com/slidegate/slidegate/internal/headerfmt"
	"github.com/slidegate/slidegate/internal/httpkit"
)

// ErrNoKey is wrapped by the errors of key functions that cannot derive a
// key from a call; such a call is answered InvalidArgument and charges
// nothing.
var ErrNoKey = errors.New("grpclimit: no rate-limit key")

// ErrInvalidOption is wrapped by the errors of New.
var ErrInvalidOption = errors.New("grpclimit: invalid option")

// maxKeyLen bounds keys taken from metadata: the bound on HTTP keys
// (httplimit.MaxKeyLen).
const maxKeyLen = httplimit.MaxKeyLen

// Metadata keys of decided calls. gRPC metadata keys are lower case; the
// values are those of the HTTP headers of the same names (see httplimit).
const (
	mdRateLimit       = "ratelimit"
	mdRateLimitPolicy = "ratelimit-policy"
	mdRetryAfter      = "retry-after"
)

// KeyFunc derives the rate-limit key of a call; fullMethod is
// "/package.Service/Method". Its error's message is sent to the client
// (with codes.InvalidArgument), so it should say what the call lacks and
// nothing internal.
type KeyFunc func(ctx context.Context, fullMethod string) (string, error)

// PeerKey keys calls by the client's IP address: the peer's, or, when the
// peer is one of ip.TrustedProxies, the client named by the one metadata
// key ip.Header names (lower-cased; x-forwarded-for by default), read as
// httplimit.ClientIP reads that HTTP header (from the right, skipping
// trusted proxies; "forwarded" is parsed as RFC 7239). Metadata from an
// untrusted peer is never read, and no other forwarding key is believed.
// IPv6 clients are grouped by ip.IPv6Prefix (/64 by default).
func PeerKey(ip httplimit.ClientIP) KeyFunc {
	name := ip.Header
	if name == "" {
		name = httpkit.DefaultClientIPHeader
	}
	mdKey, hdrKey := strings.ToLower(name), http.CanonicalHeaderKey(name)
	return func(ctx context.Context, _ string) (string, error) {
		p, ok := peer.FromContext(ctx)
		if !ok || p.Addr == nil {
			return "", fmt.Errorf("%w: the call has no peer address", ErrNoKey)
		}
		r := &http.Request{RemoteAddr: p.Addr.String(), Header: http.Header{}}
		if md, ok := metadata.FromIncomingContext(ctx); ok {
			if v := md.Get(mdKey); len(v) > 0 {
				r.Header[hdrKey] = v
			}
		}
		k, err := ip.Key(r)
		if err != nil {
			// httplimit's message names the trusted proxy, an internal
			// address: the client is told less.
			return "", fmt.Errorf("%w: the forwarding metadata names no client address", ErrNoKey)
		}
		return k, nil
	}
}

// MetadataKey keys calls by the first value of a metadata key, such as an
// API key. A call without it, or with an empty value or one longer than
// httplimit.MaxKeyLen bytes, has no key.
func MetadataKey(name string) KeyFunc {
	name = strings.ToLower(name)
	return func(ctx context.Context, _ string) (string, error) {
		md, _ := metadata.FromIncomingContext(ctx)
		v := md.Get(name)
		switch {
		case len(v) == 0 || strings.TrimSpace(v[0]) == "":
			return "", fmt.Errorf("%w: missing metadata %s", ErrNoKey, name)
		case len(v[0]) > maxKeyLen:
			return "", fmt.Errorf("%w: metadata %s is longer than %d bytes", ErrNoKey, name, maxKeyLen)
		}
		return v[0], nil
	}
}

// MethodKey returns f's key prefixed by the method, so that each method has
// its own limit per client.
func MethodKey(f KeyFunc) KeyFunc {
	return func(ctx context.Context, method string) (string, error) {
		k, err := f(ctx, method)
		if err != nil {
			return "", err
		}
		return method + " " + k, nil
	}
}

// Option configures a Limiter.
type Option func(*config) error

type config struct {
	backend engine.Backend
	key     KeyFunc
	cost    func(ctx context.Context, fullMethod string) (int, error)
	exempt  func(fullMethod string) bool
	shadow  bool
	headers bool
	observe func(Event)
}

// WithBackend sets the limiter's backend (required): an *engine.Limiter,
// or any engine.Backend, such as the Redis one.
func WithBackend(b engine.Backend) Option {
	return func(c *config) error { return clientcore.NonZero(&c.backend, b, "nil backend", ErrInvalidOption) }
}

// WithKeyFunc sets how calls are keyed; the default is PeerKey with no
// trusted proxies.
func WithKeyFunc(f KeyFunc) Option {
	return func(c *config) error {
		if f == nil {
			return fmt.Errorf("%w: nil key function", ErrInvalidOption)
		}
		c.key = f
		return nil
	}
}

// WithCostFunc sets the cost of a call (default 1). A cost outside 1..the
// policy's limit is answered InvalidArgument.
func WithCostFunc(f func(ctx context.Context, fullMethod string) (int, error)) Option {
	return func(c *config) error { c.cost = f; return nil }
}

// WithExempt exempts the methods f reports true for (health checks, say)
// from the limit.
func WithExempt(f func(fullMethod string) bool) Option {
	return func(c *config) error { c.exempt = f; return nil }
}

// WithShadow decides and counts every call but lets refused ones through
// (their metadata still shows the limit): a way to watch a new limit
// before enforcing it.
func WithShadow(on bool) Option { return func(c *config) error { c.shadow = on; return nil } }

// WithHeaders sends the RateLimit and RateLimit-Policy metadata on allowed
// calls too (default true); refusals always carry them.
func WithHeaders(on bool) Option { return func(c *config) error { c.headers = on; return nil } }

// Event reports one decision to an observer (WithObserver): tracing,
// metrics. It holds no key.
type Event struct {
	// Ctx is the call's context (with the caller's trace, if any).
	Ctx        context.Context
	FullMethod string
	Policy     string
	Cost       int
	Decision   engine.Decision
	// Latency is how long the backend took to decide.
	Latency time.Duration
	// Err is the backend's error, if it failed to decide.
	Err error
}

// WithObserver calls f after every decision the backend made or failed
// to make, on the call's goroutine; f must be safe for concurrent use.
// With an observer the limiter also times each decision (two clock
// reads); without one it does neither.
func WithObserver(f func(Event)) Option {
	return func(c *config) error { c.observe = f; return nil }
}

// Limiter rate-limits the calls of a grpc-go server through its
// interceptors. Every call (a stream counts once, when it opens) is keyed,
// decided by the backend, and either passed to the handler or ended with
// codes.ResourceExhausted, a google.rpc.RetryInfo detail and the trailers
// retry-after (seconds, rounded up: waiting that long always suffices),
// ratelimit and ratelimit-policy. A call without a key ends with
// InvalidArgument, a backend failure with Unavailable (fail closed); no
// failure detail reaches the client.
//
// A Limiter is safe for concurrent use. It does not own the backend.
type Limiter struct {
	c      config
	policy string // "name";q=L;w=W
	prefix string // "name";r=
}

// New returns a limiter; WithBackend is required.
func New(opts ...Option) (*Limiter, error) {
	c := config{key: PeerKey(httplimit.ClientIP{}), headers: true}
	for _, o := range opts {
		if err := o(&c); err != nil {
			return nil, err
		}
	}
	if c.backend == nil {
		return nil, fmt.Errorf("%w: WithBackend is required", ErrInvalidOption)
	}
	p := c.backend.Policy()
	name := p.Name
	if name == "" {
		name = "default"
	}
	q := headerfmt.SFString(name)
	return &Limiter{c: c,
		policy: q + ";q=" + strconv.Itoa(p.Limit) + ";w=" + strconv.FormatInt(headerfmt.CeilSeconds(p.Window), 10),
		prefix: q + ";r=",
	}, nil
}

// decide decides one call; md is the metadata to send (header when
// allowed, trailer with the error when refused).
func (l *Limiter) decide(ctx context.Context, method string) (md metadata.MD, err error) {
	if l.c.exempt != nil && l.c.exempt(method) {
		return nil, nil
	}
	key, err := l.c.key(ctx, method)
	if err != nil {
		return nil, status.Error(codes.InvalidArgument, err.Error())
	}
	n := 1
	if l.c.cost != nil {
		if n, err = l.c.cost(ctx, method); err != nil {
			return nil, status.Errorf(codes.InvalidArgument, "grpclimit: cost: %v", err)
		}
	}
	var start time.Time
	if l.c.observe != nil {
		start = time.Now()
	}
	d, err := l.c.backend.Decide(ctx, key, n)
	if l.c.observe != nil {
		l.c.observe(Event{Ctx: ctx, FullMethod: method, Policy: l.c.backend.Policy().Name, Cost: n, Decision: d, Latency: time.Since(start), Err: err})
	}
	if err != nil {
		if errors.Is(err, engine.ErrInvalidCost) {
			return nil, status.Errorf(codes.InvalidArgument, "grpclimit: cost %d is outside 1..%d", n, l.c.backend.Policy().Limit)
		}
		if ctx.Err() != nil {
			return nil, status.FromContextError(ctx.Err()).Err()
		}
		return nil, status.Error(codes.Unavailable, "grpclimit: the rate limiter is unavailable")
	}
	if d.Allowed || l.c.shadow {
		if !l.c.headers {
			return nil, nil
		}
		return l.md(d, false), nil
	}
	st := status.Newf(codes.ResourceExhausted, "grpclimit: rate limit exceeded; retry in %ds", headerfmt.CeilSeconds(d.RetryAfter))
	if withInfo, err := st.WithDetails(&errdetails.RetryInfo{RetryDelay: durationpb.New(d.RetryAfter)}); err == nil {
		st = withInfo
	}
	return l.md(d, true), st.Err()
}

func (l *Limiter) md(d engine.Decision, refused bool) metadata.MD {
	md := metadata.MD{
		mdRateLimitPolicy: {l.policy},
		mdRateLimit:       {l.prefix + strconv.Itoa(d.Remaining) + ";t=" + strconv.FormatInt(headerfmt.CeilSeconds(d.Reset), 10)},
	}
	if refused {
		md[mdRetryAfter] = []string{strconv.FormatInt(headerfmt.CeilSeconds(d.RetryAfter), 10)}
	}
	return md
}

// UnaryServerInterceptor returns the interceptor for unary calls.
func (l *Limiter) UnaryServerInterceptor() grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		md, err := l.decide(ctx, info.FullMethod)
		if err != nil {
			if md != nil {
				_ = grpc.SetTrailer(ctx, md)
			}
			return nil, err
		}
		if md != nil {
			_ = grpc.SetHeader(ctx, md)
		}
		return handler(ctx, req)
	}
}

// StreamServerInterceptor returns the interceptor for streams, decided
// once when they open.
func (l *Limiter) StreamServerInterceptor() grpc.StreamServerInterceptor {
	return func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
		md, err := l.decide(ss.Context(), info.FullMethod)
		if err != nil {
			if md != nil {
				ss.SetTrailer(md)
			}
			return err
		}
		if md != nil {
			_ = ss.SetHeader(md)
		}
		return handler(srv, ss)
	}
}
