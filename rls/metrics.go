package rls

import (
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc/codes"

	"github.com/slidegate/slidegate/engine"
)

// Metric names, all prefixed slidegate_rls_. Rule metrics are labelled by
// domain and descriptor (Rule.Path: configured keys and values only, never
// a request's values, which are client identities).
const (
	MetricRequests  = "slidegate_rls_requests_total"
	MetricOverLimit = "slidegate_rls_over_limit_total"
	MetricNearLimit = "slidegate_rls_near_limit_total"
	MetricShadow    = "slidegate_rls_shadow_over_limit_total"
	// MetricGlobalShadow counts requests refused by their limits but
	// answered OK under WithShadowMode (the peer's global_shadow_mode).
	MetricGlobalShadow = "slidegate_rls_global_shadow_mode_total"
	MetricLatency      = "slidegate_rls_decision_duration_seconds"
	MetricErrors       = "slidegate_rls_errors_total"
	MetricKeys         = "slidegate_rls_keys"
	MetricInstants     = "slidegate_rls_stored_instants"
	MetricBytes        = "slidegate_rls_store_bytes"
	MetricSwept        = "slidegate_rls_swept_keys_total"
	// MetricOverflows counts requests for new keys decided without state
	// because a rule held its key cap (engine.WithMaxKeys).
	MetricOverflows = "slidegate_rls_key_overflows_total"
	// MetricAboveLog is 1 for each rule whose requests_per_unit is above
	// the exact log's cap, so that it runs on the sliding window counter.
	MetricAboveLog  = "slidegate_rls_rule_on_counter"
	labelDomain     = "domain"
	labelDescriptor = "descriptor"
	labelCode       = "code"
)

// latencyBuckets span an in-memory decision (a microsecond) to a slow
// remote store (a tenth of a second).
var latencyBuckets = []float64{
	1e-6, 2.5e-6, 5e-6, 10e-6, 25e-6, 50e-6, 100e-6, 250e-6, 500e-6,
	1e-3, 2.5e-3, 5e-3, 10e-3, 25e-3, 50e-3, 100e-3,
}

type ruleMetrics struct {
	requests, over, near, shadow prometheus.Counter
}

type metrics struct {
	latency *prometheus.HistogramVec
	errors  *prometheus.CounterVec
	// globalShadow counts requests answered OK by WithShadowMode.
	globalShadow prometheus.Counter
	rules        map[*Rule]ruleMetrics
	none         ruleMetrics // counts nothing: rules without metrics of their own
}

// newMetrics builds the service's metrics and registers them on reg (when
// not nil). Every child is resolved here, so that a decision does no label
// lookups.
func newMetrics(reg prometheus.Registerer, cfg *Config, b any) (*metrics, error) {
	labels := []string{labelDomain, labelDescriptor}
	requests := prometheus.NewCounterVec(prometheus.CounterOpts{Name: MetricRequests,
		Help: "Request descriptors that matched a rule, by domain and descriptor."}, labels)
	over := prometheus.NewCounterVec(prometheus.CounterOpts{Name: MetricOverLimit,
		Help: "Descriptors answered OVER_LIMIT, by domain and descriptor."}, labels)
	near := prometheus.NewCounterVec(prometheus.CounterOpts{Name: MetricNearLimit,
		Help: "Allowed descriptors that left their limit more than the near-limit ratio used, by domain and descriptor."}, labels)
	shadow := prometheus.NewCounterVec(prometheus.CounterOpts{Name: MetricShadow,
		Help: "Shadow-mode descriptors that would have been refused, by domain and descriptor."}, labels)
	m := &metrics{
		latency: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: MetricLatency,
			Help: "Time from receiving a ShouldRateLimit request to its answer, by domain.", Buckets: latencyBuckets},
			[]string{labelDomain}),
		errors: prometheus.NewCounterVec(prometheus.CounterOpts{Name: MetricErrors,
			Help: "Requests answered with a gRPC error instead of a decision, by status code."}, []string{labelCode}),
		globalShadow: prometheus.NewCounter(prometheus.CounterOpts{Name: MetricGlobalShadow,
			Help: "Requests their limits refused, answered OK in shadow mode (SHADOW_MODE)."}),
		rules: map[*Rule]ruleMetrics{},
		none:  ruleMetrics{requests: discard, over: discard, near: discard, shadow: discard},
	}
	aboveLog := prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: MetricAboveLog,
		Help: "1 for each rule whose requests_per_unit is above the exact log's cap (engine.MaxLogLimit): it runs on the sliding window counter, approximate."}, labels)
	for _, r := range cfg.rules {
		if r.aboveLog {
			aboveLog.WithLabelValues(r.Domain, r.Path).Set(1)
		}
	}
	cs := []prometheus.Collector{requests, over, near, shadow, m.latency, m.errors, m.globalShadow, aboveLog}
	if st, ok := b.(statser); ok {
		cs = append(cs, &statsCollector{st})
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
			requests: requests.WithLabelValues(r.Domain, r.Path),
			over:     over.WithLabelValues(r.Domain, r.Path),
			near:     near.WithLabelValues(r.Domain, r.Path),
			shadow:   shadow.WithLabelValues(r.Domain, r.Path),
		}
	}
	return m, nil
}

// discard is a counter no registry holds.
var discard = prometheus.NewCounter(prometheus.CounterOpts{Name: "slidegate_rls_discarded", Help: "Not exported."})

func (m *metrics) fail(c codes.Code) { m.errors.WithLabelValues(c.String()).Inc() }

// statser is implemented by backends that can report their memory
// (*engine.Group).
type statser interface{ Stats() engine.Stats }

// statsCollector exports the backend's engine.Stats at scrape time (an
// O(shards) read, never a request's cost).
type statsCollector struct{ b statser }

var (
	descKeys     = prometheus.NewDesc(MetricKeys, "Keys holding state, over every rule.", nil, nil)
	descInstants = prometheus.NewDesc(MetricInstants, "Log entries held, over every rule.", nil, nil)
	descBytes    = prometheus.NewDesc(MetricBytes, "Approximate heap bytes of keys, maps and per-key state, over every rule.", nil, nil)
	descSwept    = prometheus.NewDesc(MetricSwept, "Idle keys dropped by the sweeper since start.", nil, nil)
	descOverflow = prometheus.NewDesc(MetricOverflows, "Requests for new keys decided without state since start, because their rule held its key cap.", nil, nil)
)

func (c *statsCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- descKeys
	ch <- descInstants
	ch <- descBytes
	ch <- descSwept
	ch <- descOverflow
}

func (c *statsCollector) Collect(ch chan<- prometheus.Metric) {
	st := c.b.Stats()
	ch <- prometheus.MustNewConstMetric(descKeys, prometheus.GaugeValue, float64(st.Keys))
	ch <- prometheus.MustNewConstMetric(descInstants, prometheus.GaugeValue, float64(st.StoredInstants))
	ch <- prometheus.MustNewConstMetric(descBytes, prometheus.GaugeValue, float64(st.Bytes))
	ch <- prometheus.MustNewConstMetric(descSwept, prometheus.CounterValue, float64(st.Swept))
	ch <- prometheus.MustNewConstMetric(descOverflow, prometheus.CounterValue, float64(st.Overflows))
}
