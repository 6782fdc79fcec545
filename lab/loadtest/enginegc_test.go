package loadtest

import (
	"fmt"
	"runtime"
	"strings"
	"testing"
)

// gcCycles counts collections: a forced one moves it.
func TestGCCyclesCounts(t *testing.T) {
	before := gcCycles()
	runtime.GC()
	if after := gcCycles(); after <= before {
		t.Fatalf("gcCycles %d after a collection, %d before", after, before)
	}
}

// A round during which a collection ended says so on its line, and on
// which side; a round without one says nothing of collections.
func TestEngineRoundShowsCollections(t *testing.T) {
	e := &engineReport{Parts: 4, Rounds: []engineRound{
		{Samples: 1, EngineP99Ns: 900, EngineP999Ns: 3000, FloorP99Ns: 900, FloorP999Ns: 1500, EngineGCs: 2, FloorGCs: 1},
		{Samples: 1, EngineP99Ns: 900, EngineP999Ns: 2000, FloorP99Ns: 900, FloorP999Ns: 1500},
	}}
	var lines []string
	e.writeText(func(format string, args ...any) { lines = append(lines, fmt.Sprintf(format, args...)) })
	var r1, r2 string
	for _, l := range lines {
		switch {
		case strings.Contains(l, "round 1:"):
			r1 = l
		case strings.Contains(l, "round 2:"):
			r2 = l
		}
	}
	if !strings.Contains(r1, "collections: engine 2, floor 1") {
		t.Errorf("round 1's line %q does not name its collections", r1)
	}
	if r2 == "" || strings.Contains(r2, "collections") {
		t.Errorf("round 2's line %q: want a line without collections", r2)
	}
}
