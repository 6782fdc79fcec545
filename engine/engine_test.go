package engine_test

import (
	"errors"
	"math"
	"testing"
	"time"

	"github.com/slidegate/slidegate/internal/leakcheck"

	"github.com/slidegate/slidegate/engine"
)

func TestMain(m *testing.M) {
	leakcheck.VerifyTestMain(m)
}

// step is one request in a step table: at instant at (from the manual
// clock's epoch), key asks for cost n and gets want.
type step struct {
	at   time.Duration
	key  string
	n    int
	want engine.Decision // At is filled in from at
	note string
}

// run drives a limiter through steps and reports the first failing step of
// each field.
func run(t *testing.T, p engine.Policy, steps []step) {
	t.Helper()
	clk := engine.NewManualClock()
	lim, err := engine.New(p, engine.WithClock(clk), engine.WithSweepInterval(0))
	if err != nil {
		t.Fatal(err)
	}
	defer lim.Close()
	for i, s := range steps {
		clk.Set(s.at)
		n := s.n
		if n == 0 {
			n = 1
		}
		key := s.key
		if key == "" {
			key = "k"
		}
		got, err := lim.AllowN(key, n)
		if err != nil {
			t.Fatalf("step %d (%s): %v", i, s.note, err)
		}
		want := s.want
		want.Limit = p.Limit
		want.At = int64(s.at)
		if got != want {
			t.Errorf("step %d at %v (%s):\n got  %+v\n want %+v", i, s.at, s.note, got, want)
		}
	}
}

func allow(rem int, reset time.Duration) engine.Decision {
	return engine.Decision{Allowed: true, Remaining: rem, Reset: reset}
}

func refuse(rem int, retry, reset time.Duration) engine.Decision {
	return engine.Decision{Remaining: rem, RetryAfter: retry, Reset: reset}
}

const s = time.Second

// The boundary traces and the worked traces of docs/semantics.md are in
// the conformance suite (internal/backendtest), which the engine runs in
// conformance_test.go.

func TestKeysAreIndependent(t *testing.T) {
	run(t, engine.Policy{Limit: 1, Window: time.Minute}, []step{
		{at: 0, key: "a", want: allow(0, 60*s)},
		{at: 0, key: "b", want: allow(0, 60*s)},
		{at: 1 * s, key: "a", want: refuse(0, 59*s, 59*s)},
		{at: 1 * s, key: "\xff\xfe not utf-8", want: allow(0, 60*s)},
		{at: 2 * s, key: "b", want: refuse(0, 58*s, 58*s)},
	})
}

func TestEmptyKeyIsAKey(t *testing.T) {
	lim, err := engine.New(engine.Policy{Limit: 1, Window: time.Minute}, engine.WithClock(engine.NewManualClock()))
	if err != nil {
		t.Fatal(err)
	}
	defer lim.Close()
	if d, err := lim.AllowNAt("", 1, 0); err != nil || !d.Allowed {
		t.Fatalf("first request for \"\": %+v, %v", d, err)
	}
	if d, _ := lim.AllowNAt("", 1, 1); d.Allowed {
		t.Fatalf("second request for \"\" within the window was allowed: %+v", d)
	}
}

func TestInvalidPolicies(t *testing.T) {
	cases := []struct {
		name string
		p    engine.Policy
	}{
		{"zero limit", engine.Policy{Limit: 0, Window: s}},
		{"negative limit", engine.Policy{Limit: -3, Window: s}},
		{"zero window", engine.Policy{Limit: 1}},
		{"negative window", engine.Policy{Limit: 1, Window: -s}},
		{"huge window", engine.Policy{Limit: 1, Window: engine.MaxWindow + 1}},
		{"huge log limit", engine.Policy{Limit: engine.MaxLogLimit + 1, Window: s}},
		{"huge counter limit", engine.Policy{Limit: engine.MaxCounterLimit + 1, Window: s, Algorithm: engine.SlidingCounter}},
		{"unknown algorithm", engine.Policy{Limit: 1, Window: s, Algorithm: 7}},
	}
	for _, c := range cases {
		lim, err := engine.New(c.p)
		if err == nil {
			lim.Close()
			t.Errorf("%s: New accepted %+v", c.name, c.p)
			continue
		}
		if !errors.Is(err, engine.ErrInvalidPolicy) {
			t.Errorf("%s: error %v is not ErrInvalidPolicy", c.name, err)
		}
	}
	// The largest valid values are accepted.
	for _, p := range []engine.Policy{
		{Limit: engine.MaxLogLimit, Window: engine.MaxWindow},
		{Limit: engine.MaxCounterLimit, Window: engine.MaxWindow, Algorithm: engine.SlidingCounter},
	} {
		lim, err := engine.New(p)
		if err != nil {
			t.Errorf("New(%+v): %v", p, err)
			continue
		}
		lim.Close()
	}
}

func TestInvalidOptions(t *testing.T) {
	p := engine.Policy{Limit: 1, Window: s}
	for name, o := range map[string]engine.Option{
		"nil clock":      engine.WithClock(nil),
		"shards 3":       engine.WithShards(3),
		"shards 0":       engine.WithShards(0),
		"negative sweep": engine.WithSweepInterval(-s),
		"presize -1":     engine.WithPresize(-1),
		"presize 2^30+1": engine.WithPresize(1<<30 + 1),
	} {
		if lim, err := engine.New(p, o); !errors.Is(err, engine.ErrInvalidOption) {
			if lim != nil {
				lim.Close()
			}
			t.Errorf("%s: got %v, want ErrInvalidOption", name, err)
		}
	}
}

// Bad costs are errors and touch no state, this key's or another's.
func TestInvalidCostChangesNothing(t *testing.T) {
	clk := engine.NewManualClock()
	lim, err := engine.New(engine.Policy{Limit: 3, Window: time.Minute}, engine.WithClock(clk))
	if err != nil {
		t.Fatal(err)
	}
	defer lim.Close()
	lim.Allow("other")
	for _, n := range []int{0, -1, 4, math.MaxInt} {
		if _, err := lim.AllowN("k", n); !errors.Is(err, engine.ErrInvalidCost) {
			t.Errorf("AllowN(k, %d): err %v, want ErrInvalidCost", n, err)
		}
		if _, err := lim.AllowNAt("k", n, 5); !errors.Is(err, engine.ErrInvalidCost) {
			t.Errorf("AllowNAt(k, %d): err %v, want ErrInvalidCost", n, err)
		}
	}
	if _, err := lim.AllowNAt("k", 1, -1); !errors.Is(err, engine.ErrInvalidInstant) {
		t.Errorf("negative instant: err %v, want ErrInvalidInstant", err)
	}
	if d := lim.Allow("k"); d.Remaining != 2 {
		t.Errorf("after bad calls, k: %+v, want Remaining 2", d)
	}
	if d := lim.Allow("other"); d.Remaining != 1 {
		t.Errorf("after bad calls, other: %+v, want Remaining 1", d)
	}
}

// Per key, time never goes backwards: a clock set back decides at the
// key's latest instant.
func TestClockBackwardsDoesNotRewindAKey(t *testing.T) {
	clk := engine.NewManualClock()
	lim, err := engine.New(engine.Policy{Limit: 2, Window: 10 * s}, engine.WithClock(clk), engine.WithSweepInterval(0))
	if err != nil {
		t.Fatal(err)
	}
	defer lim.Close()
	clk.Set(100 * s)
	lim.Allow("k")
	lim.Allow("k")
	clk.Set(95 * s) // an NTP-style step back
	d := lim.Allow("k")
	if d.At != int64(100*s) || d.Allowed || d.RetryAfter != 10*s {
		t.Fatalf("after a step back: %+v, want a refusal at 100 s with RetryAfter 10 s", d)
	}
	clk.Set(110 * s)
	if d := lim.Allow("k"); !d.Allowed || d.At != int64(110*s) {
		t.Fatalf("at 110 s: %+v, want allowed", d)
	}
	// A key never seen starts at the clock as it is.
	clk.Set(50 * s)
	if d := lim.Allow("fresh"); d.At != int64(50*s) {
		t.Fatalf("fresh key: At %d, want %d", d.At, int64(50*s))
	}
}

// Refusals move a key's time too: an instant given after a refused one is
// decided at the refused one's instant.
func TestRefusalsMoveTheKeysTime(t *testing.T) {
	lim, err := engine.New(engine.Policy{Limit: 1, Window: 10 * s}, engine.WithSweepInterval(0))
	if err != nil {
		t.Fatal(err)
	}
	defer lim.Close()
	for _, c := range []struct {
		at, wantAt int64
		allowed    bool
	}{
		{int64(3 * s), int64(3 * s), true},
		{int64(13*s) - 1, int64(13*s) - 1, false},
		{int64(12 * s), int64(13*s) - 1, false}, // earlier than the refusal: decided at its instant
		{int64(13 * s), int64(13 * s), true},
	} {
		d, err := lim.AllowNAt("k", 1, c.at)
		if err != nil || d.At != c.wantAt || d.Allowed != c.allowed {
			t.Fatalf("AllowNAt(%d): %+v, %v; want At %d, allowed %v", c.at, d, err, c.wantAt, c.allowed)
		}
	}
}

func TestRingGrowsToLimit(t *testing.T) {
	const limit = 1000
	lim, err := engine.New(engine.Policy{Limit: limit, Window: time.Hour}, engine.WithClock(engine.NewManualClock()), engine.WithSweepInterval(0))
	if err != nil {
		t.Fatal(err)
	}
	defer lim.Close()
	for i := range limit {
		d, _ := lim.AllowNAt("k", 1, int64(i))
		if !d.Allowed || d.Remaining != limit-i-1 {
			t.Fatalf("request %d: %+v", i, d)
		}
	}
	if d, _ := lim.AllowNAt("k", 1, limit); d.Allowed {
		t.Fatalf("request over the limit allowed: %+v", d)
	}
	st := lim.Stats()
	if st.Keys != 1 || st.StoredInstants != limit {
		t.Fatalf("stats %+v, want 1 key and %d instants", st, limit)
	}
	// A small client pays for few slots.
	lim.AllowNAt("small", 3, limit)
	st2 := lim.Stats()
	if grew := st2.Bytes - st.Bytes; grew > 200 {
		t.Errorf("a key with 3 requests costs %d bytes", grew)
	}
}

func TestStatsAndSweep(t *testing.T) {
	clk := engine.NewManualClock()
	lim, err := engine.New(engine.Policy{Limit: 5, Window: 10 * s}, engine.WithClock(clk), engine.WithSweepInterval(0))
	if err != nil {
		t.Fatal(err)
	}
	defer lim.Close()
	for i := range 100 {
		lim.AllowN(string(rune('a'+i%26))+string(rune('0'+i/26)), 2)
	}
	st := lim.Stats()
	if st.Keys != 100 || st.StoredInstants != 200 || st.Bytes <= 0 {
		t.Fatalf("stats %+v", st)
	}
	clk.Set(10*s - 1)
	if n := lim.Sweep(); n != 0 {
		t.Fatalf("swept %d keys one nanosecond before they went idle", n)
	}
	clk.Set(5 * s)
	lim.Allow("a0") // keep one key alive
	clk.Set(10 * s)
	if n := lim.Sweep(); n != 99 {
		t.Fatalf("swept %d keys, want 99", n)
	}
	st = lim.Stats()
	if st.Keys != 1 || st.StoredInstants != 3 || st.Swept != 99 {
		t.Fatalf("after sweep: %+v", st)
	}
}

// The background sweeper drops idle keys by itself and stops on Close
// (goleak in TestMain checks the stop).
func TestBackgroundSweeper(t *testing.T) {
	clk := engine.NewManualClock()
	lim, err := engine.New(engine.Policy{Limit: 5, Window: s}, engine.WithClock(clk),
		engine.WithShards(4), engine.WithSweepInterval(20*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	for i := range 50 {
		lim.Allow(string(rune('A' + i)))
	}
	clk.Set(2 * s)
	deadline := time.Now().Add(10 * time.Second)
	for lim.Stats().Keys != 0 {
		if time.Now().After(deadline) {
			t.Fatalf("the sweeper left %d idle keys", lim.Stats().Keys)
		}
		time.Sleep(5 * time.Millisecond)
	}
	if err := lim.Close(); err != nil {
		t.Fatal(err)
	}
	if err := lim.Close(); err != nil {
		t.Fatal("second Close:", err)
	}
	// Still decides after Close.
	if d := lim.Allow("A"); !d.Allowed {
		t.Fatalf("after Close: %+v", d)
	}
}

func TestMonotonicClockIsDefault(t *testing.T) {
	lim, err := engine.New(engine.Policy{Limit: 1, Window: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	defer lim.Close()
	a := lim.Allow("k")
	b := lim.Allow("k")
	if !a.Allowed || b.Allowed || b.At < a.At {
		t.Fatalf("got %+v then %+v", a, b)
	}
	// Wall mapping is for display: it lands near now.
	if d := time.Since(lim.WallTime(a.At)); d < -time.Minute || d > time.Minute {
		t.Fatalf("WallTime(At) is %v away from now", d)
	}
}
