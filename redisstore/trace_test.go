package redisstore

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/slidegate/slidegate/engine"
	"github.com/slidegate/slidegate/internal/reference"
)

// Long random traces replayed against the reference models, every field
// compared. They cover what short traces miss: clocks that step back
// (decisions are made at the key's watermark, which refusals raise too),
// instants with sub-microsecond parts (truncated to the µs Redis decides
// at), spans up to 2^52 µs with rebases while entries are live, windows on
// both sides of each slot-width threshold, and, on Redis TIME, keys whose
// TTL must outlive every instant at which their state still counts.
//
// SLIDEGATE_TRACE_STEPS sets the steps per trace (default 1500).

// Slot-width thresholds: the largest windows of 4- and 5-byte slots.
const (
	slot4Max = 1<<32 - 1<<29 // µs
	slot5Max = 1<<40 - 1<<37
)

func traceSteps(t *testing.T) int {
	if s := os.Getenv("SLIDEGATE_TRACE_STEPS"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 1 {
			t.Fatalf("SLIDEGATE_TRACE_STEPS=%q is not a positive number", s)
		}
		return n
	}
	return 1500
}

// clockTrace makes caller-clock readings (ns) that step back, jump far,
// land exactly on expiry boundaries (and 1 µs either side), repeat, and
// carry sub-µs parts.
func clockTrace(r *rand.Rand, p engine.Policy, keys, steps int) []traceStep {
	const us = int64(time.Microsecond)
	w := int64(p.Window)
	var past []int64
	out := make([]traceStep, 0, steps)
	now := int64(r.Int64N(1<<20)) * us
	for range steps {
		switch x := r.IntN(100); {
		case x < 15: // equal instant (maybe another sub-µs part)
		case x < 30 && len(past) > 0: // an expiry boundary, or 1 µs either side
			now = past[r.IntN(len(past))] + w + (r.Int64N(3)-1)*us
		case x < 40: // the clock steps back
			now -= r.Int64N(2*w/us+1) * us
		case x < 42: // a far jump
			now += r.Int64N(1<<40) * us
		default:
			now += (1 + r.Int64N(max(2*w/int64(p.Limit)/us, 1))) * us
		}
		now = max(now-now%us, 0)
		// Keep every instant within 2^52 µs (and so W below 2^53 µs).
		if now/us >= 1<<52-w/us {
			now = r.Int64N(1<<40) * us
		}
		t := now + r.Int64N(us) // a sub-µs part the limiter truncates
		past = append(past, now)
		if len(past) > 32 {
			past = past[1:]
		}
		n := 1 + r.IntN(min(p.Limit, 4))
		if r.IntN(20) == 0 {
			n = p.Limit
		}
		out = append(out, traceStep{key: "k" + strconv.Itoa(r.IntN(keys)), n: n, t: t})
	}
	return out
}

// retryOK accepts the counter's RetryAfter rounded up to a whole µs.
func retryOK(alg engine.Algorithm, got, want int64) bool {
	if alg == engine.SlidingLog {
		return got == want
	}
	return got == want || got > want && got-want < int64(time.Microsecond) && got%1000 == 0
}

func newModel(p engine.Policy) reference.Model {
	if p.Algorithm == engine.SlidingCounter {
		return reference.NewCounter(p.Limit, int64(p.Window))
	}
	return reference.NewLog(p.Limit, int64(p.Window))
}

// TestLongTraceCallerClock replays long caller-clock traces (clocks that
// step back, sub-µs instants, spans to 2^52 µs) through the log and the
// counter and the reference models: every field matches, At is the key's
// watermark (the latest instant decided on it) and never goes backwards.
// With the refusal cache on, decisions and instants still match (a cached
// refusal's Remaining and Reset are the original's; they are not compared).
func TestLongTraceCallerClock(t *testing.T) {
	url := standaloneURL(t)
	steps := traceSteps(t)
	var policies []engine.Policy
	for _, c := range []struct {
		limit int
		w     time.Duration
	}{
		{1, time.Microsecond},
		{3, 1999 * time.Microsecond},
		{7, 100 * time.Millisecond},
		{100, time.Second},
		{5, slot4Max * time.Microsecond},
		{5, (slot4Max + 1) * time.Microsecond},
		{4, slot5Max * time.Microsecond},
		{4, (slot5Max + 1) * time.Microsecond},
	} {
		for _, alg := range []engine.Algorithm{engine.SlidingLog, engine.SlidingCounter} {
			name := fmt.Sprintf("%s-L%d-W%dus", map[engine.Algorithm]string{engine.SlidingLog: "log", engine.SlidingCounter: "counter"}[alg], c.limit, c.w.Microseconds())
			policies = append(policies, engine.Policy{Name: name, Limit: c.limit, Window: c.w, Algorithm: alg})
		}
	}
	for _, p := range policies {
		for _, cache := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/cache=%v", p.Name, cache), func(t *testing.T) {
				t.Parallel()
				clk := engine.NewManualClock()
				size := 0
				if cache {
					size = 100
				}
				l := newTestLimiter(t, url, p, WithClock(clk), WithRefusalCache(size), WithTimeout(5*time.Second))
				model := newModel(p)
				r := rand.New(rand.NewPCG(uint64(len(p.Name)), uint64(p.Window)))
				wm := map[string]int64{}
				allowed, back := 0, 0
				for i, s := range clockTrace(r, p, 3, steps) {
					clk.Set(time.Duration(s.t))
					d, err := l.Decide(context.Background(), s.key, s.n)
					if err != nil {
						t.Fatalf("step %d %+v: %v", i, s, err)
					}
					at := max(s.t-s.t%1000, wm[s.key])
					if at > s.t-s.t%1000 {
						back++
					}
					wm[s.key] = at
					want := model.Decide(s.key, s.n, at)
					ok := d.Allowed == want.Allowed && d.At == at && d.Limit == p.Limit
					if !cache || d.Allowed {
						ok = ok && d.Remaining == want.Remaining && int64(d.Reset) == want.Reset && retryOK(p.Algorithm, int64(d.RetryAfter), want.RetryAfter)
					}
					if !ok {
						t.Fatalf("step %d (key %s, cost %d, clock %d ns): got %+v, model %+v at %d", i, s.key, s.n, s.t, d, want, at)
					}
					if d.Allowed {
						allowed++
					}
				}
				if allowed == 0 || allowed == steps || back == 0 {
					t.Errorf("%d of %d allowed, %d decided at a watermark ahead of the clock: the trace tests little", allowed, steps, back)
				}
			})
		}
	}
}

// TestLongTraceRedisTime runs parallel callers with pauses around the
// window on Redis TIME, so that keys go idle, their TTLs run out (and
// fields of one bucket are forgotten) and the counter's previous window
// still weighs; every decision is replayed by
// its At through the reference model, field by field.
func TestLongTraceRedisTime(t *testing.T) {
	url := standaloneURL(t)
	for _, p := range []engine.Policy{
		{Name: "log-1999", Limit: 3, Window: 1999 * time.Microsecond},
		{Name: "log-1500", Limit: 2, Window: 1500 * time.Microsecond},
		{Name: "counter-1999", Limit: 3, Window: 1999 * time.Microsecond, Algorithm: engine.SlidingCounter},
		{Name: "counter-2600", Limit: 4, Window: 2600 * time.Microsecond, Algorithm: engine.SlidingCounter},
	} {
		t.Run(p.Name, func(t *testing.T) {
			l := newTestLimiter(t, url, p, WithRefusalCache(0), WithTimeout(5*time.Second))
			// Three keys, and three that share one bucket, so that one
			// client's new field forgets the others' expired ones.
			keys := []string{"k0", "k1", "k2"}
			for i := 0; len(keys) < 6; i++ {
				if k := "s" + strconv.Itoa(i); slotOf(k) == slotOf("s0") {
					keys = append(keys, k)
				}
			}
			var mu sync.Mutex
			var recs []reference.Record
			var wg sync.WaitGroup
			stop := time.Now().Add(700 * time.Millisecond)
			errs := make(chan error, 4)
			for g := range 4 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					r := rand.New(rand.NewPCG(uint64(g), 9))
					var mine []reference.Record
					for time.Now().Before(stop) {
						key := keys[r.IntN(len(keys))]
						n := 1 + r.IntN(min(p.Limit, 3))
						d, err := l.Decide(context.Background(), key, n)
						if err != nil {
							errs <- err
							return
						}
						mine = append(mine, record(key, n, d))
						if r.IntN(4) == 0 {
							time.Sleep(time.Duration(r.Int64N(int64(2 * p.Window))))
						}
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
			reference.Order(recs)
			model := newModel(p)
			bad := 0
			for _, rc := range recs {
				want := model.Decide(rc.Key, rc.Cost, rc.At)
				if rc.Allowed != want.Allowed || rc.Remaining != want.Remaining || rc.Reset != want.Reset || !retryOK(p.Algorithm, rc.RetryAfter, want.RetryAfter) {
					if bad < 5 {
						t.Errorf("key %s at %d cost %d: got %+v, model %+v", rc.Key, rc.At, rc.Cost, rc, want)
					}
					bad++
				}
			}
			t.Logf("%d decisions replayed, %d mismatches", len(recs), bad)
			if len(recs) < 100 {
				t.Errorf("only %d decisions", len(recs))
			}
		})
	}
}

// TestExactnessSlips pins the cases the long traces first found, one
// step table each.
func TestExactnessSlips(t *testing.T) {
	url := standaloneURL(t)
	ctx := context.Background()
	type step struct {
		at      time.Duration
		n       int
		allowed bool
		retry   time.Duration
		wantAt  time.Duration
		comment string
	}
	run := func(t *testing.T, l *Limiter, clk *engine.ManualClock, steps []step) {
		t.Helper()
		for i, s := range steps {
			clk.Set(s.at)
			d, err := l.Decide(ctx, "k", s.n)
			if err != nil {
				t.Fatalf("step %d (%s): %v", i, s.comment, err)
			}
			if d.Allowed != s.allowed || d.RetryAfter != s.retry || d.At != int64(s.wantAt) {
				t.Fatalf("step %d (%s): %+v; want allowed %v, RetryAfter %v, At %v", i, s.comment, d, s.allowed, s.retry, s.wantAt)
			}
		}
	}
	t.Run("cost-1 refusal raises the watermark", func(t *testing.T) {
		for _, alg := range []engine.Algorithm{engine.SlidingLog, engine.SlidingCounter} {
			clk := engine.NewManualClock()
			p := engine.Policy{Name: "wm", Limit: 1, Window: 10 * time.Second, Algorithm: alg}
			l := newTestLimiter(t, url, p, WithClock(clk), WithRefusalCache(0))
			retry := 5 * time.Second
			if alg == engine.SlidingCounter {
				retry = 15 * time.Second // the window [0, 10 s) weighs until 20 s
			}
			run(t, l, clk, []step{
				{0, 1, true, 0, 0, "allowed at 0"},
				{5 * time.Second, 1, false, retry, 5 * time.Second, "refused at 5 s"},
				{3 * time.Second, 1, false, retry, 5 * time.Second, "the clock steps back: decided at 5 s"},
			})
		}
	})
	t.Run("refusal cache with sub-µs instants", func(t *testing.T) {
		clk := engine.NewManualClock()
		p := engine.Policy{Name: "subus", Limit: 1, Window: 100 * time.Microsecond}
		l := newTestLimiter(t, url, p, WithClock(clk), WithRefusalCache(10))
		run(t, l, clk, []step{
			{999, 1, true, 0, 0, "decided at 0 µs"},
			{1999, 1, false, 99 * time.Microsecond, time.Microsecond, "decided at 1 µs; cached until 100 µs"},
			{99999, 1, false, time.Microsecond, 99 * time.Microsecond, "cached, at 99 µs"},
			{100000, 1, true, 0, 100 * time.Microsecond, "free at 100 µs exactly"},
		})
	})
	t.Run("instants beyond 2^53 µs", func(t *testing.T) {
		clk := engine.NewManualClock()
		p := engine.Policy{Name: "far", Limit: 1, Window: time.Second}
		l := newTestLimiter(t, url, p, WithClock(clk))
		last := time.Duration(1<<53-p.Window.Microseconds()) * time.Microsecond
		clk.Set(last + 999)
		if d, err := l.Decide(ctx, "k", 1); err != nil || !d.Allowed || d.At != int64(last) {
			t.Fatalf("at 2^53 µs − W: %+v %v", d, err)
		}
		clk.Set(last + time.Microsecond)
		if _, err := l.Decide(ctx, "k", 1); !errors.Is(err, engine.ErrInvalidInstant) {
			t.Fatalf("beyond 2^53 µs − W: %v, want ErrInvalidInstant", err)
		}
	})
	t.Run("counter TTL covers 2W", func(t *testing.T) {
		raw := rawClient(t, standaloneAddr(t))
		// A sub-millisecond remainder (the TTL is whole milliseconds, so
		// it must round up) and a window long enough that the key cannot
		// expire before PTTL reads it: with W = 1999 µs the key lives about
		// 4 ms, which a loaded machine can spend between the two calls.
		for i, w := range []time.Duration{1999 * time.Microsecond, 1999 * time.Millisecond} {
			p := engine.Policy{Name: "ttl" + strconv.Itoa(i), Limit: 3, Window: w, Algorithm: engine.SlidingCounter}
			l := newTestLimiter(t, url, p)
			key := "k" + strconv.Itoa(i) // each window its own Redis key
			if _, err := l.Decide(ctx, key, 3); err != nil {
				t.Fatal(err)
			}
			// PTTL is rounded; PEXPIRETIME is not available before Redis 7,
			// so read the TTL the script set from the limiter's arguments.
			ttl, _ := strconv.Atoi(l.args[5])
			if time.Duration(ttl)*time.Millisecond < 2*p.Window {
				t.Fatalf("W = %v: counter TTL %d ms < 2W = %v", w, ttl, 2*p.Window)
			}
			if w < time.Second {
				continue
			}
			if n, err := raw.Do(ctx, raw.B().Pttl().Key(l.Key(key)).Build()).AsInt64(); err != nil || n <= 0 || n > int64(ttl) {
				t.Fatalf("W = %v: PTTL %d %v, want 1..%d", w, n, err, ttl)
			}
		}
	})
}
