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
	"net/netip"
	"net/url"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/slidegate/slidegate/engine"
	"github.com/slidegate/slidegate/httplimit"
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

// StoreFactory makes one backend per policy of spec, in order. The server
// closes each backend on shutdown.
type StoreFactory func(ctx context.Context, spec StoreSpec) ([]engine.Backend, error)

type options struct {
	clock  engine.Clock
	stores map[string]StoreFactory
	logger *slog.Logger
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

// tier is one policy: its backend, header writer and metrics.
type tier struct {
	name    string
	policy  engine.Policy
	backend engine.Backend
	hw      *httplimit.HeaderWriter
	m       tierMetrics
}

// Server is slidegate's HTTP server: the decision API (POST /v1/allow,
// /v1/allow/batch) or, with an upstream, a rate-limiting reverse proxy;
// and an admin listener with metrics, pprof and health checks.
//
// New builds it without listening; Start listens, Shutdown drains and
// Run does both around a context. Handler and AdminHandler serve without
// listeners, for embedding. A Server is safe for concurrent use; it is
// used once (Start after Shutdown fails).
type Server struct {
	cfg     Config
	opts    options
	log     *slog.Logger
	tiers   []*tier
	byName  map[string]*tier
	def     *tier
	reg     *prometheus.Registry
	metrics *metrics
	handler http.Handler
	admin   http.Handler
	mw      *httplimit.Middleware // gateway mode only
	tr      *http.Transport       // gateway mode only
	ready   atomic.Bool

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

// New builds a server for cfg: validates it, makes one backend per policy
// and wires the handlers. It does not listen (see Start). On error,
// nothing is left running.
func New(cfg Config, opts ...Option) (*Server, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	s := &Server{cfg: cfg, byName: map[string]*tier{}, reg: prometheus.NewRegistry()}
	for _, o := range opts {
		if o != nil {
			o(&s.opts)
		}
	}
	s.log = s.opts.logger
	if s.log == nil {
		s.log = slog.Default()
	}
	backends, err := s.makeBackends()
	if err != nil {
		return nil, err
	}
	ok := false
	defer func() {
		if !ok {
			for _, b := range backends {
				_ = b.Close()
			}
		}
	}()
	which := cfg.Headers.Which()
	for i, b := range backends {
		p := b.Policy()
		if p.Name != cfg.Policies[i].Name {
			return nil, fmt.Errorf("server: store made a backend for policy %q where %q was asked", p.Name, cfg.Policies[i].Name)
		}
		hw, err := httplimit.NewHeaderWriter(b, which)
		if err != nil {
			return nil, fmt.Errorf("server: policy %q: %w", p.Name, err)
		}
		t := &tier{name: p.Name, policy: p, backend: b, hw: hw}
		s.tiers = append(s.tiers, t)
		s.byName[t.name] = t
	}
	s.def = s.byName[cfg.DefaultPolicy]
	if s.metrics, err = newMetrics(s.reg, s.tiers); err != nil {
		return nil, err
	}
	if cfg.Upstream != "" {
		if s.handler, err = s.gatewayHandler(); err != nil {
			return nil, err
		}
	} else {
		s.handler = s.apiHandler()
	}
	s.admin = s.adminHandler()
	ok = true
	return s, nil
}

func (s *Server) makeBackends() ([]engine.Backend, error) {
	policies := make([]engine.Policy, len(s.cfg.Policies))
	for i, pc := range s.cfg.Policies {
		p, err := pc.Policy()
		if err != nil {
			return nil, err // Validate has checked
		}
		policies[i] = p
	}
	if s.cfg.Store == DefaultStore {
		var out []engine.Backend
		for _, p := range policies {
			var eopts []engine.Option
			if s.opts.clock != nil {
				eopts = append(eopts, engine.WithClock(s.opts.clock))
			}
			l, err := engine.New(p, eopts...)
			if err != nil {
				for _, b := range out {
					_ = b.Close()
				}
				return nil, fmt.Errorf("server: policy %q: %w", p.Name, err)
			}
			out = append(out, l)
		}
		return out, nil
	}
	u, _ := url.Parse(s.cfg.Store)
	f, ok := s.opts.stores[strings.ToLower(u.Scheme)]
	if !ok {
		known := []string{"memory"}
		for k := range s.opts.stores {
			known = append(known, k+"://")
		}
		sort.Strings(known[1:])
		return nil, fieldErr("store", "no backend for %q in this build (known: %s)", u.Scheme+"://", strings.Join(known, ", "))
	}
	bs, err := f(context.Background(), StoreSpec{
		URL: s.cfg.Store, Options: s.cfg.StoreOptions, Policies: policies,
		Clock: s.opts.clock, Registerer: s.reg, Logger: s.log,
	})
	if err != nil {
		return nil, fmt.Errorf("%w: store: %w", ErrConfig, err)
	}
	if len(bs) != len(policies) {
		for _, b := range bs {
			_ = b.Close()
		}
		return nil, fmt.Errorf("server: store made %d backends for %d policies", len(bs), len(policies))
	}
	return bs, nil
}

// Config returns the configuration in force, defaults filled in.
func (s *Server) Config() Config { return s.cfg }

// Registry returns the server's own Prometheus registry (what /metrics
// serves). Store factories and embedders may register more collectors.
func (s *Server) Registry() *prometheus.Registry { return s.reg }

// Backend returns the backend of a policy ("" for the default policy).
func (s *Server) Backend(policy string) (engine.Backend, bool) {
	if policy == "" {
		return s.def.backend, true
	}
	t, ok := s.byName[policy]
	if !ok {
		return nil, false
	}
	return t.backend, true
}

// Handler returns the main handler: the decision API, or the gateway.
func (s *Server) Handler() http.Handler { return s.handler }

// AdminHandler returns the admin handler: /metrics, /debug/pprof/,
// /healthz, /readyz.
func (s *Server) AdminHandler() http.Handler { return s.admin }

// observe counts one decision.
func (s *Server) observe(t *tier, key string, cost int, d engine.Decision, lat time.Duration, err error) {
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

// gatewayHandler decides every request with the middleware and proxies
// the allowed ones to the upstream.
func (s *Server) gatewayHandler() (http.Handler, error) {
	up, _ := url.Parse(s.cfg.Upstream)
	proxies, _ := httplimit.ParsePrefixes(s.cfg.TrustedProxies)
	ip := httplimit.ClientIP{TrustedProxies: proxies, IPv6Prefix: s.cfg.IPv6Prefix}
	kf, err := httplimit.ParseKeySpec(s.cfg.Key, ip)
	if err != nil {
		return nil, fieldErr("key", "%v", err)
	}
	opts := []httplimit.Option{
		httplimit.WithKeyFunc(kf),
		httplimit.WithDefaultTier(s.def.name),
		httplimit.WithHeaders(s.cfg.Headers.Which()),
		httplimit.WithShadow(s.cfg.Shadow),
		httplimit.WithErrorHandler(func(w http.ResponseWriter, r *http.Request, status int, err error) {
			if status < 500 {
				s.metrics.bad.WithLabelValues(fmt.Sprint(status)).Inc()
			}
			httplimit.WriteError(w, r, status, err)
		}),
		httplimit.WithObserver(func(ev httplimit.Event) {
			s.observe(s.byName[ev.Policy], ev.Key, ev.Cost, ev.Decision, ev.Latency, ev.Err)
		}),
	}
	if s.cfg.TierHeader != "" {
		opts = append(opts, httplimit.WithTierFunc(httplimit.HeaderTier(s.cfg.TierHeader)))
	}
	for _, t := range s.tiers {
		opts = append(opts, httplimit.WithBackend(t.backend))
	}
	mw, err := httplimit.New(opts...)
	if err != nil {
		return nil, fmt.Errorf("server: %w", err)
	}
	s.mw = mw
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.MaxIdleConns = 1024
	tr.MaxIdleConnsPerHost = 256
	s.tr = tr
	rp := &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.SetURL(up)
			// Keep the forwarding chain only when a trusted proxy sent it;
			// from anyone else it is a client's claim, and the upstream
			// sees just the address we saw.
			if xff := pr.In.Header["X-Forwarded-For"]; len(xff) > 0 {
				if peer, err := netip.ParseAddrPort(pr.In.RemoteAddr); err == nil && trusted(proxies, peer.Addr().Unmap()) {
					pr.Out.Header["X-Forwarded-For"] = append([]string(nil), xff...)
				}
			}
			pr.SetXForwarded()
		},
		Transport: tr,
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
			status := http.StatusBadGateway
			if errors.Is(err, context.DeadlineExceeded) {
				status = http.StatusGatewayTimeout
			}
			if errors.Is(err, context.Canceled) && r.Context().Err() != nil {
				return // the client went away
			}
			s.log.Warn("upstream request failed", "upstream", s.cfg.Upstream, "path", r.URL.Path, "err", err)
			httplimit.WriteError(w, r, status, fmt.Errorf("upstream %s: %w", up.Host, err))
		},
	}
	return mw.Handler(rp), nil
}

func trusted(proxies []netip.Prefix, a netip.Addr) bool {
	for _, p := range proxies {
		if p.Contains(a) {
			return true
		}
	}
	return false
}

func (s *Server) adminHandler() http.Handler {
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(s.reg, promhttp.HandlerOpts{Registry: s.reg}))
	mux.HandleFunc("/debug/pprof/", pprof.Index)
	mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
	mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
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
		IdleTimeout:       s.cfg.IdleTimeout,
		ErrorLog:          errLog,
	}
	s.serveErr = make(chan error, 2)
	go func() { s.serveErr <- s.srv.Serve(lis) }()
	if adminLis != nil {
		s.adminSrv = &http.Server{
			Handler:           s.admin,
			ReadHeaderTimeout: s.cfg.ReadTimeout,
			IdleTimeout:       s.cfg.IdleTimeout,
			ErrorLog:          errLog,
		}
		go func() { s.serveErr <- s.adminSrv.Serve(adminLis) }()
	}
	s.ready.Store(true)
	mode := "decision API"
	if s.cfg.Upstream != "" {
		mode = "gateway to " + s.cfg.Upstream
	}
	s.log.Info("slidegate serving", "listen", lis.Addr().String(), "admin", s.adminAddrLocked(), "mode", mode,
		"store", s.cfg.Store, "policies", len(s.tiers), "default_policy", s.def.name)
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
		if s.tr != nil {
			s.tr.CloseIdleConnections()
		}
		for _, t := range s.tiers {
			if err := t.backend.Close(); err != nil {
				s.log.Warn("closing backend", "policy", t.name, "err", err)
			}
		}
	})
}

// Run starts the server, serves until ctx is done (for slidegate serve:
// SIGINT or SIGTERM), then shuts down gracefully within ShutdownTimeout.
// It returns nil after a clean shutdown.
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
	s.log.Info("shutting down", "timeout", s.cfg.ShutdownTimeout.String())
	sctx, cancel := context.WithTimeout(context.Background(), s.cfg.ShutdownTimeout)
	defer cancel()
	if err := s.Shutdown(sctx); err != nil {
		return fmt.Errorf("server: shutdown: %w", err)
	}
	s.log.Info("stopped")
	return nil
}
