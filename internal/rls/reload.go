package rls

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/slidegate/slidegate/engine"
	mn "github.com/slidegate/slidegate/internal/metricnames"
	"github.com/slidegate/slidegate/internal/tick"
)

// Defaults of a Reloader.
const (
	// DefaultWatchInterval is how often Watch looks at the configuration's
	// files (envoyproxy/ratelimit reacts to file events; a poll of one
	// second puts a copied file in force within about as long).
	DefaultWatchInterval = time.Second
	// DefaultMaxOverrides bounds the distinct limit overrides
	// (RateLimitDescriptor.limit: requests_per_unit and unit) a service
	// decides, on any backend (and MemoryBackends keeps limiters for,
	// across reloads); a descriptor with a new one beyond it is decided
	// by its configured rule.
	DefaultMaxOverrides = 64
	// DefaultRetireAfter is how long a replaced configuration's backend
	// stays open for calls still in flight on it.
	DefaultRetireAfter = 10 * time.Second
	// DefaultRuleShards is the shard count of each rule's limiter in
	// MemoryBackends. Each shard holds a concurrent map whose empty table
	// is about 3 KB, so engine.DefaultShards (64) cost about 200 KB per
	// rule before any traffic; 8 keep a rule at about 30 KB, and the maps
	// are concurrent within a shard.
	DefaultRuleShards = 8
)

// BackendFactory builds the backend of a configuration's policies and
// what closes it once no call uses it (nil when the configuration has no
// policies).
type BackendFactory func(cfg *Config) (engine.GroupBackend, func(), error)

// MemoryBackends keeps one in-memory limiter per rule across reloads:
// a rule whose domain, path, limit, window and algorithm are unchanged
// keeps its limiter, and so its state. A limiter stops when no backend it
// made uses it any more. It is safe for concurrent use.
type MemoryBackends struct {
	mu        sync.Mutex
	opts      []engine.Option
	clock     engine.Clock
	limiters  map[ruleID]*memLimiter
	overrides map[overrideID]*engine.Limiter
	// One sweeper drops the idle keys of every limiter, where each
	// limiter would run a goroutine of its own; it starts with the first
	// limiter and stops on Close.
	stop, done chan struct{}
	lastSweep  map[*engine.Limiter]time.Time
}

type overrideID struct {
	limit  int64
	window time.Duration
}

type memLimiter struct {
	l    *engine.Limiter
	refs int
}

type ruleID struct {
	domain, path string
	limit        int
	window       time.Duration
	algo         engine.Algorithm
}

// NewMemoryBackends returns an empty set; opts are given to every limiter
// after a monotonic clock they all share, as a group needs, and after
// DefaultRuleShards shards. One goroutine sweeps every limiter's idle
// keys, each once per window (at least engine.MinSweepInterval, at most
// engine.DefaultMaxSweepInterval apart), until Close.
func NewMemoryBackends(opts ...engine.Option) *MemoryBackends {
	return &MemoryBackends{opts: opts, clock: engine.NewMonotonicClock(), limiters: map[ruleID]*memLimiter{},
		overrides: map[overrideID]*engine.Limiter{}, lastSweep: map[*engine.Limiter]time.Time{}}
}

// newLimiter makes a limiter for p, swept by m's sweeper. Precondition:
// m.mu is held.
func (m *MemoryBackends) newLimiter(p engine.Policy) (*engine.Limiter, error) {
	l, err := engine.New(p, append([]engine.Option{engine.WithClock(m.clock), engine.WithShards(DefaultRuleShards), engine.WithSweepInterval(0)}, m.opts...)...)
	if err != nil {
		return nil, err
	}
	m.lastSweep[l] = time.Now()
	if m.stop == nil {
		m.stop, m.done = make(chan struct{}), make(chan struct{})
		go m.sweep(m.stop, m.done)
	}
	return l, nil
}

// sweep sweeps each limiter once its window (clamped to
// [engine.MinSweepInterval, engine.DefaultMaxSweepInterval]) has passed
// since its last sweep.
func (m *MemoryBackends) sweep(stop <-chan struct{}, done chan<- struct{}) {
	defer close(done)
	t := time.NewTicker(engine.MinSweepInterval)
	defer t.Stop()
	var due []*engine.Limiter
	for {
		select {
		case <-stop:
			return
		case now := <-t.C:
			due = due[:0]
			m.mu.Lock()
			for l, last := range m.lastSweep {
				every := min(max(l.Policy().Window, engine.MinSweepInterval), engine.DefaultMaxSweepInterval)
				if now.Sub(last) >= every {
					due = append(due, l)
					m.lastSweep[l] = now
				}
			}
			m.mu.Unlock()
			for _, l := range due {
				l.Sweep() // outside the lock: a reload does not wait for it
			}
		}
	}
}

// Factory is the BackendFactory over m: what it returns to close the
// backend releases the backend's limiters.
func (m *MemoryBackends) Factory(cfg *Config) (engine.GroupBackend, func(), error) {
	if len(cfg.policies) == 0 {
		return nil, nil, nil
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	ids := make([]ruleID, len(cfg.policies))
	for _, r := range cfg.rules {
		if r.Policy >= 0 {
			p := cfg.policies[r.Policy]
			ids[r.Policy] = ruleID{r.Domain, r.Path, p.Limit, p.Window, p.Algorithm}
		}
	}
	release := func(ids []ruleID) {
		for _, id := range ids {
			ml, ok := m.limiters[id]
			if !ok {
				continue // closed by Close
			}
			if ml.refs--; ml.refs == 0 {
				_ = ml.l.Close()
				delete(m.limiters, id)
				delete(m.lastSweep, ml.l)
			}
		}
	}
	ls := make([]*engine.Limiter, len(ids))
	for i, id := range ids {
		ml, ok := m.limiters[id]
		if !ok {
			l, err := m.newLimiter(cfg.policies[i])
			if err != nil {
				release(ids[:i])
				return nil, nil, fmt.Errorf("rls: %w", err)
			}
			ml = &memLimiter{l: l}
			m.limiters[id] = ml
		}
		ml.refs++
		ls[i] = ml.l
	}
	g, err := engine.NewGroupOf(ls...)
	if err != nil {
		release(ids)
		return nil, nil, fmt.Errorf("rls: %w", err)
	}
	var once sync.Once
	return memGroup{Group: g, ls: ls, m: m}, func() {
		once.Do(func() {
			m.mu.Lock()
			defer m.mu.Unlock()
			release(ids)
		})
	}, nil
}

// Close stops the sweeper and every limiter, in use or not.
func (m *MemoryBackends) Close() error {
	m.mu.Lock()
	stop, done := m.stop, m.done
	m.stop = nil
	m.mu.Unlock()
	if stop != nil {
		close(stop)
		<-done
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	clear(m.lastSweep)
	for id, ml := range m.limiters {
		_ = ml.l.Close()
		delete(m.limiters, id)
	}
	for id, l := range m.overrides {
		_ = l.Close()
		delete(m.overrides, id)
	}
	return nil
}

// override returns the limiter of a descriptor's limit override (limit
// per window, limit ≥ 1, of policy p), made on first use; nil once
// DefaultMaxOverrides distinct ones exist.
func (m *MemoryBackends) override(limit int64, p engine.Policy) *engine.Limiter {
	m.mu.Lock()
	defer m.mu.Unlock()
	id := overrideID{limit, p.Window}
	if l, ok := m.overrides[id]; ok {
		return l
	}
	if len(m.overrides) >= DefaultMaxOverrides {
		return nil
	}
	l, err := m.newLimiter(p)
	if err != nil {
		return nil
	}
	m.overrides[id] = l
	return l
}

// memGroup is a group over MemoryBackends' limiters, which it does not
// own.
type memGroup struct {
	*engine.Group
	ls []*engine.Limiter
	m  *MemoryBackends
}

func (memGroup) Close() error { return nil }

// Reloader is a rate limit service whose configuration is read again when
// its files change (Watch) or when asked (Reload). Each configuration is a
// generation: its Service, its gauges and its backend; the counters span
// generations. A call is decided wholly by one generation, and a replaced
// one closes its backend after DefaultRetireAfter. A configuration that fails to load leaves the
// current one in force. It is safe for concurrent use.
type Reloader struct {
	rlsv3.UnimplementedRateLimitServiceServer

	load    func() (*Config, string, error) // the configuration and a digest of its files
	factory BackendFactory
	opts    []Option
	logger  *slog.Logger

	mu      sync.Mutex // serializes reloads and Close
	cur     atomic.Pointer[generation]
	sig     string // the files in force
	badSig  string // the files that last failed to load
	timers  []*time.Timer
	retire  []func()
	closed  bool
	reloads *prometheus.CounterVec
	vecs    *vectors             // every generation's counters, so that a reload keeps them
	vecReg  *prometheus.Registry // holds vecs
	changed func(*Config)        // called with each configuration put in force
}

type generation struct {
	svc   *Service
	reg   *prometheus.Registry
	close func()
}

// Metric names of a Reloader: reloads carry surface="rls" and a result,
// success or failure.
const (
	MetricReloads = mn.ConfigReloads
)

// NewReloader loads the configuration at path (a file, or a directory
// read as opts say, as LoadDir does), builds its backend with factory and
// its service with svcOpts, and returns the Reloader in force with it.
// The files are hashed before they are parsed: a reload whose files hold
// the same bytes leaves the configuration in force, and a look at files
// whose names, sizes, times and modes are unchanged opens none. reg,
// when not nil, gets the reload counter; Gather gathers the current
// generation's metrics.
func NewReloader(path string, opts LoadOptions, factory BackendFactory, reg prometheus.Registerer, logger *slog.Logger, svcOpts ...Option) (*Reloader, error) {
	if logger == nil {
		logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	r := &Reloader{load: loadFunc(path, opts), factory: factory, opts: svcOpts, logger: logger,
		reloads: prometheus.NewCounterVec(prometheus.CounterOpts{Name: MetricReloads,
			Help: mn.HelpConfigReloads, ConstLabels: mn.Surface(mn.SurfaceRLS)}, []string{mn.LabelResult}),
		vecs: newVectors(), vecReg: prometheus.NewRegistry()}
	r.reloads.WithLabelValues(mn.ResultSuccess)
	r.reloads.WithLabelValues(mn.ResultFailure)
	for _, c := range r.vecs.collectors() {
		if err := r.vecReg.Register(c); err != nil {
			return nil, fmt.Errorf("rls: registering metrics: %w", err)
		}
	}
	if reg != nil {
		if err := reg.Register(r.reloads); err != nil {
			return nil, fmt.Errorf("rls: registering metrics: %w", err)
		}
	}
	if _, err := r.Reload(); err != nil {
		return nil, err
	}
	return r, nil
}

// loadFunc returns the load function of NewReloader over LoadDir. It
// looks at the files' names, sizes, times and modes first, and reads
// them only when those changed; it parses them only when their contents
// changed. So an idle tick of Watch opens no file.
func loadFunc(path string, opts LoadOptions) func() (*Config, string, error) {
	var (
		mu      sync.Mutex
		lastFP  string
		lastSig string
		lastCfg *Config
		lastErr error
	)
	return func() (*Config, string, error) {
		mu.Lock()
		defer mu.Unlock()
		st, err := statFiles(path, opts)
		if err != nil {
			lastFP = ""
			return nil, "error\x00" + err.Error(), err
		}
		fp := fingerprint(st)
		if fp == lastFP {
			return lastCfg, lastSig, lastErr
		}
		data, err := readFiles(st)
		if err != nil {
			lastFP = ""
			return nil, "error\x00" + err.Error(), err
		}
		sig := signature(st, data)
		if sig != lastSig {
			lastCfg, lastErr = parseFiles(path, st, data, opts.Merge)
		}
		lastFP, lastSig = fp, sig
		return lastCfg, lastSig, lastErr
	}
}

// fingerprint digests the files' names, sizes, modification times,
// modes, inodes and change times: what changes when a file is written,
// replaced or swapped.
func fingerprint(st []fileStat) string {
	h := sha256.New()
	for _, f := range st {
		fmt.Fprintf(h, "%s\x00%d\x00%d\x00%d\x00%d\x00%d\x00", f.name, f.size, f.mod.UnixNano(), f.mode, f.ino, f.ctime)
	}
	return hex.EncodeToString(h.Sum(nil))
}

// signature digests the files' names and contents.
func signature(st []fileStat, data [][]byte) string {
	h := sha256.New()
	for i, f := range st {
		fmt.Fprintf(h, "%s\x00%d\x00", f.name, len(data[i]))
		h.Write(data[i])
	}
	return hex.EncodeToString(h.Sum(nil))
}

// Reload reads the configuration again and, when its files changed,
// puts it in force; it reports whether it did. On an error the current
// configuration stays.
func (r *Reloader) Reload() (bool, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return false, errors.New("rls: the reloader is closed")
	}
	cfg, sig, err := r.load()
	if r.cur.Load() != nil && (sig == r.sig || err != nil && sig == r.badSig) {
		return false, nil // unchanged, or the same broken files again
	}
	if err != nil {
		if r.cur.Load() != nil {
			r.badSig = sig
			r.reloads.WithLabelValues(mn.ResultFailure).Inc()
			r.logger.Error("envoy configuration not reloaded; the previous one stays in force", "err", err)
		}
		return false, err
	}
	b, closeB, err := r.factory(cfg)
	if err != nil {
		if r.cur.Load() != nil {
			r.reloads.WithLabelValues(mn.ResultFailure).Inc()
		}
		return false, err
	}
	if closeB == nil {
		closeB = func() {}
	}
	reg := prometheus.NewRegistry()
	svc, err := New(cfg, b, append(slices.Clone(r.opts), WithRegisterer(reg), withVectors(r.vecs))...)
	if err != nil {
		closeB()
		if r.cur.Load() != nil {
			r.reloads.WithLabelValues(mn.ResultFailure).Inc()
		}
		return false, err
	}
	old := r.cur.Swap(&generation{svc: svc, reg: reg, close: closeB})
	r.sig = sig
	if r.changed != nil {
		r.changed(cfg)
	}
	for _, w := range cfg.Warnings() {
		r.logger.Warn("envoy configuration", "warning", w)
	}
	if old != nil {
		r.reloads.WithLabelValues(mn.ResultSuccess).Inc()
		r.logger.Info("envoy configuration reloaded", "domains", cfg.Domains(), "rules", len(cfg.rules))
		r.retireLater(old.close)
	}
	return true, nil
}

// retireLater closes a replaced generation's backend once the calls in
// flight on it are done. Precondition: r.mu is held.
func (r *Reloader) retireLater(f func()) {
	var once sync.Once
	run := func() { once.Do(f) }
	r.retire = append(r.retire, run)
	r.timers = append(r.timers, time.AfterFunc(DefaultRetireAfter, run))
}

// OnChange calls f with the configuration in force now, and then with
// each configuration put in force, one call at a time (envoy serve's
// health follows whether any domain is configured). f must not call the
// Reloader's Reload or Close.
func (r *Reloader) OnChange(f func(*Config)) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.changed = f
	if g := r.cur.Load(); g != nil && f != nil {
		f(g.svc.Config())
	}
}

// Config returns the configuration in force.
func (r *Reloader) Config() *Config { return r.cur.Load().svc.Config() }

// ShouldRateLimit decides with the configuration in force.
func (r *Reloader) ShouldRateLimit(ctx context.Context, req *rlsv3.RateLimitRequest) (*rlsv3.RateLimitResponse, error) {
	return r.cur.Load().svc.ShouldRateLimit(ctx, req)
}

// Gather gathers the service's counters, kept across reloads, and the
// metrics of the configuration in force (a prometheus.Gatherer).
func (r *Reloader) Gather() ([]*dto.MetricFamily, error) {
	return prometheus.Gatherers{r.vecReg, r.cur.Load().reg}.Gather()
}

// countError counts a call answered with an error before it reached the
// service (a malformed or oversized message).
func (r *Reloader) countError(code string) { r.cur.Load().svc.m.errors.WithLabelValues(code).Inc() }

// Watch reloads whenever the configuration's files change, looking every
// interval (DefaultWatchInterval when 0), until ctx ends.
func (r *Reloader) Watch(ctx context.Context, interval time.Duration) {
	if interval <= 0 {
		interval = DefaultWatchInterval
	}
	// A failure is logged and counted once per content.
	tick.Every(ctx.Done(), interval, func() { _, _ = r.Reload() })
}

// Close closes every generation's backend; calls after it must not be
// made.
func (r *Reloader) Close() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return nil
	}
	r.closed = true
	for _, t := range r.timers {
		t.Stop()
	}
	for _, f := range r.retire {
		f()
	}
	if g := r.cur.Load(); g != nil {
		g.close()
	}
	return nil
}

// Dump renders the configuration's rules one a line, as
// envoyproxy/ratelimit's /rlconfig does: "domain.path: unit=MINUTE
// requests_per_unit=5, shadow_mode: false, quota_mode: false".
func (c *Config) Dump() string {
	var b strings.Builder
	for _, r := range c.rules {
		if r.Unlimited {
			fmt.Fprintf(&b, "%s.%s: unlimited, shadow_mode: %t, quota_mode: %t\n", r.Domain, r.Path, r.Shadow, r.Quota)
			continue
		}
		fmt.Fprintf(&b, "%s.%s: unit=%s requests_per_unit=%d, shadow_mode: %t, quota_mode: %t\n",
			r.Domain, r.Path, strings.ToUpper(r.Unit), r.Limit, r.Shadow, r.Quota)
	}
	return b.String()
}
