package redisstore

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/slidegate/slidegate/engine"
	"github.com/slidegate/slidegate/internal/reference"
)

// scriptCalls returns the script calls (FCALL, EVALSHA, EVAL) the servers
// at addrs ran so far.
func scriptCalls(t testing.TB, addrs []string) int64 {
	t.Helper()
	var n int64
	for _, a := range addrs {
		n += cmdCalls(t, a, "fcall") + cmdCalls(t, a, "evalsha") + cmdCalls(t, a, "eval")
	}
	return n
}

// TestBatchExactUnderStress: 96 callers decide on a log and a counter
// limiter of one store (so batches mix policies), on one hot key, warm
// keys and keys never seen before (a bucket's new fields), with costs 1 to
// 3, at GOMAXPROCS 2 and 32, standalone and on the cluster. Every decision
// is replayed through the reference models at its Redis instant: no
// mismatch in any field, and the log neither over- nor under-admits. The
// store made fewer script calls than there were decisions: decisions
// that queued behind a call went together (one call each before). The
// cluster-uniform cases spread the keys uniformly over 150 keys, so over
// as many slots: few decisions share a slot, and only per-node lanes
// batch them (at least 1.5 decisions per call; with slot lanes about 1).
func TestBatchExactUnderStress(t *testing.T) {
	for _, tc := range []struct {
		name    string
		url     func(testing.TB) string
		uniform bool
	}{
		{"standalone", standaloneURL, false},
		{"cluster", clusterURL, false},
		{"cluster-uniform", clusterURL, true},
	} {
		for _, procs := range []int{2, 32} {
			t.Run(fmt.Sprintf("%s/procs=%d", tc.name, procs), func(t *testing.T) {
				defer setProcs(procs)()
				st, err := Open(tc.url(t), WithKeyPrefix(testPrefix(t)), WithTimeout(5*time.Second), WithRefusalCache(0))
				if err != nil {
					t.Fatal(err)
				}
				defer st.Close()
				lp := engine.Policy{Name: "blog", Limit: 30, Window: time.Minute}
				cp := engine.Policy{Name: "bctr", Limit: 30, Window: time.Minute, Algorithm: engine.SlidingCounter}
				ll, err := st.Limiter(lp)
				if err != nil {
					t.Fatal(err)
				}
				cl, err := st.Limiter(cp)
				if err != nil {
					t.Fatal(err)
				}
				// The store's own count: the servers' commandstats also
				// count other packages' calls, which make test runs on
				// these servers at the same time.
				calls0 := st.calls.Load()
				var mu sync.Mutex
				var logRecs, ctrRecs []reference.Record
				var errs atomic.Int64
				var wg sync.WaitGroup
				const callers, each = 96, 60
				for g := range callers {
					wg.Add(1)
					go func() {
						defer wg.Done()
						r := rand.New(rand.NewPCG(uint64(g), 7))
						var lr, cr []reference.Record
						for i := range each {
							var key string
							switch k := r.IntN(4); {
							case tc.uniform:
								key = fmt.Sprintf("u-%d", r.IntN(150))
							case k == 0:
								key = "hot"
							case k == 1:
								key = fmt.Sprintf("warm-%d", r.IntN(8))
							default:
								key = fmt.Sprintf("cold-%d-%d", g, i)
							}
							n := 1 + r.IntN(3)
							l, recs := ll, &lr
							if r.IntN(3) == 0 {
								l, recs = cl, &cr
							}
							d, err := l.Decide(context.Background(), key, n)
							if err != nil || d.Fallback {
								errs.Add(1)
								continue
							}
							*recs = append(*recs, record(key, n, d))
						}
						mu.Lock()
						logRecs = append(logRecs, lr...)
						ctrRecs = append(ctrRecs, cr...)
						mu.Unlock()
					}()
				}
				wg.Wait()
				calls := st.calls.Load() - calls0
				if errs.Load() != 0 {
					t.Fatalf("%d errors or fallback decisions on a healthy Redis", errs.Load())
				}
				rep := reference.VerifyLog(lp.Limit, int64(lp.Window), logRecs)
				if !rep.OK() {
					t.Errorf("log replay: %+v", rep)
				}
				if bad := replayCounter(cp, ctrRecs); len(bad) != 0 {
					t.Errorf("counter replay: %d of %d decisions differ from the model, e.g. %v", len(bad), len(ctrRecs), bad[:min(len(bad), 3)])
				}
				decisions := int64(len(logRecs) + len(ctrRecs))
				t.Logf("%d decisions (log %d allowed, %d refused), %d script calls: %.2f decisions per call",
					decisions, rep.Allowed, rep.Refused, calls, float64(decisions)/float64(calls))
				if rep.Allowed == 0 || rep.Refused == 0 {
					t.Errorf("no key was driven to its limit: %d allowed, %d refused", rep.Allowed, rep.Refused)
				}
				if calls >= decisions {
					t.Errorf("%d script calls for %d decisions: no decisions went together", calls, decisions)
				}
				if tc.uniform && 2*decisions < 3*calls {
					t.Errorf("%d script calls for %d decisions of uniform keys: fewer than 1.5 decisions per call, the master's decisions did not share calls", calls, decisions)
				}
			})
		}
	}
}

// replayCounter replays recs through the reference counter in replay
// order and returns the decisions that differ from it; the store's
// RetryAfter is the model's rounded up to a whole microsecond.
func replayCounter(p engine.Policy, recs []reference.Record) []string {
	reference.Order(recs)
	m := reference.NewCounter(p.Limit, int64(p.Window))
	var bad []string
	for _, r := range recs {
		want := m.Decide(r.Key, r.Cost, r.At)
		want.RetryAfter = (want.RetryAfter + 999) / 1000 * 1000
		got := reference.Result{Allowed: r.Allowed, Remaining: r.Remaining, RetryAfter: r.RetryAfter, Reset: r.Reset}
		if got != want {
			bad = append(bad, fmt.Sprintf("%q at %d cost %d: got %+v, model %+v", r.Key, r.At, r.Cost, got, want))
		}
	}
	return bad
}

// holdLane fills the lane of key's slot, as laneDepth calls in flight
// would, and returns a function that waits until k decisions are queued
// on it. The test then ends the calls with leaveAll.
func holdLane(t *testing.T, l *Limiter, key string) (*lane, func(k int)) {
	t.Helper()
	ln := l.st.laneOf(slotOf(key))
	ln.mu.Lock()
	if ln.inflight != 0 {
		ln.mu.Unlock()
		t.Fatal("the lane has calls in flight with nothing running")
	}
	ln.inflight = laneDepth
	ln.mu.Unlock()
	return ln, func(k int) {
		for {
			ln.mu.Lock()
			q := len(ln.q)
			ln.mu.Unlock()
			if q >= k {
				return
			}
			time.Sleep(time.Millisecond)
		}
	}
}

// leaveAll ends the calls holdLane made up, as each would end.
func leaveAll(s *Store, ln *lane) {
	for range laneDepth {
		s.leave(ln)
	}
}

// TestBatchCancelledWaiter: ten decisions of one key queue behind a call
// in flight; the first one's caller gives up. It gets its context's
// error at once; the other nine are decided, in one script call, each on
// the state the previous left, and the abandoned decision was made before
// them (it was first in the batch): it counts, as a call whose reply was
// lost would.
func TestBatchCancelledWaiter(t *testing.T) {
	p := engine.Policy{Name: "bcancel", Limit: 10, Window: time.Minute}
	l := newTestLimiter(t, standaloneURL(t), p, WithRefusalCache(0))
	addrs := []string{standaloneAddr(t)}
	ln, queued := holdLane(t, l, "k")
	ctx, cancel := context.WithCancel(context.Background())
	first := make(chan error, 1)
	go func() {
		_, err := l.Decide(ctx, "k", 1)
		first <- err
	}()
	queued(1)
	type result struct {
		d   engine.Decision
		err error
	}
	res := make(chan result, 9)
	for range 9 {
		go func() {
			d, err := l.Decide(context.Background(), "k", 1)
			res <- result{d, err}
		}()
	}
	queued(10)
	cancel()
	if err := <-first; !errors.Is(err, context.Canceled) {
		t.Fatalf("the cancelled waiter: %v, want context.Canceled", err)
	}
	calls0 := scriptCalls(t, addrs)
	leaveAll(l.st, ln) // the calls in flight are over: the queue goes
	seen := map[int]bool{}
	for range 9 {
		r := <-res
		if r.err != nil || !r.d.Allowed || r.d.Fallback {
			t.Fatalf("a waiter: %+v %v, want allowed by Redis", r.d, r.err)
		}
		seen[r.d.Remaining] = true
	}
	if calls := scriptCalls(t, addrs) - calls0; calls != 1 {
		t.Errorf("%d script calls for the queued decisions, want 1", calls)
	}
	for rem := range 9 {
		if !seen[rem] {
			t.Errorf("no waiter saw %d remaining (saw %v): the abandoned decision was made first, the others in order", rem, seen)
		}
	}
	d, err := l.Decide(context.Background(), "k", 1)
	if err != nil || d.Allowed {
		t.Fatalf("the eleventh decision: %+v %v, want refused (ten made, the abandoned one included)", d, err)
	}
}

// TestBatchErrorFansOut: decisions queued behind a call in flight when the
// server dies all get the failure policy's answer (FailClosed: an error
// wrapping ErrUnavailable); none is left waiting.
func TestBatchErrorFansOut(t *testing.T) {
	srv := ownRedis(t)
	p := engine.Policy{Name: "bfail", Limit: 10, Window: time.Minute}
	l := newTestLimiter(t, "redis://"+srv.addr, p, WithFailurePolicy(FailClosed), WithRefusalCache(0))
	if _, err := l.Decide(context.Background(), "k", 1); err != nil {
		t.Fatal(err)
	}
	ln, queued := holdLane(t, l, "k")
	errs := make(chan error, 8)
	for i := range 8 {
		go func() {
			_, err := l.Decide(context.Background(), fmt.Sprintf("k%d", i%2), 1)
			errs <- err
		}()
	}
	queued(8)
	srv.kill()
	leaveAll(l.st, ln)
	for range 8 {
		if err := <-errs; !errors.Is(err, ErrUnavailable) {
			t.Fatalf("a waiter of the failed batch: %v, want ErrUnavailable", err)
		}
	}
}

// TestBatchClose: decisions queued when the store closes get an error, and
// Close leaves no goroutine behind (TestMain's leak check).
func TestBatchClose(t *testing.T) {
	p := engine.Policy{Name: "bclose", Limit: 10, Window: time.Minute}
	st, err := Open(standaloneURL(t), WithKeyPrefix(testPrefix(t)), WithRefusalCache(0), WithFailurePolicy(FailClosed))
	if err != nil {
		t.Fatal(err)
	}
	l, err := st.Limiter(p)
	if err != nil {
		t.Fatal(err)
	}
	ln, queued := holdLane(t, l, "k")
	errs := make(chan error, 4)
	for range 4 {
		go func() {
			_, err := l.Decide(context.Background(), "k", 1)
			errs <- err
		}()
	}
	queued(4)
	st.Close()
	leaveAll(st, ln)
	for range 4 {
		if err := <-errs; err == nil {
			t.Fatal("a decision queued across Close was answered without error")
		}
	}
}

// TestBatchNewClientsCommands: new clients of different buckets decided in
// one batch cost the commands each would cost alone: no HGET of a bucket's
// state (its HMGET read it), and one TIME for the batch.
func TestBatchNewClientsCommands(t *testing.T) {
	p := engine.Policy{Name: "bnew", Limit: 10, Window: time.Minute}
	l := newTestLimiter(t, standaloneURL(t), p, WithRefusalCache(0))
	addr := standaloneAddr(t)
	ln, queued := holdLane(t, l, "c0")
	res := make(chan error, 12)
	for i := range 12 {
		go func() {
			d, err := l.Decide(context.Background(), fmt.Sprintf("c%d", i), 1)
			if err == nil && (!d.Allowed || d.Fallback) {
				err = fmt.Errorf("new client: %+v", d)
			}
			res <- err
		}()
	}
	queued(12)
	hget0, time0, calls0 := cmdCalls(t, addr, "hget"), cmdCalls(t, addr, "time"), scriptCalls(t, []string{addr})
	leaveAll(l.st, ln)
	for range 12 {
		if err := <-res; err != nil {
			t.Fatal(err)
		}
	}
	if calls := scriptCalls(t, []string{addr}) - calls0; calls != 1 {
		t.Fatalf("%d script calls for 12 queued decisions, want 1", calls)
	}
	if n := cmdCalls(t, addr, "hget") - hget0; n != 0 {
		t.Errorf("%d HGETs for 12 new clients in one batch, want 0", n)
	}
	if n := cmdCalls(t, addr, "time") - time0; n != 1 {
		t.Errorf("%d TIMEs for one batch, want 1", n)
	}
}

// holdOneCall makes the lane of key's slot look as it does while one call
// is in flight, and returns the lane; the test ends that call with
// l.st.leave(ln).
func holdOneCall(t *testing.T, l *Limiter, key string) *lane {
	t.Helper()
	ln := l.st.laneOf(slotOf(key))
	ln.mu.Lock()
	defer ln.mu.Unlock()
	if ln.inflight != 0 {
		t.Fatal("the lane has calls in flight with nothing running")
	}
	ln.inflight = 1
	return ln
}

// TestBatchQueuesBehindOneCall: with one call of its lane in flight, a
// decision does not go at once: it queues, and goes with the next batch
// when that call is over (the lane's rule, batch.go), in one script call.
func TestBatchQueuesBehindOneCall(t *testing.T) {
	p := engine.Policy{Name: "bone", Limit: 10, Window: time.Minute}
	l := newTestLimiter(t, standaloneURL(t), p, WithRefusalCache(0))
	ln := holdOneCall(t, l, "k")
	res := make(chan error, 1)
	go func() {
		d, err := l.Decide(context.Background(), "k", 1)
		if err == nil && (!d.Allowed || d.Fallback) {
			err = fmt.Errorf("the queued decision: %+v, want allowed by Redis", d)
		}
		res <- err
	}()
	for {
		ln.mu.Lock()
		q := len(ln.q)
		ln.mu.Unlock()
		if q == 1 {
			break
		}
		select {
		case err := <-res:
			t.Fatalf("the decision went at once beside a call in flight (%v), want it queued", err)
		case <-time.After(time.Millisecond):
		}
	}
	calls0 := l.st.calls.Load()
	l.st.leave(ln) // the call in flight is over: the queue goes
	if err := <-res; err != nil {
		t.Fatal(err)
	}
	if calls := l.st.calls.Load() - calls0; calls != 1 {
		t.Errorf("%d script calls for the queued decision, want 1", calls)
	}
	waitIdle(t, ln)
}

// TestBatchFullQueueGoes: with one call of its lane in flight that does
// not end, batchMax decisions queue, and the last of them sends the full
// queue at once, as one script call beside the call in flight: none waits
// for it.
func TestBatchFullQueueGoes(t *testing.T) {
	p := engine.Policy{Name: "bfull", Limit: 2 * batchMax, Window: time.Minute}
	l := newTestLimiter(t, standaloneURL(t), p, WithRefusalCache(0))
	ln := holdOneCall(t, l, "k")
	calls0 := l.st.calls.Load()
	res := make(chan error, batchMax)
	for range batchMax {
		go func() {
			d, err := l.Decide(context.Background(), "k", 1)
			if err == nil && (!d.Allowed || d.Fallback) {
				err = fmt.Errorf("a queued decision: %+v, want allowed by Redis", d)
			}
			res <- err
		}()
	}
	for range batchMax {
		if err := <-res; err != nil {
			t.Fatal(err)
		}
	}
	if calls := l.st.calls.Load() - calls0; calls != 1 {
		t.Errorf("%d script calls for %d decisions queued behind a call in flight, want 1", calls, batchMax)
	}
	l.st.leave(ln)
	waitIdle(t, ln)
	d, err := l.Decide(context.Background(), "k", batchMax)
	if err != nil || !d.Allowed || d.Remaining != 0 {
		t.Fatalf("the rest of the limit: %+v %v, want allowed with 0 remaining (%d made)", d, err, batchMax)
	}
}

// waitIdle waits until ln has no call in flight and nothing queued: every
// call the test made up or caused has ended.
func waitIdle(t *testing.T, ln *lane) {
	t.Helper()
	for {
		ln.mu.Lock()
		idle := ln.inflight == 0 && len(ln.q) == 0
		ln.mu.Unlock()
		if idle {
			return
		}
		time.Sleep(time.Millisecond)
	}
}
