package rls

import (
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc/codes"

	"github.com/slidegate/slidegate/engine"
	mn "github.com/slidegate/slidegate/internal/metricnames"
	"github.com/slidegate/slidegate/internal/server/enginestats"
)

// Metric names. The service's own are prefixed slidegate_rls_; those it
// shares with the HTTP server (internal/metricnames) carry surface="rls".
// The engine's statistics go by the shared names alone
// (internal/server/enginestats).
// Rule metrics are labelled by domain and descriptor (Rule.Path:
// configured keys and values only, never a request's values, which are
// client identities).
const (
	MetricRequests  = "slidegate_rls_requests_total"
	MetricOverLimit = "slidegate_rls_over_limit_total"
	MetricNearLimit = "slidegate_rls_near_limit_total"
	MetricShadow    = "slidegate_rls_shadow_over_limit_total"
	// MetricGlobalShadow counts requests refused by their limits but
	// answered OK under WithShadowMode (the peer's global_shadow_mode).
	MetricGlobalShadow = "slidegate_rls_global_shadow_mode_total"
	MetricLatency      = mn.DecisionDuration
	MetricErrors       = "slidegate_rls_errors_total"
	// MetricAboveLog is 1 for each rule whose requests_per_unit is above
	// the exact log's cap, so that it runs on the sliding window counter.
	MetricAboveLog  = "slidegate_rls_rule_on_counter"
	labelDomain     = "domain"
	labelDescriptor = "descriptor"
	labelCode       = "code"
)

type ruleMetrics struct {
	requests, over, near, shadow prometheus.Counter
	// name is the rule as WithRefusals names it: domain/descriptor.
	name string
}

type metrics struct {
	latency *prometheus.HistogramVec
	errors  *prometheus.CounterVec
	// globalShadow counts requests answered OK by WithShadowMode.
	globalShadow prometheus.Counter
	rules        map[*Rule]ruleMetrics
	none         ruleMetrics // counts nothing: rules without metrics of their own
}

// vectors are the service's counters and its latency histogram. A
// Reloader makes them once and gives them to every generation, so that
// they stay monotonic across reloads.
type vectors struct {
	requests, over, near, shadow, errors *prometheus.CounterVec
	latency                              *prometheus.HistogramVec
	globalShadow                         prometheus.Counter
}

func newVectors() *vectors {
	labels := []string{labelDomain, labelDescriptor}
	return &vectors{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{Name: MetricRequests,
			Help: "Request descriptors that matched a rule, by domain and descriptor."}, labels),
		over: prometheus.NewCounterVec(prometheus.CounterOpts{Name: MetricOverLimit,
			Help: "Descriptors answered OVER_LIMIT, by domain and descriptor."}, labels),
		near: prometheus.NewCounterVec(prometheus.CounterOpts{Name: MetricNearLimit,
			Help: "Allowed descriptors that left their limit more than the near-limit ratio used, by domain and descriptor."}, labels),
		shadow: prometheus.NewCounterVec(prometheus.CounterOpts{Name: MetricShadow,
			Help: "Shadow-mode descriptors that would have been refused, by domain and descriptor."}, labels),
		latency: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: MetricLatency,
			Help: mn.HelpDecisionDuration, Buckets: mn.LatencyBuckets, ConstLabels: mn.Surface(mn.SurfaceRLS)},
			[]string{mn.LabelPolicy, mn.LabelDomain}),
		errors: prometheus.NewCounterVec(prometheus.CounterOpts{Name: MetricErrors,
			Help: "Requests answered with a gRPC error instead of a decision, by status code."}, []string{labelCode}),
		globalShadow: prometheus.NewCounter(prometheus.CounterOpts{Name: MetricGlobalShadow,
			Help: "Requests their limits refused, answered OK in shadow mode (SHADOW_MODE)."}),
	}
}

func (v *vectors) collectors() []prometheus.Collector {
	return []prometheus.Collector{v.requests, v.over, v.near, v.shadow, v.latency, v.errors, v.globalShadow}
}

// newMetrics builds the service's metrics and registers them on reg (when
// not nil). v, when not nil, holds vectors registered elsewhere (a
// Reloader's); reg then gets only what belongs to this configuration.
// Every child is resolved here, so that a decision does no label lookups.
func newMetrics(reg prometheus.Registerer, cfg *Config, b any, v *vectors) (*metrics, error) {
	var cs []prometheus.Collector
	if v == nil {
		v = newVectors()
		cs = v.collectors()
	}
	m := &metrics{
		latency:      v.latency,
		errors:       v.errors,
		globalShadow: v.globalShadow,
		rules:        map[*Rule]ruleMetrics{},
		none:         ruleMetrics{requests: discard, over: discard, near: discard, shadow: discard, name: "(override)"},
	}
	aboveLog := prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: MetricAboveLog,
		Help: "1 for each rule whose requests_per_unit is above the exact log's cap (engine.MaxLogLimit): it runs on the sliding window counter, approximate."},
		[]string{labelDomain, labelDescriptor})
	for _, r := range cfg.rules {
		if r.aboveLog {
			aboveLog.WithLabelValues(r.Domain, r.Path).Set(1)
		}
	}
	cs = append(cs, aboveLog)
	if st, ok := b.(enginestats.Statser); ok {
		// The shared names keep the HTTP server's policy label (empty
		// here, which Prometheus drops), so that both surfaces fit on one
		// registry.
		cs = append(cs, enginestats.New(mn.SurfaceRLS, func(emit func(string, engine.Stats)) { emit("", st.Stats()) }))
	}
	if reg != nil {
		for _, c := range cs {
			if err := reg.Register(c); err != nil {
				return nil, fmt.Errorf("rls: registering metrics: %w", err)
			}
		}
	}
	for _, r := range cfg.rules {
		m.rules[r] = ruleMetrics{
			requests: v.requests.WithLabelValues(r.Domain, r.Path),
			over:     v.over.WithLabelValues(r.Domain, r.Path),
			near:     v.near.WithLabelValues(r.Domain, r.Path),
			shadow:   v.shadow.WithLabelValues(r.Domain, r.Path),
			name:     r.Domain + "/" + r.Path,
		}
	}
	return m, nil
}

// discard is a counter no registry holds.
var discard = prometheus.NewCounter(prometheus.CounterOpts{Name: "slidegate_rls_discarded", Help: "Not exported."})

func (m *metrics) fail(c codes.Code) { m.errors.WithLabelValues(c.String()).Inc() }

// withVectors makes a service count on v instead of vectors of its own.
func withVectors(v *vectors) Option { return func(o *options) { o.vecs = v } }
