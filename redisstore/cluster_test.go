package redisstore

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os/exec"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/rueidis"
	"github.com/slidegate/slidegate/engine"
	"github.com/slidegate/slidegate/internal/reference"
)

// ownCluster starts a cluster of masters (no replicas) for one test, on
// free loopback ports, with cluster-require-full-coverage off (the
// setting docs/distributed.md asks for) and a one-second node timeout;
// every server is killed when the test ends, whatever its outcome.
func ownCluster(t *testing.T, masters int) []*redisProc {
	t.Helper()
	return createCluster(t, masters, 0, "--cluster-require-full-coverage", "no")
}

// createCluster starts masters × (1 + replicasEach) cluster-enabled
// servers with a one-second node timeout and the extra options, joins
// them with redis-cli --cluster create and waits for the cluster to be
// ok; every server is killed when the test ends.
func createCluster(t *testing.T, masters, replicasEach int, extra ...string) []*redisProc {
	t.Helper()
	needRedis(t)
	var nodes []*redisProc
	var addrs []string
	for range masters * (1 + replicasEach) {
		p := startRedis(t, true, append([]string{"--cluster-enabled", "yes", "--cluster-node-timeout", "1000"}, extra...)...)
		t.Cleanup(p.stop)
		nodes = append(nodes, p)
		addrs = append(addrs, p.addr)
	}
	args := append([]string{"--cluster", "create"}, addrs...)
	args = append(args, "--cluster-replicas", strconv.Itoa(replicasEach), "--cluster-yes")
	if out, err := exec.Command("redis-cli", args...).CombinedOutput(); err != nil {
		t.Fatalf("redis-cli --cluster create: %v\n%s", err, out)
	}
	waitClusterOK(t, addrs)
	return nodes
}

// slotOwners returns, per slot, the address of its master.
func slotOwners(t *testing.T, c rueidis.Client) map[int64]string {
	t.Helper()
	ranges, err := c.Do(context.Background(), c.B().ClusterSlots().Build()).ToArray()
	if err != nil {
		t.Fatal(err)
	}
	out := map[int64]string{}
	for _, rg := range ranges {
		f, _ := rg.ToArray()
		lo, _ := f[0].AsInt64()
		hi, _ := f[1].AsInt64()
		m, _ := f[2].ToArray()
		host, _ := m[0].ToString()
		port, _ := m[1].AsInt64()
		for s := lo; s <= hi; s++ {
			out[s] = fmt.Sprintf("%s:%d", host, port)
		}
	}
	return out
}

// TestKilledMaster kills one master of a three-master cluster under load
// and restarts it empty. Two stores run at once, one failing closed and
// one falling back locally. Keys on the two healthy masters never see an
// error or a fallback decision, and their decisions replay exactly through
// the reference model; keys on the killed master follow each store's
// failure policy; after the restart Redis decides them again.
func TestKilledMaster(t *testing.T) {
	nodes := ownCluster(t, 3)
	var addrs []string
	for _, n := range nodes {
		addrs = append(addrs, n.addr)
	}
	url := "redis-cluster://" + strings.Join(addrs, ",")
	raw := rawClient(t, addrs[0])
	p := engine.Policy{Name: "killed", Limit: 5, Window: 200 * time.Millisecond}
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))

	type store struct {
		fp        FailurePolicy
		l         *Limiter
		fallbacks sync.Map // key → *atomic.Int64
	}
	stores := []*store{{fp: FailClosed}, {fp: FailLocal}}
	// A generous deadline: the killed master's calls fail at once (its
	// connections are reset, new ones refused), and a loaded CI machine
	// must not turn a slow healthy call into an error.
	for _, s := range stores {
		l, err := New(url, p, WithKeyPrefix(testPrefix(t)), WithFailurePolicy(s.fp), WithTimeout(2*time.Second),
			WithBreaker(5, 200*time.Millisecond), WithRefusalCache(0), WithLogger(quiet), WithDialTimeout(500*time.Millisecond),
			WithHealthInterval(200*time.Millisecond),
			WithFallbackHook(func(key string, _ error) {
				v, _ := s.fallbacks.LoadOrStore(key, new(atomic.Int64))
				v.(*atomic.Int64).Add(1)
			}))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { l.Close() })
		s.l = l
	}

	// Which master holds each client key (the slot depends on the client
	// key only, so it is the same in both stores).
	keys := make([]string, 300)
	redisKeys := make([]string, len(keys))
	for i := range keys {
		keys[i] = fmt.Sprintf("client-%d", i)
		redisKeys[i] = stores[0].l.Key(keys[i])
	}
	owners := slotOwners(t, raw)
	victim := nodes[0]
	onVictim := map[string]bool{}
	cmds := make(rueidis.Commands, len(keys))
	for i, k := range redisKeys {
		cmds[i] = raw.B().ClusterKeyslot().Key(k).Build()
	}
	for i, r := range raw.DoMulti(context.Background(), cmds...) {
		s, err := r.AsInt64()
		if err != nil {
			t.Fatal(err)
		}
		onVictim[keys[i]] = owners[s] == victim.addr
	}
	var victimKeys, healthyKeys []string
	for _, k := range keys {
		if onVictim[k] {
			victimKeys = append(victimKeys, k)
		} else {
			healthyKeys = append(healthyKeys, k)
		}
	}
	if len(victimKeys) == 0 || len(healthyKeys) == 0 {
		t.Fatalf("%d keys on the victim, %d elsewhere", len(victimKeys), len(healthyKeys))
	}

	// Load: 8 goroutines, each deciding random keys through both stores.
	const (
		before = iota
		outage
		after
	)
	var phase atomic.Int32
	type result struct {
		phase   int32
		store   int
		key     string
		n       int
		d       engine.Decision
		err     error
		latency time.Duration
	}
	var mu sync.Mutex
	var results []result
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var mine []result
			for i := 0; ; i++ {
				select {
				case <-stop:
					mu.Lock()
					results = append(results, mine...)
					mu.Unlock()
					return
				default:
				}
				k := keys[(g*37+i*11)%len(keys)]
				for si, s := range stores {
					ph := phase.Load()
					start := time.Now()
					d, err := s.l.Decide(context.Background(), k, 1)
					mine = append(mine, result{ph, si, k, 1, d, err, time.Since(start)})
				}
			}
		}()
	}
	time.Sleep(500 * time.Millisecond)
	phase.Store(outage)
	victim.kill()
	time.Sleep(2 * time.Second)
	if err := victim.start(); err != nil {
		t.Fatal(err)
	}
	waitClusterOK(t, addrs)
	phase.Store(after)
	// Recovery: Redis decides the victim's keys again, in both stores.
	waitFor(t, "Redis to decide the restarted master's keys", func() bool {
		for _, s := range stores {
			k := victimKeys[0]
			fb := func() int64 {
				v, ok := s.fallbacks.Load(k)
				if !ok {
					return 0
				}
				return v.(*atomic.Int64).Load()
			}
			f0 := fb()
			if _, err := s.l.Decide(context.Background(), k, 1); err != nil || fb() != f0 {
				return false
			}
		}
		return true
	})
	time.Sleep(300 * time.Millisecond)
	close(stop)
	wg.Wait()

	// Healthy keys: no error, no fallback, exact; latency logged by phase.
	for si, s := range stores {
		for _, k := range healthyKeys {
			if v, ok := s.fallbacks.Load(k); ok {
				t.Errorf("%s store: key %s on a healthy master had %d fallback decisions", s.fp, k, v.(*atomic.Int64).Load())
			}
		}
		var recs []reference.Record
		lat := map[int32][]time.Duration{}
		healthyErrs, victimErrs, victimDecisions := 0, 0, 0
		for _, r := range results {
			if r.store != si {
				continue
			}
			if !onVictim[r.key] {
				if r.err != nil {
					healthyErrs++
					if healthyErrs <= 3 {
						t.Errorf("%s store, phase %d: key %s on a healthy master: %v", s.fp, r.phase, r.key, r.err)
					}
					continue
				}
				recs = append(recs, record(r.key, r.n, r.d))
				lat[r.phase] = append(lat[r.phase], r.latency)
				continue
			}
			if r.phase == outage {
				victimDecisions++
				if r.err != nil {
					victimErrs++
					if !errors.Is(r.err, ErrUnavailable) || s.fp != FailClosed {
						t.Errorf("%s store: victim key error %v", s.fp, r.err)
					}
				}
			}
		}
		rep := reference.VerifyLog(p.Limit, int64(p.Window), recs)
		// A loaded machine may spread a key's requests too thin for any
		// refusal; where more than the limit was asked within one window,
		// one is certain.
		due := refusalsDue(recs, p.Limit, int64(p.Window))
		if !rep.OK() || due > 0 && rep.Refused == 0 {
			t.Errorf("%s store: healthy keys' replay (%d requests met a window already asked past the limit): %+v", s.fp, due, rep)
		}
		victimFallbacks := int64(0)
		for _, k := range victimKeys {
			if v, ok := s.fallbacks.Load(k); ok {
				victimFallbacks += v.(*atomic.Int64).Load()
			}
		}
		pct := func(ds []time.Duration, q float64) time.Duration {
			if len(ds) == 0 {
				return 0
			}
			slices.Sort(ds)
			return ds[int(float64(len(ds)-1)*q)]
		}
		t.Logf("%s store: healthy keys: %d decisions (%d refused, %d asked past the limit), %d errors, 0 fallbacks, replay %d mismatches / %d over / %d under; p50/p99 before %v/%v, during the outage %v/%v, after %v/%v",
			s.fp, len(recs), rep.Refused, due, healthyErrs, rep.Mismatches, rep.OverAdmissions, rep.UnderAdmissions,
			pct(lat[before], .5), pct(lat[before], .99), pct(lat[outage], .5), pct(lat[outage], .99), pct(lat[after], .5), pct(lat[after], .99))
		t.Logf("%s store: killed master's keys during the outage: %d decisions, %d errors, %d fallback decisions; breaker transitions to open: %v",
			s.fp, victimDecisions, victimErrs, victimFallbacks, metricValue(s.l.st.m.transitions.WithLabelValues(victim.addr, "open")))
		if victimFallbacks == 0 {
			t.Errorf("%s store: the killed master's keys never went to the failure policy", s.fp)
		}
		if s.fp == FailClosed && victimErrs == 0 {
			t.Errorf("closed store: no errors on the killed master's keys")
		}
		if s.fp == FailLocal && victimErrs != 0 {
			t.Errorf("local store: %d errors on the killed master's keys", victimErrs)
		}
		if got := metricValue(s.l.st.m.restarts.WithLabelValues(victim.addr)); got != 1 {
			t.Errorf("%s store: restarts of the killed master counted %v, want 1", s.fp, got)
		}
	}
}

// refusalsDue counts the requests whose key was asked for more than
// limit in total over the window ending at their instant (them included):
// not all of those can be admitted, so a trace with any such request
// must hold a refusal, however its requests were timed.
func refusalsDue(recs []reference.Record, limit int, window int64) int {
	byKey := map[string][]reference.Record{}
	for _, r := range recs {
		byKey[r.Key] = append(byKey[r.Key], r)
	}
	due := 0
	for _, rs := range byKey {
		slices.SortFunc(rs, func(a, b reference.Record) int { return cmp.Compare(a.At, b.At) })
		lo, sum := 0, 0
		for _, r := range rs {
			sum += r.Cost
			for rs[lo].At <= r.At-window {
				sum -= rs[lo].Cost
				lo++
			}
			if sum > limit {
				due++
			}
		}
	}
	return due
}

// TestStressTopologyRefresh decides from many goroutines while the slot
// map is re-read and republished in a tight loop (the health loop at 1 ms,
// plus direct refreshes and kicks), at GOMAXPROCS 2, 8 and 32, with a
// window of 2 ms on Redis TIME. Without the refusal cache every decision
// replays exactly through the reference model; with it, none over- or
// under-admits.
func TestStressTopologyRefresh(t *testing.T) {
	url := clusterURL(t)
	p := engine.Policy{Name: "stress", Limit: 3, Window: 2 * time.Millisecond}
	for _, procs := range []int{2, 8, 32} {
		for _, cache := range []int{0, 1000} {
			t.Run(fmt.Sprintf("procs=%d/cache=%d", procs, cache), func(t *testing.T) {
				defer setProcs(procs)()
				l := newTestLimiter(t, url, p, WithRefusalCache(cache), WithHealthInterval(time.Millisecond),
					WithTimeout(5*time.Second))
				stop := make(chan struct{})
				var bg sync.WaitGroup
				bg.Add(1)
				go func() {
					defer bg.Done()
					for {
						select {
						case <-stop:
							return
						default:
						}
						l.st.refreshTopology(context.Background())
						l.st.kickHealth()
					}
				}()
				var mu sync.Mutex
				var recs []reference.Record
				var wg sync.WaitGroup
				end := time.Now().Add(300 * time.Millisecond)
				for g := range 32 {
					wg.Add(1)
					go func() {
						defer wg.Done()
						var mine []reference.Record
						for i := 0; time.Now().Before(end); i++ {
							key := fmt.Sprintf("k%d", (g+i)%4)
							n := 1 + (g+i)%3
							d, err := l.Decide(context.Background(), key, n)
							if err != nil {
								t.Error(err)
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
				close(stop)
				bg.Wait()
				rep := reference.VerifyLog(p.Limit, int64(p.Window), recs)
				t.Logf("%d decisions, %d allowed, %d mismatches, %d over, %d under", rep.Decisions, rep.Allowed, rep.Mismatches, rep.OverAdmissions, rep.UnderAdmissions)
				if rep.OverAdmissions != 0 || rep.UnderAdmissions != 0 || rep.Allowed == 0 || rep.Refused == 0 || cache == 0 && rep.Mismatches != 0 {
					t.Fatalf("%+v", rep)
				}
				if fb := metricValue(l.st.m.fallbacks.WithLabelValues("local")); fb != 0 {
					t.Fatalf("%v fallback decisions on a healthy cluster", fb)
				}
			})
		}
	}
}

// setProcs sets GOMAXPROCS and returns a function restoring it.
func setProcs(n int) func() {
	old := runtime.GOMAXPROCS(n)
	return func() { runtime.GOMAXPROCS(old) }
}
