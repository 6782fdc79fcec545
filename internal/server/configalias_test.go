package server_test

import (
	"testing"

	"github.com/slidegate/slidegate/internal/server"
	"github.com/slidegate/slidegate/internal/server/config"
)

// TestTopCountersBounds: the view of the keys refused most (top.go) and
// the configuration that validates top_counters agree on its default and
// bound.
func TestTopCountersBounds(t *testing.T) {
	if server.DefaultTopCounters != config.DefaultTopCounters || server.MaxTopCounters != config.MaxTopCounters {
		t.Errorf("top_counters: the server's default %d and bound %d, the configuration's %d and %d",
			server.DefaultTopCounters, server.MaxTopCounters, config.DefaultTopCounters, config.MaxTopCounters)
	}
}
