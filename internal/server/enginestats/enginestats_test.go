package enginestats_test

import (
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/slidegate/slidegate/engine"
	mn "github.com/slidegate/slidegate/internal/metricnames"
	"github.com/slidegate/slidegate/internal/server/enginestats"
)

// TestCollector: each backend listed at a scrape gives the five shared
// series, with its policy label and the surface's constant label, and
// both surfaces fit on one registry (slidegate serve --grpc).
func TestCollector(t *testing.T) {
	reg := prometheus.NewRegistry()
	http := enginestats.New(mn.SurfaceHTTP, func(emit func(string, engine.Stats)) {
		emit("free", engine.Stats{Keys: 3, StoredInstants: 5, Bytes: 700, Swept: 2, Overflows: 1})
		emit("paid", engine.Stats{Keys: 1})
	})
	rls := enginestats.New(mn.SurfaceRLS, func(emit func(string, engine.Stats)) {
		emit("", engine.Stats{Keys: 4, StoredInstants: 6, Bytes: 800, Swept: 7, Overflows: 9})
	})
	for _, c := range []prometheus.Collector{http, rls} {
		if err := reg.Register(c); err != nil {
			t.Fatal(err)
		}
	}
	want := `
# HELP slidegate_keys ` + mn.HelpKeys + `
# TYPE slidegate_keys gauge
slidegate_keys{policy="free",surface="http"} 3
slidegate_keys{policy="paid",surface="http"} 1
slidegate_keys{policy="",surface="rls"} 4
# HELP slidegate_stored_instants ` + mn.HelpStoredInstants + `
# TYPE slidegate_stored_instants gauge
slidegate_stored_instants{policy="free",surface="http"} 5
slidegate_stored_instants{policy="paid",surface="http"} 0
slidegate_stored_instants{policy="",surface="rls"} 6
# HELP slidegate_store_bytes ` + mn.HelpStoreBytes + `
# TYPE slidegate_store_bytes gauge
slidegate_store_bytes{policy="free",surface="http"} 700
slidegate_store_bytes{policy="paid",surface="http"} 0
slidegate_store_bytes{policy="",surface="rls"} 800
# HELP slidegate_swept_keys_total ` + mn.HelpSweptKeys + `
# TYPE slidegate_swept_keys_total counter
slidegate_swept_keys_total{policy="free",surface="http"} 2
slidegate_swept_keys_total{policy="paid",surface="http"} 0
slidegate_swept_keys_total{policy="",surface="rls"} 7
# HELP slidegate_key_overflows_total ` + mn.HelpKeyOverflows + `
# TYPE slidegate_key_overflows_total counter
slidegate_key_overflows_total{policy="free",surface="http"} 1
slidegate_key_overflows_total{policy="paid",surface="http"} 0
slidegate_key_overflows_total{policy="",surface="rls"} 9
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want)); err != nil {
		t.Error(err)
	}
}
