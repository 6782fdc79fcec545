package redisstore

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/slidegate/slidegate/engine"
	"github.com/slidegate/slidegate/internal/reference"
)

// hogThreads spinning threads on 2 cores make a load average of about 10
// (with the test's own work), as on a busy shared machine.
const hogThreads = 10

// loadTimeout is the decision deadline under the hog: under -race at such
// a load a healthy call took up to 808 ms (the default 50 ms would fail
// healthy keys for want of CPU, not of Redis).
const loadTimeout = 2 * time.Second

// cpuHog starts a child process that keeps threads busy for at most d,
// and kills it when the test ends (or when stop is called).
func cpuHog(t *testing.T, threads int, d time.Duration) (stop func()) {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^TestCPUHogChild$", "-test.count=1")
	cmd.Env = append(os.Environ(), "SLIDEGATE_HOG_THREADS="+strconv.Itoa(threads), "SLIDEGATE_HOG_FOR="+d.String())
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { cmd.Wait(); close(done) }()
	var once sync.Once
	stop = func() { once.Do(func() { cmd.Process.Kill(); <-done }) }
	t.Cleanup(stop)
	return stop
}

// TestCPUHogChild runs only as cpuHog's child: it spins its threads until
// its time is up.
func TestCPUHogChild(t *testing.T) {
	n, _ := strconv.Atoi(os.Getenv("SLIDEGATE_HOG_THREADS"))
	d, err := time.ParseDuration(os.Getenv("SLIDEGATE_HOG_FOR"))
	if n == 0 || err != nil {
		t.Skip("runs as cpuHog's child process")
	}
	runtime.GOMAXPROCS(n)
	end := time.Now().Add(d)
	var wg sync.WaitGroup
	for range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			x := 0
			for time.Now().Before(end) {
				for i := range 100000 {
					x += i
				}
			}
			_ = x
		}()
	}
	wg.Wait()
}

// runQueue reads the number of runnable threads from /proc/loadavg.
func runQueue() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "?"
	}
	f := strings.Fields(string(b))
	if len(f) < 4 {
		return "?"
	}
	return f[3] + " (load " + f[0] + ")"
}

// TestLoadedHungMaster stops one master of a three-master cluster
// (SIGSTOP) for 3 s while a CPU hog keeps about 10 threads runnable on the
// machine: the stopped master's keys go to the failure policy, keys on the
// two others never see an error or a fallback, and replay exactly.
func TestLoadedHungMaster(t *testing.T) {
	nodes := ownCluster(t, 3)
	var addrs []string
	for _, n := range nodes {
		addrs = append(addrs, n.addr)
	}
	p := engine.Policy{Name: "loaded", Limit: 5, Window: 200 * time.Millisecond}
	var fallbacks sync.Map
	l, err := New("redis-cluster://"+strings.Join(addrs, ","), p, WithKeyPrefix(testPrefix(t)),
		WithFailurePolicy(FailClosed), WithTimeout(loadTimeout), WithRefusalCache(0),
		WithBreaker(5, 200*time.Millisecond), WithHealthInterval(200*time.Millisecond),
		WithLogger(slog.New(slog.NewTextHandler(io.Discard, nil))),
		WithFallbackHook(func(key string, cause error) {
			v, _ := fallbacks.LoadOrStore(key, new(atomic.Int64))
			v.(*atomic.Int64).Add(1)
		}))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	victim := nodes[0]
	keys := make([]string, 300)
	onVictim := map[string]bool{}
	owners := slotOwners(t, rawClient(t, addrs[0]))
	for i := range keys {
		keys[i] = fmt.Sprintf("client-%d", i)
		onVictim[keys[i]] = owners[int64(slotOf(keys[i]))] == victim.addr
	}

	stopHog := cpuHog(t, hogThreads, 20*time.Second)
	type result struct {
		key     string
		d       engine.Decision
		err     error
		at      time.Time
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
			defer func() { mu.Lock(); results = append(results, mine...); mu.Unlock() }()
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				k := keys[(g*37+i*11)%len(keys)]
				start := time.Now()
				d, err := l.Decide(context.Background(), k, 1)
				mine = append(mine, result{k, d, err, start, time.Since(start)})
			}
		}()
	}
	time.Sleep(time.Second)
	rq := runQueue()
	stopped := time.Now()
	victim.signal(syscall.SIGSTOP)
	time.Sleep(3 * time.Second)
	victim.signal(syscall.SIGCONT)
	time.Sleep(time.Second)
	close(stop)
	wg.Wait()
	stopHog()

	var recs []reference.Record
	healthyErrs, victimErrs, slow := 0, 0, 0
	var worst time.Duration
	var slowAt []time.Duration // when the slow healthy calls started, from SIGSTOP
	for _, r := range results {
		if onVictim[r.key] {
			if r.err != nil {
				victimErrs++
			}
			continue
		}
		worst = max(worst, r.latency)
		if r.latency > 500*time.Millisecond {
			slow++
			if len(slowAt) < 10 {
				slowAt = append(slowAt, r.at.Sub(stopped).Round(10*time.Millisecond))
			}
		}
		if r.err != nil {
			healthyErrs++
			if healthyErrs <= 5 {
				t.Errorf("healthy key %s, %v after SIGSTOP: %v", r.key, r.at.Sub(stopped).Round(time.Millisecond), r.err)
			}
			continue
		}
		recs = append(recs, record(r.key, 1, r.d))
	}
	rep := reference.VerifyLog(p.Limit, int64(p.Window), recs)
	t.Logf("slow healthy calls started at %v from SIGSTOP", slowAt)
	t.Logf("run queue under the hog: %s; %d decisions; healthy keys: %d decisions, %d errors, slowest %v (%d over 500 ms), replay %d mismatches / %d over / %d under; stopped master's keys: %d errors",
		rq, len(results), len(recs), healthyErrs, worst.Round(time.Millisecond), slow, rep.Mismatches, rep.OverAdmissions, rep.UnderAdmissions, victimErrs)
	if healthyErrs > 0 {
		t.Errorf("%d errors on keys of healthy masters", healthyErrs)
	}
	if !rep.OK() || refusalsDue(recs, p.Limit, int64(p.Window)) > 0 && rep.Refused == 0 {
		t.Errorf("healthy keys' replay: %+v", rep)
	}
	for _, k := range keys {
		if v, ok := fallbacks.Load(k); ok && !onVictim[k] {
			t.Errorf("healthy key %s: %d fallback decisions", k, v.(*atomic.Int64).Load())
		}
	}
	if victimErrs == 0 {
		t.Error("no error on the stopped master's keys")
	}
}

// TestLoadedFailover kills one master of a cluster with a replica per
// master while a CPU hog keeps about 10 threads runnable: the replica is
// promoted, its breaker (a new address) is not opened by the old
// master's errors, and keys on the other masters never fail.
func TestLoadedFailover(t *testing.T) {
	nodes := createCluster(t, 3, 1, "--cluster-require-full-coverage", "no")
	var addrs []string
	for _, n := range nodes {
		addrs = append(addrs, n.addr)
	}
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
	p := engine.Policy{Name: "loadedfo", Limit: 5, Window: 200 * time.Millisecond}
	var logs syncBuffer
	l, err := New("redis-cluster://"+strings.Join(addrs, ","), p, WithKeyPrefix(testPrefix(t)),
		WithFailurePolicy(FailClosed), WithTimeout(loadTimeout), WithRefusalCache(0),
		WithBreaker(5, 200*time.Millisecond), WithHealthInterval(200*time.Millisecond),
		WithLogger(slog.New(slog.NewTextHandler(&logs, nil))))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	raw := rawClient(t, addrs...)
	owners := slotOwners(t, raw)
	var victim *redisProc
	for _, n := range nodes {
		out, _ := cli(n.addr, "info", "replication")
		if strings.Contains(out, "role:master") {
			victim = n
			break
		}
	}
	var replica string
	for _, n := range nodes {
		out, _ := cli(n.addr, "info", "replication")
		if strings.Contains(out, "role:slave") && strings.Contains(out, "master_port:"+strconv.Itoa(victim.port)) {
			replica = n.addr
		}
	}
	if replica == "" {
		t.Fatal("no replica of the victim")
	}
	keys := make([]string, 300)
	onVictim := map[string]bool{}
	for i := range keys {
		keys[i] = fmt.Sprintf("client-%d", i)
		onVictim[keys[i]] = owners[int64(slotOf(keys[i]))] == victim.addr
	}
	stopHog := cpuHog(t, hogThreads, 30*time.Second)
	type result struct {
		key string
		d   engine.Decision
		err error
		at  time.Time
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
			defer func() { mu.Lock(); results = append(results, mine...); mu.Unlock() }()
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				k := keys[(g*37+i*11)%len(keys)]
				start := time.Now()
				d, err := l.Decide(context.Background(), k, 1)
				mine = append(mine, result{k, d, err, start})
			}
		}()
	}
	time.Sleep(time.Second)
	rq := runQueue()
	killed := time.Now()
	victim.kill()
	waitFor(t, "the replica promoted and in the store's slot map", func() bool {
		for _, n := range l.st.topo.Load().nodes {
			if n.addr == replica {
				return true
			}
		}
		return false
	})
	promoted := time.Since(killed)
	time.Sleep(2 * time.Second)
	close(stop)
	wg.Wait()
	stopHog()

	var recs []reference.Record
	healthyErrs, victimErrs := 0, 0
	for _, r := range results {
		if onVictim[r.key] {
			if r.err != nil {
				victimErrs++
			}
			continue
		}
		if r.err != nil {
			healthyErrs++
			if healthyErrs <= 5 {
				t.Errorf("healthy key %s, %v after the kill: %v", r.key, r.at.Sub(killed).Round(time.Millisecond), r.err)
			}
			continue
		}
		recs = append(recs, record(r.key, 1, r.d))
	}
	rep := reference.VerifyLog(p.Limit, int64(p.Window), recs)
	opened := metricValue(l.st.m.transitions.WithLabelValues(replica, "open"))
	t.Logf("run queue under the hog: %s; replica in the slot map %v after the kill; healthy keys: %d decisions, %d errors, replay %d mismatches / %d over / %d under; killed master's keys: %d errors; promoted replica's breaker opened %v times",
		rq, promoted.Round(time.Millisecond), len(recs), healthyErrs, rep.Mismatches, rep.OverAdmissions, rep.UnderAdmissions, victimErrs, opened)
	if healthyErrs > 0 {
		t.Errorf("%d errors on keys of healthy masters", healthyErrs)
	}
	if !rep.OK() {
		t.Errorf("healthy keys' replay: %+v", rep)
	}
	if opened != 0 {
		for _, line := range strings.Split(logs.String(), "\n") {
			if strings.Contains(line, replica) && strings.Contains(line, "opened") {
				t.Log(line)
			}
		}
		t.Errorf("the promoted replica's breaker opened %v times", opened)
	}
	if victimErrs == 0 {
		t.Error("no error on the killed master's keys")
	}
}
