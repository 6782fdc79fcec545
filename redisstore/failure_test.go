package redisstore

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/slidegate/slidegate/engine"
	"github.com/slidegate/slidegate/internal/clientcore"
	"github.com/slidegate/slidegate/internal/reference"
)

// syncBuffer is a bytes.Buffer safe for the logger's concurrent writes.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// metricValue reads a counter or gauge (client_golang's testutil would add
// a dependency to the module for this one function).
func metricValue(m prometheus.Metric) float64 {
	var d dto.Metric
	if err := m.Write(&d); err != nil {
		panic(err)
	}
	if c := d.GetCounter(); c != nil {
		return c.GetValue()
	}
	return d.GetGauge().GetValue()
}

// waitFor polls cond every 10 ms for up to 10 s.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestNoDoubleCounting stalls the server past the client deadline while a
// decision's script is queued on it: the call times out on the client, the
// script runs once when the server resumes, and the log holds one entry.
// A client that retries on timeouts (go-redis's defaults) can charge the
// same request several times; the package never retries a script call.
// The debug-sleep variant blocks the whole server instead, so that commands
// of connections closed meanwhile run when it wakes.
func TestNoDoubleCounting(t *testing.T) {
	srv := ownRedis(t)
	raw := rawClient(t, srv.addr)
	p := engine.Policy{Name: "dbl", Limit: 10, Window: time.Minute}
	ctx := context.Background()
	// A deadline long enough that the call is surely written before it
	// passes, however loaded the machine: the server, not the client,
	// holds the script.
	held := newTestLimiter(t, "redis://"+srv.addr, p, WithTimeout(time.Second),
		WithFailurePolicy(FailClosed), WithBreaker(0, 0), WithRefusalCache(0))
	if _, err := held.Decide(ctx, "warm", 1); err != nil {
		t.Fatal(err)
	}
	// CLIENT PAUSE WRITE holds every script (they may write) until
	// CLIENT UNPAUSE (or a minute, should the test die first).
	if err := raw.Do(ctx, raw.B().ClientPause().Timeout(60000).Write().Build()).Error(); err != nil {
		t.Fatal(err)
	}
	_, err := held.Decide(ctx, "victim", 1)
	if !errors.Is(err, ErrUnavailable) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("stalled call: %v, want ErrUnavailable caused by the deadline", err)
	}
	if got := metricValue(held.st.m.unknown); got != 1 {
		t.Errorf("unknown outcomes %v after one timed-out call, want 1", got)
	}
	// The script is on the server, held by the pause: its client is
	// blocked (flags=b) on FCALL (EVALSHA where Functions are off).
	waitFor(t, "the stalled script to be held on the server", func() bool {
		list, err := raw.Do(ctx, raw.B().ClientList().Build()).ToString()
		if err != nil {
			t.Fatal(err)
		}
		for _, line := range strings.Split(list, "\n") {
			if strings.Contains(line, " flags=b ") && (strings.Contains(line, " cmd=evalsha ") || strings.Contains(line, " cmd=fcall ")) {
				return true
			}
		}
		return false
	})
	if n := logCount(t, raw, held, "victim"); n != 0 {
		t.Fatalf("the held script has already left %d entries", n)
	}
	if err := raw.Do(ctx, raw.B().ClientUnpause().Build()).Error(); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the stalled script to run", func() bool { return logCount(t, raw, held, "victim") >= 1 })
	// Anything the client queued after the stalled call (a retry) has run
	// once this later call on the same connection returns.
	if _, err := held.Decide(ctx, "after", 1); err != nil {
		t.Fatal(err)
	}
	if n := logCount(t, raw, held, "victim"); n != 1 {
		t.Fatalf("one timed-out request left %d entries in the log, want 1", n)
	}

	l := newTestLimiter(t, "redis://"+srv.addr, p, WithTimeout(50*time.Millisecond),
		WithFailurePolicy(FailClosed), WithBreaker(0, 0), WithRefusalCache(0))
	// DEBUG SLEEP blocks the whole server; the commands sent meanwhile
	// (and those of connections closed meanwhile) run when it wakes.
	stall := func() <-chan struct{} { return stallRedis(t, srv.addr, "0.4") }
	t.Run("debug-sleep", func(t *testing.T) {
		done := stall()
		_, err := l.Decide(ctx, "sleeper", 1)
		<-done
		if _, err := l.Decide(ctx, "after", 1); err != nil {
			t.Fatal(err)
		}
		n := logCount(t, raw, l, "sleeper")
		t.Logf("DEBUG SLEEP: the request returned %v and left %d entries", err, n)
		if n > 1 {
			t.Fatalf("one request (error %v) left %d entries in the log, want at most 1", err, n)
		}
	})
}

// TestHungServer: a server that stops answering (SIGSTOP) costs each
// caller at most its deadline, not the client library's default of
// seconds; the failure policy answers; decisions come from Redis again
// after SIGCONT.
func TestHungServer(t *testing.T) {
	srv := ownRedis(t)
	p := engine.Policy{Name: "hung", Limit: 5, Window: time.Minute}
	const timeout = 100 * time.Millisecond
	l := newTestLimiter(t, "redis://"+srv.addr, p, WithTimeout(timeout), WithBreaker(0, 0), WithRefusalCache(0))
	ctx := context.Background()
	if _, err := l.Decide(ctx, "warm", 1); err != nil {
		t.Fatal(err)
	}
	srv.signal(syscall.SIGSTOP)
	var wg sync.WaitGroup
	var mu sync.Mutex
	var worst time.Duration
	for g := range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 3 {
				start := time.Now()
				d, err := l.Decide(ctx, fmt.Sprintf("k%d-%d", g, i), 1)
				el := time.Since(start)
				if err != nil || !d.Allowed {
					t.Errorf("hung server, local fallback: %+v %v", d, err)
				}
				mu.Lock()
				worst = max(worst, el)
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	srv.signal(syscall.SIGCONT)
	t.Logf("hung server: slowest of 48 calls took %v (deadline %v)", worst, timeout)
	// The bound only separates "the deadline" from "seconds" (rueidis's
	// write timeout, go-redis's 3 s read timeout); it leaves a second of
	// scheduling slack for a loaded machine under -race.
	if worst > timeout+time.Second {
		t.Errorf("a call on a hung server took %v, deadline %v", worst, timeout)
	}
	if got := metricValue(l.st.m.fallbacks.WithLabelValues("local")); got != 48 {
		t.Errorf("fallback decisions %v, want 48", got)
	}
	fb := metricValue(l.st.m.fallbacks.WithLabelValues("local"))
	waitFor(t, "Redis to decide again", func() bool {
		d, err := l.Decide(ctx, fmt.Sprintf("recovered-%d", time.Now().UnixNano()), 1)
		now := metricValue(l.st.m.fallbacks.WithLabelValues("local"))
		ok := err == nil && d.Allowed && now == fb
		fb = now
		return ok
	})
}

// TestRestart kills redis-server under load and restarts it empty, for
// each failure policy: during the outage the policy decides, the breaker
// opens (logged, counted), and after the restart the script is loaded
// again (NOSCRIPT → EVAL), the breaker closes and decisions are exact.
func TestRestart(t *testing.T) {
	for _, fp := range []FailurePolicy{FailLocal, FailOpen, FailClosed} {
		t.Run(fp.String(), func(t *testing.T) {
			srv := ownRedis(t)
			var logs syncBuffer
			logger := slog.New(slog.NewTextHandler(&logs, nil))
			p := engine.Policy{Name: "restart", Limit: 5, Window: time.Minute}
			clk := engine.NewManualClock()
			clk.Set(time.Hour)
			l := newTestLimiter(t, "redis://"+srv.addr, p, WithClock(clk), WithTimeout(100*time.Millisecond),
				WithFailurePolicy(fp), WithBreaker(3, 100*time.Millisecond), WithRefusalCache(0),
				WithLogger(logger), WithDialTimeout(200*time.Millisecond))
			ctx := context.Background()
			if d, err := l.Decide(ctx, "up", 1); err != nil || !d.Allowed {
				t.Fatalf("before the crash: %+v %v", d, err)
			}

			// Background load across the crash and the restart.
			stop := make(chan struct{})
			var wg sync.WaitGroup
			for g := range 4 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for i := 0; ; i++ {
						select {
						case <-stop:
							return
						default:
						}
						_, err := l.Decide(ctx, fmt.Sprintf("load%d-%d", g, i%7), 1)
						if err != nil && !(fp == FailClosed && errors.Is(err, ErrUnavailable)) {
							t.Errorf("load under %s: %v", fp, err)
							return
						}
					}
				}()
			}
			time.Sleep(50 * time.Millisecond)
			srv.kill()

			for i := range 2 * p.Limit {
				d, err := l.Decide(ctx, "down", 1)
				switch fp {
				case FailOpen:
					if err != nil || !d.Allowed {
						t.Fatalf("open, request %d: %+v %v", i, d, err)
					}
				case FailClosed:
					if !errors.Is(err, ErrUnavailable) || d.Allowed {
						t.Fatalf("closed, request %d: %+v %v", i, d, err)
					}
				case FailLocal:
					if err != nil || d.Allowed != (i < p.Limit) {
						t.Fatalf("local, request %d: %+v %v", i, d, err)
					}
				}
			}
			if got := metricValue(l.st.m.transitions.WithLabelValues(srv.addr, "open")); got < 1 {
				t.Errorf("breaker never opened (transitions to open: %v)", got)
			}
			if !strings.Contains(logs.String(), "circuit breaker opened") {
				t.Errorf("no log line for the breaker opening; log:\n%s", logs.String())
			}

			if err := srv.start(); err != nil {
				t.Fatal(err)
			}
			waitFor(t, "the breaker to close", func() bool {
				l.Decide(ctx, "probe", 1)
				return l.st.nodeOf(slotOf("probe")).br.State() == clientcore.StateClosed
			})
			close(stop)
			wg.Wait()
			if !strings.Contains(logs.String(), "to=closed") {
				t.Errorf("no log line for the breaker closing; log:\n%s", logs.String())
			}
			// The health check loads the library again, soon after the
			// first FCALL that found none.
			waitFor(t, "the script or library loaded after the restart", func() bool {
				_, ok := scriptOn(t, l, srv.addr)
				return ok
			})
			// Exact again: a fresh trace against the model.
			model := reference.NewLog(p.Limit, int64(p.Window))
			for i := range 3 * p.Limit {
				clk.Advance(7 * time.Second)
				d, err := l.Decide(ctx, "after", 1+i%2)
				want := model.Decide("after", 1+i%2, clk.Now()/1000*1000)
				got := reference.Result{Allowed: d.Allowed, Remaining: d.Remaining, RetryAfter: int64(d.RetryAfter), Reset: int64(d.Reset)}
				if err != nil || got != want {
					t.Fatalf("after recovery, step %d: %+v %v, model %+v", i, got, err, want)
				}
			}
		})
	}
}

// TestRefusalCache steps through the cache's contract with a caller clock:
// refusals are served locally until RetryAfter from when the call was
// sent, only for costs at least the refused one; allows are never cached;
// the cache is bounded.
func TestRefusalCache(t *testing.T) {
	clk := engine.NewManualClock()
	p := engine.Policy{Name: "cache", Limit: 3, Window: 10 * time.Second}
	l := newTestLimiter(t, standaloneURL(t), p, WithClock(clk), WithRefusalCache(64))
	ctx := context.Background()
	hits := func() float64 { return metricValue(l.st.m.cacheHits) }
	steps := []struct {
		at      time.Duration
		n       int
		allowed bool
		retry   time.Duration
		hit     bool
		comment string
	}{
		{0, 1, true, 0, false, "entry at 0"},
		{500 * time.Millisecond, 2, true, 0, false, "entries at 0.5 s; full"},
		{time.Second, 2, false, 9500 * time.Millisecond, false, "Redis refuses cost 2 until 10.5 s"},
		{2 * time.Second, 2, false, 8500 * time.Millisecond, true, "cached"},
		{2 * time.Second, 1, false, 8 * time.Second, false, "cost 1 < 2: Redis decides; caches cost 1 until 10 s"},
		{3 * time.Second, 3, false, 7 * time.Second, true, "cost 3 ≥ 1: cached"},
		{10 * time.Second, 1, true, 0, false, "released at 10 s: the entry at 0 expired; Redis allows"},
		{10 * time.Second, 1, false, 500 * time.Millisecond, false, "allows are not cached; Redis refuses"},
	}
	for i, s := range steps {
		clk.Set(s.at)
		h := hits()
		d, err := l.Decide(ctx, "k", s.n)
		if err != nil {
			t.Fatalf("step %d (%s): %v", i, s.comment, err)
		}
		if d.Allowed != s.allowed || d.RetryAfter != s.retry || (hits() > h) != s.hit {
			t.Fatalf("step %d (%s): %+v, cache hit %v; want allowed %v retry %v hit %v",
				i, s.comment, d, hits() > h, s.allowed, s.retry, s.hit)
		}
	}
	// Bounded.
	for i := range 1000 {
		k := fmt.Sprintf("b%d", i)
		for range p.Limit + 1 {
			l.Decide(ctx, k, 1)
		}
	}
	if n := l.cache.len(); n > 64+cacheShards {
		t.Errorf("cache holds %d keys, bound 64", n)
	}
}

// TestRefusalCacheUnderLoad: with the cache on, two replicas under
// parallel load on Redis TIME still never over-admit, and the cache's
// refusals are true (no under-admission at their estimated instants).
func TestRefusalCacheUnderLoad(t *testing.T) {
	p := engine.Policy{Name: "cacheload", Limit: 5, Window: 100 * time.Millisecond}
	url := standaloneURL(t)
	prefix := testPrefix(t)
	var reps []*Limiter
	for range 2 {
		l, err := New(url, p, WithKeyPrefix(prefix), WithTimeout(5*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		defer l.Close()
		reps = append(reps, l)
	}
	var mu sync.Mutex
	var recs []reference.Record
	var wg sync.WaitGroup
	stop := time.Now().Add(700 * time.Millisecond)
	for g := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var mine []reference.Record
			for i := 0; time.Now().Before(stop); i++ {
				key := fmt.Sprintf("k%d", i%2)
				d, err := reps[g%2].Decide(context.Background(), key, 1)
				if err != nil {
					t.Error(err)
					return
				}
				mine = append(mine, record(key, 1, d))
			}
			mu.Lock()
			recs = append(recs, mine...)
			mu.Unlock()
		}()
	}
	wg.Wait()
	rep := reference.VerifyLog(p.Limit, int64(p.Window), recs)
	h := metricValue(reps[0].st.m.cacheHits) + metricValue(reps[1].st.m.cacheHits)
	t.Logf("%d decisions, %d allowed, %d cache hits, %d over-, %d under-admissions", rep.Decisions, rep.Allowed, int(h), rep.OverAdmissions, rep.UnderAdmissions)
	if rep.OverAdmissions != 0 || rep.UnderAdmissions != 0 || h == 0 {
		t.Fatalf("%+v", rep)
	}
}

// TestClusterFailover kills the master that holds a client's key in a
// cluster with one replica per master: the failure policy decides while
// the cluster promotes the replica, then the promoted replica, which never
// saw the script (scripts are not replicated), gets it through the
// NOSCRIPT fallback, and decisions are exact again.
func TestClusterFailover(t *testing.T) {
	nodes := createCluster(t, 3, 1)
	var addrs []string
	for _, n := range nodes {
		addrs = append(addrs, n.addr)
	}
	// Wait for every replica to be in sync, so that a failover can happen.
	waitFor(t, "replicas in sync", func() bool {
		synced := 0
		for _, a := range addrs {
			out, _ := cli(a, "info", "replication")
			if strings.Contains(out, "role:slave") && strings.Contains(out, "master_link_status:up") {
				synced++
			}
		}
		return synced == 3
	})

	clk := engine.NewManualClock()
	url := "redis-cluster://" + strings.Join(addrs[:3], ",")
	prefix := testPrefix(t)
	p := engine.Policy{Name: "fo", Limit: 4, Window: time.Minute}
	l, err := New(url, p, WithKeyPrefix(prefix), WithClock(clk), WithTimeout(100*time.Millisecond),
		WithBreaker(3, 200*time.Millisecond), WithRefusalCache(0), WithFailurePolicy(FailLocal),
		WithLogger(slog.New(slog.NewTextHandler(io.Discard, nil))))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	ctx := context.Background()
	if d, err := l.Decide(ctx, "victim", 1); err != nil || !d.Allowed {
		t.Fatalf("before: %+v %v", d, err)
	}
	// The master holding the key.
	var master *redisProc
	for _, n := range nodes {
		out, _ := cli(n.addr, "info", "replication")
		if !strings.Contains(out, "role:master") {
			continue
		}
		if got, _ := cli(n.addr, append([]string{"exists"}, stateKeys(l, "victim")...)...); strings.TrimSpace(got) == "1" {
			master = n
		}
	}
	if master == nil {
		t.Fatal("no master holds the key")
	}
	master.kill()
	fb := func() float64 { return metricValue(l.st.m.fallbacks.WithLabelValues("local")) }
	waitFor(t, "the promoted replica to decide", func() bool {
		before := fb()
		d, err := l.Decide(ctx, "victim", 1)
		return err == nil && fb() == before && d.At == clk.Now()
	})
	t.Logf("failover: %v fallback decisions while the replica was promoted", fb())
	promoted := false
	for _, n := range nodes {
		if n == master {
			continue
		}
		role, _ := cli(n.addr, "info", "replication")
		has, _ := cli(n.addr, append([]string{"exists"}, stateKeys(l, "victim")...)...)
		if strings.Contains(role, "role:master") && strings.TrimSpace(has) == "1" {
			promoted = true
			if what, ok := scriptOn(t, l, n.addr); !ok {
				t.Errorf("promoted master %s lacks the %s", n.addr, what)
			}
		}
	}
	if !promoted {
		t.Error("no promoted master holds the key")
	}
	// Exact again, in the same slot (same client key, so same hash tag).
	l2, err := l.st.Limiter(engine.Policy{Name: "fo-after", Limit: 3, Window: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer l2.Close()
	model := reference.NewLog(3, int64(time.Second))
	for i := range 20 {
		clk.Advance(150 * time.Millisecond)
		d, err := l2.Decide(ctx, "victim", 1+i%2)
		want := model.Decide("victim", 1+i%2, clk.Now())
		got := reference.Result{Allowed: d.Allowed, Remaining: d.Remaining, RetryAfter: int64(d.RetryAfter), Reset: int64(d.Reset)}
		if err != nil || got != want {
			t.Fatalf("after failover, step %d: %+v %v, model %+v", i, got, err, want)
		}
	}
	if metricValue(l.st.m.fallbacks.WithLabelValues("local")) != fb() {
		t.Fatal("fallback decisions after recovery")
	}
}
