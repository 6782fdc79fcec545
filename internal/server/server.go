package server

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/slidegate/slidegate/engine"
	"github.com/slidegate/slidegate/httplimit"
	"github.com/slidegate/slidegate/internal/connlimit"
	"github.com/slidegate/slidegate/internal/httpkit"
	"github.com/slidegate/slidegate/internal/logthrottle"
	"github.com/slidegate/slidegate/internal/redact"
	"github.com/slidegate/slidegate/internal/server/config"
	"github.com/slidegate/slidegate/internal/tlsfiles"
	"github.com/slidegate/slidegate/internal/topk"
)

type options struct {
	clock   engine.Clock
	stores  map[string]StoreFactory
	logger  *slog.Logger
	build   BuildInfo
	tracing Tracing
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
	cfg      config.Config // as started: listeners, store and timeouts
	opts     options
	clock    engine.Clock // the memory store's one clock
	log      *slog.Logger
	flood    *logthrottle.Logger // store and upstream failures, once a second per cause
	cur      atomic.Pointer[state]
	reg      *prometheus.Registry
	metrics  *metrics
	adminOps *prometheus.CounterVec // admin key operations (admin.go)
	top      *topk.Tracker          // the keys refused most (top.go)
	handler  http.Handler
	admin    http.Handler
	tr       *http.Transport
	certs    *tlsfiles.Certs // nil: plain HTTP
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
	connLis   *connlimit.Listener // lis, bounded; its exemptions follow trusted_proxies
	adminLis  net.Listener
	serveErr  chan error
	closeOnce sync.Once
}

// New builds a server for cfg: validates it, makes one backend per policy
// and wires the handlers. It does not listen (see Start). On error,
// nothing is left running.
func New(cfg config.Config, opts ...Option) (*Server, error) {
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
	s.flood = logthrottle.New(s.log, logthrottle.DefaultInterval)
	s.top = topk.New(int(cfg.TopCounters), topk.DefaultEpoch, topk.DefaultEpochs, s.clock.Now)
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.MaxIdleConns = 1024
	tr.MaxIdleConnsPerHost = 256
	tr.ResponseHeaderTimeout = time.Duration(cfg.UpstreamHeaderTimeout)
	s.tr = tr
	if t := cfg.TLS; t.CertFile != "" {
		if s.certs, err = tlsfiles.Load(tlsfiles.Files{Cert: t.CertFile, Key: t.KeyFile, ClientCA: t.ClientCAFile}); err != nil {
			return nil, fmt.Errorf("%w: %w", config.ErrConfig, err)
		}
	}
	if s.adminOps, err = newAdminKeyOps(s.reg); err != nil {
		return nil, err
	}
	if s.metrics, err = newMetrics(s.reg, s.policiesNow, s.opts.build); err != nil {
		return nil, err
	}
	st, err := s.build(cfg, nil)
	if err != nil {
		return nil, err
	}
	s.cur.Store(st)
	s.handler = http.HandlerFunc(s.serveHTTP)
	if wrap := s.opts.tracing.Handler; wrap != nil {
		s.handler = wrap(surface(cfg), s.handler)
	}
	s.admin = s.adminHandler()
	return s, nil
}

// policiesNow returns the policies in force, for the metrics collector.
func (s *Server) policiesNow() []*policy {
	if st := s.cur.Load(); st != nil {
		return st.policies
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

// Config returns the configuration in force, defaults filled in.
func (s *Server) Config() config.Config { return s.cur.Load().cfg }

// Registry returns the server's own Prometheus registry (what /metrics
// serves). Store factories and embedders may register more collectors.
func (s *Server) Registry() *prometheus.Registry { return s.reg }

// policyNamed returns a policy ("" for the default policy) of the
// configuration in force.
func (s *Server) policyNamed(policy string) (*policy, bool) {
	st := s.cur.Load()
	if policy == "" {
		return st.def, true
	}
	t, ok := st.byName[policy]
	return t, ok
}

// Handler returns the main handler: the decision API, or the gateway.
func (s *Server) Handler() http.Handler { return s.handler }

// AdminHandler returns the admin handler: /metrics, /debug/pprof/,
// /healthz, /readyz, /admin/keys.
func (s *Server) AdminHandler() http.Handler { return s.admin }

// failInternal answers a request the server could not decide or proxy
// (a 5xx): the client gets a generic message, the log the detail, so that
// no backend error or internal address reaches a client.
func (s *Server) failInternal(w http.ResponseWriter, r *http.Request, status int, msg string, err error) {
	e := redact.URLs(err.Error())
	s.flood.Log(slog.LevelWarn, failureCause(msg, status, e), msg, "status", status, "method", r.Method, "path", r.URL.Path, "err", e)
	httplimit.WriteError(w, r, status, errors.New(msg))
}

// failureCause names a failure for the log's throttle: what failed, the
// status and the error's text (its first 200 bytes).
func failureCause(msg string, status int, err string) string {
	if len(err) > 200 {
		err = err[:200]
	}
	return msg + "\x00" + strconv.Itoa(status) + "\x00" + err
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
