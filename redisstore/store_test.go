package redisstore

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/slidegate/slidegate/engine"
	"github.com/slidegate/slidegate/internal/reference"
)

// newTestLimiter opens a limiter on addr ("redis://..." or
// "redis-cluster://...") with a fresh key prefix, closed at the end of t.
func newTestLimiter(t testing.TB, url string, p engine.Policy, opts ...Option) *Limiter {
	t.Helper()
	// A loaded machine can stall a round trip past the 50ms default, and a
	// fallback decision would then pass unseen: only a hang reaches this.
	opts = append([]Option{WithKeyPrefix(testPrefix(t)), WithTimeout(5 * time.Second)}, opts...)
	l, err := New(url, p, opts...)
	if err != nil {
		t.Fatalf("New(%s): %v", url, err)
	}
	t.Cleanup(func() { l.Close() })
	return l
}

func standaloneURL(t testing.TB) string { return "redis://" + standaloneAddr(t) }
func clusterURL(t testing.TB) string {
	return "redis-cluster://" + strings.Join(clusterAddrs(t), ",")
}

// traceStep is one request of a random trace.
type traceStep struct {
	key string
	n   int
	t   int64 // ns, a whole number of µs
}

// TestClusterSpread: keys land on all three masters.
func TestClusterSpread(t *testing.T) {
	url := clusterURL(t)
	l := newTestLimiter(t, url, engine.Policy{Name: "spread", Limit: 3, Window: time.Minute})
	for i := range 300 {
		if _, err := l.Decide(context.Background(), fmt.Sprintf("client-%d", i), 1); err != nil {
			t.Fatal(err)
		}
	}
	for _, addr := range clusterAddrs(t) {
		c := rawClient(t, addr)
		keys, err := c.Do(context.Background(), c.B().Keys().Pattern(l.prefix+"*").Build()).AsStrSlice()
		if err != nil {
			t.Fatal(err)
		}
		if len(keys) == 0 {
			t.Errorf("master %s holds none of the 300 keys", addr)
		}
		t.Logf("master %s: %d keys", addr, len(keys))
	}
}

// TestRedisTime: by default Redis TIME decides; At is Unix time in µs.
func TestRedisTime(t *testing.T) {
	p := engine.Policy{Name: "time", Limit: 2, Window: time.Minute}
	l := newTestLimiter(t, standaloneURL(t), p)
	before := time.Now()
	d, err := l.Decide(context.Background(), "k", 1)
	if err != nil {
		t.Fatal(err)
	}
	if d.At%1000 != 0 {
		t.Errorf("At %d is not a whole number of µs", d.At)
	}
	if w := l.WallTime(d.At); w.Before(before.Add(-time.Minute)) || w.After(before.Add(time.Minute)) {
		t.Errorf("WallTime(At) = %v, far from now %v", w, before)
	}
	if !d.Allowed || d.Remaining != 1 || d.Reset != time.Minute {
		t.Errorf("first decision %+v", d)
	}
}

// TestReplicaProblem: two replicas with their own in-memory limiters admit
// up to 2L jointly; two redisstore limiters (two clients, as two replicas
// would have) on one Redis never exceed L in any window under parallel
// load, and every decision replays exactly through the reference model.
func TestReplicaProblem(t *testing.T) {
	p := engine.Policy{Name: "replica", Limit: 10, Window: 200 * time.Millisecond}
	t.Run("memory", func(t *testing.T) {
		clk := engine.NewManualClock()
		var recs []reference.Record
		for range 2 {
			lim, err := engine.New(p, engine.WithClock(clk))
			if err != nil {
				t.Fatal(err)
			}
			defer lim.Close()
			for range p.Limit {
				d := lim.Allow("shared")
				recs = append(recs, record("shared", 1, d))
			}
		}
		rep := reference.VerifyLog(p.Limit, int64(p.Window), recs)
		if rep.OverAdmissions == 0 {
			t.Fatalf("two in-memory replicas did not over-admit: %+v", rep)
		}
		t.Logf("two in-memory replicas: %d allowed of limit %d, %d over-admissions", rep.Allowed, p.Limit, rep.OverAdmissions)
	})
	t.Run("redis", func(t *testing.T) {
		url := standaloneURL(t)
		prefix := testPrefix(t)
		var reps []*Limiter
		for range 2 {
			l, err := New(url, p, WithKeyPrefix(prefix), WithRefusalCache(0), WithTimeout(5*time.Second))
			if err != nil {
				t.Fatal(err)
			}
			defer l.Close()
			reps = append(reps, l)
		}
		var mu sync.Mutex
		var recs []reference.Record
		var wg sync.WaitGroup
		stop := time.Now().Add(time.Second)
		errs := make(chan error, 32)
		for g := range 16 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				l := reps[g%2]
				r := rand.New(rand.NewPCG(uint64(g), 2))
				var mine []reference.Record
				for time.Now().Before(stop) {
					key := fmt.Sprintf("k%d", r.IntN(3))
					n := 1 + r.IntN(3)
					d, err := l.Decide(context.Background(), key, n)
					if err != nil {
						errs <- err
						return
					}
					mine = append(mine, record(key, n, d))
				}
				mu.Lock()
				recs = append(recs, mine...)
				mu.Unlock()
			}()
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Fatal(err)
		}
		rep := reference.VerifyLog(p.Limit, int64(p.Window), recs)
		t.Logf("two redisstore replicas: %d decisions, %d allowed, %d refused", rep.Decisions, rep.Allowed, rep.Refused)
		if !rep.OK() || rep.Allowed == 0 || rep.Refused == 0 {
			t.Fatalf("replay: %+v", rep)
		}
	})
}

func record(key string, n int, d engine.Decision) reference.Record {
	return reference.Record{Key: key, Cost: n, At: d.At, Allowed: d.Allowed, Remaining: d.Remaining,
		RetryAfter: int64(d.RetryAfter), Reset: int64(d.Reset)}
}

func TestBadInput(t *testing.T) {
	for _, u := range []string{
		"", "localhost:6379", "http://localhost", "redis://", "redis://:6379", "redis://h:0", "redis://h:99999",
		"redis://h:port", "redis://h:6379/x", "redis://h:6379/-1", "redis://a:1,b:2",
		"redis-cluster://", "redis-cluster://a:1,,b:2", "redis-cluster://a:1/2", "redis://h:1?x=y",
	} {
		_, err := New(u, engine.Policy{Limit: 1, Window: time.Second})
		if !errors.Is(err, ErrInvalidURL) {
			t.Errorf("New(%q): %v, want ErrInvalidURL", u, err)
		}
	}
	p := engine.Policy{Limit: 1, Window: time.Second}
	// Unreachable: a port nothing listens on.
	port := freePort(t, false)
	_, err := New(fmt.Sprintf("redis://127.0.0.1:%d", port), p, WithDialTimeout(time.Second))
	if !errors.Is(err, ErrConnect) {
		t.Errorf("unreachable: %v, want ErrConnect", err)
	} else {
		t.Logf("unreachable: %v", err)
	}
	_, err = New(fmt.Sprintf("redis-cluster://127.0.0.1:%d", port), p, WithDialTimeout(time.Second))
	if !errors.Is(err, ErrConnect) {
		t.Errorf("unreachable cluster: %v, want ErrConnect", err)
	}
	// Authentication.
	srv := ownRedis(t, "--requirepass", "s3cret")
	for _, u := range []string{"redis://" + srv.addr, "redis://:wrong@" + srv.addr} {
		_, err := New(u, p)
		if !errors.Is(err, ErrConnect) {
			t.Errorf("%s: %v, want ErrConnect", u, err)
		} else {
			t.Logf("%s: %v", u, err)
			if strings.Contains(err.Error(), "wrong") {
				t.Errorf("error shows the password: %v", err)
			}
		}
	}
	// A loaded machine can stall the first call (the script's load) past
	// the 50 ms default: the request is then refused without a decision.
	l, err := New("redis://:s3cret@"+srv.addr+"/3", p, WithKeyPrefix(testPrefix(t)), WithTimeout(5*time.Second))
	if err != nil {
		t.Fatalf("right password: %v", err)
	}
	if d, err := l.Decide(context.Background(), "k", 1); err != nil || !d.Allowed {
		t.Errorf("decision with auth: %+v, %v", d, err)
	}
	l.Close()
	// Database out of range.
	if _, err := New("redis://:s3cret@"+srv.addr+"/999", p); !errors.Is(err, ErrConnect) {
		t.Errorf("db 999: %v, want ErrConnect", err)
	}
	// Policies and costs.
	url := standaloneURL(t)
	for _, bad := range []engine.Policy{
		{Limit: 0, Window: time.Second},
		{Limit: 1, Window: 1500 * time.Nanosecond},
		{Limit: 1, Window: time.Second, Algorithm: engine.Algorithm(9)},
	} {
		if _, err := New(url, bad); !errors.Is(err, engine.ErrInvalidPolicy) {
			t.Errorf("policy %+v: %v, want ErrInvalidPolicy", bad, err)
		}
	}
	// The counter's products are exact beyond 2^53 (TestCounterExactProducts):
	// its largest limit over the longest window is a policy like any other.
	wide := newTestLimiter(t, url, engine.Policy{Limit: 1 << 30, Window: engine.MaxWindow, Algorithm: engine.SlidingCounter})
	if d, err := wide.Decide(context.Background(), "k", 3); err != nil || !d.Allowed || d.Remaining != 1<<30-3 {
		t.Errorf("counter of 2^30 per %v: %+v %v", engine.MaxWindow, d, err)
	}
	for _, o := range []Option{WithTimeout(0), WithBreaker(-1, time.Second), WithBreaker(1, 0), WithRefusalCache(-1),
		WithKeyPrefix("a{b"), WithClock(nil), WithLogger(nil), WithFailurePolicy(FailurePolicy(7)), WithDialTimeout(-1)} {
		if _, err := New(url, engine.Policy{Limit: 1, Window: time.Second}, o); !errors.Is(err, ErrInvalidOption) {
			t.Errorf("bad option: %v, want ErrInvalidOption", err)
		}
	}
	if _, err := parseFailurePolicy("sometimes"); !errors.Is(err, ErrInvalidOption) {
		t.Errorf("parseFailurePolicy: %v", err)
	}
}

// TestAnyKey: keys with braces, empty keys and binary keys are distinct
// clients.
func TestAnyKey(t *testing.T) {
	for _, url := range []string{standaloneURL(t), clusterURL(t)} {
		l := newTestLimiter(t, url, engine.Policy{Name: "anykey", Limit: 1, Window: time.Minute})
		for _, k := range []string{"", "{", "}", "{}", "a}b{c", "\x00\xff", strings.Repeat("x", 1000)} {
			d, err := l.Decide(context.Background(), k, 1)
			if err != nil || !d.Allowed {
				t.Errorf("%s key %q: %+v %v", url, k, d, err)
			}
		}
	}
}

func TestSlotWidth(t *testing.T) {
	for _, c := range []struct {
		w time.Duration
		s int
	}{
		{time.Microsecond, 4}, {time.Minute, 4}, {time.Hour, 4}, {62 * time.Minute, 4}, {63 * time.Minute, 5},
		{24 * time.Hour, 5}, {11 * 24 * time.Hour, 5}, {12 * 24 * time.Hour, 6}, {engine.MaxWindow, 6},
	} {
		if got := slotWidth(c.w.Microseconds()); got != c.s {
			t.Errorf("slotWidth(%v) = %d, want %d", c.w, got, c.s)
		}
	}
}

// TestRebase steps a key through a rebase with live entries: accepts
// every 0.6 W keep the log non-empty while the instants climb past 2^32 µs
// above the first one.
func TestRebase(t *testing.T) {
	clk := engine.NewManualClock()
	p := engine.Policy{Name: "rebase", Limit: 3, Window: time.Hour}
	l := newTestLimiter(t, standaloneURL(t), p, WithClock(clk), WithRefusalCache(0))
	raw := rawClient(t, standaloneAddr(t))
	model := reference.NewLog(p.Limit, int64(p.Window))
	ctx := context.Background()
	var firstBase, lastBase int64 = -1, -1
	for i := range 12 {
		now := time.Duration(i) * 36 * time.Minute
		clk.Set(now)
		for range 2 {
			d, err := l.Decide(ctx, "k", 1)
			want := model.Decide("k", 1, int64(now))
			got := reference.Result{Allowed: d.Allowed, Remaining: d.Remaining, RetryAfter: int64(d.RetryAfter), Reset: int64(d.Reset)}
			if err != nil || got != want {
				t.Fatalf("at %v: %+v %v, model %+v", now, got, err, want)
			}
		}
		b, err := raw.Do(ctx, raw.B().Getrange().Key(l.Key("k")).Start(0).End(7).Build()).AsBytes()
		if err != nil {
			t.Fatal(err)
		}
		base := int64(binary.LittleEndian.Uint64(b))
		if firstBase < 0 {
			firstBase = base
		}
		lastBase = base
		if now-time.Duration(base)*time.Microsecond >= 1<<32*time.Microsecond {
			t.Fatalf("at %v the base is %d µs: offsets overflow 4 bytes", now, base)
		}
	}
	if lastBase == firstBase {
		t.Fatal("never rebased")
	}
}
