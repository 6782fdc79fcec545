// Package enginestats exports engine.Stats as Prometheus metrics. The
// HTTP server (one set a policy) and the Envoy service (one set, policy
// empty) both export them through Collector, under the shared names of
// internal/metricnames.
package enginestats

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/slidegate/slidegate/engine"
	mn "github.com/slidegate/slidegate/internal/metricnames"
)

// Statser is implemented by backends that can report their memory
// (*engine.Limiter, *engine.Group).
type Statser interface{ Stats() engine.Stats }

// Collector exports engine.Stats at scrape time. Stats adds up counters
// the store keeps on its write path, O(shards) per backend: a scrape
// costs the same at ten keys and at ten million.
type Collector struct {
	keys, instants, bytes, swept, overflows *prometheus.Desc
	// each calls emit once per backend to export, with its policy
	// label.
	each func(emit func(policy string, st engine.Stats))
}

// New returns a collector whose series carry surface (mn.SurfaceHTTP or
// mn.SurfaceRLS) as a constant label and a policy label. each lists the
// backends at every scrape.
func New(surface string, each func(emit func(policy string, st engine.Stats))) *Collector {
	labels := []string{mn.LabelPolicy}
	c := mn.Surface(surface)
	return &Collector{
		keys:      prometheus.NewDesc(mn.Keys, mn.HelpKeys, labels, c),
		instants:  prometheus.NewDesc(mn.StoredInstants, mn.HelpStoredInstants, labels, c),
		bytes:     prometheus.NewDesc(mn.StoreBytes, mn.HelpStoreBytes, labels, c),
		swept:     prometheus.NewDesc(mn.SweptKeys, mn.HelpSweptKeys, labels, c),
		overflows: prometheus.NewDesc(mn.KeyOverflows, mn.HelpKeyOverflows, labels, c),
		each:      each,
	}
}

// Describe implements prometheus.Collector.
func (c *Collector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.keys
	ch <- c.instants
	ch <- c.bytes
	ch <- c.swept
	ch <- c.overflows
}

// Collect implements prometheus.Collector.
func (c *Collector) Collect(ch chan<- prometheus.Metric) {
	c.each(func(policy string, st engine.Stats) {
		ch <- prometheus.MustNewConstMetric(c.keys, prometheus.GaugeValue, float64(st.Keys), policy)
		ch <- prometheus.MustNewConstMetric(c.instants, prometheus.GaugeValue, float64(st.StoredInstants), policy)
		ch <- prometheus.MustNewConstMetric(c.bytes, prometheus.GaugeValue, float64(st.Bytes), policy)
		ch <- prometheus.MustNewConstMetric(c.swept, prometheus.CounterValue, float64(st.Swept), policy)
		ch <- prometheus.MustNewConstMetric(c.overflows, prometheus.CounterValue, float64(st.Overflows), policy)
	})
}
