package httplimit

import (
	"context"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/slidegate/slidegate/engine"
	"github.com/slidegate/slidegate/internal/clientcore"
)

// Waiter is what a Transport paces requests with: *engine.Limiter waits in
// one process; redisstore's store waits for a whole fleet.
type Waiter interface {
	WaitN(ctx context.Context, key string, n int) error
}

var _ Waiter = (*engine.Limiter)(nil)

// Defaults of a Transport.
const (
	// defaultMargin is added to the remote's window by NewPacedTransport:
	// the instants the remote sees differ from the
	// admitted ones by each request's delay (connection, queueing, the
	// network), and a margin above the spread of that delay keeps every
	// window of the remote's clock at its limit. It costs margin/(W+margin)
	// of the rate: 0.17 % at one minute.
	defaultMargin = 100 * time.Millisecond
	// defaultMaxPause bounds how long a remote's Retry-After or RateLimit
	// reset can pause a key: a remote that asks for more is obeyed this
	// long, then tried again.
	defaultMaxPause = 10 * time.Minute
	// defaultPause is the pause after a 429 that names no instant.
	defaultPause = time.Second
)

// Transport is an http.RoundTripper that paces outgoing requests so that a
// remote API's limit is never exceeded: before each request it waits on a
// Waiter (keyed by the request's host, or by a key function), and it obeys
// what the remote says: a 429, or a 503 with Retry-After, or a response
// whose RateLimit or X-RateLimit headers say no quota remains, pauses the
// key until the instant given (at most MaxPause), counted in Stats.Paused.
// Responses pass through unchanged: the transport does not retry.
//
// The wait uses the request's context: a request whose context ends while
// it waits returns the context's error and leaves its slot to the next.
// A Transport is safe for concurrent use.
type Transport struct {
	base     http.RoundTripper
	waiter   Waiter
	key      func(*http.Request) string
	maxPause time.Duration
	owned    interface{ Close() error }

	pauses sync.Map // key → time.Time: no request before it

	waited, paused, remote429, waitErrs atomic.Int64
}

// TransportStats counts what a Transport did.
type TransportStats struct {
	Waited    int64 // requests admitted by the Waiter and sent
	WaitErrs  int64 // requests that were not sent: their wait failed (a context ended, a store failed)
	Paused    int64 // responses that paused their key (429, Retry-After, RateLimit quota spent)
	Remote429 int64 // responses with status 429
}

// Stats returns the transport's counters.
func (t *Transport) Stats() TransportStats {
	return TransportStats{Waited: t.waited.Load(), WaitErrs: t.waitErrs.Load(), Paused: t.paused.Load(), Remote429: t.remote429.Load()}
}

// TransportOption configures a Transport.
type TransportOption func(*transportConfig) error

type transportConfig struct {
	base     http.RoundTripper
	key      func(*http.Request) string
	maxPause time.Duration
	margin   time.Duration
}

// WithBase sets the RoundTripper that sends the requests; the default is
// http.DefaultTransport.
func WithBase(rt http.RoundTripper) TransportOption {
	return func(c *transportConfig) error {
		if rt == nil {
			return fmt.Errorf("httplimit: nil base RoundTripper")
		}
		c.base = rt
		return nil
	}
}

// WithRequestKey sets the function that names a request's key; the
// default is its URL's host (host:port when a port is given).
func WithRequestKey(f func(*http.Request) string) TransportOption {
	return func(c *transportConfig) error {
		if f == nil {
			return fmt.Errorf("httplimit: nil request key function")
		}
		c.key = f
		return nil
	}
}

// WithMaxPause bounds a remote-requested pause (> 0; default 10 minutes).
func WithMaxPause(d time.Duration) TransportOption {
	return func(c *transportConfig) error {
		if d <= 0 {
			return fmt.Errorf("httplimit: max pause %v must be positive", d)
		}
		c.maxPause = d
		return nil
	}
}

// WithMargin sets the margin NewPacedTransport adds to the window (≥ 0;
// default 100 ms).
func WithMargin(d time.Duration) TransportOption {
	return func(c *transportConfig) error {
		if d < 0 {
			return fmt.Errorf("httplimit: margin %v is negative", d)
		}
		c.margin = d
		return nil
	}
}

func newTransportConfig(opts []TransportOption) (transportConfig, error) {
	c := transportConfig{base: http.DefaultTransport, key: hostKey, maxPause: defaultMaxPause, margin: defaultMargin}
	if err := clientcore.Apply(&c, opts); err != nil {
		return transportConfig{}, err
	}
	return c, nil
}

func hostKey(r *http.Request) string { return r.URL.Host }

// NewTransport returns a Transport that waits on w before each request.
// w's policy should be the remote's with a margin added to its window
// (100 ms, as NewPacedTransport adds): a Waiter shared by a fleet
// (redisstore) enforces that policy.
func NewTransport(w Waiter, opts ...TransportOption) (*Transport, error) {
	if w == nil {
		return nil, fmt.Errorf("httplimit: nil Waiter")
	}
	c, err := newTransportConfig(opts)
	if err != nil {
		return nil, err
	}
	return &Transport{base: c.base, waiter: w, key: c.key, maxPause: c.maxPause}, nil
}

// NewPacedTransport returns a Transport that paces requests in this
// process with an in-memory limiter of the remote's policy p plus the
// margin (WithMargin, default 100 ms). Close releases the limiter. For a
// limiter with engine options (a clock, a key cap), make it with engine.New
// and pass it to NewTransport.
func NewPacedTransport(p engine.Policy, opts ...TransportOption) (*Transport, error) {
	c, err := newTransportConfig(opts)
	if err != nil {
		return nil, err
	}
	p.Window += c.margin
	lim, err := engine.New(p)
	if err != nil {
		return nil, err
	}
	return &Transport{base: c.base, waiter: lim, key: c.key, maxPause: c.maxPause, owned: lim}, nil
}

// Close releases the limiter NewPacedTransport made; it does not close
// the base RoundTripper or a Waiter passed to NewTransport.
func (t *Transport) Close() error {
	if t.owned != nil {
		return t.owned.Close()
	}
	return nil
}

// RoundTrip waits for the request's key to be paused no longer and for the
// Waiter to admit it, then sends it with the base RoundTripper.
func (t *Transport) RoundTrip(req *http.Request) (*http.Response, error) {
	key := t.key(req)
	ctx := req.Context()
	if err := t.waitPause(ctx, key); err != nil {
		t.waitErrs.Add(1)
		closeBody(req)
		return nil, err
	}
	if err := t.waiter.WaitN(ctx, key, 1); err != nil {
		t.waitErrs.Add(1)
		closeBody(req)
		return nil, fmt.Errorf("httplimit: pacing %s: %w", key, err)
	}
	t.waited.Add(1)
	resp, err := t.base.RoundTrip(req)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode == http.StatusTooManyRequests {
		t.remote429.Add(1)
	}
	if d, ok := remotePause(resp, time.Now()); ok {
		t.pause(key, min(d, t.maxPause))
	}
	return resp, nil
}

// closeBody closes a request body the transport will not send, as a
// RoundTripper must.
func closeBody(req *http.Request) {
	if req.Body != nil {
		_ = req.Body.Close()
	}
}

// pause holds key's requests back for d.
func (t *Transport) pause(key string, d time.Duration) {
	t.paused.Add(1)
	until := time.Now().Add(d)
	for {
		old, loaded := t.pauses.LoadOrStore(key, until)
		if !loaded || !old.(time.Time).Before(until) || t.pauses.CompareAndSwap(key, old, until) {
			return
		}
	}
}

// waitPause sleeps while key is paused.
func (t *Transport) waitPause(ctx context.Context, key string) error {
	v, ok := t.pauses.Load(key)
	if !ok {
		return nil
	}
	d := time.Until(v.(time.Time))
	if d <= 0 {
		t.pauses.CompareAndDelete(key, v)
		return nil
	}
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-timer.C:
		return nil
	}
}

// remotePause returns how long the remote asks its client to hold off, as
// of now: Retry-After on a 429 or 503; otherwise, when the RateLimit or
// X-RateLimit headers say no quota remains, until their reset. A 429
// without any of them pauses one second.
func remotePause(resp *http.Response, now time.Time) (time.Duration, bool) {
	h := resp.Header
	limited := resp.StatusCode == http.StatusTooManyRequests || resp.StatusCode == http.StatusServiceUnavailable
	if limited {
		if d, ok := retryAfter(h.Get("Retry-After"), now); ok {
			return d, true
		}
	}
	if d, ok := rateLimitReset(h, now); ok {
		return d, true
	}
	if resp.StatusCode == http.StatusTooManyRequests {
		return defaultPause, true
	}
	return 0, false
}

// retryAfter parses Retry-After: delay seconds or an HTTP date.
func retryAfter(v string, now time.Time) (time.Duration, bool) {
	v = strings.TrimSpace(v)
	if v == "" {
		return 0, false
	}
	if s, err := strconv.ParseInt(v, 10, 64); err == nil {
		if s < 0 {
			return 0, false
		}
		return seconds(s), true
	}
	if t, err := http.ParseTime(v); err == nil {
		return max(0, t.Sub(now)), true
	}
	return 0, false
}

// seconds converts s seconds to a Duration, saturating instead of
// overflowing (the caller bounds it by MaxPause).
func seconds(s int64) time.Duration {
	if s > int64(defaultMaxPause/time.Second)*1000 {
		return time.Duration(1 << 62)
	}
	return time.Duration(s) * time.Second
}

// rateLimitReset returns the wait until the remote's quota resets when its
// headers say none remains: the IETF draft's RateLimit ("name";r=0;t=5,
// or the older remaining=0, reset=5), RateLimit-Remaining with
// RateLimit-Reset, or X-RateLimit-Remaining with X-RateLimit-Reset (epoch
// seconds, or a delay when it is small).
func rateLimitReset(h http.Header, now time.Time) (time.Duration, bool) {
	if v := h.Get("RateLimit"); v != "" {
		r, rok := param(v, "r", "remaining")
		t, tok := param(v, "t", "reset")
		if rok && tok && r == 0 && t >= 0 {
			return seconds(t), true
		}
	}
	for _, p := range []string{"RateLimit-", "X-RateLimit-"} {
		rem, err1 := strconv.ParseInt(strings.TrimSpace(h.Get(p+"Remaining")), 10, 64)
		reset, err2 := strconv.ParseInt(strings.TrimSpace(h.Get(p+"Reset")), 10, 64)
		if err1 != nil || err2 != nil || rem != 0 || reset < 0 {
			continue
		}
		if reset > 1_000_000_000 { // an epoch instant, not a delay
			return max(0, time.Unix(reset, 0).Sub(now)), true
		}
		return seconds(reset), true
	}
	return 0, false
}

// param finds the integer parameter a (the draft's structured form, in
// its first policy's item: "name";r=0;t=5) or b (the older form:
// remaining=0, reset=5) in a RateLimit value.
func param(v string, a, b string) (int64, bool) {
	fields, want := strings.Split(v, ","), b
	if strings.Contains(v, ";") {
		fields, want = strings.Split(fields[0], ";"), a
	}
	for _, f := range fields {
		name, val, ok := strings.Cut(strings.TrimSpace(f), "=")
		if !ok || strings.TrimSpace(name) != want {
			continue
		}
		n, err := strconv.ParseInt(strings.TrimSpace(val), 10, 64)
		return n, err == nil
	}
	return 0, false
}
