package peers

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/slidegate/slidegate/lab/internal/latency"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m,
		// ulule's memory store stops its cleaner from a finalizer only.
		goleak.IgnoreTopFunction("github.com/ulule/limiter/v3/drivers/store/memory.(*cleaner).Run"),
		goleak.IgnoreAnyFunction("github.com/ulule/limiter/v3/drivers/store/memory.(*cleaner).Run"))
}

func newPeer(t *testing.T, p Peer, limit int, window time.Duration) Limiter {
	t.Helper()
	l, err := p.New(limit, window)
	if err != nil {
		t.Fatalf("%s: %v", p.Name, err)
	}
	t.Cleanup(func() {
		if err := l.Close(); err != nil {
			t.Errorf("%s: Close: %v", p.Name, err)
		}
	})
	return l
}

// Every design admits a burst of L from an idle key and refuses the next
// request at once (token buckets start full, GCRA with MaxBurst L−1 admits
// L, fixed and sliding windows start empty), and keys are independent.
func TestAdaptersAdmitABurstOfL(t *testing.T) {
	for _, p := range All() {
		l := newPeer(t, p, 3, time.Hour)
		for i := range 3 {
			if !l.Allow("a") {
				t.Fatalf("%s: request %d of a burst of 3 refused", p.Name, i+1)
			}
		}
		if l.Allow("a") {
			t.Fatalf("%s: 4th request within the hour allowed, limit 3", p.Name)
		}
		if !l.Allow("b") {
			t.Fatalf("%s: another key refused", p.Name)
		}
		if !l.Allow("") {
			t.Fatalf("%s: the empty key refused", p.Name)
		}
	}
}

// After two whole windows without requests every design admits again.
func TestAdaptersRecoverAfterTwoWindows(t *testing.T) {
	const w = 50 * time.Millisecond
	ls := map[string]Limiter{}
	for _, p := range All() {
		l := newPeer(t, p, 2, w)
		for l.Allow("k") {
		}
		ls[p.Name] = l
	}
	time.Sleep(2*w + 20*time.Millisecond)
	for name, l := range ls {
		if !l.Allow("k") {
			t.Errorf("%s: still refusing two windows after the last request", name)
		}
	}
}

// Token buckets and GCRA refill gradually: one request fits W/L after the
// bucket ran dry, long before the window is over. The exact logs keep
// refusing until the oldest entry is W old. Assertions are made only when
// the machine did not stall past the window.
func TestAdaptersRefill(t *testing.T) {
	const w = 400 * time.Millisecond
	gradual := map[string]bool{"x/time/rate+mutex": true, "x/time/rate+xsync": true, "throttled": true}
	for _, p := range All() {
		if !gradual[p.Name] && !p.Exact {
			continue
		}
		l := newPeer(t, p, 4, w)
		start := time.Now()
		for range 4 {
			l.Allow("k")
		}
		time.Sleep(w/4 + 50*time.Millisecond)
		got := l.Allow("k")
		if time.Since(start) >= w {
			t.Logf("%s: machine stalled past the window, not asserting", p.Name)
			continue
		}
		if got != gradual[p.Name] {
			t.Errorf("%s: allowed %v a quarter window after a full burst, want %v", p.Name, got, gradual[p.Name])
		}
	}
}

func TestFind(t *testing.T) {
	if p, err := Find("throttled"); err != nil || p.Design != "GCRA" {
		t.Fatalf("Find(throttled) = %+v, %v", p, err)
	}
	if _, err := Find("nope"); err == nil {
		t.Fatal("Find(nope): no error")
	}
	for _, p := range append(append(All(), Floor()), Diagnostics()...) {
		if l, err := p.New(0, time.Second); err == nil || l != nil {
			t.Errorf("%s: limit 0 gave %v, %v", p.Name, l, err)
		}
	}
}

// The exactness scenarios: the exact logs never admit more than L in a
// window shorter than W (that bound is sound, whatever the machine does),
// and a token bucket, GCRA and fixed windows do, as their designs say.
func TestExactness(t *testing.T) {
	if testing.Short() {
		t.Skip("real-time scenarios take a few seconds")
	}
	var sel []Peer
	for _, name := range []string{"slidegate", "textbook", "textbook64", "x/time/rate+xsync", "throttled", "go-limiter", "ulule"} {
		p, err := Find(name)
		if err != nil {
			t.Fatal(err)
		}
		sel = append(sel, p)
	}
	const limit = 5
	res, err := Exactness(context.Background(), sel, limit, 500*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	exact := map[string]bool{"slidegate": true, "textbook": true, "textbook64": true}
	for _, r := range res {
		if r.Windows == 0 {
			t.Errorf("%s %s: no valid window", r.Peer, r.Scenario)
			continue
		}
		if exact[r.Peer] && r.MaxInWindow > limit {
			t.Errorf("%s %s: %d admitted in a window shorter than W, limit %d", r.Peer, r.Scenario, r.MaxInWindow, limit)
		}
		if !exact[r.Peer] && r.Scenario == Boundary && r.Windows > r.Ticks/4 && r.MaxInWindow <= limit {
			t.Errorf("%s boundary burst: most in a window %d, want over-admission above %d", r.Peer, r.MaxInWindow, limit)
		}
	}
}

func TestCountWindows(t *testing.T) {
	base := time.Unix(0, 0)
	const w = 100 * time.Millisecond
	tick := w / TicksPerWindow
	recs := [][]tickRecord{make([]tickRecord, 25)}
	for k := range recs[0] {
		s := base.Add(time.Duration(k) * tick)
		recs[0][k] = tickRecord{start: s, end: s.Add(time.Microsecond), sent: 1, admitted: 1}
	}
	r := countWindows(recs, 25, w)
	if r.MaxInWindow != TicksPerWindow-1 || r.Windows != 25-TicksPerWindow+2 || r.Admitted != 25 {
		t.Fatalf("regular ticks: %+v", r)
	}
	// Tick 20 ran a whole window late: windows containing it are skipped.
	recs[0][20].start = recs[0][20].start.Add(w)
	recs[0][20].end = recs[0][20].start
	r = countWindows(recs, 25, w)
	if r.Windows != 2 {
		t.Fatalf("late tick: %d valid windows, want 2 (ticks 0–18 and 1–19)", r.Windows)
	}
}

// runTable runs cfg and returns its results and table.
func runTable(t *testing.T, cfg Config) (*Results, string) {
	t.Helper()
	res, err := Run(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	if err := res.WriteTable(&buf); err != nil {
		t.Fatal(err)
	}
	return res, buf.String()
}

func TestRunPrintsOneTable(t *testing.T) {
	res, out := runTable(t, Config{Keys: 2000, Rounds: 2, Duration: 2 * time.Millisecond, SkipExact: true, HeapObjects: 10_000})
	for _, p := range All() {
		if !strings.Contains(out, "| "+p.Name+" | ") {
			t.Errorf("table has no row for %s:\n%s", p.Name, out)
		}
		for _, m := range TimeMetrics {
			if vs := res.Values[p.Name][m]; len(vs) != 2 || vs[0] <= 0 {
				t.Errorf("%s %s: values %v", p.Name, m, vs)
			}
		}
	}
	if !strings.Contains(out, "| slidegate | exact sliding log | ") || !strings.Contains(out, "| floor | ") {
		t.Errorf("unexpected table:\n%s", out)
	}
	for _, m := range ThroughputMetrics {
		if a := res.Allocs[Baseline][m]; len(a) != 2 {
			t.Errorf("allocations of %s: %v", m, a)
		}
	}
	for _, want := range []string{"| allocations per decision |", "| core sweep, 2k uniform, allowed |", "over the floor's"} {
		if !strings.Contains(out, want) {
			t.Errorf("table lacks %q:\n%s", want, out)
		}
	}
	if r := latency.Median(res.Ratios[Baseline][HotKey]); r != 1 {
		t.Errorf("slidegate's ratio to itself %v", r)
	}
}

// TestDiagnosticRows: with Diagnostics the table has a row for each
// diagnostic, measured every round, and a line of its time over the
// floor's; they stay out of the exactness column and the fastest-peer
// lines, which compare limiters.
func TestDiagnosticRows(t *testing.T) {
	p, err := Find("go-limiter")
	if err != nil {
		t.Fatal(err)
	}
	res, out := runTable(t, Config{Keys: 2000, Rounds: 2, Duration: 2 * time.Millisecond, HeapObjects: 10_000, Diagnostics: true,
		Peers: []Peer{All()[0], p}, ExactLimit: 3, ExactWindow: 40 * time.Millisecond})
	for _, d := range Diagnostics() {
		if !strings.Contains(out, "| "+d.Name+" | "+d.Design+" | ") {
			t.Errorf("no row for %s:\n%s", d.Name, out)
		}
		if !strings.Contains(out, "- "+d.Name+": time over the floor's, same rounds: ") {
			t.Errorf("no line of %s's time over the floor's:\n%s", d.Name, out)
		}
		if vs := res.Values[d.Name][UniAllowed]; len(vs) != 2 || vs[0] <= 0 {
			t.Errorf("%s: uniform allowed values %v", d.Name, vs)
		}
		if _, ok := res.Values[d.Name][Boundary]; ok {
			t.Errorf("%s took part in the exactness scenarios", d.Name)
		}
		for _, line := range strings.Split(out, "\n") {
			if strings.HasPrefix(line, "| "+d.Name+" | "+d.Design+" | ") && !strings.HasSuffix(line, " | — |") {
				t.Errorf("%s's exactness cell is not a dash: %s", d.Name, line)
			}
			if strings.HasPrefix(line, "- Fastest peer") && strings.Contains(line, d.Name) {
				t.Errorf("%s named among the peers: %s", d.Name, line)
			}
		}
	}
}

func TestConfigErrors(t *testing.T) {
	bad := []Config{
		{Keys: -1},
		{Rounds: -1},
		{Duration: time.Microsecond},
		{Peers: []Peer{All()[1]}},
		{ExactWindow: time.Millisecond},
	}
	for _, c := range bad {
		if _, err := Run(context.Background(), c); err == nil {
			t.Errorf("Run(%+v): no error", c)
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := Run(ctx, Config{Keys: 100, Rounds: 1, Duration: time.Millisecond}); err == nil {
		t.Error("Run with a done context: no error")
	}
}

func TestCoresBusy(t *testing.T) {
	r := &Results{Values: map[string]map[Metric][]float64{
		// Two rounds: lock-free (CPU twice the wall time) in every
		// parallel column; the hot key (one goroutine) is left out.
		"free": {
			HotKey: {10, 10}, cpuMetric(HotKey): {100, 100},
			UniAllowed: {100, 200}, cpuMetric(UniAllowed): {200, 400},
			UniRefused: {50, 50}, cpuMetric(UniRefused): {100, 100},
		},
		// Queued on one mutex: CPU time about the wall time.
		"mutex": {
			UniAllowed: {300, 300}, cpuMetric(UniAllowed): {310, 290},
			UniRefused: {100}, cpuMetric(UniRefused): {100, 100},
		},
	}}
	if got := r.coresBusy("free"); got != 2 {
		t.Errorf("lock-free: cores busy %v, want 2", got)
	}
	if got := r.coresBusy("mutex"); got != 1 {
		t.Errorf("one mutex: cores busy %v, want 1 (median of 310/300, 290/300, 100/100)", got)
	}
	if got := r.coresBusy("absent"); got != 0 {
		t.Errorf("no measurements: cores busy %v, want 0", got)
	}
}

func TestFastestPeerLeavesOutOwnModes(t *testing.T) {
	ratios := func(q float64) map[Metric][]float64 {
		m := map[Metric][]float64{}
		for _, tm := range TimeMetrics {
			m[tm] = []float64{q}
			m[cpuMetric(tm)] = []float64{q}
		}
		return m
	}
	r := &Results{
		Config: Config{NoFloor: true, Peers: []Peer{{Name: Baseline}, {Name: "slidegate-counter"}, {Name: "other"}}},
		Values: map[string]map[Metric][]float64{Baseline: ratios(100)},
		Ratios: map[string]map[Metric][]float64{Baseline: ratios(1), "slidegate-counter": ratios(0.5), "other": ratios(0.8)},
	}
	var b strings.Builder
	r.writeVersus(&b)
	r.writeCPU(&b)
	out := b.String()
	if strings.Contains(out, "slidegate-counter 0.50×") || strings.Count(out, "other 0.80×") != len(TimeMetrics)+len(ThroughputMetrics) {
		t.Errorf("the fastest peer must be the other design, not slidegate's own counter:\n%s", out)
	}
}

// TestPackKeys: a packed key sequence is the table's keys in the stream's
// order, byte for byte.
func TestPackKeys(t *testing.T) {
	keys := []string{"a", "", "k12", "key number three"}
	idx := []uint32{2, 0, 3, 3, 1, 2}
	s := packKeys(keys, idx)
	if s.len() != len(idx) {
		t.Fatalf("len %d, want %d", s.len(), len(idx))
	}
	for i, k := range idx {
		if got := s.at(i); got != keys[k] {
			t.Errorf("key %d: %q, want %q", i, got, keys[k])
		}
	}
	// next walks the same keys and wraps around.
	i := len(idx) - 2
	for _, want := range []uint32{idx[len(idx)-2], idx[len(idx)-1], idx[0]} {
		if got := s.next(&i); got != keys[want] {
			t.Errorf("next: %q, want %q", got, keys[want])
		}
	}
	if i != 1 {
		t.Errorf("after wrapping, next index %d, want 1", i)
	}
}

// TestRunCachedKeys: with CachedKeys every scenario still runs over the
// whole key population (a uniform run and the few-requests schedule spread
// over 2,000 keys admit everything at 100/min; the same traffic on a few
// keys would not), and the table says how keys were chosen.
func TestRunCachedKeys(t *testing.T) {
	cfg := Config{Keys: 2000, Rounds: 1, Duration: 2 * time.Millisecond, SkipExact: true, HeapObjects: 10_000,
		Peers: []Peer{All()[0]}, NoFloor: true, CachedKeys: true}
	res, out := runTable(t, cfg)
	for _, m := range TimeMetrics {
		if vs := res.Values[Baseline][m]; len(vs) != 1 || vs[0] <= 0 {
			t.Errorf("%s: values %v", m, vs)
		}
	}
	share := res.AllowedShare[Baseline]
	for m, want := range map[Metric]float64{UniAllowed: 1, FewReqs: 1, FewReqsHeap: 1, UniRefused: 0, ZipfRefused: 0} {
		if share[m] != want {
			t.Errorf("%s: allowed share %v, want %v", m, share[m], want)
		}
	}
	if !strings.Contains(out, "Keys (-cached-keys)") {
		t.Errorf("table does not say how keys were chosen:\n%s", out)
	}
}
