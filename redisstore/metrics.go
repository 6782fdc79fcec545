package redisstore

import (
	"github.com/prometheus/client_golang/prometheus"
)

// metrics is the store's prometheus.Collector: register it on the
// server's registry (Store.Collector). Names start with slidegate_redis_.
type metrics struct {
	latency     prometheus.Histogram
	errors      *prometheus.CounterVec
	state       prometheus.Gauge
	transitions *prometheus.CounterVec
	cacheHits   prometheus.Counter
	fallbacks   *prometheus.CounterVec
}

var _ prometheus.Collector = (*metrics)(nil)

func newMetrics() *metrics {
	return &metrics{
		latency: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "slidegate_redis_call_duration_seconds",
			Help:    "Round-trip time of decision scripts sent to Redis, failures included.",
			Buckets: prometheus.ExponentialBuckets(50e-6, 2, 16), // 50µs .. 1.6s
		}),
		errors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "slidegate_redis_errors_total",
			Help: "Failed decision calls to Redis, by kind (timeout, connection, redis).",
		}, []string{"kind"}),
		state: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "slidegate_redis_breaker_state",
			Help: "Circuit breaker state: 0 closed, 1 open, 2 half-open.",
		}),
		transitions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "slidegate_redis_breaker_transitions_total",
			Help: "Circuit breaker state changes, by new state.",
		}, []string{"to"}),
		cacheHits: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "slidegate_redis_refusal_cache_hits_total",
			Help: "Requests refused by the local refusal cache without a round trip.",
		}),
		fallbacks: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "slidegate_redis_fallback_decisions_total",
			Help: "Decisions made by the failure policy because Redis could not decide, by policy (local, open, closed).",
		}, []string{"policy"}),
	}
}

func (m *metrics) Describe(ch chan<- *prometheus.Desc) {
	m.latency.Describe(ch)
	m.errors.Describe(ch)
	m.state.Describe(ch)
	m.transitions.Describe(ch)
	m.cacheHits.Describe(ch)
	m.fallbacks.Describe(ch)
}

func (m *metrics) Collect(ch chan<- prometheus.Metric) {
	m.latency.Collect(ch)
	m.errors.Collect(ch)
	m.state.Collect(ch)
	m.transitions.Collect(ch)
	m.cacheHits.Collect(ch)
	m.fallbacks.Collect(ch)
}
