package main

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"sync"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"google.golang.org/grpc"
	"google.golang.org/grpc/health"
	"google.golang.org/protobuf/proto"

	"github.com/slidegate/slidegate/engine"
	"github.com/slidegate/slidegate/internal/connlimit"
	"github.com/slidegate/slidegate/internal/redact"
	"github.com/slidegate/slidegate/internal/rls"
	"github.com/slidegate/slidegate/internal/server"
	"github.com/slidegate/slidegate/internal/server/config"
	"github.com/slidegate/slidegate/telemetry"
)

// runnerSpec is what the Envoy rate limit service runs with, as
// slidegate serve --grpc and slidegate envoy serve build it.
type runnerSpec struct {
	config  string // a file, or a directory
	load    rls.LoadOptions
	factory rls.BackendFactory
	opts    []rls.Option
	// reg gets the reload counter and the listener's refusals.
	reg    prometheus.Registerer
	logger *slog.Logger
	addr   string
	conns  connlimit.Config
	tls    *tls.Config // nil: plaintext
	grpc   []grpc.ServerOption
	watch  time.Duration // how often the files are looked at
	// healthyWithConfig keeps health NOT_SERVING while no domain is
	// configured (the peer's HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED).
	healthyWithConfig bool
}

// envoyRunner is the Envoy rate limit service of both commands: one
// Reloader over the configuration's files, one gRPC listener, and one
// reload policy. SIGHUP reloads at once. A watch looks at the files
// every spec.watch; it hashes them before it parses, so bytes rewritten
// unchanged leave the rules in force. A file that fails to load leaves
// them in force too, and counts a failed reload.
type envoyRunner struct {
	r      *rls.Reloader
	gs     *grpc.Server
	hs     *health.Server
	addr   string
	logger *slog.Logger

	served   chan struct{} // closed when gs.Serve returns
	serveErr error         // gs.Serve's error, set before served closes

	health    *envoyHealth       // the configuration's and Redis's
	stopLoops context.CancelFunc // ends the watch, the SIGHUP loop and the health watcher
	loops     sync.WaitGroup
}

// startRunner loads the configuration, listens and serves. When ctx ends
// (the drain begins) health turns NOT_SERVING while calls are still
// answered. stop drains the calls; close closes the configurations'
// backends.
func startRunner(ctx context.Context, spec runnerSpec) (*envoyRunner, error) {
	r, err := rls.NewReloader(spec.config, spec.load, spec.factory, spec.reg, spec.logger, spec.opts...)
	if err != nil {
		return nil, err
	}
	lis, err := net.Listen("tcp", spec.addr)
	if err != nil {
		_ = r.Close()
		return nil, err
	}
	gs, hs := rls.NewGRPCServer(r, spec.grpc...)
	er := &envoyRunner{r: r, gs: gs, hs: hs, addr: lis.Addr().String(), logger: spec.logger, served: make(chan struct{}), health: newEnvoyHealth(hs)}
	r.OnChange(func(cfg *rls.Config) { er.health.setConfig(!spec.healthyWithConfig || len(cfg.Domains()) > 0) })
	// gRPC has no ConnState, so no idle connection is closed for another;
	// each closes after its idle lifetime.
	var glis net.Listener = connlimit.New(lis, spec.conns)
	if spec.tls != nil {
		// TLS on the listener, not as gRPC credentials, so that the guard
		// counts and throttles failed handshakes.
		tc := spec.tls.Clone()
		tc.NextProtos = []string{"h2"}
		glis = tls.NewListener(glis, tc)
	}
	// Failed handshakes and connections that are not HTTP/2 are counted
	// and logged throttled, before gRPC would log each one.
	glis = rls.GuardListener(glis, spec.reg, spec.logger)
	go func() {
		er.serveErr = gs.Serve(glis)
		close(er.served)
	}()
	// The loops run until stop, not until ctx ends: SIGHUP stays handled
	// through the drain.
	lctx, cancel := context.WithCancel(context.Background())
	er.stopLoops = cancel
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	er.loops.Add(3)
	go func() {
		defer er.loops.Done()
		r.Watch(lctx, spec.watch)
	}()
	go func() {
		defer er.loops.Done()
		defer signal.Stop(hup)
		for {
			select {
			case <-lctx.Done():
				return
			case <-hup:
				if changed, err := r.Reload(); err == nil {
					spec.logger.Info("SIGHUP: envoy configuration read", "changed", changed)
				}
			}
		}
	}()
	go func() {
		defer er.loops.Done()
		select {
		case <-ctx.Done():
		case <-lctx.Done():
		}
		hs.Shutdown()
	}()
	return er, nil
}

// healthy reports whether the configuration in force satisfies the
// health rule (spec.healthyWithConfig), and Redis is reachable when its
// health is followed.
func (er *envoyRunner) healthy() bool { return er.health.ok() }

// failed is closed when the gRPC server stops serving on its own; err
// then says why.
func (er *envoyRunner) failed() <-chan struct{} { return er.served }

func (er *envoyRunner) err() error { return er.serveErr }

// stop ends the reload loops, turns health NOT_SERVING, and lets calls in
// flight finish within timeout before cutting them.
func (er *envoyRunner) stop(timeout time.Duration) {
	er.stopLoops()
	er.loops.Wait()
	er.hs.Shutdown()
	drained := make(chan struct{})
	go func() { er.gs.GracefulStop(); close(drained) }()
	t := time.NewTimer(timeout)
	select {
	case <-drained:
		t.Stop()
	case <-t.C:
		er.logger.Warn("envoy rate limit service: calls still in flight at the shutdown timeout; cutting them")
		er.gs.Stop()
		<-drained
	}
	<-er.served
	if err := er.serveErr; err != nil && !errors.Is(err, net.ErrClosed) {
		er.logger.Error("envoy rate limit service", "err", err)
	}
}

// close closes every configuration's backend; no call may be made after
// it.
func (er *envoyRunner) close() {
	_ = er.r.Close()
	er.logger.Info("envoy rate limit service stopped")
}

// envoyStore is where the Envoy service's rules decide: the memory store
// (url empty or config.DefaultStore) capped at maxKeys keys per rule, or
// a Redis URL with its store options.
type envoyStore struct {
	url     string
	options map[string]any
	maxKeys int
}

// envoyBackends is the BackendFactory of both commands over es, and what
// closes what the factory keeps. The memory store keeps each rule's
// limiter across reloads; Redis builds a store per configuration, its
// metrics those of the one in force.
func envoyBackends(ctx context.Context, es envoyStore, tr *telemetry.Tracing, reg prometheus.Registerer, logger *slog.Logger) (rls.BackendFactory, func()) {
	store, options, maxKeys := es.url, es.options, es.maxKeys
	if store == "" || store == config.DefaultStore {
		mb := rls.NewMemoryBackends(engine.WithMaxKeys(maxKeys)) // a new key beyond it is refused: OVER_LIMIT
		return mb.Factory, func() { _ = mb.Close() }
	}
	storeMetrics := &latestCollector{}
	if err := reg.Register(storeMetrics); err != nil {
		logger.Warn("envoy store metrics", "err", err)
	}
	return func(cfg *rls.Config) (engine.GroupBackend, func(), error) {
		if len(cfg.Policies()) == 0 {
			return nil, nil, nil
		}
		st, err := tracedRedis(tr)(ctx, server.StoreSpec{URL: store, Options: options, Policies: cfg.Policies(), Logger: logger, Registerer: storeMetrics})
		if err != nil {
			return nil, nil, fmt.Errorf("store: %s", redact.URLs(err.Error()))
		}
		return rls.WithPeek(st.Group, st.Backends), func() { _ = st.Close() }, nil
	}, func() {}
}

// latestCollector is a prometheus.Registerer that keeps only the last
// collector registered on it, and a Collector that collects it: each
// configuration's Redis store registers its metrics here, and /metrics
// shows the store in force.
type latestCollector struct {
	mu sync.Mutex
	c  prometheus.Collector
}

func (l *latestCollector) Register(c prometheus.Collector) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.c = c
	return nil
}

func (l *latestCollector) MustRegister(cs ...prometheus.Collector) {
	for _, c := range cs {
		_ = l.Register(c)
	}
}

func (l *latestCollector) Unregister(prometheus.Collector) bool { return false }

// Describe sends nothing: the collector is unchecked, its metrics those of
// the store in force.
func (l *latestCollector) Describe(chan<- *prometheus.Desc) {}

func (l *latestCollector) Collect(ch chan<- prometheus.Metric) {
	l.mu.Lock()
	c := l.c
	l.mu.Unlock()
	if c != nil {
		c.Collect(ch)
	}
}

// gatherCollector collects what a Gatherer gathers, so that a Registry
// can serve it: the Reloader's metrics are those of the configuration
// in force at each scrape. It is unchecked (Describe sends nothing).
type gatherCollector struct{ g prometheus.Gatherer }

func (gatherCollector) Describe(chan<- *prometheus.Desc) {}

func (c gatherCollector) Collect(ch chan<- prometheus.Metric) {
	mfs, err := c.g.Gather()
	if err != nil {
		ch <- prometheus.NewInvalidMetric(prometheus.NewInvalidDesc(err), err)
	}
	for _, mf := range mfs {
		desc := prometheus.NewDesc(mf.GetName(), mf.GetHelp(), nil, nil)
		for _, m := range mf.GetMetric() {
			ch <- gatheredMetric{desc, m}
		}
	}
}

// gatheredMetric is one gathered metric, labels and value, as a
// prometheus.Metric.
type gatheredMetric struct {
	desc *prometheus.Desc
	m    *dto.Metric
}

func (g gatheredMetric) Desc() *prometheus.Desc { return g.desc }

func (g gatheredMetric) Write(out *dto.Metric) error {
	proto.Merge(out, g.m)
	return nil
}
