package remote_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/slidegate/slidegate/engine"
	"github.com/slidegate/slidegate/internal/backendtest"
	"github.com/slidegate/slidegate/internal/reference"
	"github.com/slidegate/slidegate/remote"
)

// sizes keeps the suite to seconds under -race on two cores: every
// decision is an HTTP round trip.
var sizes = backendtest.Sizes{Traces: 6, TraceSteps: 500, Goroutines: 8, PerG: 250}

// suiteOptions: any server failure an error rather than a silent local
// decision, a timeout a loaded machine cannot reach, and a key prefix (the
// server refuses an empty key, which the group traces use).
func suiteOptions() []remote.Option {
	return []remote.Option{remote.WithFailurePolicy(remote.FailClosed), remote.WithTimeout(30 * time.Second), remote.WithKeyPrefix("t:")}
}

// backend is a remote Limiter with the client it came from, closed
// together.
type backend struct {
	*remote.Limiter
	c *remote.Client
}

func (b backend) Close() error { _ = b.Limiter.Close(); return b.c.Close() }

type group struct {
	*remote.Group
	c *remote.Client
}

func (g group) Close() error { _ = g.Group.Close(); return g.c.Close() }

// dial dials base with a timeout a loaded machine cannot reach (a slow
// answer would otherwise be decided by the local fallback), unless opts
// set another.
func dial(t *testing.T, base string, opts ...remote.Option) *remote.Client {
	t.Helper()
	c, err := remote.Dial(base, append([]remote.Option{remote.WithTimeout(30 * time.Second)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func TestConformance(t *testing.T) {
	backendtest.Run(t, func(t *testing.T, p engine.Policy, clk engine.Clock) engine.Backend {
		base, named, _ := serve(t, []engine.Policy{p}, clk)
		c := dial(t, base, suiteOptions()...)
		l, err := c.Limiter(named[0])
		if err != nil {
			t.Fatal(err)
		}
		return backend{l, c}
	}, sizes, engine.SlidingLog, engine.SlidingCounter)
}

func TestGroupConformance(t *testing.T) {
	backendtest.RunGroup(t, func(t *testing.T, ps []engine.Policy, clk engine.Clock) engine.GroupBackend {
		base, named, _ := serve(t, ps, clk)
		c := dial(t, base, suiteOptions()...)
		g, err := c.Group(named...)
		if err != nil {
			t.Fatal(err)
		}
		return group{g, c}
	}, groupSizes)
}

// groupSizes: the server takes one cost per request, so a request with
// a cost per ref is decided at the largest.
var groupSizes = func() backendtest.Sizes { s := sizes; s.SharedCost = true; return s }()

// TestReplicasReplay: four clients, as four replicas of a service would
// be, decide on shared keys of one server on its own monotonic clock, in
// parallel; every decision, ordered by the server's instants, replays
// exactly through the reference log, so the replicas together never
// admitted more than the limit in any window.
func TestReplicasReplay(t *testing.T) {
	p := engine.Policy{Name: "shared", Limit: 4, Window: 50 * time.Millisecond}
	base, _, _ := serve(t, []engine.Policy{p}, nil)
	const replicas, perG = 4, 200
	recs := make([][]reference.Record, replicas)
	var wg sync.WaitGroup
	for i := range replicas {
		c := dial(t, base, suiteOptions()...)
		defer c.Close()
		l, err := c.Limiter(p)
		if err != nil {
			t.Fatal(err)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := rand.New(rand.NewPCG(uint64(i), 9))
			for range perG {
				key := fmt.Sprintf("user-%d", r.IntN(3))
				n := 1 + r.IntN(2)
				d, err := l.Decide(context.Background(), key, n)
				if err != nil {
					t.Errorf("replica %d: %v", i, err)
					return
				}
				recs[i] = append(recs[i], backendtest.Record("t:"+key, n, d))
			}
		}()
	}
	wg.Wait()
	var all []reference.Record
	for _, rs := range recs {
		all = append(all, rs...)
	}
	rep := reference.VerifyLog(p.Limit, int64(p.Window), all)
	if rep.Decisions != replicas*perG || !rep.OK() {
		t.Fatalf("%d of %d decisions verified; %d mismatches, %d over-admissions: %v", rep.Decisions, replicas*perG, rep.Mismatches, rep.OverAdmissions, rep.Examples)
	}
	if rep.Allowed == 0 || rep.Refused == 0 {
		t.Fatalf("both outcomes not exercised: %+v", rep)
	}
}
