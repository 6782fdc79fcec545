package engine_test

import (
	"testing"

	"github.com/slidegate/slidegate/engine"
	"github.com/slidegate/slidegate/internal/backendtest"
)

// The engine runs the conformance suite every backend runs.
func TestConformance(t *testing.T) {
	backendtest.Run(t, func(t *testing.T, p engine.Policy, clk engine.Clock) engine.Backend {
		lim, err := engine.New(p, engine.WithClock(clk), engine.WithSweepInterval(0))
		if err != nil {
			t.Fatal(err)
		}
		return lim
	}, backendtest.Sizes{}, engine.SlidingLog, engine.SlidingCounter)
}

// The group runs the multi-limit suite.
func TestGroupConformance(t *testing.T) {
	backendtest.RunGroup(t, func(t *testing.T, ps []engine.Policy, clk engine.Clock) engine.GroupBackend {
		g, err := engine.NewGroup(ps, engine.WithClock(clk), engine.WithSweepInterval(0))
		if err != nil {
			t.Fatal(err)
		}
		return g
	}, backendtest.Sizes{})
}
