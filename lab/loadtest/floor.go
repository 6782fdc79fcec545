package loadtest

import (
	"sync/atomic"
	"time"

	"github.com/slidegate/slidegate/lab/internal/latency"
)

// floorReport is the engine phase's workload run through the floor
// (package floor, every key inserted beforehand). It runs the same
// goroutines over the same key streams with the same timing bracket, in
// turn with the engine round by round, so that the engine's latency can
// be judged as a ratio that does not depend on the machine.
type floorReport struct {
	Decisions  int64           `json:"decisions"`
	DurationNs int64           `json:"duration_ns"`
	Throughput float64         `json:"decisions_per_sec"`
	Latency    latency.Summary `json:"latency"`
}

// floorWorker is engineWorker.run with the floor in place of the limiter:
// the first and then one in sampleEvery decisions timed, the key's bytes
// touched before the timed call as there. It returns the decisions made.
func floorWorker(d *engineDrive, seq []uint32, h *latency.Histogram) int64 {
	f, keys, sampleEvery, stop, done := d.fl, d.keys, d.sampleEvery, &d.stop, &d.done
	if stop.Load() {
		return 0
	}
	var touch byte
	var n int
	var counted int64
	countdown := 1
	i := 0
	for ; i < len(seq); i++ {
		if i&4095 == 0 && i > 0 {
			done.Add(4096)
			counted += 4096
			if stop.Load() {
				break
			}
		}
		key := keys[seq[i]]
		if countdown--; countdown == 0 {
			countdown = sampleEvery
			touch += key[0] + key[len(key)-1]
			t0 := time.Now()
			ok := f.Allow(key)
			h.Record(int64(time.Since(t0)))
			if ok {
				n++
			}
		} else if f.Allow(key) {
			n++
		}
	}
	done.Add(int64(i) - counted)
	floorSink.Add(int64(n) + int64(touch))
	return int64(i)
}

// floorSink keeps the floor's results live, so the compiler cannot drop
// the calls that produce them.
var floorSink atomic.Int64
