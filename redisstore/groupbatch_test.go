package redisstore

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/slidegate/slidegate/engine"
	"github.com/slidegate/slidegate/internal/backendtest"
	"github.com/slidegate/slidegate/internal/reference"
)

// awaitQueued waits until lane ln holds k queued decisions. The bound is a
// hang bound only: a decision that does not queue fails the test.
func awaitQueued(t *testing.T, ln *lane, k int) {
	t.Helper()
	for end := time.Now().Add(30 * time.Second); ; {
		ln.mu.Lock()
		q := len(ln.q)
		ln.mu.Unlock()
		if q >= k {
			return
		}
		if time.Now().After(end) {
			t.Fatalf("%d decisions queued behind the calls in flight, want %d: they did not wait for the lane", q, k)
		}
		time.Sleep(time.Millisecond)
	}
}

// TestGroupBatched: group decisions that arrive while the lane has
// laneDepth calls in flight queue, as single decisions do, and go in one
// script call with the single decisions queued beside them. Eight group
// requests (a log and a counter, one user and one IP) and four single
// decisions on the same log key: one call, one instant for all twelve,
// exactly ten of the log's twelve entries admitted, and every decision as
// the reference models replay it at that instant.
func TestGroupBatched(t *testing.T) {
	ps := []engine.Policy{
		{Name: "gbl", Limit: 10, Window: time.Minute},
		{Name: "gbc", Limit: 10, Window: time.Minute, Algorithm: engine.SlidingCounter},
	}
	st, ls, g := openGroup(t, standaloneURL(t), ps, WithKeyPrefix(testPrefix(t)), WithRefusalCache(0))
	defer st.Close()
	ln, _ := holdLane(t, ls[0], "u")
	type result struct {
		rec reference.GroupRecord
		err error
	}
	res := make(chan result, 12)
	for i := range 12 {
		go func() {
			if i%3 == 2 {
				d, err := ls[0].Decide(context.Background(), "u", 1)
				res <- result{backendtest.SingleRecord(0, "u", 1, d), err}
				return
			}
			refs := []engine.Ref{{Policy: 0, Key: "u"}, {Policy: 1, Key: "ip"}}
			gd, err := g.DecideGroup(context.Background(), nil, engine.GroupRequest{Refs: refs, N: 1})
			if err == nil && slices.ContainsFunc(gd.Limits, func(d engine.Decision) bool { return d.Fallback }) {
				err = fmt.Errorf("a fallback decision: %+v", gd)
			}
			res <- result{backendtest.GroupRecord(refs, 1, gd), err}
		}()
	}
	awaitQueued(t, ln, 12)
	calls0 := st.calls.Load()
	leaveAll(st, ln)
	var recs []reference.GroupRecord
	allowed := 0
	for range 12 {
		r := <-res
		if r.err != nil {
			t.Fatal(r.err)
		}
		if r.rec.Allowed {
			allowed++
		}
		recs = append(recs, r.rec)
	}
	if calls := st.calls.Load() - calls0; calls != 1 {
		t.Errorf("%d script calls for 12 queued decisions, want 1", calls)
	}
	for _, r := range recs[1:] {
		if r.At != recs[0].At {
			t.Errorf("decisions of one batch at %d and %d: one call decides at one instant", recs[0].At, r.At)
			break
		}
	}
	if allowed != 10 {
		t.Errorf("%d of 12 decisions on a log of limit 10 admitted, want 10", allowed)
	}
	backendtest.VerifyGroupAt(t, ps, recs, time.Microsecond)
}

// TestGroupBatchErrorFansOut: group and single decisions queued behind a
// call in flight when the server dies all get the failure policy's answer
// (FailClosed: an error wrapping ErrUnavailable, every limit marked
// Fallback); none is left waiting.
func TestGroupBatchErrorFansOut(t *testing.T) {
	srv := ownRedis(t)
	ps := []engine.Policy{
		{Name: "gbfa", Limit: 10, Window: time.Minute},
		{Name: "gbfb", Limit: 10, Window: time.Minute},
	}
	st, ls, g := openGroup(t, "redis://"+srv.addr, ps, WithKeyPrefix(testPrefix(t)), WithRefusalCache(0))
	defer st.Close()
	refs := []engine.Ref{{Policy: 0, Key: "u"}, {Policy: 1, Key: "ip"}}
	if _, err := g.DecideGroup(context.Background(), nil, engine.GroupRequest{Refs: refs, N: 1}); err != nil {
		t.Fatal(err)
	}
	ln, _ := holdLane(t, ls[0], "u")
	errs := make(chan error, 6)
	for i := range 6 {
		go func() {
			if i == 5 {
				_, err := ls[1].Decide(context.Background(), "ip", 1)
				errs <- err
				return
			}
			gd, err := g.DecideGroup(context.Background(), nil, engine.GroupRequest{Refs: refs, N: 1})
			if err != nil && slices.ContainsFunc(gd.Limits, func(d engine.Decision) bool { return !d.Fallback }) {
				err = fmt.Errorf("a limit without Fallback: %+v", gd)
			}
			errs <- err
		}()
	}
	awaitQueued(t, ln, 6)
	srv.kill()
	leaveAll(st, ln)
	for range 6 {
		if err := <-errs; !errors.Is(err, ErrUnavailable) {
			t.Fatalf("a waiter of the failed batch: %v, want ErrUnavailable", err)
		}
	}
}

// TestGroupBatchReplay: 48 callers decide group requests over two logs (a
// short one that refuses often, one beyond 64 slots that is read in part)
// and a counter, on hot, warm and never-seen keys (new clients in their
// buckets, second entries), under Redis TIME, at GOMAXPROCS 2 and 32; in
// the mixed cases a quarter of the callers decide single limits on the
// same keys. Every decision is replayed through the reference models at
// its Redis instant: no field differs, no log over- or under-admits. On
// the standalone server, group decisions share calls: fewer calls than
// group decisions in the groups-only case (one call each before). On the
// Cluster (tagged requests; per-node lanes, where group decisions go
// alone) the replay alone is checked.
func TestGroupBatchReplay(t *testing.T) {
	ps := []engine.Policy{
		{Name: "gsh", Limit: 4, Window: 30 * time.Millisecond},
		{Name: "glo", Limit: 120, Window: 400 * time.Millisecond},
		{Name: "gct", Limit: 8, Window: 50 * time.Millisecond, Algorithm: engine.SlidingCounter},
	}
	for _, c := range []struct {
		name   string
		url    func(testing.TB) string
		tag    string
		single bool
	}{
		{"StandaloneGroups", standaloneURL, "", false},
		{"StandaloneMixed", standaloneURL, "", true},
		{"ClusterTaggedMixed", clusterURL, "t", true},
	} {
		for _, procs := range []int{2, 32} {
			t.Run(fmt.Sprintf("%s/procs=%d", c.name, procs), func(t *testing.T) {
				defer setProcs(procs)()
				st, ls, g := openGroup(t, c.url(t), ps, WithKeyPrefix(testPrefix(t)), WithRefusalCache(0))
				defer st.Close()
				calls0 := st.calls.Load()
				const callers, each = 48, 60
				recs := make([][]reference.GroupRecord, callers)
				var groups, bad atomic.Int64
				var wg sync.WaitGroup
				for w := range callers {
					wg.Add(1)
					go func() {
						defer wg.Done()
						r := rand.New(rand.NewPCG(uint64(w), uint64(procs)))
						key := func(i int) string {
							switch k := r.IntN(5); {
							case k == 0:
								return "hot"
							case k < 3:
								return fmt.Sprintf("warm-%d", r.IntN(6))
							default:
								return fmt.Sprintf("cold-%d-%d", w, i)
							}
						}
						dst := make([]engine.Decision, 4)
						for i := range each {
							if c.single && w%4 == 3 {
								p, k := r.IntN(3), key(i)
								var d engine.Decision
								var err error
								if c.tag != "" {
									d, err = ls[p].DecideTagged(context.Background(), c.tag, k, 1)
								} else {
									d, err = ls[p].Decide(context.Background(), k, 1)
								}
								if err != nil || d.Fallback {
									bad.Add(1)
									continue
								}
								recs[w] = append(recs[w], backendtest.SingleRecord(p, k, 1, d))
								continue
							}
							var refs []engine.Ref
							u := key(i)
							refs = append(refs, engine.Ref{Policy: 0, Key: u})
							if r.IntN(2) == 0 {
								refs = append(refs, engine.Ref{Policy: 1, Key: "long"})
							}
							if r.IntN(2) == 0 {
								refs = append(refs, engine.Ref{Policy: 2, Key: u})
							}
							n := 1
							if r.IntN(8) == 0 {
								n = 2
							}
							gd, err := g.DecideGroup(context.Background(), dst, engine.GroupRequest{Refs: refs, N: n, Tag: c.tag})
							if err != nil || gd.Limits[0].Fallback {
								bad.Add(1)
								continue
							}
							groups.Add(1)
							recs[w] = append(recs[w], backendtest.GroupRecord(refs, n, gd))
						}
					}()
				}
				wg.Wait()
				if bad.Load() != 0 {
					t.Fatalf("%d errors or fallback decisions on a healthy Redis", bad.Load())
				}
				all := slices.Concat(recs...)
				rep := backendtest.VerifyGroupAt(t, ps, all, time.Microsecond)
				calls := st.calls.Load() - calls0
				t.Logf("%d decisions (%d groups; %d allowed, %d refused), %d script calls: %.2f decisions per call",
					len(all), groups.Load(), rep.Allowed, rep.Refused, calls, float64(len(all))/float64(calls))
				if c.tag == "" && !c.single && (calls == 0 || calls >= groups.Load()) {
					t.Errorf("%d script calls for %d group decisions: no group decisions went together", calls, groups.Load())
				}
			})
		}
	}
}

// TestGroupNewClientsCommands: a group request of new clients of
// different buckets (a user and its address, two policies) costs what
// each would alone: no HGET of the second bucket's state, which its HMGET
// read before the first client's write to another bucket.
func TestGroupNewClientsCommands(t *testing.T) {
	ps := []engine.Policy{
		{Name: "gnu", Limit: 10, Window: time.Minute},
		{Name: "gni", Limit: 10, Window: time.Minute},
	}
	// A server of its own: the shared one's commandstats also count the
	// calls of tests of other packages running at the same time.
	srv := ownRedis(t)
	st, _, g := openGroup(t, "redis://"+srv.addr, ps, WithKeyPrefix(testPrefix(t)), WithRefusalCache(0))
	defer st.Close()
	addr := srv.addr
	hget0 := cmdCalls(t, addr, "hget")
	for i := range 8 {
		u := fmt.Sprintf("u%d", i)
		refs := []engine.Ref{{Policy: 0, Key: u}, {Policy: 1, Key: "10.0." + u}}
		gd, err := g.DecideGroup(context.Background(), nil, engine.GroupRequest{Refs: refs, N: 1})
		if err != nil || !gd.Allowed || gd.Limits[0].Fallback {
			t.Fatalf("new clients: %+v %v, want allowed by Redis", gd, err)
		}
	}
	if n := cmdCalls(t, addr, "hget") - hget0; n != 0 {
		t.Errorf("%d HGETs for 8 group requests of new clients, want 0", n)
	}
}
