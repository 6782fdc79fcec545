package rls

import (
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc/codes"
)

// Metric names, all prefixed slidegate_rls_. Rule metrics are labelled by
// domain and descriptor (Rule.Path: configured keys and values only, never
// a request's values, which are client identities).
const (
	MetricRequests  = "slidegate_rls_requests_total"
	MetricOverLimit = "slidegate_rls_over_limit_total"
	MetricNearLimit = "slidegate_rls_near_limit_total"
	MetricShadow    = "slidegate_rls_shadow_over_limit_total"
	MetricLatency   = "slidegate_rls_decision_duration_seconds"
	MetricErrors    = "slidegate_rls_errors_total"
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
	rules   map[*Rule]ruleMetrics
}

// newMetrics builds the service's metrics and registers them on reg (when
// not nil). Every child is resolved here, so that a decision does no label
// lookups.
func newMetrics(reg prometheus.Registerer, cfg *Config) (*metrics, error) {
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
		rules: map[*Rule]ruleMetrics{},
	}
	if reg != nil {
		for _, c := range []prometheus.Collector{requests, over, near, shadow, m.latency, m.errors} {
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

func (m *metrics) fail(c codes.Code) { m.errors.WithLabelValues(c.String()).Inc() }
