package redisstore

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/slidegate/slidegate/engine"
	"github.com/slidegate/slidegate/internal/clientcore"
	"github.com/slidegate/slidegate/internal/reference"
)

// TestExactUnderLoad runs the defaults (refusal cache on, the default
// timeout, breaker and failure policy) on a healthy Redis with a starved
// scheduler: a two-loop CPU hog in a child process, GOMAXPROCS 1, two
// goroutines spinning, and 64 callers
// hammering one hot key and 16 warm ones in a loop, for less than one
// window, after Redis admitted half of each key's limit. Every decision
// is replayed at its instant through the reference log: no window may hold
// more than L admits. A busy host must not turn into local decisions that
// admit on top of what Redis admitted.
func TestExactUnderLoad(t *testing.T) {
	for _, tc := range []struct {
		name string
		url  func(testing.TB) string
	}{{"standalone", standaloneURL}, {"cluster", clusterURL}} {
		t.Run(tc.name, func(t *testing.T) {
			url := tc.url(t)
			p := engine.Policy{Name: "exactload", Limit: 20, Window: time.Minute}
			l, err := New(url, p, WithKeyPrefix(testPrefix(t)),
				WithLogger(slog.New(slog.NewTextHandler(io.Discard, nil))))
			if err != nil {
				t.Fatal(err)
			}
			defer l.Close()
			// Before the load, Redis admits half of each key's limit, as a
			// fleet's other traffic would have.
			var recs []reference.Record
			for k := range 17 {
				key := "hot"
				if k > 0 {
					key = fmt.Sprintf("warm-%d", k-1)
				}
				for range p.Limit / 2 {
					d, err := l.Decide(context.Background(), key, 1)
					if err != nil {
						t.Fatal(err)
					}
					recs = append(recs, record(key, 1, d))
				}
			}
			stopHog := cpuHog(t, 2, 20*time.Second)
			defer stopHog()
			defer setProcs(1)()
			stop := make(chan struct{})
			var hogs sync.WaitGroup
			for range 2 {
				hogs.Add(1)
				go func() {
					defer hogs.Done()
					x := 0
					for {
						select {
						case <-stop:
							_ = x
							return
						default:
						}
						for i := range 10000 {
							x += i
						}
					}
				}()
			}
			var mu sync.Mutex
			var errs atomic.Int64
			var wg sync.WaitGroup
			end := time.Now().Add(3 * time.Second)
			for g := range 64 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					var mine []reference.Record
					for i := 0; time.Now().Before(end); i++ {
						key := "hot"
						if i%2 == 1 {
							key = fmt.Sprintf("warm-%d", (g+i)%16)
						}
						d, err := l.Decide(context.Background(), key, 1)
						if err != nil {
							errs.Add(1)
							continue
						}
						mine = append(mine, record(key, 1, d))
					}
					mu.Lock()
					recs = append(recs, mine...)
					mu.Unlock()
				}()
			}
			wg.Wait()
			close(stop)
			hogs.Wait()
			fb := metricValue(l.st.m.fallbacks.WithLabelValues("local"))
			slow := metricValue(l.st.m.slow)
			rep := reference.VerifyLog(p.Limit, int64(p.Window), recs)
			t.Logf("%d decisions, %d allowed, %d refused, %d errors, %v fallback decisions, %v slow refusals, %v cache hits, %v timeouts; over-admissions %d",
				rep.Decisions, rep.Allowed, rep.Refused, errs.Load(), fb, slow, metricValue(l.st.m.cacheHits),
				metricValue(l.st.m.errors.WithLabelValues("timeout")), rep.OverAdmissions)
			if errs.Load() != 0 {
				t.Errorf("%d errors on a healthy Redis", errs.Load())
			}
			if rep.Allowed == 0 || rep.Refused == 0 {
				t.Errorf("the hot key was not driven to its limit: %d allowed, %d refused", rep.Allowed, rep.Refused)
			}
			if rep.OverAdmissions != 0 {
				t.Errorf("%d over-admissions on a healthy Redis under load (replay: %v)", rep.OverAdmissions, rep.Examples)
			}
		})
	}
}

// TestFallbackSaysSo: when the failure policy decides (here the server is
// gone: connection refused), the decision says so (Fallback), the metric
// counts it, and one throttled log line names the cause; decisions Redis
// made do not have Fallback set.
func TestFallbackSaysSo(t *testing.T) {
	srv := ownRedis(t)
	var logs syncBuffer
	var mu sync.Mutex
	var causes []error
	p := engine.Policy{Name: "says", Limit: 5, Window: time.Minute}
	l := newTestLimiter(t, "redis://"+srv.addr, p, WithBreaker(0, 0),
		WithLogger(slog.New(slog.NewTextHandler(&logs, nil))),
		WithFallbackHook(func(_ string, cause error) { mu.Lock(); causes = append(causes, cause); mu.Unlock() }))
	ctx := context.Background()
	d, err := l.Decide(ctx, "k", 1)
	if err != nil || !d.Allowed || d.Fallback {
		t.Fatalf("healthy Redis: %+v %v, want allowed by Redis", d, err)
	}
	srv.kill()
	for i := range 20 {
		d, err := l.Decide(ctx, "k", 1)
		if err != nil || !d.Fallback {
			t.Fatalf("decision %d without Redis: %+v %v, want Fallback set", i, d, err)
		}
	}
	if got := metricValue(l.st.m.fallbacks.WithLabelValues("local")); got != 20 {
		t.Errorf("fallback decisions counted %v, want 20", got)
	}
	lines := 0
	for _, line := range strings.Split(logs.String(), "\n") {
		if strings.Contains(line, "failure policy decided without Redis") {
			lines++
			// The first fallback's cause: the broken connection (EOF) or
			// the refused reconnection, whichever came first.
			if len(causes) == 0 || !strings.Contains(line, causes[0].Error()) || !strings.Contains(line, "failure_policy=local") {
				t.Errorf("the log line does not name the cause and the policy: %s", line)
			}
		}
	}
	if lines != 1 {
		t.Errorf("%d log lines for 20 fallback decisions within the throttle's period, want 1:\n%s", lines, logs.String())
	}
}

// TestCallTimeoutFollowsLatency: the deadline of a call is the timeout
// while round trips are short, four times their smoothed value when that
// is longer, and never beyond the probe's base grace; the probe's own
// grace follows round trips further, up to the dial timeout.
func TestCallTimeoutFollowsLatency(t *testing.T) {
	s := &Store{cfg: config{timeout: 50 * time.Millisecond, dialTimeout: 2 * time.Second}}
	if got := s.callTimeout(); got != 50*time.Millisecond {
		t.Fatalf("no round trip seen: %v, want the timeout", got)
	}
	for range 200 {
		s.observe(time.Millisecond)
	}
	if got := s.callTimeout(); got != 50*time.Millisecond {
		t.Fatalf("1 ms round trips: %v, want the timeout", got)
	}
	for range 200 {
		s.observe(30 * time.Millisecond)
	}
	if got := s.callTimeout(); got < 110*time.Millisecond || got > 120*time.Millisecond {
		t.Fatalf("30 ms round trips: %v, want about 120 ms", got)
	}
	for range 200 {
		s.observe(time.Second)
	}
	if got, base := s.callTimeout(), s.probeBase(); got != base || base != 250*time.Millisecond {
		t.Fatalf("1 s round trips: %v, want the probe's base grace %v (250 ms)", got, base)
	}
	if got := s.probeGrace(); got != 2*time.Second {
		t.Fatalf("1 s round trips: the probe's grace %v, want the dial timeout (2 s)", got)
	}
}

// TestSlowIsNotAnOutage: Redis stalls (DEBUG SLEEP) past the deadline but
// answers the liveness probe. Under FailLocal the timed-out requests, whose
// scripts run when Redis wakes, are refused (Fallback set, counted as slow
// refusals), not decided by the local limiter; the breaker stays closed.
// Before, each timeout was a failure: the local limiter admitted them,
// beside the entries their scripts left on Redis.
func TestSlowIsNotAnOutage(t *testing.T) {
	srv := ownRedis(t)
	p := engine.Policy{Name: "slow", Limit: 5, Window: time.Minute}
	ps := []engine.Policy{p, {Name: "slow2", Limit: 5, Window: time.Minute}}
	st, ls, g := openGroup(t, "redis://"+srv.addr, ps, WithKeyPrefix(testPrefix(t)),
		WithFailurePolicy(FailLocal), WithTimeout(100*time.Millisecond), WithBreaker(1, time.Hour), WithRefusalCache(0),
		WithLogger(slog.New(slog.NewTextHandler(io.Discard, nil))))
	defer st.Close()
	l := ls[0]
	ctx := context.Background()
	if _, err := l.Decide(ctx, "warm", 1); err != nil {
		t.Fatal(err)
	}
	if _, err := g.DecideGroup(ctx, nil, engine.GroupRequest{Refs: []engine.Ref{{Policy: 0, Key: "warm"}, {Policy: 1, Key: "warm"}}, N: 1}); err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		done := stallRedis(t, srv.addr, "0.25")
		if i < 2 {
			d, err := l.Decide(ctx, "k", 1)
			if err != nil || d.Allowed || !d.Fallback {
				t.Errorf("request %d during the stall: %+v %v, want refused with Fallback set", i, d, err)
			}
		} else {
			gd, err := g.DecideGroup(ctx, nil, engine.GroupRequest{Refs: []engine.Ref{{Policy: 0, Key: "k"}, {Policy: 1, Key: "k"}}, N: 1})
			if err != nil || gd.Allowed || !gd.Limits[0].Fallback || !gd.Limits[1].Fallback {
				t.Errorf("group request during the stall: %+v %v, want refused with Fallback set", gd, err)
			}
		}
		<-done
	}
	if got := metricValue(st.m.fallbacks.WithLabelValues("local")); got != 0 {
		t.Errorf("%v decisions by the local limiter, want 0: a slow Redis is not an outage", got)
	}
	if got := metricValue(st.m.slow); got != 3 {
		t.Errorf("slow refusals counted %v, want 3", got)
	}
	if s := st.nodeOf(slotOf("k")).br.State(); s != clientcore.StateClosed {
		t.Errorf("breaker %s after timeouts on a node that answers, want closed", s)
	}
	// Redis decides again, and holds what the stalled scripts logged.
	d, err := l.Decide(ctx, "k", 1)
	if err != nil || d.Fallback || !d.Allowed {
		t.Fatalf("after the stalls: %+v %v", d, err)
	}
	t.Logf("after the stalls: %d of 5 left on k (the refused requests' scripts ran on Redis)", d.Remaining)
}
