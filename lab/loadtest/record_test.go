package loadtest

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"

	"github.com/slidegate/slidegate/engine"
	"github.com/slidegate/slidegate/internal/reference"
	"github.com/slidegate/slidegate/lab/internal/latency"
)

// synthetic returns a correct decision log for the policies: decisions on
// a few keys at random instants (many equal, many on window boundaries),
// decided by the reference model itself.
func synthetic(policies []engine.Policy, n int) []record {
	rng := rand.New(rand.NewPCG(1, 2))
	models := make([]*reference.Log, len(policies))
	for i, p := range policies {
		models[i] = reference.NewLog(p.Limit, int64(p.Window))
	}
	var recs []record
	now := make(map[[2]int]int64)
	for range n {
		p := rng.IntN(len(policies))
		k := rng.IntN(5)
		t := now[[2]int{p, k}] + int64(rng.IntN(4))*int64(policies[p].Window)/4
		now[[2]int{p, k}] = t
		cost := 1 + rng.IntN(policies[p].Limit)
		r := models[p].Decide(clientKey(k), cost, t)
		recs = append(recs, makeRecord(uint8(p), uint32(k), cost, engine.Decision{
			Allowed: r.Allowed, Remaining: r.Remaining, At: t,
			RetryAfter: time.Duration(r.RetryAfter), Reset: time.Duration(r.Reset),
		}))
	}
	return recs
}

var testPolicies = []engine.Policy{
	{Name: "free", Limit: 3, Window: 10 * time.Second},
	{Name: "pro", Limit: 7, Window: 4 * time.Second},
}

func keyName(i uint32) string { return clientKey(int(i)) }

func TestVerifyCleanLog(t *testing.T) {
	recs := synthetic(testPolicies, 5000)
	v := verify(testPolicies, recs, keyName)
	if !v.OK() || v.Records != 5000 || v.Allowed == 0 || v.Refused == 0 {
		t.Fatalf("clean log: %+v", v)
	}
	if v.Allowed+v.Refused != v.Records {
		t.Errorf("allowed %d + refused %d != records %d", v.Allowed, v.Refused, v.Records)
	}
}

// A record whose cost no limiter may accept is a mismatch, not a crash.
func TestVerifyImpossibleCost(t *testing.T) {
	recs := synthetic(testPolicies, 200)
	recs[7].Cost = uint32(testPolicies[recs[7].Policy].Limit + 1)
	v := verify(testPolicies, recs, keyName)
	if v.OK() || v.Mismatches == 0 || v.Records != 200 {
		t.Fatalf("impossible cost passed: %+v", v)
	}
}

// firstWhere returns the index of the first record satisfying f.
func firstWhere(t *testing.T, recs []record, f func(record) bool) int {
	t.Helper()
	for i, r := range recs {
		if f(r) {
			return i
		}
	}
	t.Fatal("no such record")
	return -1
}

func TestVerifyDetectsPlantedFaults(t *testing.T) {
	t.Run("over-admission", func(t *testing.T) {
		recs := synthetic(testPolicies, 2000)
		// A refusal turned into an accept: the window now holds more than
		// the limit.
		i := firstWhere(t, recs, func(r record) bool { return !r.Allowed && r.Policy == 0 })
		recs[i].Allowed, recs[i].RetryAfter = true, 0
		v := verify(testPolicies, recs, keyName)
		if v.OverAdmissions < 1 || v.Mismatches < 1 || v.OK() {
			t.Fatalf("planted over-admission not found: %+v", v)
		}
	})
	t.Run("under-admission", func(t *testing.T) {
		recs := synthetic(testPolicies, 2000)
		// A lone request on a fresh key, refused although the window is
		// empty.
		recs = append(recs, record{Key: 99, Policy: 1, Cost: 1, At: 5, Allowed: false, Remaining: 7, RetryAfter: 1})
		v := verify(testPolicies, recs, keyName)
		if v.UnderAdmissions != 1 || v.Mismatches != 1 || v.OverAdmissions != 0 {
			t.Fatalf("planted under-admission: %+v", v)
		}
		if len(v.Examples) == 0 || !strings.Contains(strings.Join(v.Examples, "\n"), `"client-99"`) {
			t.Errorf("examples do not name the key: %q", v.Examples)
		}
	})
	t.Run("mismatch", func(t *testing.T) {
		recs := synthetic(testPolicies, 2000)
		// A field off by one: a replay mismatch, but no window is wrong.
		i := firstWhere(t, recs, func(r record) bool { return r.Allowed && r.Policy == 1 })
		recs[i].Reset++
		v := verify(testPolicies, recs, keyName)
		if v.Mismatches != 1 || v.OverAdmissions != 0 || v.UnderAdmissions != 0 {
			t.Fatalf("planted mismatch: %+v", v)
		}
	})
	t.Run("policy limits", func(t *testing.T) {
		// The same records replayed under swapped policies must fail:
		// each policy's records are checked against its own limit.
		recs := synthetic(testPolicies, 2000)
		swapped := []engine.Policy{testPolicies[1], testPolicies[0]}
		if v := verify(swapped, recs, keyName); v.OK() {
			t.Fatalf("records verified under the wrong policies: %+v", v)
		}
	})
}

func TestRecorder(t *testing.T) {
	r := newRecorder([]string{"free", "pro"}, 10, 4)
	d := engine.Decision{Allowed: true, Remaining: 2, At: 5}
	r.Add("free", clientKey(3), 1, d)
	r.Add("pro", "someone-else", 2, d)
	r.Add("pro", clientKey(12), 1, d) // beyond clients: interned
	r.Add("pro", "someone-else", 1, d)
	recs, err := r.Records()
	if err != nil || len(recs) != 4 {
		t.Fatalf("Records() = %d records, %v", len(recs), err)
	}
	if recs[0].Key != 3 || recs[0].Policy != 0 || recs[1].Policy != 1 || recs[1].Cost != 2 {
		t.Errorf("records %+v", recs[:2])
	}
	if recs[1].Key != recs[3].Key || r.keyName(recs[1].Key) != "someone-else" || r.keyName(recs[2].Key) != clientKey(12) {
		t.Errorf("interned keys: %+v", recs)
	}
	// An interned key is copied: the server hands the recorder a view of
	// a request buffer it reuses (recordingBackend.BorrowsKey).
	r4 := newRecorder([]string{"free"}, 10, 4)
	buf := []byte("borrowed")
	r4.Add("free", unsafe.String(&buf[0], len(buf)), 1, d)
	copy(buf, "reused!!")
	if recs, _ := r4.Records(); len(recs) != 1 || r4.keyName(recs[0].Key) != "borrowed" {
		t.Errorf("an interned key changed with the buffer it came from: %q", r4.keyName(recs[0].Key))
	}
	r.Add("free", clientKey(1), 1, d) // over the bound
	if _, err := r.Records(); !errors.Is(err, errRecordLimit) {
		t.Errorf("over the bound: %v", err)
	}
	r2 := newRecorder([]string{"free"}, 10, 4)
	r2.Add("gold", clientKey(1), 1, d)
	if _, err := r2.Records(); err == nil || !strings.Contains(err.Error(), "gold") {
		t.Errorf("unknown policy: %v", err)
	}
	// Several chunks, the last one cut at the bound: every record once,
	// in the order added.
	const n = 2*recordChunk + 5
	r3 := newRecorder([]string{"free"}, n, n)
	for i := range n + 1 {
		r3.Add("free", clientKey(i%n), 1, engine.Decision{At: int64(i)})
	}
	recs, err = r3.Records()
	if !errors.Is(err, errRecordLimit) || len(recs) != n {
		t.Fatalf("%d records, %v; want %d and the bound's error", len(recs), err, n)
	}
	for i, rec := range recs {
		if rec.At != int64(i) || rec.Key != uint32(i) {
			t.Fatalf("record %d: %+v", i, rec)
		}
	}
}

// TestReportPlumbing checks that planted faults reach the verdict, the
// exit status and the summary.
func TestReportPlumbing(t *testing.T) {
	recs := synthetic(testPolicies[:1], 1000)
	i := firstWhere(t, recs, func(r record) bool { return !r.Allowed })
	recs[i].Allowed = true
	v := verify(testPolicies[:1], recs, keyName)
	rep := &report{Config: DefaultConfig(), Engine: &engineReport{Verification: v}}
	rep.judge()
	if rep.OK || rep.Correct || !strings.HasPrefix(rep.Verdict, "correctness FAIL") || !strings.Contains(rep.Verdict, "over-admissions") {
		t.Fatalf("judge: OK=%v verdict %q", rep.OK, rep.Verdict)
	}
	var sb strings.Builder
	rep.writeText(&sb)
	if !strings.Contains(sb.String(), "over-admission key=") {
		t.Errorf("summary lacks the example:\n%s", sb.String())
	}

	// A phase that should have been verified but was not is a failure;
	// an external target is not.
	rep = &report{Config: DefaultConfig(), HTTP: &httpReport{Verification: verification{Reason: "loadtest: record limit reached"}}}
	rep.judge()
	if rep.OK {
		t.Error("unverified phase passed")
	}
	rep = &report{Config: DefaultConfig(), HTTP: &httpReport{Verification: verification{Reason: "external target: not visible"}}}
	rep.judge()
	if !rep.OK {
		t.Errorf("external target failed: %s", rep.Verdict)
	}
	// Responses that do not add up to the recorded decisions fail.
	rep = &report{Config: DefaultConfig(), HTTP: &httpReport{Verification: verification{Verified: true}, Disagreement: "clients saw 1 allowed"}}
	rep.judge()
	if rep.OK || !strings.Contains(rep.Verdict, "clients saw") {
		t.Errorf("disagreement passed: %s", rep.Verdict)
	}
	// A failed request fails the run.
	rep = &report{Config: DefaultConfig(), HTTP: &httpReport{Verification: verification{Verified: true}, Errors: 3, TargetRate: 1, Rate: 1}}
	rep.judge()
	if rep.OK || !strings.Contains(rep.Verdict, "3 requests failed") {
		t.Errorf("failed requests passed: %s", rep.Verdict)
	}
}

// TestStrictTargets: a missed target is reported as missed and fails the
// run only under --strict; correctness is judged apart.
func TestStrictTargets(t *testing.T) {
	good := verification{Verified: true, Records: 10}
	slow := func(strict bool) *report {
		cfg := DefaultConfig()
		cfg.Strict = strict
		// The floor's tails, measured in the same run, are what the
		// engine's are judged against.
		floor := &floorReport{Latency: latency.Summary{P99Ns: 1000, P999Ns: 2000}}
		return &report{Config: cfg, Engine: &engineReport{Verification: good, Latency: latency.Summary{P99Ns: 5000, P999Ns: 9000}, Floor: floor,
			Rounds: sameRounds(minJudgeRounds, 5000, 9000, 1000, 2000)}}
	}
	rep := slow(false)
	rep.judge()
	if !rep.OK || !rep.Correct || rep.TargetsMet || !strings.Contains(rep.Verdict, "correctness PASS") ||
		!strings.Contains(rep.Verdict, "2 of 2 missed") || !strings.Contains(rep.Verdict, "not enforced") {
		t.Errorf("lenient: ok=%v correct=%v met=%v %q", rep.OK, rep.Correct, rep.TargetsMet, rep.Verdict)
	}
	var sb strings.Builder
	rep.writeText(&sb)
	if !strings.Contains(sb.String(), "MISSED") || strings.Contains(sb.String(), "exit status 1") {
		t.Errorf("lenient summary:\n%s", sb.String())
	}
	rep = slow(true)
	rep.judge()
	if rep.OK || !rep.Correct || !strings.Contains(rep.Verdict, "targets FAIL (--strict)") {
		t.Errorf("strict: ok=%v correct=%v %q", rep.OK, rep.Correct, rep.Verdict)
	}
	sb.Reset()
	rep.writeText(&sb)
	if !strings.Contains(sb.String(), "exit status 1") {
		t.Errorf("strict summary:\n%s", sb.String())
	}
	// Met targets pass under --strict.
	rep = slow(true)
	rep.Engine.Latency = latency.Summary{P99Ns: 300, P999Ns: 900}
	rep.Engine.Rounds = sameRounds(minJudgeRounds, 300, 900, 1000, 2000)
	rep.judge()
	if !rep.OK || !rep.TargetsMet || !strings.Contains(rep.Verdict, "all 2 met") {
		t.Errorf("strict, met: ok=%v %q", rep.OK, rep.Verdict)
	}
}

// TestRecordSize pins the record at 40 bytes, as documented (--max-records).
func TestRecordSize(t *testing.T) {
	if n := unsafe.Sizeof(record{}); n != 40 {
		t.Errorf("Record is %d bytes, documented as 40", n)
	}
}

// TestTargetsAreRatios: the targets compare figures of the same run, so a
// slow machine that slows the engine and its floor alike meets them, a
// slow engine beside a fast floor misses them, and the absolute figures
// (an http p99 of seconds, a rate far below the one asked) are shown in
// the summary but never judged.
func TestTargetsAreRatios(t *testing.T) {
	good := verification{Verified: true, Records: 10}
	cfg := DefaultConfig()
	cfg.Strict = true
	slowMachine := &report{Config: cfg,
		Engine: &engineReport{Verification: good, Latency: latency.Summary{P99Ns: 40_000, P999Ns: 90_000},
			Floor:  &floorReport{Latency: latency.Summary{P99Ns: 30_000, P999Ns: 60_000}},
			Rounds: sameRounds(minJudgeRounds, 40_000, 90_000, 30_000, 60_000)},
		HTTP: &httpReport{Verification: good, TargetRate: 5000, Rate: 900, Latency: vegetaLatencies{P99Ns: int64(3 * time.Second)}},
	}
	slowMachine.judge()
	if !slowMachine.OK || !slowMachine.TargetsMet || len(slowMachine.Targets) != 2 {
		t.Errorf("slow machine: ok=%v met=%v targets %+v; %s", slowMachine.OK, slowMachine.TargetsMet, slowMachine.Targets, slowMachine.Verdict)
	}
	var sb strings.Builder
	slowMachine.writeText(&sb)
	if !strings.Contains(sb.String(), "p99 3000.00 ms") {
		t.Errorf("the http p99 is not shown:\n%s", sb.String())
	}
	slowEngine := &report{Config: cfg,
		Engine: &engineReport{Verification: good, Latency: latency.Summary{P99Ns: 900, P999Ns: 1200},
			Floor:  &floorReport{Latency: latency.Summary{P99Ns: 300, P999Ns: 700}},
			Rounds: sameRounds(minJudgeRounds, 900, 1200, 300, 700)},
	}
	slowEngine.judge()
	if slowEngine.OK || slowEngine.TargetsMet || !strings.Contains(slowEngine.Verdict, "1 of 2 missed") {
		t.Errorf("slow engine: ok=%v met=%v %s", slowEngine.OK, slowEngine.TargetsMet, slowEngine.Verdict)
	}
}

// TestCapacityNamesNoAbsentProfile: without --profile-dir the capacity
// section names no CPU profile; with one it names the file written.
func TestCapacityNamesNoAbsentProfile(t *testing.T) {
	var sb strings.Builder
	p := func(f string, a ...any) { fmt.Fprintf(&sb, f+"\n", a...) }
	c := &capacityReport{}
	c.writeText(p)
	if strings.Contains(sb.String(), "pprof") {
		t.Errorf("names a profile that was not written:\n%s", sb.String())
	}
	sb.Reset()
	c.CPUProfile = "profiles/capacity-cpu.pprof"
	c.writeText(p)
	if !strings.Contains(sb.String(), "go tool pprof -tags profiles/capacity-cpu.pprof") {
		t.Errorf("does not name the profile written:\n%s", sb.String())
	}
}

// sameRounds is n engine rounds with the same tails.
func sameRounds(n int, p99, p999, floorP99, floorP999 int64) []engineRound {
	out := make([]engineRound, n)
	for i := range out {
		out[i] = engineRound{EngineP99Ns: p99, EngineP999Ns: p999, FloorP99Ns: floorP99, FloorP999Ns: floorP999}
	}
	return out
}

// BenchmarkRecorderAdd is the harness's recording of one decision, as the
// capacity phase's server handlers make it, from parallel goroutines:
// what recording adds to the server's CPU per request. cpu-ns/op is the
// process's CPU per decision, which a loaded machine does not inflate as
// it does ns/op.
//
//	go test -run '^$' -bench RecorderAdd -benchmem ./loadtest
func BenchmarkRecorderAdd(b *testing.B) {
	keys := make([]string, 1<<12)
	for i := range keys {
		keys[i] = clientKey(i * 7919)
	}
	r := newRecorder([]string{"free"}, 1<<30, b.N+1)
	d := engine.Decision{Allowed: true, Remaining: 3, At: 1}
	var seed atomic.Int64
	b.ReportAllocs()
	cpu0 := cpuSeconds()
	b.RunParallel(func(pb *testing.PB) {
		i := seed.Add(1) << 10
		for pb.Next() {
			i++
			r.Add("free", keys[i&(1<<12-1)], 1, d)
		}
	})
	b.ReportMetric((cpuSeconds()-cpu0)/float64(b.N)*1e9, "cpu-ns/op")
}

// TestRecorderTakesNoLock: a decision for a client key under a known
// policy is recorded while the recorder's lock is held elsewhere (the
// recording of one server core's decisions never waits for the
// other's). Before, every Add took the lock.
func TestRecorderTakesNoLock(t *testing.T) {
	r := newRecorder([]string{"free"}, 10, 4)
	r.mu.Lock()
	added := make(chan struct{})
	go func() {
		defer close(added)
		r.Add("free", clientKey(3), 1, engine.Decision{Allowed: true})
	}()
	select {
	case <-added:
		r.mu.Unlock()
	case <-time.After(10 * time.Second): // a hang bound only
		r.mu.Unlock()
		<-added
		t.Fatal("Add waited for the recorder's lock")
	}
	if recs, err := r.Records(); err != nil || len(recs) != 1 || recs[0].Key != 3 {
		t.Fatalf("Records() = %+v, %v", recs, err)
	}
}

// TestRecorderConcurrent: decisions added from many goroutines, across
// chunks and past the bound, are each recorded once, and the overflow is
// reported.
func TestRecorderConcurrent(t *testing.T) {
	const workers, per = 8, recordChunk / 2
	const max = workers*per - 7
	r := newRecorder([]string{"free", "pro"}, workers*per, max)
	var wg sync.WaitGroup
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range per {
				k := w*per + i
				r.Add([]string{"free", "pro"}[k%2], clientKey(k), 1, engine.Decision{At: int64(k)})
			}
		}()
	}
	wg.Wait()
	recs, err := r.Records()
	if !errors.Is(err, errRecordLimit) || !strings.Contains(err.Error(), "7 decisions") || len(recs) != max {
		t.Fatalf("%d records, %v; want %d and 7 over the bound", len(recs), err, max)
	}
	seen := make([]bool, workers*per)
	for _, rec := range recs {
		if rec.At != int64(rec.Key) || int(rec.Policy) != int(rec.Key)%2 || seen[rec.Key] {
			t.Fatalf("record %+v: torn or repeated", rec)
		}
		seen[rec.Key] = true
	}
}
