// Package metricnames holds the names, labels and help texts of the
// metrics that the HTTP server and the Envoy rate limit service share.
// One quantity has one name; the surface label tells the two apart.
// Both surfaces can register on one registry (slidegate serve --grpc),
// which needs the same help text and label names for one name.
package metricnames

// Shared metric names.
const (
	Keys             = "slidegate_keys"
	StoredInstants   = "slidegate_stored_instants"
	StoreBytes       = "slidegate_store_bytes"
	SweptKeys        = "slidegate_swept_keys_total"
	KeyOverflows     = "slidegate_key_overflows_total"
	DecisionDuration = "slidegate_decision_duration_seconds"
	ConfigReloads    = "slidegate_config_reloads_total"
)

// Labels and their values.
const (
	// LabelSurface names the surface that made a series: SurfaceHTTP
	// (slidegate serve's policies) or SurfaceRLS (the Envoy service).
	LabelSurface = "surface"
	SurfaceHTTP  = "http"
	SurfaceRLS   = "rls"
	// LabelPolicy is the HTTP policy; empty on the rls surface.
	LabelPolicy = "policy"
	// LabelDomain is the Envoy domain; empty on the http surface.
	LabelDomain = "domain"
	// LabelResult is a reload's result: ResultSuccess or ResultFailure.
	LabelResult   = "result"
	ResultSuccess = "success"
	ResultFailure = "failure"
)

// Surface is the constant label set of the shared names' series on
// surface (SurfaceHTTP, SurfaceRLS); it converts to prometheus.Labels.
func Surface(surface string) map[string]string { return map[string]string{LabelSurface: surface} }

// Help texts.
const (
	HelpKeys             = "Keys holding state, by surface (http: per policy; rls: over every rule)."
	HelpStoredInstants   = "Log entries held, by surface (some may have expired since their key was last decided)."
	HelpStoreBytes       = "Approximate heap bytes of keys, maps and per-key state, by surface."
	HelpSweptKeys        = "Idle keys dropped by the sweeper since start, by surface."
	HelpKeyOverflows     = "Requests for new keys a key cap turned away from tracking since start, by surface (http: max_keys, refused or admitted untracked; rls: OVER_LIMIT)."
	HelpDecisionDuration = "Time to decide, by surface (http: the backend's time, by policy; rls: from receiving a request to its answer, by domain)."
	HelpConfigReloads    = "Configuration reloads, by surface and result (success, failure)."
)

// LatencyBuckets span an in-memory decision (~100 ns) to a slow remote
// store (a tenth of a second). Both surfaces use them, so that one
// histogram aggregates across surfaces.
var LatencyBuckets = []float64{
	100e-9, 250e-9, 500e-9,
	1e-6, 2.5e-6, 5e-6, 10e-6, 25e-6, 50e-6, 100e-6, 250e-6, 500e-6,
	1e-3, 2.5e-3, 5e-3, 10e-3, 25e-3, 50e-3, 100e-3,
}
