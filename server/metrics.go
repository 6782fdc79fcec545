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
)

// Metric names, all prefixed slidegate_.
const (
	MetricDecisions      = "slidegate_decisions_total"
	MetricLatency        = "slidegate_decision_duration_seconds"
	MetricBadRequests    = "slidegate_bad_requests_total"
	MetricKeys           = "slidegate_keys"
	MetricStoredInstants = "slidegate_stored_instants"
	MetricStoreBytes     = "slidegate_store_bytes"
	MetricSweptKeys      = "slidegate_swept_keys_total"
	MetricReloads        = "slidegate_config_reloads_total"
	MetricKeyOverflows   = "slidegate_key_overflows_total"
	MetricConnections    = "slidegate_open_connections"
	MetricConnCloses     = "slidegate_connections_closed_total"
	MetricBuildInfo      = "slidegate_build_info"
)

// latencyBuckets span an in-memory decision (~100 ns) to a slow remote
// store (tens of ms).
var latencyBuckets = []float64{
	100e-9, 250e-9, 500e-9,
	1e-6, 2.5e-6, 5e-6, 10e-6, 25e-6, 50e-6, 100e-6, 250e-6, 500e-6,
	1e-3, 2.5e-3, 5e-3, 10e-3, 25e-3, 50e-3, 100e-3,
}

type metrics struct {
	decisions *prometheus.CounterVec
	latency   *prometheus.HistogramVec
	bad       *prometheus.CounterVec
	reloads   *prometheus.CounterVec
	conns     *prometheus.GaugeVec
	// connCloses counts connections the listeners closed to stay within
	// their bounds.
	connCloses *prometheus.CounterVec
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
			Name:    MetricLatency,
			Help:    "Time the backend took to decide, by policy.",
			Buckets: latencyBuckets,
		}, []string{"policy"}),
		bad: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: MetricBadRequests,
			Help: "Requests answered with a 4xx error before any decision, by status code.",
		}, []string{"code"}),
		reloads: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: MetricReloads,
			Help: "Configuration reloads (SIGHUP), by result (success, failure).",
		}, []string{"result"}),
	}
	m.conns = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: MetricConnections,
		Help: "Open connections, by listener (main, admin); each is capped at max_conns.",
	}, []string{"listener"})
	m.connCloses = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: MetricConnCloses,
		Help: "Connections a listener closed to stay within its bounds, by listener and reason (per_address: over max_conns_per_ip; idle_evicted: an idle keep-alive closed near max_conns).",
	}, []string{"listener", "reason"})
	for _, l := range []string{"main", "admin"} {
		for _, r := range []string{connlimit.ReasonPerAddr, connlimit.ReasonIdle} {
			m.connCloses.WithLabelValues(l, r)
		}
	}
	m.reloads.WithLabelValues("success")
	m.reloads.WithLabelValues("failure")
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
		m.decisions, m.latency, m.bad, m.reloads, m.conns, m.connCloses, info,
		&statsCollector{policies: policies},
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
		latency: m.latency.WithLabelValues(name),
	}
}

// statser is implemented by backends that can report their memory
// (*engine.Limiter).
type statser interface {
	Stats() engine.Stats
}

// statsCollector exports engine.Stats per policy at scrape time. Stats
// adds up counters the store keeps on its write path, O(shards) per
// policy: a scrape costs the same at ten keys and at ten million.
type statsCollector struct {
	policies func() []*policy // the policies in force
}

var (
	descKeys = prometheus.NewDesc(MetricKeys,
		"Keys holding state.", []string{"policy"}, nil)
	descInstants = prometheus.NewDesc(MetricStoredInstants,
		"Log entries held (some may have expired since their key was last decided).", []string{"policy"}, nil)
	descBytes = prometheus.NewDesc(MetricStoreBytes,
		"Approximate heap bytes of keys, maps and per-key state.", []string{"policy"}, nil)
	descSwept = prometheus.NewDesc(MetricSweptKeys,
		"Idle keys dropped by the sweeper since start.", []string{"policy"}, nil)
	descOverflows = prometheus.NewDesc(MetricKeyOverflows,
		"Requests for new keys the max_keys cap turned away from tracking (refused, or admitted untracked), since start.", []string{"policy"}, nil)
)

func (c *statsCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- descKeys
	ch <- descInstants
	ch <- descBytes
	ch <- descSwept
	ch <- descOverflows
}

func (c *statsCollector) Collect(ch chan<- prometheus.Metric) {
	for _, t := range c.policies() {
		s, ok := t.backend.(statser)
		if !ok {
			continue
		}
		st := s.Stats()
		ch <- prometheus.MustNewConstMetric(descKeys, prometheus.GaugeValue, float64(st.Keys), t.name)
		ch <- prometheus.MustNewConstMetric(descInstants, prometheus.GaugeValue, float64(st.StoredInstants), t.name)
		ch <- prometheus.MustNewConstMetric(descBytes, prometheus.GaugeValue, float64(st.Bytes), t.name)
		ch <- prometheus.MustNewConstMetric(descSwept, prometheus.CounterValue, float64(st.Swept), t.name)
		ch <- prometheus.MustNewConstMetric(descOverflows, prometheus.CounterValue, float64(st.Overflows), t.name)
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
	if s.opts.tracing.Decision != nil {
		surface := "check"
		if st.cfg.Upstream != "" {
			surface = "gateway"
		}
		s.traceDecision(ev.Request.Context(), surface, ev.Policy, ev.Cost, ev.Decision, ev.Latency, ev.Err)
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
