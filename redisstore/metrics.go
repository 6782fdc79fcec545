package redisstore

import (
	"github.com/prometheus/client_golang/prometheus"
	"github.com/slidegate/slidegate/internal/clientcore"
)

// metrics is the store's prometheus.Collector: register it on the
// server's registry (Store.Collector). Names start with slidegate_redis_.
// Every label value known in advance exists from start-up at zero (error
// kinds, failure policies, and each node's series when the node is first
// seen), so that rate() and alerts see a counter before its first
// increment.
type metrics struct {
	latency     prometheus.Histogram
	errors      *prometheus.CounterVec
	unknown     prometheus.Counter
	state       *prometheus.GaugeVec
	transitions *prometheus.CounterVec
	cacheHits   prometheus.Counter
	fallbacks   *prometheus.CounterVec
	slow        prometheus.Counter
	givebacks   *prometheus.CounterVec
	restarts    *prometheus.CounterVec
	evictions   *prometheus.CounterVec
	unchecked   *prometheus.GaugeVec
}

var _ prometheus.Collector = (*metrics)(nil)

// errorKinds are the values of the errors metric's kind label.
var errorKinds = []string{"timeout", "connection", "redis"}

func newMetrics(fp FailurePolicy) *metrics {
	m := &metrics{
		latency: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "slidegate_redis_call_duration_seconds",
			Help:    "Round-trip time of decision scripts sent to Redis, failures included.",
			Buckets: prometheus.ExponentialBuckets(50e-6, 2, 16), // 50µs .. 1.6s
		}),
		errors: counterVec("slidegate_redis_errors_total",
			"Failed decision calls to Redis, by kind (timeout, connection, redis).", "kind"),
		unknown: counter("slidegate_redis_unknown_outcomes_total",
			"Decisions whose call to Redis failed but may have run on the server anyway (deadline, cancellation, connection lost after sending), one per decision of a batch call: their entries may count although the request got no decision from Redis."),
		state: gaugeVec("slidegate_redis_breaker_state",
			"Circuit breaker state per Redis node (master address): 0 closed, 1 open, 2 half-open.", "node"),
		transitions: counterVec("slidegate_redis_breaker_transitions_total",
			"Circuit breaker state changes per Redis node, by new state.", "node", "to"),
		cacheHits: counter("slidegate_redis_refusal_cache_hits_total",
			"Requests refused by the local refusal cache without a round trip."),
		fallbacks: counterVec("slidegate_redis_fallback_decisions_total",
			"Decisions made by the failure policy because Redis could not decide, by failure policy (local, open, closed).", "failure_policy"),
		slow: counter("slidegate_redis_slow_refusals_total",
			"Requests refused without a decision from Redis because their call missed the timeout while the node answered a liveness probe (overload, not an outage; FailLocal): the script may have run, so no local decision is made."),
		givebacks: counterVec("slidegate_redis_givebacks_total",
			"Keys of refused cross-slot group requests whose entries were given back, by result: ok, expired (nothing left to give back), failed (the entries count until they expire).", "result"),
		restarts: counterVec("slidegate_redis_node_restarts_total",
			"Restarts of a Redis node seen by its run id changing; without persistence every limit it held is lost.", "node"),
		evictions: counterVec("slidegate_redis_evicted_keys_total",
			"Keys a Redis node evicted (its evicted_keys), any key of the database; an evicted limiter key is a forgotten limit.", "node"),
		unchecked: gaugeVec("slidegate_redis_unchecked",
			"1 for each start-up check of a Redis node the store could not make, because the server denies the command (managed services rename or disable CONFIG, some restrict INFO): maxmemory_policy, version, restarts (INFO), cluster_require_full_coverage (CONFIG GET).", "node", "check"),
	}
	for _, k := range errorKinds {
		m.errors.WithLabelValues(k)
	}
	m.fallbacks.WithLabelValues(fp.String())
	for _, r := range []string{"ok", "expired", "failed"} {
		m.givebacks.WithLabelValues(r)
	}
	return m
}

// initNode creates a node's series at zero.
func (m *metrics) initNode(addr string) {
	m.state.WithLabelValues(addr).Set(0)
	for _, to := range []clientcore.State{clientcore.StateClosed, clientcore.StateOpen, clientcore.StateHalfOpen} {
		m.transitions.WithLabelValues(addr, to.String())
	}
	m.restarts.WithLabelValues(addr)
	m.evictions.WithLabelValues(addr)
}

// all lists the collectors, for Describe and Collect.
func (m *metrics) all() []prometheus.Collector {
	return []prometheus.Collector{m.latency, m.errors, m.unknown, m.state, m.transitions, m.cacheHits,
		m.fallbacks, m.slow, m.givebacks, m.restarts, m.evictions, m.unchecked}
}

func (m *metrics) Describe(ch chan<- *prometheus.Desc) {
	for _, c := range m.all() {
		c.Describe(ch)
	}
}

func (m *metrics) Collect(ch chan<- prometheus.Metric) {
	for _, c := range m.all() {
		c.Collect(ch)
	}
}

// counter, counterVec and gaugeVec make one metric each.
func counter(name, help string) prometheus.Counter {
	return prometheus.NewCounter(prometheus.CounterOpts{Name: name, Help: help})
}

func counterVec(name, help string, labels ...string) *prometheus.CounterVec {
	return prometheus.NewCounterVec(prometheus.CounterOpts{Name: name, Help: help}, labels)
}

func gaugeVec(name, help string, labels ...string) *prometheus.GaugeVec {
	return prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: name, Help: help}, labels)
}
