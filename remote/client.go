package remote

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/slidegate/slidegate/engine"
	"github.com/slidegate/slidegate/internal/clientcore"
	"github.com/slidegate/slidegate/internal/httpkit"
)

// maxAnswer bounds how much of an answer is read: a decision's is under
// 400 bytes, a group's under 400 per limit.
const maxAnswer = 64 << 10

// Client is a connection pool to one slidegate serve's decision API. Make
// it with Dial; it is safe for concurrent use.
type Client struct {
	cfg      config
	allowURL string
	name     string // the base URL without user information, for errors
	hc       *http.Client
	own      *http.Transport // closed by Close; nil for a caller's transport
	br       *clientcore.Breaker

	// epoch is the local wall time at the server clock's instant 0, as
	// estimated from the first answer (Dial's time until then): WallTime
	// and the local fallback's clock count from it.
	epoch    atomic.Pointer[time.Time]
	anchored atomic.Bool

	mu     sync.Mutex
	locals []interface{ Close() error } // fallback limiters, stopped by Close
	done   chan struct{}                // closed by Close, under mu
}

// Dial returns a client for the slidegate serve at base (http:// or
// https://, host and port, the main listener). It does not connect: the
// first decision does.
func Dial(base string, opts ...Option) (*Client, error) {
	cfg := defaultConfig()
	if err := clientcore.Apply(&cfg, opts); err != nil {
		return nil, err
	}
	u, err := url.Parse(base)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("%w: server URL %q: want http://host:port or https://host:port", ErrInvalidOption, redactURL(base))
	}
	u.Path = strings.TrimSuffix(u.Path, "/") + "/v1/allow"
	u.RawQuery, u.Fragment = "", ""
	c := &Client{cfg: cfg, allowURL: u.String(), done: make(chan struct{})}
	c.br = clientcore.NewBreaker(cfg.threshold, cfg.cooldown, nil)
	shown := *u
	shown.User = nil
	shown.Path = strings.TrimSuffix(shown.Path, "/v1/allow")
	c.name = shown.String()
	rt := cfg.transport
	if rt == nil {
		tr := http.DefaultTransport.(*http.Transport).Clone()
		tr.MaxIdleConns = cfg.idle
		tr.MaxIdleConnsPerHost = cfg.idle
		c.own = tr
		rt = tr
	}
	c.hc = &http.Client{Transport: rt, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	now := time.Now()
	c.epoch.Store(&now)
	return c, nil
}

// redactURL drops user information from a URL for error messages.
func redactURL(s string) string {
	u, err := url.Parse(s)
	if err != nil || u.User == nil {
		if i := strings.Index(s, "@"); i >= 0 {
			return "…" + s[i:]
		}
		return s
	}
	u.User = nil
	return u.String()
}

// Close stops every Limiter and Group the client made and closes its idle
// connections. Decisions after Close return ErrClosed.
func (c *Client) Close() error {
	c.mu.Lock()
	if c.isClosed() {
		c.mu.Unlock()
		return nil
	}
	close(c.done)
	locals := c.locals
	c.locals = nil
	c.mu.Unlock()
	var errs []error
	for _, l := range locals {
		errs = append(errs, l.Close())
	}
	if c.own != nil {
		c.own.CloseIdleConnections()
	}
	return errors.Join(errs...)
}

// isClosed reports whether Close has run.
func (c *Client) isClosed() bool {
	select {
	case <-c.done:
		return true
	default:
		return false
	}
}

// fallback makes FailLocal's local limiter or group with mk, on the
// client's clock, and registers it for Close; under another failure
// policy it makes none (T's zero value). It fails after Close.
func fallback[T interface{ Close() error }](c *Client, mk func(engine.Option) (T, error)) (T, error) {
	var none T
	if c.cfg.failure != FailLocal {
		return none, nil
	}
	local, err := mk(engine.WithClock(localClock{c}))
	if err != nil {
		return none, err
	}
	c.mu.Lock()
	closed := c.isClosed()
	if !closed {
		c.locals = append(c.locals, local)
	}
	c.mu.Unlock()
	if closed {
		_ = local.Close()
		return none, ErrClosed
	}
	return local, nil
}

// wallTime maps a server instant to local wall time.
func (c *Client) wallTime(at int64) time.Time { return c.epoch.Load().Add(time.Duration(at)) }

// anchor fixes the epoch from the first answer with a valid at (see
// maxAt): the server decided at at about now (half a round trip ago,
// which display can ignore).
func (c *Client) anchor(at int64) {
	if c.anchored.Load() || !validAt(at) {
		return
	}
	if c.anchored.CompareAndSwap(false, true) {
		e := time.Now().Add(-time.Duration(at))
		c.epoch.Store(&e)
	}
}

// localClock is the fallback limiters' clock: the server's timeline as
// estimated from the epoch, so that local and remote instants compare.
type localClock struct{ c *Client }

func (l localClock) Now() int64 { return int64(time.Since(*l.c.epoch.Load())) }

// Wire forms of the decision API (server.AllowRequest and its answers).
type limitReq struct {
	Policy string `json:"policy"`
	Key    string `json:"key"`
}

type allowReq struct {
	Key    string     `json:"key,omitempty"`
	Policy string     `json:"policy,omitempty"`
	Cost   int        `json:"cost"`
	Limits []limitReq `json:"limits,omitempty"`
}

// decisionResp is the server's answer to one decision, with the client's
// checks of it as methods.
type decisionResp httpkit.AllowResponse

// maxAt bounds the decision instants the client believes: about 146
// years of a server's uptime. An instant beyond it (or below 0) is not
// one a server's monotonic clock gives; anchored, it would stop the local
// fallback's clock, which saturates at the largest time.Duration.
const maxAt = int64(1) << 62

// decision returns d as an engine.Decision of policy p, clamped to what
// the contract allows, since a server's answer is trusted no further
// than the client can check. Remaining is clamped to 0..Limit and Reset
// to 0..w, where w is the longest a refusal can last: the window for the
// log, twice the window for the counter. RetryAfter is 0 when allowed;
// a refusal's outside (0, w] becomes w. An At outside 0..maxAt is
// replaced by the local clock's instant. Limit itself is checked by the
// caller (ErrPolicyMismatch).
func (d decisionResp) decision(c *Client, p engine.Policy) engine.Decision {
	w := p.Window
	if p.Algorithm == engine.SlidingCounter {
		w *= 2
	}
	out := engine.Decision{Allowed: d.Allowed, Limit: d.Limit, Remaining: min(max(d.Remaining, 0), p.Limit),
		Reset: min(max(time.Duration(d.ResetNs), 0), w), At: d.At, Overflow: d.Overflow}
	if !d.Allowed {
		out.RetryAfter = time.Duration(d.RetryAfterNs)
		if out.RetryAfter <= 0 || out.RetryAfter > w {
			out.RetryAfter = w
		}
	}
	if !validAt(d.At) {
		out.At = localClock{c}.Now()
	}
	return out
}

// validAt reports whether at is an instant a server's clock can give.
func validAt(at int64) bool { return at >= 0 && at <= maxAt }

type groupResp struct {
	Allowed bool           `json:"allowed"`
	Binding int            `json:"binding"`
	Limits  []decisionResp `json:"limits"`
}

// consistent makes g all or nothing, the stricter way, since a server's
// answer is trusted no further than the client can check: allowed only
// when every limit allowed, and a refusal that names no refusing limit
// is a refusal by every limit (each then retries as decision clamps it).
func (g *groupResp) consistent() {
	refusing := false
	for _, d := range g.Limits {
		if !d.Allowed {
			refusing = true
		}
	}
	if refusing {
		g.Allowed = false
	} else if !g.Allowed {
		for i := range g.Limits {
			g.Limits[i].Allowed = false
		}
	}
}

type problem struct {
	Detail string `json:"detail"`
}

// unavailable is why the server did not decide: it says which server
// and what happened, never the request's key.
func (c *Client) unavailable(cause error) error {
	return &clientcore.Unavailable{Backend: "slidegate", Server: c.name, Cause: cause}
}

// post sends one decision request and decodes the answer into out. An
// error wrapping ErrRejected or ErrPolicyMismatch is the request's fault;
// a *clientcore.Unavailable is the server's, for the failure policy; a
// caller's cancelled context returns its error. The breaker sees every
// outcome.
func (c *Client) post(ctx context.Context, req *allowReq, out any) error {
	if !c.br.Allow() {
		return c.unavailable(ErrBreakerOpen)
	}
	err := c.send(ctx, req, out)
	var ue *clientcore.Unavailable
	switch {
	case errors.As(err, &ue):
		c.br.Failure(err)
	case err != nil && ctx.Err() != nil:
		c.br.Abandon()
	default:
		c.br.Success()
	}
	return err
}

// send is post without the breaker.
func (c *Client) send(ctx context.Context, req *allowReq, out any) error {
	body, err := json.Marshal(req)
	if err != nil {
		return fmt.Errorf("%w: %w", ErrRejected, err)
	}
	cctx, cancel := context.WithTimeout(ctx, c.cfg.timeout)
	defer cancel()
	hr, err := http.NewRequestWithContext(cctx, http.MethodPost, c.allowURL, bytes.NewReader(body))
	if err != nil {
		return c.unavailable(err)
	}
	hr.Header["Content-Type"] = jsonCT
	resp, err := c.hc.Do(hr)
	if err != nil {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		var ue *url.Error
		if errors.As(err, &ue) {
			err = ue.Err // the URL is in the message already
		}
		return c.unavailable(err)
	}
	data, err := io.ReadAll(io.LimitReader(resp.Body, maxAnswer))
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, maxAnswer)) // lets the connection be reused
	_ = resp.Body.Close()
	if err != nil {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		return c.unavailable(fmt.Errorf("reading the answer: %w", err))
	}
	switch st := resp.StatusCode; {
	case st == http.StatusOK || st == http.StatusTooManyRequests:
		if err := json.Unmarshal(data, out); err != nil {
			return c.unavailable(fmt.Errorf("malformed answer (status %d): %w", st, err))
		}
		return nil
	case st >= 500 && st != http.StatusNotImplemented:
		return c.unavailable(fmt.Errorf("status %d: %s", st, detail(data)))
	default:
		return fmt.Errorf("%w: status %d from %s: %s", ErrRejected, st, c.name, detail(data))
	}
}

var jsonCT = []string{"application/json"}

// detail is a problem+json answer's detail, else the answer itself, at
// most 200 bytes either way: a server's text is bounded in errors too.
func detail(data []byte) string {
	var p problem
	s := strings.TrimSpace(string(data))
	if json.Unmarshal(data, &p) == nil && p.Detail != "" {
		s = p.Detail
	}
	if len(s) > 200 {
		s = s[:200] + "…"
	}
	if s == "" {
		return "no detail"
	}
	return s
}
