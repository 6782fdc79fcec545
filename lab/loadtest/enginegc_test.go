package loadtest

import (
	"fmt"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/slidegate/slidegate/engine"
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

// A worker's plot samples, sized before the phase, never grow while its
// decisions run: whatever the stream's length, the sampling and the
// plotting rates, and however the stream is cut into parts, every kept
// sample fits the room presizePoints gave.
func TestEnginePlotPointsPresized(t *testing.T) {
	lim, err := engine.New(engine.Policy{Limit: 5, Window: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer lim.Close()
	keys := []string{"a", "b", "c"}
	for _, n := range []int{1, 7, 8, 9, 100, 1001} {
		for _, sampleEvery := range []int{1, 3, 8} {
			for _, plotEvery := range []int64{1, 2, 5} {
				for _, parts := range []int{1, 4} {
					w := []engineWorker{{seq: make([]uint32, n)}}
					for i := range w[0].seq {
						w[0].seq[i] = uint32(i % len(keys))
					}
					d := &engineDrive{lim: lim, keys: keys, sampleEvery: sampleEvery, plotEvery: plotEvery, start: time.Now()}
					d.presizePoints(w)
					c := cap(w[0].points)
					for p := range parts {
						lo, hi := partRange(n, 0, 1, p, parts)
						w[0].run(d, lo, hi)
					}
					if len(w[0].points) == 0 || cap(w[0].points) != c {
						t.Errorf("%d decisions, one in %d timed, one in %d of those plotted, %d parts: %d samples kept, room %d, then %d",
							n, sampleEvery, plotEvery, parts, len(w[0].points), c, cap(w[0].points))
					}
				}
			}
		}
	}
}
