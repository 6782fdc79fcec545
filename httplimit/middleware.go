package httplimit

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/slidegate/slidegate/engine"
	"github.com/slidegate/slidegate/internal/clientcore"
	"github.com/slidegate/slidegate/internal/headerfmt"
	"github.com/slidegate/slidegate/internal/httpkit"
)

// ErrInvalidOption is wrapped by the errors New returns for bad options.
var ErrInvalidOption = httpkit.ErrInvalidOption

// Refusal describes a refused request to the refusal handler
// (WithRefusalHandler). The rate-limit
// headers (Retry-After included) are already set on the response.
type Refusal struct {
	Policy   engine.Policy
	Key      string
	Cost     int
	Decision engine.Decision
	// Limits holds every limit's decision when the tier has several
	// (WithLimits), in the tier's order; Policy, Key and Decision are then
	// the binding limit's. Nil for a tier of one backend.
	Limits []engine.Decision
}

// Event reports one decision to an observer (metrics, recording).
type Event struct {
	Request  *http.Request
	Policy   string
	Key      string
	Cost     int
	Decision engine.Decision
	// Latency is how long the backend took to decide.
	Latency time.Duration
	// Err is the backend's error, if it failed to decide.
	Err error
	// Limits holds every limit's part of a multi-limit decision
	// (WithLimits), in the tier's order; Policy, Key and Decision are then
	// the binding limit's. Nil for a tier of one backend, and when Err is
	// set.
	Limits []LimitEvent
}

type config struct {
	tiers     []engine.Backend
	groups    []groupSpec
	order     []string // tier names in the order they were added
	defTier   string
	tierFn    func(*http.Request) (string, error)
	keyFn     KeyFunc
	tagFn     KeyFunc
	costFn    func(*http.Request) (int, error)
	exempt    func(*http.Request) bool
	shadow    bool
	headers   Headers
	onRefusal func(http.ResponseWriter, *http.Request, Refusal)
	onError   func(http.ResponseWriter, *http.Request, int, error)
	observe   func(Event)
	respCost  string // the response header or trailer with the request's whole cost
}

// Option configures a Middleware.
type Option func(*config) error

// WithBackend adds a tier: the backend's policy, under the policy's name.
// The first backend added is the default tier unless WithDefaultTier says
// otherwise. At least one is required.
func WithBackend(b engine.Backend) Option {
	return func(c *config) error {
		if b == nil {
			return fmt.Errorf("%w: nil backend", ErrInvalidOption)
		}
		c.tiers = append(c.tiers, b)
		c.order = append(c.order, b.Policy().Name)
		return nil
	}
}

// WithResponseCost charges a request by what its response says it cost:
// the response header or trailer named header holds the whole cost, a
// whole number, set by the handler (or the upstream behind a proxy) by
// the time it returns. The request is admitted on its cost at arrival (1,
// or WithCostFunc's). When the handler returns, a whole cost above that is
// charged for the rest: at most the limit, reserved as ReserveN does, at
// the earliest instant from then on at which it fits the window. So no
// window ever holds more than the limit, and a request that cost more
// than its window had left delays the key's next ones until its cost has
// passed. A missing, malformed or smaller cost charges nothing more;
// nothing is given back. docs/semantics.md defines it.
//
// Every tier must be one backend that can reserve (engine.Limiter; the
// sliding log): New refuses multi-limit tiers and other backends.
func WithResponseCost(header string) Option {
	return func(c *config) error {
		if header == "" {
			return fmt.Errorf("%w: empty response cost header", ErrInvalidOption)
		}
		c.respCost = http.CanonicalHeaderKey(header)
		return nil
	}
}

// reserver is a backend that can charge after the response.
type reserver interface {
	ReserveN(key string, n int) (*engine.Reservation, error)
}

// charge is what a request admitted under WithResponseCost still owes
// once its handler returns.
type charge struct {
	r     reserver
	key   string
	cost  int // charged at arrival
	limit int
}

// settle charges what the response says the request cost beyond c.cost.
func (c charge) settle(h http.Header, name string) {
	v := h.Get(name)
	if v == "" {
		v = h.Get(http.TrailerPrefix + name)
	}
	total, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
	if err != nil || total <= int64(c.cost) {
		return
	}
	rest := int(min(total-int64(c.cost), int64(c.limit)))
	// The reservation needs no waiting: its slot counts in every window
	// from now on. An error (a full key queue, the key cap, a limit
	// lowered meanwhile) leaves the rest uncharged.
	_, _ = c.r.ReserveN(c.key, rest)
}

// WithDefaultTier names the tier of requests the tier function assigns
// none (""). Without it the first tier added (WithBackend or WithLimits)
// is the default.
func WithDefaultTier(name string) Option {
	return func(c *config) error { c.defTier = name; return nil }
}

// WithTierFunc sets how a request's tier is chosen (for example
// HeaderTier("X-Plan")): f names the tier, the policy the caller's plan
// chooses. "" from f means the default tier. Without it every request gets
// the default tier. An error from f, or a request naming an unknown tier,
// is answered 400.
func WithTierFunc(f func(r *http.Request) (string, error)) Option {
	return func(c *config) error { c.tierFn = f; return nil }
}

// WithKeyFunc sets how a request's key is derived. The default is
// ClientIP{}.Key: the socket peer's address, no proxy trusted.
func WithKeyFunc(f KeyFunc) Option {
	return func(c *config) error { return setKeyFunc(&c.keyFn, f, "key") }
}

// setKeyFunc is the check of WithKeyFunc and WithTag: it sets *dst to a
// non-nil f; what names the option in the error.
func setKeyFunc(dst *KeyFunc, f KeyFunc, what string) error {
	if f == nil {
		return fmt.Errorf("%w: nil %s function", ErrInvalidOption, what)
	}
	*dst = f
	return nil
}

// WithCostFunc sets a request's cost (default 1). A cost outside
// 1..Limit is answered 400, as is an error from f.
func WithCostFunc(f func(*http.Request) (int, error)) Option {
	return func(c *config) error { c.costFn = f; return nil }
}

// WithExempt exempts requests for which f returns true: they are neither
// decided nor counted and carry no rate-limit headers.
func WithExempt(f func(*http.Request) bool) Option {
	return func(c *config) error { c.exempt = f; return nil }
}

// WithShadow turns shadow mode on: requests are decided, counted and given
// the RateLimit and X-RateLimit headers, but never refused, and no
// Retry-After is written (the response is not a refusal). Use it to see
// what a policy would do before enforcing it.
func WithShadow(on bool) Option {
	return func(c *config) error { c.shadow = on; return nil }
}

// WithHeaders selects the header families written (default HeadersAll).
func WithHeaders(h Headers) Option {
	return func(c *config) error {
		if h&^HeadersAll != 0 {
			return fmt.Errorf("%w: unknown header bits %#x", ErrInvalidOption, uint8(h&^HeadersAll))
		}
		c.headers = h
		return nil
	}
}

// WithRefusalHandler sets how refusals are answered (default
// WriteProblem, 429 with an application/problem+json body). The rate-limit
// headers are already set on w when f runs.
func WithRefusalHandler(f func(w http.ResponseWriter, r *http.Request, ref Refusal)) Option {
	return func(c *config) error { c.onRefusal = f; return nil }
}

// WithErrorHandler sets how undecidable requests are answered (default
// WriteError). status is 400 when the request itself is at fault (no key,
// unknown tier, bad cost) and 503 when the backend failed.
func WithErrorHandler(f func(w http.ResponseWriter, r *http.Request, status int, err error)) Option {
	return func(c *config) error { c.onError = f; return nil }
}

// WithObserver calls f after every decision, on the request's goroutine;
// f must be safe for concurrent use. With an observer the middleware also
// times each decision (two clock reads).
func WithObserver(f func(Event)) Option {
	return func(c *config) error { c.observe = f; return nil }
}

// Middleware limits requests to a handler by sliding-window policies: per
// tier, one backend (WithBackend) or several limits decided all or nothing
// (WithLimits).
//
// For each request that is not exempt it chooses the tier (the tier
// function, else the default), derives the key (one per limit of a
// multi-limit tier), decides with the tier's backend or group at cost 1
// (or the cost function's), writes the rate-limit headers (of the binding
// limit, for several), and either passes the request on (allowed, or shadow mode) or
// hands it to the refusal handler (429 with Retry-After and a problem+json
// body by default). A request that cannot be decided (no key, unknown
// tier, bad cost, failed backend) goes to the error handler and is never
// charged to any bucket.
//
// Build one with New (the zero value is not usable) and wrap handlers with
// Handler; most callers want Limit. A Middleware is safe for concurrent
// use and may wrap any number of handlers, which then share its buckets.
// Its backends are the caller's to Close.
type Middleware struct {
	cfg         config
	def         *tierWriter // nil when the default tier is defGroup
	defGroup    *groupTier
	tiers       map[string]*tierWriter
	groups      map[string]*groupTier
	fastRefusal bool // no refusal handler given: WriteProblem, pre-rendered
}

// New returns a Middleware, or an error naming the bad option.
func New(opts ...Option) (*Middleware, error) {
	c := config{headers: HeadersAll}
	if err := clientcore.Apply(&c, opts); err != nil {
		return nil, err
	}
	if len(c.order) == 0 {
		return nil, fmt.Errorf("%w: no backend (use WithBackend or WithLimits)", ErrInvalidOption)
	}
	if c.keyFn == nil {
		c.keyFn = ClientIP{}.Key
	}
	fastRefusal := c.onRefusal == nil
	if c.onError == nil {
		c.onError = WriteError
	}
	m := &Middleware{tiers: make(map[string]*tierWriter, len(c.tiers))}
	for _, b := range c.tiers {
		hw, err := newTierWriter(b, c.headers)
		if err != nil {
			return nil, err
		}
		name := hw.policy.Name
		if _, dup := m.tiers[name]; dup {
			return nil, fmt.Errorf("%w: two backends with policy name %q", ErrInvalidOption, name)
		}
		m.tiers[name] = hw
	}
	if c.respCost != "" {
		if len(c.groups) > 0 {
			return nil, fmt.Errorf("%w: WithResponseCost takes tiers of one backend, not WithLimits", ErrInvalidOption)
		}
		for _, b := range c.tiers {
			_, ok := b.(reserver)
			if !ok || b.Policy().Algorithm != engine.SlidingLog {
				return nil, fmt.Errorf("%w: WithResponseCost: the backend of policy %q cannot charge after the response (it needs an engine.Limiter on the sliding log)", ErrInvalidOption, b.Policy().Name)
			}
		}
	}
	m.groups = make(map[string]*groupTier, len(c.groups))
	for _, gs := range c.groups {
		if _, dup := m.tiers[gs.name]; dup {
			return nil, fmt.Errorf("%w: tier %q is both a backend's policy and a multi-limit tier", ErrInvalidOption, gs.name)
		}
		if _, dup := m.groups[gs.name]; dup {
			return nil, fmt.Errorf("%w: two multi-limit tiers named %q", ErrInvalidOption, gs.name)
		}
		gt, err := newGroupTier(gs, c.keyFn, c.headers)
		if err != nil {
			return nil, err
		}
		m.groups[gs.name] = gt
	}
	if c.defTier == "" {
		c.defTier = c.order[0]
	}
	def, ok := m.tiers[c.defTier]
	if !ok {
		if m.defGroup, ok = m.groups[c.defTier]; !ok {
			return nil, fmt.Errorf("%w: default tier %q is not a backend's policy", ErrInvalidOption, c.defTier)
		}
	}
	m.def, m.cfg, m.fastRefusal = def, c, fastRefusal
	return m, nil
}

// Limit is New followed by Handler, in the func(http.Handler) http.Handler
// shape routers take.
func Limit(opts ...Option) (func(http.Handler) http.Handler, error) {
	m, err := New(opts...)
	if err != nil {
		return nil, err
	}
	return m.Handler, nil
}

// Handler wraps next: each request not exempt is decided, given the
// rate-limit headers, and passed to next when allowed (always in shadow
// mode); refusals go to the refusal handler.
func (m *Middleware) Handler(next http.Handler) http.Handler {
	if m.cfg.respCost != "" {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			var ch charge
			if m.decide(w, r, &ch) {
				next.ServeHTTP(w, r)
				if ch.r != nil {
					ch.settle(w.Header(), m.cfg.respCost)
				}
			}
		})
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if m.decide(w, r, nil) {
			next.ServeHTTP(w, r)
		}
	})
}

// decide decides r, writing headers and any refusal or error; it reports
// whether the request should go on to the next handler. Under
// WithResponseCost it fills ch with what an admitted request still owes
// when its handler returns.
func (m *Middleware) decide(w http.ResponseWriter, r *http.Request, ch *charge) bool {
	c := &m.cfg
	if c.exempt != nil && c.exempt(r) {
		return true
	}
	hw, gt := m.def, m.defGroup
	if c.tierFn != nil {
		name, err := c.tierFn(r)
		if err != nil {
			c.onError(w, r, http.StatusBadRequest, err)
			return false
		}
		if name != "" {
			var ok bool
			if hw, ok = m.tiers[name]; ok {
				gt = nil
			} else if gt, ok = m.groups[name]; !ok {
				c.onError(w, r, http.StatusBadRequest, fmt.Errorf("httplimit: unknown policy %q", name))
				return false
			}
		}
	}
	if gt != nil {
		return m.serveGroup(w, r, gt)
	}
	key, err := c.keyFn(r)
	if err != nil {
		c.onError(w, r, http.StatusBadRequest, err)
		return false
	}
	if len(key) > MaxKeyLen {
		c.onError(w, r, http.StatusBadRequest, fmt.Errorf("%w: the request's key is longer than %d bytes", ErrNoKey, MaxKeyLen))
		return false
	}
	cost := 1
	if c.costFn != nil {
		if cost, err = c.costFn(r); err != nil {
			c.onError(w, r, http.StatusBadRequest, err)
			return false
		}
	}
	var (
		d     engine.Decision
		start time.Time
	)
	if c.observe != nil {
		start = time.Now()
	}
	d, err = hw.Backend().Decide(r.Context(), key, cost)
	if c.observe != nil {
		c.observe(Event{Request: r, Policy: hw.policy.Name, Key: key, Cost: cost, Decision: d, Latency: time.Since(start), Err: err})
	}
	if err != nil {
		c.onError(w, r, httpkit.StatusOf(err), err)
		return false
	}
	if d.Allowed || c.shadow {
		hw.write(w.Header(), d, false)
		if ch != nil {
			*ch = charge{r: hw.Backend().(reserver), key: key, cost: cost, limit: d.Limit}
		}
		return true
	}
	hw.write(w.Header(), d, true)
	if m.fastRefusal {
		hw.writeProblem(w, r, d)
	} else {
		c.onRefusal(w, r, Refusal{Policy: applied(hw.policy, d), Key: key, Cost: cost, Decision: d})
	}
	return false
}

// Problem is the application/problem+json body (RFC 9457) of refusals and
// errors. Error repeats Detail for clients that look for an "error" field.
type Problem struct {
	Type   string `json:"type"`
	Title  string `json:"title"`
	Status int    `json:"status"`
	Detail string `json:"detail"`
	Error  string `json:"error,omitempty"`
	// Refusals only.
	Policy            string `json:"policy,omitempty"`
	Limit             int    `json:"limit,omitempty"`
	WindowSeconds     int64  `json:"window_seconds,omitempty"`
	RetryAfterSeconds int64  `json:"retry_after_seconds,omitempty"`
	RetryAfterNs      int64  `json:"retry_after_ns,omitempty"`
	// Reason is "key_cap" when the request was refused because its key is
	// new and the limiter already tracks its cap of keys
	// (engine.WithMaxKeys), not because the key used up its limit.
	Reason string `json:"reason,omitempty"`
}

// reasonKeyCap is Problem.Reason for a refusal by the key cap.
const reasonKeyCap = "key_cap"

// problemType is the type URI of refusals.
const problemType = "https://github.com/slidegate/slidegate/blob/main/docs/http.md#429-too-many-requests"

// WriteProblem is the default refusal handler (WithRefusalHandler): 429 with a problem+json body
// naming the policy and the retry time, and the key cap when that is what
// refused the request (Decision.Overflow).
func WriteProblem(w http.ResponseWriter, _ *http.Request, ref Refusal) {
	secs := headerfmt.CeilSeconds(ref.Decision.RetryAfter)
	if ref.Decision.Overflow {
		writeJSON(w, http.StatusTooManyRequests, "application/problem+json", Problem{
			Type:   problemType,
			Title:  "Too Many Requests",
			Status: http.StatusTooManyRequests,
			Detail: "policy " + strconv.Quote(ref.Policy.Name) + " is tracking as many clients as its key cap allows; " +
				"new clients are refused until idle ones expire; retry in " + strconv.FormatInt(secs, 10) + " s",
			Policy:            ref.Policy.Name,
			Limit:             ref.Policy.Limit,
			WindowSeconds:     headerfmt.CeilSeconds(ref.Policy.Window),
			RetryAfterSeconds: secs,
			RetryAfterNs:      int64(ref.Decision.RetryAfter),
			Reason:            reasonKeyCap,
		})
		return
	}
	writeJSON(w, http.StatusTooManyRequests, "application/problem+json", Problem{
		Type:              problemType,
		Title:             "Too Many Requests",
		Status:            http.StatusTooManyRequests,
		Detail:            detailPrefix(ref.Policy) + strconv.FormatInt(secs, 10) + " s",
		Policy:            ref.Policy.Name,
		Limit:             ref.Policy.Limit,
		WindowSeconds:     headerfmt.CeilSeconds(ref.Policy.Window),
		RetryAfterSeconds: secs,
		RetryAfterNs:      int64(ref.Decision.RetryAfter),
	})
}

// WriteError is the default error handler (WithErrorHandler): status with a problem+json body
// whose detail (and error) is err's message.
func WriteError(w http.ResponseWriter, _ *http.Request, status int, err error) {
	writeJSON(w, status, "application/problem+json", Problem{
		Type:   "about:blank",
		Title:  http.StatusText(status),
		Status: status,
		Detail: err.Error(),
		Error:  err.Error(),
	})
}

func writeJSON(w http.ResponseWriter, status int, ctype string, v any) {
	body, err := json.Marshal(v)
	if err != nil { // cannot happen for the types above
		body = []byte(`{"error":"internal error"}`)
	}
	body = append(body, '\n')
	h := w.Header()
	h.Set("Content-Type", ctype)
	h.Set("Content-Length", strconv.Itoa(len(body)))
	h.Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(status)
	_, _ = w.Write(body)
}
