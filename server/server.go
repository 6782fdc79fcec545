package server

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httputil"
	"net/http/pprof"
	"net/url"
	"os"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"golang.org/x/net/netutil"

	"github.com/slidegate/slidegate/engine"
	"github.com/slidegate/slidegate/httplimit"
	"github.com/slidegate/slidegate/internal/httpkit"
	"github.com/slidegate/slidegate/internal/redact"
)

// StoreSpec is what a StoreFactory is given: the store URL of the
// configuration, its store_options, the policies to make backends for (in
// configuration order), the clock the caller injected (nil for the
// backend's own), the server's registry for the store's own metrics, and
// its logger.
type StoreSpec struct {
	URL        string
	Options    map[string]any
	Policies   []engine.Policy
	Clock      engine.Clock
	Registerer prometheus.Registerer
	Logger     *slog.Logger
}

// Store is what a StoreFactory makes for a configuration's policies.
type Store struct {
	// Backends holds one backend per policy of the spec, in order.
	Backends []engine.Backend
	// Group decides over any subset of those policies (Ref.Policy indexes
	// Backends), all or nothing, sharing their state; nil if the store
	// cannot. A configuration with a route of two or more limits needs
	// it, and so do decision API requests naming several limits.
	Group engine.GroupBackend
	// Close releases everything the factory made; the server calls it
	// once, after the last request that uses the store.
	Close func() error
}

// StoreFactory makes the backends of spec's policies in one store. The
// server calls it at start-up and on every reload (the state lives in the
// store, so that a reload loses none of it), and closes the Store once no
// request uses it any more.
type StoreFactory func(ctx context.Context, spec StoreSpec) (Store, error)

type options struct {
	clock  engine.Clock
	stores map[string]StoreFactory
	logger *slog.Logger
	build  BuildInfo
}

// BuildInfo describes the running binary, exported as the
// slidegate_build_info metric.
type BuildInfo struct {
	Version, Commit, Date string
}

// Option configures a Server.
type Option func(*options)

// WithClock makes the in-memory backends decide on clk (engine.WithClock)
// instead of the monotonic clock, and hands it to store factories: for
// tests and deterministic replays.
func WithClock(clk engine.Clock) Option { return func(o *options) { o.clock = clk } }

// WithStore registers a store factory for URLs of the given scheme
// ("redis", "redis-cluster"); Config.Store selects it.
func WithStore(scheme string, f StoreFactory) Option {
	return func(o *options) {
		if o.stores == nil {
			o.stores = map[string]StoreFactory{}
		}
		o.stores[strings.ToLower(scheme)] = f
	}
}

// WithLogger sets the logger (default: slog.Default()).
func WithLogger(l *slog.Logger) Option { return func(o *options) { o.logger = l } }

// WithBuildInfo sets what slidegate_build_info reports (default: version
// "unknown").
func WithBuildInfo(b BuildInfo) Option { return func(o *options) { o.build = b } }

// tier is one policy: its backend, header writer and metrics. index is
// its place in the configuration's policies, and so its Ref.Policy in the
// state's group.
type tier struct {
	name    string
	index   int
	pc      PolicyConfig
	policy  engine.Policy
	backend engine.Backend
	hw      *httpkit.HeaderWriter
	m       tierMetrics
	// borrowsKey: backend keeps nothing of the key strings it decides
	// (httpkit.BorrowsKey), so the decision API may hand it a view of
	// the request's buffer.
	borrowsKey bool
}

// state is what a configuration reload replaces as a whole: the policies
// and everything built from them. Requests take mu for reading while they
// use a state, so that a reload can wait for them before closing the
// backends it retired.
type state struct {
	mu     sync.RWMutex
	cfg    Config
	tiers  []*tier
	byName map[string]*tier
	def    *tier
	// group decides over any subset of tiers (Ref.Policy is a tier's
	// index), all or nothing; nil when the store cannot.
	group engine.GroupBackend
	// closeStore, for a store other than memory, closes the Store the
	// tiers' backends come from; memory tiers are closed one by one, as
	// a reload keeps the unchanged ones.
	closeStore func() error
	routes     *router
	handler    http.Handler
}

// Server is slidegate's HTTP server: the decision API (POST /v1/allow,
// /v1/allow/batch) or, with an upstream, a rate-limiting reverse proxy;
// and an admin listener with metrics, pprof and health checks.
//
// New builds it without listening; Start listens, Shutdown drains and
// Run does both around a context, with a drain delay first (Hurry cuts it
// short). Reload replaces the policies while serving. Handler and
// AdminHandler serve without listeners, for embedding. A Server is safe
// for concurrent use; it is used once (Start after Shutdown fails).
type Server struct {
	cfg      Config // as started: listeners, store and timeouts
	opts     options
	clock    engine.Clock // the memory store's one clock
	log      *slog.Logger
	cur      atomic.Pointer[state]
	reg      *prometheus.Registry
	metrics  *metrics
	adminOps *prometheus.CounterVec // admin key operations (admin.go)
	handler  http.Handler
	admin    http.Handler
	tr       *http.Transport
	ready    atomic.Bool
	draining atomic.Bool   // Run's drain has begun: responses close their connections
	hurry    chan struct{} // Hurry's tokens, buffered 1
	reload   sync.Mutex    // one Reload at a time
	retired  sync.WaitGroup

	mu        sync.Mutex
	started   bool
	stopped   bool
	srv       *http.Server
	adminSrv  *http.Server
	lis       net.Listener
	adminLis  net.Listener
	serveErr  chan error
	closeOnce sync.Once
}

// Check validates cfg as New would with opts: the configuration itself,
// the store_file and whether this build has a backend for the store URL.
// It returns the configuration's warnings (Config.Warnings). slidegate
// serve --print-config runs it, so that what it prints is what serve
// would accept.
func Check(cfg Config, opts ...Option) ([]string, error) {
	var o options
	for _, f := range opts {
		if f != nil {
			f(&o)
		}
	}
	_, warnings, err := check(cfg, &o)
	return warnings, err
}

// check is Check with the options applied; it returns cfg with defaults
// filled in and the store URL read from store_file.
func check(cfg Config, o *options) (Config, []string, error) {
	cfg, err := resolveStore(cfg)
	if err != nil {
		return Config{}, nil, err
	}
	if cfg.Store != DefaultStore {
		u, _ := url.Parse(cfg.Store)
		if _, ok := o.stores[strings.ToLower(u.Scheme)]; !ok {
			known := []string{"memory"}
			for k := range o.stores {
				known = append(known, k+"://")
			}
			sort.Strings(known[1:])
			return Config{}, nil, fieldErr("store", "no backend for %q in this build (known: %s)", u.Scheme+"://", strings.Join(known, ", "))
		}
	}
	return cfg, cfg.Warnings(), nil
}

// resolveStore validates cfg and, when StoreFile is set, reads the store
// URL from it.
func resolveStore(cfg Config) (Config, error) {
	if err := cfg.Validate(); err != nil {
		return Config{}, err
	}
	cfg = cfg.withDefaults()
	if cfg.StoreFile == "" {
		return cfg, nil
	}
	b, err := os.ReadFile(cfg.StoreFile)
	if err != nil {
		return Config{}, fieldErr("store_file", "%v", err)
	}
	if strings.TrimSpace(string(b)) == "" {
		return Config{}, fieldErr("store_file", "%s is empty", cfg.StoreFile)
	}
	cfg.Store, cfg.StoreFile = strings.TrimSpace(string(b)), ""
	if err := cfg.Validate(); err != nil {
		return Config{}, fmt.Errorf("store_file: %w", err)
	}
	return cfg, nil
}

// New builds a server for cfg: validates it, makes one backend per policy
// and wires the handlers. It does not listen (see Start). On error,
// nothing is left running.
func New(cfg Config, opts ...Option) (*Server, error) {
	s := &Server{reg: prometheus.NewRegistry(), hurry: make(chan struct{}, 1)}
	for _, o := range opts {
		if o != nil {
			o(&s.opts)
		}
	}
	cfg, warnings, err := check(cfg, &s.opts)
	if err != nil {
		return nil, err
	}
	s.cfg = cfg
	s.clock = s.opts.clock
	if s.clock == nil {
		s.clock = engine.NewMonotonicClock()
	}
	s.log = s.opts.logger
	if s.log == nil {
		s.log = slog.Default()
	}
	for _, w := range warnings {
		s.log.Warn("configuration: " + w)
	}
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.MaxIdleConns = 1024
	tr.MaxIdleConnsPerHost = 256
	tr.ResponseHeaderTimeout = cfg.UpstreamHeaderTimeout
	s.tr = tr
	if s.adminOps, err = newAdminKeyOps(s.reg); err != nil {
		return nil, err
	}
	if s.metrics, err = newMetrics(s.reg, s.tiersNow, s.opts.build); err != nil {
		return nil, err
	}
	st, err := s.build(cfg, nil)
	if err != nil {
		return nil, err
	}
	s.cur.Store(st)
	s.handler = http.HandlerFunc(s.serveHTTP)
	s.admin = s.adminHandler()
	return s, nil
}

// tiersNow returns the tiers in force, for the metrics collector.
func (s *Server) tiersNow() []*tier {
	if st := s.cur.Load(); st != nil {
		return st.tiers
	}
	return nil
}

// serveHTTP serves one request with the state in force, holding it for
// reading so that a reload closes no backend under the request.
func (s *Server) serveHTTP(w http.ResponseWriter, r *http.Request) {
	if s.draining.Load() {
		w.Header().Set("Connection", "close")
	}
	for {
		st := s.cur.Load()
		// A writer only ever locks a state a reload has already replaced
		// (to close its retired backends once its requests are done), so
		// a failed TryRLock or a changed pointer both mean: take the new
		// state. Waiting on RLock instead could park this request behind
		// the slowest request of the old state.
		if !st.mu.TryRLock() {
			continue
		}
		if s.cur.Load() != st {
			st.mu.RUnlock()
			continue
		}
		st.handler.ServeHTTP(w, r)
		st.mu.RUnlock()
		return
	}
}

// build makes a state for cfg (defaults filled in). With the memory
// store it reuses the tiers of old whose policy is unchanged, so that they
// keep their state, and makes one group over all of them; another store
// is asked for every policy again (its state lives in the store). On
// error nothing it made is left open.
func (s *Server) build(cfg Config, old *state) (*state, error) {
	memory := cfg.Store == DefaultStore
	st := &state{cfg: cfg, byName: map[string]*tier{}}
	var fresh []PolicyConfig
	for _, pc := range cfg.Policies {
		if memory && old != nil {
			if t, ok := old.byName[pc.Name]; ok && t.pc == pc {
				continue
			}
		}
		fresh = append(fresh, pc)
	}
	store, err := s.makeStore(cfg, fresh)
	if err != nil {
		return nil, err
	}
	ok := false
	defer func() {
		if !ok {
			if err := store.Close(); err != nil {
				s.log.Warn("closing store", "err", err)
			}
		}
	}()
	// The tiers' header writers serve the decision API; the gateway's
	// middleware writes cfg.Headers (middlewareOptions).
	which := cfg.DecisionHeaders.Which()
	made := map[string]engine.Backend{}
	for i, b := range store.Backends {
		if b.Policy().Name != fresh[i].Name {
			return nil, fmt.Errorf("server: store made a backend for policy %q where %q was asked", b.Policy().Name, fresh[i].Name)
		}
		made[fresh[i].Name] = b
	}
	for i, pc := range cfg.Policies {
		var t *tier
		if b, ok := made[pc.Name]; ok {
			hw, err := httpkit.NewHeaderWriter(b, which)
			if err != nil {
				return nil, fmt.Errorf("server: policy %q: %w", pc.Name, err)
			}
			t = &tier{name: pc.Name, pc: pc, policy: b.Policy(), backend: b, hw: hw}
			t.m = s.metrics.forTier(t.name)
		} else {
			o := old.byName[pc.Name]
			hw, err := httpkit.NewHeaderWriter(o.backend, which)
			if err != nil {
				return nil, fmt.Errorf("server: policy %q: %w", pc.Name, err)
			}
			t = &tier{name: o.name, pc: o.pc, policy: o.policy, backend: o.backend, hw: hw, m: o.m}
		}
		t.index = i
		t.borrowsKey = httpkit.BorrowsKey(t.backend)
		st.tiers = append(st.tiers, t)
		st.byName[t.name] = t
	}
	st.def = st.byName[cfg.DefaultPolicy]
	if memory {
		ls := make([]*engine.Limiter, len(st.tiers))
		for i, t := range st.tiers {
			ls[i] = t.backend.(*engine.Limiter) // made by makeStore
		}
		g, err := engine.NewGroupOf(ls...)
		if err != nil {
			return nil, fmt.Errorf("server: %w", err)
		}
		st.group = g
	} else {
		st.group, st.closeStore = store.Group, store.Close
		if err := checkGroup(st); err != nil {
			return nil, err
		}
	}
	if err := needGroup(cfg, st.group); err != nil {
		return nil, err
	}
	if st.routes, err = s.newRouter(st); err != nil {
		return nil, err
	}
	if cfg.Upstream != "" {
		if st.handler, err = s.gatewayHandler(st); err != nil {
			return nil, err
		}
	} else {
		st.handler = s.apiHandler(st)
	}
	ok = true
	return st, nil
}

// checkGroup checks that a store's group decides over st's policies, in
// order.
func checkGroup(st *state) error {
	if st.group == nil {
		return nil
	}
	ps := st.group.Policies()
	if len(ps) != len(st.tiers) {
		return fmt.Errorf("server: store made a group of %d policies for %d", len(ps), len(st.tiers))
	}
	for i, p := range ps {
		if p.Name != st.tiers[i].name {
			return fmt.Errorf("server: store made a group whose policy %d is %q where %q was asked", i, p.Name, st.tiers[i].name)
		}
	}
	return nil
}

// needGroup reports, as a configuration error, a route of several limits
// on a store that cannot decide them at once.
func needGroup(cfg Config, g engine.GroupBackend) error {
	needsTag := g != nil && engine.NeedsTag(g)
	for i, rc := range cfg.Routes {
		for _, l := range rc.lists() {
			if len(l.limits) < 2 {
				continue
			}
			if g == nil {
				return fieldErr(fmt.Sprintf("routes[%d]%s", i, l.field), "%d limits, but store %s cannot decide several limits at once (all or nothing); give the route one limit, or use a store that can", len(l.limits), storeScheme(cfg.Store))
			}
			if !needsTag || rc.ClusterTag != "" {
				continue
			}
			specs := map[string]bool{}
			for _, lc := range l.limits {
				spec := lc.Key
				if spec == "" {
					spec = cfg.Key
				}
				specs[strings.TrimSpace(spec)] = true
			}
			if len(specs) > 1 {
				return fieldErr(fmt.Sprintf("routes[%d].cluster_tag", i), "required: store %s keeps keys in hash slots (Redis Cluster), and the limits of routes[%d]%s use different keys, which one atomic call cannot reach; name the key that places them together (for example header:X-API-Key)", storeScheme(cfg.Store), i, l.field)
			}
		}
	}
	return nil
}

// storeScheme names a store URL by its scheme ("memory", "redis://").
func storeScheme(store string) string {
	if store == DefaultStore {
		return store
	}
	u, err := url.Parse(store)
	if err != nil {
		return "(unparsable URL)"
	}
	return u.Scheme + "://"
}

// makeStore makes the backends of pcs, in order, in the store of cfg. The
// memory store makes one engine.Limiter per policy, all on the server's
// one clock (so that NewGroupOf can combine them), and no group: build
// makes it over the tiers it keeps too.
func (s *Server) makeStore(cfg Config, pcs []PolicyConfig) (Store, error) {
	policies := make([]engine.Policy, len(pcs))
	for i, pc := range pcs {
		p, err := pc.Policy()
		if err != nil {
			return Store{}, err // Validate has checked
		}
		policies[i] = p
	}
	if cfg.Store == DefaultStore {
		var out []engine.Backend
		closeAll := func() error {
			var errs []error
			for _, b := range out {
				errs = append(errs, b.Close())
			}
			return errors.Join(errs...)
		}
		for i, p := range policies {
			l, err := engine.New(p, s.engineOptions(pcs[i])...)
			if err != nil {
				_ = closeAll()
				return Store{}, fmt.Errorf("server: policy %q: %w", p.Name, err)
			}
			out = append(out, l)
		}
		return Store{Backends: out, Close: closeAll}, nil
	}
	u, _ := url.Parse(cfg.Store)
	f := s.opts.stores[strings.ToLower(u.Scheme)] // Check has found it
	store, err := f(context.Background(), StoreSpec{
		URL: cfg.Store, Options: cfg.StoreOptions, Policies: policies,
		Clock: s.opts.clock, Registerer: s.reg, Logger: s.log,
	})
	if err != nil {
		return Store{}, fmt.Errorf("%w: store: %s", ErrConfig, redact.URLs(err.Error()))
	}
	if store.Close == nil {
		bs := store.Backends
		store.Close = func() error {
			var errs []error
			for _, b := range bs {
				errs = append(errs, b.Close())
			}
			return errors.Join(errs...)
		}
	}
	if len(store.Backends) != len(policies) {
		_ = store.Close()
		return Store{}, fmt.Errorf("server: store made %d backends for %d policies", len(store.Backends), len(policies))
	}
	return store, nil
}

// engineOptions are the in-memory engine's options for one policy.
func (s *Server) engineOptions(pc PolicyConfig) []engine.Option {
	eopts := []engine.Option{engine.WithClock(s.clock)}
	if pc.MaxKeys > 0 {
		o, _ := engine.ParseOverflow(pc.Overflow) // Validate has checked
		eopts = append(eopts, engine.WithMaxKeys(pc.MaxKeys), engine.WithOverflow(o))
	}
	return eopts
}

// Config returns the configuration in force, defaults filled in.
func (s *Server) Config() Config { return s.cur.Load().cfg }

// Registry returns the server's own Prometheus registry (what /metrics
// serves). Store factories and embedders may register more collectors.
func (s *Server) Registry() *prometheus.Registry { return s.reg }

// backend returns the backend of a policy ("" for the default policy) in
// the configuration in force.
func (s *Server) backend(policy string) (engine.Backend, bool) {
	st := s.cur.Load()
	if policy == "" {
		return st.def.backend, true
	}
	t, ok := st.byName[policy]
	if !ok {
		return nil, false
	}
	return t.backend, true
}

// Handler returns the main handler: the decision API, or the gateway.
func (s *Server) Handler() http.Handler { return s.handler }

// AdminHandler returns the admin handler: /metrics, /debug/pprof/,
// /healthz, /readyz, /admin/keys.
func (s *Server) AdminHandler() http.Handler { return s.admin }

// observe counts one decision.
func (s *Server) observe(t *tier, d engine.Decision, lat time.Duration, err error) {
	t.m.latency.Observe(lat.Seconds())
	switch {
	case err != nil:
		t.m.failed.Inc()
		return
	case d.Allowed:
		t.m.allowed.Inc()
	default:
		t.m.refused.Inc()
	}
}

// failInternal answers a request the server could not decide or proxy
// (a 5xx): the client gets a generic message, the log the detail, so that
// no backend error or internal address reaches a client.
func (s *Server) failInternal(w http.ResponseWriter, r *http.Request, status int, msg string, err error) {
	s.log.Warn(msg, "status", status, "method", r.Method, "path", r.URL.Path, "err", redact.URLs(err.Error()))
	httplimit.WriteError(w, r, status, errors.New(msg))
}

// backendFailed answers a request whose backend failed to decide.
func (s *Server) backendFailed(w http.ResponseWriter, r *http.Request, err error) {
	status := httpkit.StatusOf(err)
	if status < 500 {
		httplimit.WriteError(w, r, status, err)
		return
	}
	msg := "the rate-limit store is unavailable"
	if status == http.StatusGatewayTimeout {
		msg = "the rate-limit store did not answer in time"
	}
	s.failInternal(w, r, status, msg, err)
}

// gatewayHandler decides every request with the middleware and proxies
// the allowed ones to the upstream.
func (s *Server) gatewayHandler(st *state) (http.Handler, error) {
	cfg := st.cfg
	up, _ := url.Parse(cfg.Upstream)
	proxies, _ := httpkit.ParsePrefixes(cfg.TrustedProxies)
	opts := s.middlewareOptions(st)
	opts = append(opts, httplimit.WithDefaultTier(st.def.name))
	if cfg.TierHeader != "" {
		opts = append(opts, httplimit.WithTierFunc(httplimit.HeaderTier(cfg.TierHeader)))
	}
	for _, t := range st.tiers {
		opts = append(opts, httplimit.WithBackend(t.backend))
	}
	mw, err := httplimit.New(opts...)
	if err != nil {
		return nil, fmt.Errorf("server: %w", err)
	}
	forwarded := http.CanonicalHeaderKey(cfg.ClientIPHeader)
	rp := &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.SetURL(up)
			// Keep the forwarding chain only when a trusted proxy sent it;
			// from anyone else it is a client's claim, and the upstream
			// sees just the address we saw.
			if xff := pr.In.Header["X-Forwarded-For"]; len(xff) > 0 {
				if httpkit.TrustedPeer(proxies, pr.In.RemoteAddr) {
					pr.Out.Header["X-Forwarded-For"] = append([]string(nil), xff...)
				}
			}
			// The client address header the ip key read (when it is not
			// X-Forwarded-For, which SetXForwarded writes) is passed on
			// from trusted proxies only.
			if forwarded != "X-Forwarded-For" && forwarded != "Forwarded" {
				if !httpkit.TrustedPeer(proxies, pr.In.RemoteAddr) {
					pr.Out.Header.Del(forwarded)
				}
			}
			pr.SetXForwarded()
		},
		Transport: s.tr,
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
			if errors.Is(err, context.Canceled) && r.Context().Err() != nil {
				return // the client went away
			}
			var ne net.Error
			if errors.Is(err, context.DeadlineExceeded) || (errors.As(err, &ne) && ne.Timeout()) {
				s.failInternal(w, r, http.StatusGatewayTimeout, "the upstream did not answer in time", err)
				return
			}
			s.failInternal(w, r, http.StatusBadGateway, "the upstream is unavailable", err)
		},
	}
	fallback := mw.Handler(rp)
	if st.routes == nil {
		return fallback, nil
	}
	for _, x := range st.routes.routes {
		x.h = x.mw.Handler(rp)
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if x := st.routes.match(r); x != nil {
			x.h.ServeHTTP(w, r)
			return
		}
		fallback.ServeHTTP(w, r)
	}), nil
}

// middlewareOptions are the options every middleware of st's gateway
// shares: the default key, headers, shadow mode, errors and observation.
func (s *Server) middlewareOptions(st *state) []httplimit.Option {
	cfg := st.cfg
	proxies, _ := httpkit.ParsePrefixes(cfg.TrustedProxies)
	ip := httplimit.ClientIP{TrustedProxies: proxies, Header: cfg.ClientIPHeader, IPv6Prefix: cfg.IPv6Prefix}
	kf, err := parseKeySpec(cfg.Key, ip, httplimit.Route{FoldCase: cfg.RouteFoldCase})
	if err != nil { // Validate has checked
		kf = func(*http.Request) (string, error) { return "", err }
	}
	return []httplimit.Option{
		httplimit.WithKeyFunc(kf),
		httplimit.WithHeaders(cfg.Headers.Which()),
		httplimit.WithShadow(cfg.Shadow),
		httplimit.WithErrorHandler(func(w http.ResponseWriter, r *http.Request, status int, err error) {
			if status < 500 {
				s.metrics.bad.WithLabelValues(strconv.Itoa(status)).Inc()
				httplimit.WriteError(w, r, status, err)
				return
			}
			s.backendFailed(w, r, err)
		}),
		httplimit.WithObserver(func(ev httplimit.Event) { s.observeEvent(st, ev) }),
	}
}

// observeEvent counts one decision of the middleware.
func (s *Server) observeEvent(st *state, ev httplimit.Event) {
	if len(ev.Limits) <= 1 {
		s.observe(st.byName[ev.Policy], ev.Decision, ev.Latency, ev.Err)
		return
	}
	allowed := true
	for _, l := range ev.Limits {
		allowed = allowed && l.Decision.Allowed
	}
	for _, l := range ev.Limits {
		observeLimit(st.byName[l.Policy], allowed, ev.Latency)
	}
}

// observeLimit counts one limit's part of a decision over several limits:
// each limit's policy counts the request with the request's outcome (a
// limit that had room still saw its request refused by another).
func observeLimit(t *tier, allowed bool, lat time.Duration) {
	t.m.latency.Observe(lat.Seconds())
	if allowed {
		t.m.allowed.Inc()
	} else {
		t.m.refused.Inc()
	}
}

func (s *Server) adminHandler() http.Handler {
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(s.reg, promhttp.HandlerOpts{Registry: s.reg}))
	mux.HandleFunc("/debug/pprof/", pprof.Index)
	mux.HandleFunc("/debug/pprof/cmdline", cmdline)
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
	mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	mux.HandleFunc("GET /admin/keys", s.adminKeys)
	mux.HandleFunc("DELETE /admin/keys", s.adminKeys)
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		_, _ = io.WriteString(w, "ok\n")
	})
	mux.HandleFunc("/readyz", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		if !s.ready.Load() {
			w.WriteHeader(http.StatusServiceUnavailable)
			_, _ = io.WriteString(w, "not ready\n")
			return
		}
		_, _ = io.WriteString(w, "ready\n")
	})
	return mux
}

// cmdline is pprof.Cmdline with passwords in URLs redacted: the command
// line may carry --store redis://:PASSWORD@host.
func cmdline(w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	args := make([]string, len(os.Args))
	for i, a := range os.Args {
		args[i] = redact.URLs(a)
	}
	_, _ = io.WriteString(w, strings.Join(args, "\x00"))
}

// Start listens on the configured addresses and serves in the background.
// Addr and AdminAddr then return the bound addresses (useful with port 0).
func (s *Server) Start() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.started || s.stopped {
		return errors.New("server: already started")
	}
	lis, err := net.Listen("tcp", s.cfg.Listen)
	if err != nil {
		return fmt.Errorf("%w: listen: %w", ErrConfig, err)
	}
	var adminLis net.Listener
	if s.cfg.Admin != "off" {
		if adminLis, err = net.Listen("tcp", s.cfg.Admin); err != nil {
			_ = lis.Close()
			return fmt.Errorf("%w: admin: %w", ErrConfig, err)
		}
	}
	s.started = true
	s.lis, s.adminLis = lis, adminLis
	errLog := slog.NewLogLogger(s.log.Handler(), slog.LevelWarn)
	s.srv = &http.Server{
		Handler:           s.handler,
		ReadHeaderTimeout: s.cfg.ReadTimeout,
		ReadTimeout:       s.cfg.ReadTimeout,
		WriteTimeout:      s.cfg.WriteTimeout,
		IdleTimeout:       s.cfg.IdleTimeout,
		MaxHeaderBytes:    s.cfg.MaxHeaderBytes,
		ErrorLog:          errLog,
	}
	s.srv.ConnState = s.metrics.connState("main")
	s.serveErr = make(chan error, 2)
	go func() { s.serveErr <- s.srv.Serve(netutil.LimitListener(lis, s.cfg.MaxConns)) }()
	if adminLis != nil {
		// No write timeout here: /debug/pprof/profile?seconds=30 writes
		// for as long as it was asked to.
		s.adminSrv = &http.Server{
			Handler:           s.admin,
			ReadHeaderTimeout: s.cfg.ReadTimeout,
			ReadTimeout:       s.cfg.ReadTimeout,
			IdleTimeout:       s.cfg.IdleTimeout,
			MaxHeaderBytes:    s.cfg.MaxHeaderBytes,
			ErrorLog:          errLog,
			ConnState:         s.metrics.connState("admin"),
		}
		go func() { s.serveErr <- s.adminSrv.Serve(netutil.LimitListener(adminLis, s.cfg.MaxConns)) }()
	}
	s.ready.Store(true)
	st := s.cur.Load()
	mode := "decision API"
	if st.cfg.Upstream != "" {
		mode = "gateway to " + redact.URLs(st.cfg.Upstream)
	}
	s.log.Info("slidegate serving", "listen", lis.Addr().String(), "admin", s.adminAddrLocked(), "mode", mode,
		"store", redact.URLs(s.cfg.Store), "policies", len(st.tiers), "default_policy", st.def.name)
	return nil
}

// Addr returns the main listener's address once started, else "".
func (s *Server) Addr() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.lis == nil {
		return ""
	}
	return s.lis.Addr().String()
}

// AdminAddr returns the admin listener's address once started, else "".
func (s *Server) AdminAddr() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.adminAddrLocked()
}

// adminAddrLocked is AdminAddr; s.mu must be held.
func (s *Server) adminAddrLocked() string {
	if s.adminLis == nil {
		return ""
	}
	return s.adminLis.Addr().String()
}

// ErrReload is wrapped by the errors of Reload.
var ErrReload = errors.New("server: reload")

// Reload replaces the configuration while serving: policies, routes,
// default policy, tier header, keys, trusted proxies, headers, shadow,
// upstream and the decision API's bounds take effect for the next request.
// With the memory store a policy whose name and settings are unchanged
// keeps its limiter, and so its keys' state, and the group that decides
// several limits at once is rebuilt over the kept and new limiters; a
// changed or removed policy's limiter is closed once the requests using it
// are done. Another store (Redis) holds the state itself: Reload asks its
// factory for every policy again and closes the previous Store once the
// requests using it are done. Settings of the listeners, the store and the
// timeouts need a restart: Reload keeps them and logs which differ.
//
// On error (an invalid configuration, a store that cannot make a
// backend, a route of several limits on a store without a group) nothing
// changes: the old configuration keeps serving. Every call is counted in
// slidegate_config_reloads_total.
func (s *Server) Reload(cfg Config) error {
	s.reload.Lock()
	defer s.reload.Unlock()
	err := s.reloadLocked(cfg)
	if err != nil {
		s.metrics.reloads.WithLabelValues("failure").Inc()
		s.log.Error("configuration reload failed; the previous configuration keeps serving", "err", redact.URLs(err.Error()))
		return err
	}
	s.metrics.reloads.WithLabelValues("success").Inc()
	return nil
}

// ReloadFrom is Reload of the configuration load returns (slidegate
// serve's SIGHUP: read the file again, apply the flags); an error from
// load counts and logs as a failed reload, and nothing changes.
func (s *Server) ReloadFrom(load func() (Config, error)) error {
	cfg, err := load()
	if err != nil {
		s.reload.Lock()
		defer s.reload.Unlock()
		err = fmt.Errorf("%w: %w", ErrReload, err)
		s.metrics.reloads.WithLabelValues("failure").Inc()
		s.log.Error("configuration reload failed; the previous configuration keeps serving", "err", redact.URLs(err.Error()))
		return err
	}
	return s.Reload(cfg)
}

func (s *Server) reloadLocked(cfg Config) error {
	s.mu.Lock()
	stopped := s.stopped
	s.mu.Unlock()
	if stopped {
		return fmt.Errorf("%w: the server is shutting down", ErrReload)
	}
	cfg, err := resolveStore(cfg)
	if err != nil {
		return fmt.Errorf("%w: %w", ErrReload, err)
	}
	var restart []string
	keep := func(name string, same bool) {
		if !same {
			restart = append(restart, name)
		}
	}
	keep("listen", cfg.Listen == s.cfg.Listen)
	keep("admin", cfg.Admin == s.cfg.Admin)
	keep("store", cfg.Store == s.cfg.Store)
	keep("store_options", fmt.Sprint(cfg.StoreOptions) == fmt.Sprint(s.cfg.StoreOptions))
	keep("read_timeout", cfg.ReadTimeout == s.cfg.ReadTimeout)
	keep("write_timeout", cfg.WriteTimeout == s.cfg.WriteTimeout)
	keep("idle_timeout", cfg.IdleTimeout == s.cfg.IdleTimeout)
	keep("upstream_header_timeout", cfg.UpstreamHeaderTimeout == s.cfg.UpstreamHeaderTimeout)
	keep("max_header_bytes", cfg.MaxHeaderBytes == s.cfg.MaxHeaderBytes)
	keep("max_conns", cfg.MaxConns == s.cfg.MaxConns)
	cfg.Listen, cfg.Admin, cfg.Store, cfg.StoreFile, cfg.StoreOptions = s.cfg.Listen, s.cfg.Admin, s.cfg.Store, "", s.cfg.StoreOptions
	cfg.ReadTimeout, cfg.WriteTimeout, cfg.IdleTimeout = s.cfg.ReadTimeout, s.cfg.WriteTimeout, s.cfg.IdleTimeout
	cfg.UpstreamHeaderTimeout, cfg.MaxHeaderBytes, cfg.MaxConns = s.cfg.UpstreamHeaderTimeout, s.cfg.MaxHeaderBytes, s.cfg.MaxConns
	if err := cfg.Validate(); err != nil { // max_keys against the store in force
		return fmt.Errorf("%w: %w", ErrReload, err)
	}
	old := s.cur.Load()
	st, err := s.build(cfg, old)
	if err != nil {
		return fmt.Errorf("%w: %w", ErrReload, err)
	}
	var retired []*tier
	for _, t := range old.tiers {
		if nt, ok := st.byName[t.name]; !ok || nt.backend != t.backend {
			retired = append(retired, t)
		}
	}
	s.cur.Store(st)
	for _, w := range cfg.Warnings() {
		s.log.Warn("configuration: " + w)
	}
	if len(restart) > 0 {
		s.log.Warn("configuration reloaded, but these settings take effect only at restart", "fields", strings.Join(restart, ", "))
	}
	kept := len(old.tiers) - len(retired)
	s.log.Info("configuration reloaded", "policies", len(st.tiers), "kept", kept, "retired", len(retired), "default_policy", st.def.name)
	// A store other than memory is closed whole, even when its factory
	// handed back the backends in force (they compare equal and so retire
	// nothing): the Store it made for old has references of its own.
	if len(retired) > 0 || old.closeStore != nil {
		s.retired.Add(1)
		go func() {
			defer s.retired.Done()
			old.mu.Lock() // every request that took old is done
			defer old.mu.Unlock()
			s.closeState(old, retired)
		}()
	}
	return nil
}

// closeState closes what st's tiers retired hold: the whole store, for a
// store other than memory, else each retired tier's limiter.
func (s *Server) closeState(st *state, retired []*tier) {
	if st.closeStore != nil {
		if err := st.closeStore(); err != nil {
			s.log.Warn("closing store", "err", redact.URLs(err.Error()))
		}
		return
	}
	for _, t := range retired {
		if err := t.backend.Close(); err != nil {
			s.log.Warn("closing backend", "policy", t.name, "err", err)
		}
	}
}

// Hurry moves a drain in progress (Run after its context ended) to its
// next stage at once: during the drain delay it ends the delay, so the
// listeners close now; once they are closed, it stops waiting for
// in-flight requests and cuts them off. slidegate serve calls it on each
// SIGINT or SIGTERM after the first. A call before Run's context ends
// skips the coming delay.
func (s *Server) Hurry() {
	select {
	case s.hurry <- struct{}{}:
	default: // one is pending already
	}
}

// Shutdown stops accepting connections, waits for in-flight requests until
// ctx ends, then closes the backends (stopping their sweepers). It returns
// ctx's error if requests were still running when it ended (they are then
// cut off). Shutdown is safe to call more than once.
func (s *Server) Shutdown(ctx context.Context) error {
	s.ready.Store(false)
	s.mu.Lock()
	srv, adminSrv, started := s.srv, s.adminSrv, s.started
	s.stopped = true
	s.mu.Unlock()
	var errs []error
	if started {
		if err := srv.Shutdown(ctx); err != nil {
			errs = append(errs, err)
			_ = srv.Close()
		}
		if adminSrv != nil {
			if err := adminSrv.Shutdown(ctx); err != nil {
				_ = adminSrv.Close()
			}
		}
	}
	s.closeBackends()
	return errors.Join(errs...)
}

// Close stops everything at once, cutting off in-flight requests.
func (s *Server) Close() error {
	s.ready.Store(false)
	s.mu.Lock()
	srv, adminSrv := s.srv, s.adminSrv
	s.stopped = true
	s.mu.Unlock()
	if srv != nil {
		_ = srv.Close()
	}
	if adminSrv != nil {
		_ = adminSrv.Close()
	}
	s.closeBackends()
	return nil
}

func (s *Server) closeBackends() {
	s.closeOnce.Do(func() {
		s.reload.Lock() // no reload after this
		defer s.reload.Unlock()
		s.tr.CloseIdleConnections()
		st := s.cur.Load()
		s.closeState(st, st.tiers)
		s.retired.Wait()
	})
}

// Run starts the server, serves until ctx is done (for slidegate serve:
// SIGINT or SIGTERM), then drains: /readyz answers 503 for DrainDelay
// while requests are still served, so that load balancers stop sending;
// then the listeners close and in-flight requests get ShutdownTimeout to
// finish. Hurry cuts both waits short. It returns nil after a clean
// shutdown.
func (s *Server) Run(ctx context.Context) error {
	if err := s.Start(); err != nil {
		s.closeBackends()
		return err
	}
	select {
	case <-ctx.Done():
	case err := <-s.serveErr:
		if errors.Is(err, http.ErrServerClosed) {
			return nil // Shutdown or Close was called directly
		}
		_ = s.Close()
		return fmt.Errorf("server: %w", err)
	}
	s.ready.Store(false)
	// From now on every response says Connection: close, so that a client
	// that keeps sending has no idle keep-alive connection left when the
	// listeners close (a request sent on one as the server closes it fails
	// with EOF or a reset). Not SetKeepAlivesEnabled(false): it closes the
	// idle connections at once, racing the requests clients are sending
	// on them.
	s.draining.Store(true)
	if d := *s.cfg.DrainDelay; d > 0 {
		s.log.Info("draining: /readyz answers 503; listeners close after the drain delay", "drain_delay", d.String())
		t := time.NewTimer(d)
		select {
		case <-t.C:
		case <-s.hurry:
			t.Stop()
			s.log.Info("drain cut short")
		}
	} else {
		select {
		case <-s.hurry: // the delay it would have ended is empty
		default:
		}
	}
	s.log.Info("shutting down", "timeout", s.cfg.ShutdownTimeout.String())
	sctx, cancel := context.WithTimeout(context.Background(), s.cfg.ShutdownTimeout)
	defer cancel()
	go func() {
		select {
		case <-s.hurry:
			s.log.Info("no longer waiting for in-flight requests: cutting them off")
			cancel()
		case <-sctx.Done():
		}
	}()
	if err := s.Shutdown(sctx); err != nil {
		return fmt.Errorf("server: shutdown: %w", err)
	}
	s.log.Info("stopped")
	return nil
}
