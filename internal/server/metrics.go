package server

import (
	"fmt"
	"net"
	"net/http"
	"runtime"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/slidegate/slidegate/engine"
	"github.com/slidegate/slidegate/httplimit"
	"github.com/slidegate/slidegate/internal/connlimit"
	mn "github.com/slidegate/slidegate/internal/metricnames"
	"github.com/slidegate/slidegate/internal/server/enginestats"
)

// Metric names, all prefixed slidegate_. The names the Envoy service
// shares carry surface="http" here; see internal/metricnames.
const (
	MetricDecisions      = "slidegate_decisions_total"
	MetricLatency        = mn.DecisionDuration
	MetricBadRequests    = "slidegate_bad_requests_total"
	MetricKeys           = mn.Keys
	MetricStoredInstants = mn.StoredInstants
	MetricStoreBytes     = mn.StoreBytes
	MetricSweptKeys      = mn.SweptKeys
	MetricReloads        = mn.ConfigReloads
	MetricKeyOverflows   = mn.KeyOverflows
	MetricConnections    = "slidegate_open_connections"
	MetricConnCloses     = "slidegate_connections_closed_total"
	MetricConnErrors     = "slidegate_connection_errors_total"
	MetricBuildInfo      = "slidegate_build_info"
)

type metrics struct {
	decisions *prometheus.CounterVec
	latency   *prometheus.HistogramVec
	bad       *prometheus.CounterVec
	reloads   *prometheus.CounterVec
	conns     *prometheus.GaugeVec
	// connCloses counts connections the listeners closed to stay within
	// their bounds.
	connCloses *prometheus.CounterVec
	// connErrors counts the connection errors net/http logs (failed TLS
	// handshakes and the like), which the log throttles.
	connErrors *prometheus.CounterVec
}

// policyMetrics are one policy's children, resolved once so that the hot
// path does no label lookups.
type policyMetrics struct {
	allowed, refused, failed prometheus.Counter
	latency                  prometheus.Observer
}

func newMetrics(reg *prometheus.Registry, policies func() []*policy, build BuildInfo) (*metrics, error) {
	m := &metrics{
		decisions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: MetricDecisions,
			Help: "Decisions made, by policy and outcome (allowed, refused, error).",
		}, []string{"policy", "outcome"}),
		latency: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:        MetricLatency,
			Help:        mn.HelpDecisionDuration,
			Buckets:     mn.LatencyBuckets,
			ConstLabels: mn.Surface(mn.SurfaceHTTP),
		}, []string{mn.LabelPolicy, mn.LabelDomain}),
		bad: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: MetricBadRequests,
			Help: "Requests answered with a 4xx error before any decision, by status code.",
		}, []string{"code"}),
		reloads: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name:        MetricReloads,
			Help:        mn.HelpConfigReloads,
			ConstLabels: mn.Surface(mn.SurfaceHTTP),
		}, []string{mn.LabelResult}),
	}
	m.conns = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: MetricConnections,
		Help: "Open connections, by listener (main, admin); each is capped at max_conns.",
	}, []string{"listener"})
	m.connCloses = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: MetricConnCloses,
		Help: "Connections a listener closed to stay within its bounds, by listener and reason (per_address: over max_conns_per_ip; idle_evicted: an idle keep-alive closed near max_conns).",
	}, []string{"listener", "reason"})
	m.connErrors = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: MetricConnErrors,
		Help: "Connection errors, by listener and kind (tls_handshake, http2, other); the log shows at most one a second per kind.",
	}, []string{"listener", "kind"})
	for _, l := range []string{"main", "admin"} {
		for _, r := range []string{connlimit.ReasonPerAddr, connlimit.ReasonIdle} {
			m.connCloses.WithLabelValues(l, r)
		}
		for _, k := range []string{connErrTLS, connErrHTTP2, connErrOther} {
			m.connErrors.WithLabelValues(l, k)
		}
	}
	m.reloads.WithLabelValues(mn.ResultSuccess)
	m.reloads.WithLabelValues(mn.ResultFailure)
	if build.Version == "" {
		build.Version = "unknown"
	}
	info := prometheus.NewGauge(prometheus.GaugeOpts{
		Name: MetricBuildInfo,
		Help: "Always 1; the labels describe the running slidegate binary.",
		ConstLabels: prometheus.Labels{
			"version": build.Version, "commit": build.Commit, "date": build.Date, "goversion": runtime.Version(),
		},
	})
	info.Set(1)
	for _, c := range []prometheus.Collector{
		m.decisions, m.latency, m.bad, m.reloads, m.conns, m.connCloses, m.connErrors, info,
		enginestats.New(mn.SurfaceHTTP, policyStats(policies)),
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
		collectors.NewBuildInfoCollector(),
	} {
		// A store factory may have registered collectors of its own
		// first; a clash is reported, not panicked on.
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("server: registering metrics: %w", err)
		}
	}
	return m, nil
}

// connClosed counts the connections a listener closed itself, by reason
// (connlimit.ReasonPerAddr, connlimit.ReasonIdle).
func (m *metrics) connClosed(listener string) func(string) {
	perAddr := m.connCloses.WithLabelValues(listener, connlimit.ReasonPerAddr)
	idle := m.connCloses.WithLabelValues(listener, connlimit.ReasonIdle)
	return func(reason string) {
		if reason == connlimit.ReasonPerAddr {
			perAddr.Inc()
		} else {
			idle.Inc()
		}
	}
}

// connState counts a listener's open connections (http.Server.ConnState).
func (m *metrics) connState(listener string) func(net.Conn, http.ConnState) {
	g := m.conns.WithLabelValues(listener)
	return func(_ net.Conn, st http.ConnState) {
		switch st {
		case http.StateNew:
			g.Inc()
		case http.StateClosed, http.StateHijacked:
			g.Dec()
		}
	}
}

// forTier resolves one policy's children, once, so that the hot path
// does no label lookups.
func (m *metrics) forPolicy(name string) policyMetrics {
	return policyMetrics{
		allowed: m.decisions.WithLabelValues(name, "allowed"),
		refused: m.decisions.WithLabelValues(name, "refused"),
		failed:  m.decisions.WithLabelValues(name, "error"),
		latency: m.latency.WithLabelValues(name, ""),
	}
}

// policyStats lists, at each scrape, the policies in force whose backend
// reports its memory.
func policyStats(policies func() []*policy) func(func(string, engine.Stats)) {
	return func(emit func(string, engine.Stats)) {
		for _, t := range policies() {
			if s, ok := t.backend.(enginestats.Statser); ok {
				emit(t.name, s.Stats())
			}
		}
	}
}

// observe counts one decision.
func (s *Server) observe(t *policy, d engine.Decision, lat time.Duration, err error) {
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

// observeEvent counts one decision of the middleware.
func (s *Server) observeEvent(st *state, ev httplimit.Event) {
	if ev.Err == nil && !ev.Decision.Allowed {
		s.noteRefusal(ev.Policy, ev.Key, ev.Cost)
	}
	if s.opts.tracing.Decision != nil {
		surface := "check"
		if st.cfg.Upstream != "" {
			surface = "gateway"
		}
		s.traceDecision(ev.Request.Context(), surface, httplimit.Event{Policy: ev.Policy, Cost: ev.Cost, Decision: ev.Decision, Latency: ev.Latency, Err: ev.Err})
	}
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
func observeLimit(t *policy, allowed bool, lat time.Duration) {
	t.m.latency.Observe(lat.Seconds())
	if allowed {
		t.m.allowed.Inc()
	} else {
		t.m.refused.Inc()
	}
}
