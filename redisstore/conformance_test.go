package redisstore

import (
	"context"
	"fmt"
	"math/rand/v2"
	"runtime"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/slidegate/slidegate/engine"
	"github.com/slidegate/slidegate/internal/backendtest"
	"github.com/slidegate/slidegate/internal/reference"
)

// conformanceSizes keeps the suite to a few seconds per server under
// -race on two cores: every decision is a round trip.
var conformanceSizes = backendtest.Sizes{Traces: 6, TraceSteps: 600, Goroutines: 8, PerG: 300, Resolution: time.Microsecond}

// suiteOptions: the caller's clock, no refusal cache (a cached refusal
// repeats the original's Remaining), and any Redis failure an error
// rather than a silent local decision.
func suiteOptions(t *testing.T, clk engine.Clock) []Option {
	return []Option{WithKeyPrefix(testPrefix(t)), WithClock(clk), WithRefusalCache(0),
		WithFailurePolicy(FailClosed), WithTimeout(5 * time.Second)}
}

func limiterFactory(url func(testing.TB) string) backendtest.Factory {
	return func(t *testing.T, p engine.Policy, clk engine.Clock) engine.Backend {
		l, err := New(url(t), p, suiteOptions(t, clk)...)
		if err != nil {
			t.Fatal(err)
		}
		return l
	}
}

// storeGroup is a Group with the store it came from, closed together: a
// GroupFactory's result. With a tag, every request is placed by it, as a
// server that groups requests by API key does.
type storeGroup struct {
	*Group
	st     *Store
	tag    string
	tagged bool
}

func (g storeGroup) DecideGroup(ctx context.Context, dst []engine.Decision, req engine.GroupRequest) (engine.GroupDecision, error) {
	if g.tagged {
		req.Tag = g.tag
	}
	return g.Group.DecideGroup(ctx, dst, req)
}

func (g storeGroup) Close() error { return g.st.Close() }

// openGroup opens a store at url with a group over policies.
func openGroup(t testing.TB, url string, ps []engine.Policy, opts ...Option) (*Store, []*Limiter, *Group) {
	t.Helper()
	// As newTestLimiter: a loaded machine can stall a round trip past the
	// default deadline, and a fallback decision would then pass unseen.
	opts = append([]Option{WithTimeout(5 * time.Second), WithFailurePolicy(FailClosed)}, opts...)
	st, err := Open(url, opts...)
	if err != nil {
		t.Fatal(err)
	}
	ls, err := st.Limiters(ps)
	if err != nil {
		st.Close()
		t.Fatal(err)
	}
	g, err := NewGroup(ls...)
	if err != nil {
		st.Close()
		t.Fatal(err)
	}
	return st, ls, g
}

func groupFactory(url func(testing.TB) string, tag string, tagged bool) backendtest.GroupFactory {
	return func(t *testing.T, ps []engine.Policy, clk engine.Clock) engine.GroupBackend {
		st, _, g := openGroup(t, url(t), ps, suiteOptions(t, clk)...)
		return storeGroup{Group: g, st: st, tag: tag, tagged: tagged}
	}
}

// TestConformance runs the suite every backend runs, on a standalone
// server and on the three-master cluster.
func TestConformance(t *testing.T) {
	for _, c := range []struct {
		name string
		url  func(testing.TB) string
	}{{"Standalone", standaloneURL}, {"Cluster", clusterURL}} {
		t.Run(c.name, func(t *testing.T) {
			backendtest.Run(t, limiterFactory(c.url), conformanceSizes, engine.SlidingLog, engine.SlidingCounter)
		})
	}
}

// TestGroupConformance runs the multi-limit suite: untagged on a
// standalone server (each key where Limiter.Decide keeps it), and tagged
// on both (the request's keys in one slot on the cluster; the standalone
// server ignores the tag).
func TestGroupConformance(t *testing.T) {
	for _, c := range []struct {
		name   string
		url    func(testing.TB) string
		tagged bool
	}{{"Standalone", standaloneURL, false}, {"StandaloneTagged", standaloneURL, true}, {"ClusterTagged", clusterURL, true}} {
		t.Run(c.name, func(t *testing.T) {
			backendtest.RunGroup(t, groupFactory(c.url, "tenant-7", c.tagged), conformanceSizes)
		})
	}
}

// TestGroupParallelReplay: many goroutines decide requests over
// overlapping subsets of three limits (two logs and a counter) and three
// keys, and single limits on their own through the group's limiters, while
// the clock moves; at GOMAXPROCS 1, 2, 8 and 32, every decision replays
// exactly through one reference model per limit, while another goroutine
// inspects the keys in a tight loop. On the cluster every
// request carries one tag (one slot); on the standalone server requests
// are untagged, sharing state with Limiter.Decide.
func TestGroupParallelReplay(t *testing.T) {
	ps := []engine.Policy{
		{Name: "fast", Limit: 3, Window: 15 * time.Millisecond},
		{Name: "ctr", Limit: 6, Window: 40 * time.Millisecond, Algorithm: engine.SlidingCounter},
		{Name: "slow", Limit: 8, Window: 60 * time.Millisecond},
	}
	keys := []string{"u1", "u2", "ip-9"}
	for _, c := range []struct {
		name   string
		url    func(testing.TB) string
		tagged bool
	}{{"Standalone", standaloneURL, false}, {"Cluster", clusterURL, true}} {
		for _, procs := range []int{1, 2, 8, 32} {
			t.Run(fmt.Sprintf("%s/GOMAXPROCS=%d", c.name, procs), func(t *testing.T) {
				defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(procs))
				clk := engine.NewManualClock()
				clk.Set(time.Second)
				st, ls, g := openGroup(t, c.url(t), ps, suiteOptions(t, clk)...)
				defer st.Close()
				const tag = "tenant"
				quit, done, inspected := make(chan struct{}), make(chan struct{}), make(chan struct{})
				go func() {
					defer close(done)
					for {
						select {
						case <-quit:
							return
						default:
							clk.Advance(time.Millisecond)
							time.Sleep(100 * time.Microsecond)
						}
					}
				}()
				// Operators inspecting the keys in a tight loop change
				// nothing (on the cluster, the untagged keys it reads are
				// others than the requests'; it still loads the servers).
				go func() {
					defer close(inspected)
					for i := 0; ; i++ {
						select {
						case <-quit:
							return
						default:
						}
						if _, _, err := ls[i%3].InspectKey(context.Background(), keys[i%len(keys)]); err != nil {
							t.Errorf("InspectKey: %v", err)
							return
						}
					}
				}()
				recs := make([][]reference.GroupRecord, 16)
				var wg sync.WaitGroup
				for w := range recs {
					wg.Add(1)
					go func() {
						defer wg.Done()
						r := rand.New(rand.NewPCG(uint64(w), uint64(procs)))
						dst := make([]engine.Decision, 4)
						for range 250 {
							if w%4 == 3 { // one limiter on its own
								i, key, n := r.IntN(3), keys[r.IntN(3)], 1+r.IntN(2)
								var d engine.Decision
								var err error
								if c.tagged {
									d, err = ls[i].DecideTagged(context.Background(), tag, key, n)
								} else {
									d, err = ls[i].Decide(context.Background(), key, n)
								}
								if err != nil {
									t.Errorf("Decide: %v", err)
									return
								}
								recs[w] = append(recs[w], backendtest.SingleRecord(i, key, n, d))
								continue
							}
							refs := backendtest.RandomRefs(r, 3, keys)
							n := 1 + r.IntN(backendtest.MinLimit(ps, refs))
							var gd engine.GroupDecision
							var err error
							if c.tagged {
								gd, err = g.DecideGroup(context.Background(), dst, engine.GroupRequest{Refs: refs, N: n, Tag: tag})
							} else {
								gd, err = g.DecideGroup(context.Background(), dst, engine.GroupRequest{Refs: refs, N: n})
							}
							if err != nil {
								t.Errorf("DecideGroup: %v", err)
								return
							}
							recs[w] = append(recs[w], backendtest.GroupRecord(refs, n, gd))
						}
					}()
				}
				wg.Wait()
				close(quit)
				<-done
				<-inspected
				all := slices.Concat(recs...)
				backendtest.VerifyGroupAt(t, ps, all, time.Microsecond)
			})
		}
	}
}
