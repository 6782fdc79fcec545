package engine_test

import (
	"errors"
	"testing"

	"github.com/slidegate/slidegate/engine"
)

// Algorithm and Overflow print and parse the names configuration files
// use; every spelling Parse accepts, and its errors, are pinned here.
func TestEnumNames(t *testing.T) {
	for v, want := range map[engine.Algorithm]string{engine.SlidingLog: "log", engine.SlidingCounter: "counter", 7: "Algorithm(7)", -1: "Algorithm(-1)"} {
		if got := v.String(); got != want {
			t.Errorf("Algorithm %d: %q, want %q", int(v), got, want)
		}
	}
	for v, want := range map[engine.Overflow]string{engine.OverflowRefuse: "refuse", engine.OverflowAllow: "allow", 2: "Overflow(2)"} {
		if got := v.String(); got != want {
			t.Errorf("Overflow %d: %q, want %q", int(v), got, want)
		}
	}
	for s, want := range map[string]engine.Algorithm{
		"": engine.SlidingLog, "log": engine.SlidingLog, " Sliding-Log ": engine.SlidingLog, "sliding_log": engine.SlidingLog,
		"COUNTER": engine.SlidingCounter, "sliding-counter": engine.SlidingCounter, "sliding_counter": engine.SlidingCounter,
	} {
		if got, err := engine.ParseAlgorithm(s); err != nil || got != want {
			t.Errorf("ParseAlgorithm(%q) = %v, %v; want %v", s, got, err, want)
		}
	}
	for s, want := range map[string]engine.Overflow{"": engine.OverflowRefuse, " REFUSE": engine.OverflowRefuse, "allow": engine.OverflowAllow} {
		if got, err := engine.ParseOverflow(s); err != nil || got != want {
			t.Errorf("ParseOverflow(%q) = %v, %v; want %v", s, got, err, want)
		}
	}
	if _, err := engine.ParseAlgorithm("Algorithm(0)"); err == nil || err.Error() != `engine: unknown algorithm "Algorithm(0)" (want log or counter)` {
		t.Errorf("ParseAlgorithm of an unknown name: %v", err)
	}
	if _, err := engine.ParseOverflow("drop"); !errors.Is(err, engine.ErrInvalidOption) || err.Error() != `engine: invalid option: unknown overflow "drop" (want refuse or allow)` {
		t.Errorf("ParseOverflow of an unknown name: %v", err)
	}
}
