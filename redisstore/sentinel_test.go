package redisstore

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
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

// startSentinel starts a sentinel (redis-server --sentinel) monitoring
// the master at masterAddr as set, with a one-second down-after; it is
// killed when the test ends.
func startSentinel(t *testing.T, set, masterAddr string, extra ...string) string {
	t.Helper()
	host, port, _ := strings.Cut(masterAddr, ":")
	for range 20 {
		sp := freePort(t, false)
		dir := t.TempDir()
		conf := filepath.Join(dir, "sentinel.conf")
		body := fmt.Sprintf("port %d\nbind 127.0.0.1\ndir %s\nsentinel monitor %s %s %s 1\n"+
			"sentinel down-after-milliseconds %s 1000\nsentinel failover-timeout %s 10000\n",
			sp, dir, set, host, port, set, set)
		for _, line := range extra {
			body += line + "\n"
		}
		if err := os.WriteFile(conf, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
		cmd := exec.Command("redis-server", conf, "--sentinel")
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		done := make(chan struct{})
		go func() { cmd.Wait(); close(done) }()
		t.Cleanup(func() { cmd.Process.Kill(); <-done })
		addr := "127.0.0.1:" + strconv.Itoa(sp)
		for range 250 {
			if out, err := cli(addr, "ping"); err == nil && (strings.Contains(out, "PONG") || strings.Contains(out, "NOAUTH")) {
				return addr
			}
			select {
			case <-done:
			default:
				time.Sleep(20 * time.Millisecond)
				continue
			}
			break
		}
		cmd.Process.Kill()
	}
	t.Fatal("could not start a sentinel")
	return ""
}

// TestSentinelFailover: a redis-sentinel:// store decides under traffic
// while SENTINEL FAILOVER promotes the replica. The store follows the
// sentinel to the new master within seconds, the new master's breaker is
// not opened by the old master's errors, and every key replays exactly
// through the reference model, except keys whose accepted requests the
// old master acknowledged after the replica stopped copying it (the
// asynchronous-replication loss docs/distributed.md describes): those
// over-admit by at most the entries lost.
func TestSentinelFailover(t *testing.T) {
	needRedis(t)
	master := ownRedis(t)
	replica := ownRedis(t)
	if out, err := cli(replica.addr, "replicaof", "127.0.0.1", strconv.Itoa(master.port)); err != nil {
		t.Fatalf("replicaof: %v %s", err, out)
	}
	waitFor(t, "the replica in sync", func() bool {
		out, _ := cli(replica.addr, "info", "replication")
		return strings.Contains(out, "master_link_status:up")
	})
	const set = "slidegate-test"
	sentinel := startSentinel(t, set, master.addr)
	waitFor(t, "the sentinel to know the replica", func() bool {
		out, _ := cli(sentinel, "sentinel", "replicas", set)
		return strings.Contains(out, strconv.Itoa(replica.port))
	})

	p := engine.Policy{Name: "sentinel", Limit: 5, Window: time.Minute}
	st, err := Open("redis-sentinel://"+sentinel+"?master_set="+set, WithKeyPrefix(testPrefix(t)),
		WithFailurePolicy(FailClosed), WithTimeout(2*time.Second), WithRefusalCache(0),
		WithBreaker(5, 200*time.Millisecond), WithHealthInterval(200*time.Millisecond),
		WithLogger(slog.New(slog.NewTextHandler(io.Discard, nil))))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	l, err := st.Limiter(p)
	if err != nil {
		t.Fatal(err)
	}
	if got := st.nodeOf(0).addr; got != master.addr {
		t.Fatalf("store on %s, master is %s", got, master.addr)
	}

	tr := startFailoverTraffic(t, l)
	waitFor(t, "traffic", func() bool { return tr.next.Load() > 400 })
	start := time.Now()
	// A sentinel refuses with NOGOODSLAVE until it has the replica's own
	// INFO, which can come after the replica is listed.
	var out string
	waitFor(t, "SENTINEL FAILOVER to be accepted", func() bool {
		start = time.Now()
		out, err = cli(sentinel, "sentinel", "failover", set)
		if err == nil && strings.Contains(out, "NOGOODSLAVE") {
			return false
		}
		return true
	})
	if err != nil || !strings.Contains(out, "OK") {
		t.Fatalf("SENTINEL FAILOVER: %v %s", err, out)
	}
	waitFor(t, "the store on the promoted replica", func() bool {
		out, _ := cli(replica.addr, "info", "replication")
		if !strings.Contains(out, "role:master") || st.nodeOf(0).addr != replica.addr {
			return false
		}
		_, err := l.Decide(context.Background(), fmt.Sprintf("probe-%d", time.Now().UnixNano()), 1)
		return err == nil
	})
	t.Logf("SENTINEL FAILOVER: the store decided on the promoted replica %v after the command", time.Since(start).Round(time.Millisecond))
	results := tr.stopAfter(t, 400)
	checkFailoverReplay(t, l, results, rawClient(t, replica.addr), start, "SENTINEL FAILOVER")
	if got := metricValue(st.m.transitions.WithLabelValues(replica.addr, "open")); got != 0 {
		t.Errorf("the promoted replica's breaker opened %v times", got)
	}
}

// failoverResult is one decision of the failover traffic.
type failoverResult struct {
	key string
	d   engine.Decision
	err error
}

// failoverTraffic is 8 goroutines deciding: each takes the next request
// number, and every 8 requests share a key, so keys fill (L = 5: 5
// accepted, 3 refused) and new keys keep coming through a failover.
type failoverTraffic struct {
	next    atomic.Int64
	stop    chan struct{}
	halt    sync.Once
	wg      sync.WaitGroup
	mu      sync.Mutex
	results []failoverResult
}

// startFailoverTraffic decides from 8 goroutines until stopAfter, or until
// the test ends: a test that fails early must not leave them spinning
// against a closed store for the rest of the package.
func startFailoverTraffic(t *testing.T, l *Limiter) *failoverTraffic {
	tr := &failoverTraffic{stop: make(chan struct{})}
	t.Cleanup(tr.stopNow)
	for range 8 {
		tr.wg.Add(1)
		go func() {
			defer tr.wg.Done()
			var mine []failoverResult
			defer func() { tr.mu.Lock(); tr.results = append(tr.results, mine...); tr.mu.Unlock() }()
			for {
				select {
				case <-tr.stop:
					return
				default:
				}
				k := "k" + strconv.FormatInt(tr.next.Add(1)/8, 10)
				d, err := l.Decide(context.Background(), k, 1)
				mine = append(mine, failoverResult{k, d, err})
			}
		}()
	}
	return tr
}

// stopAfter lets n more requests through, stops the traffic and returns
// every decision.
func (tr *failoverTraffic) stopAfter(t *testing.T, n int64) []failoverResult {
	at := tr.next.Load()
	waitFor(t, "traffic after the failover", func() bool { return tr.next.Load() > at+n })
	tr.stopNow()
	return tr.results
}

// stopNow stops the traffic and waits for it; it may be called twice.
func (tr *failoverTraffic) stopNow() {
	tr.halt.Do(func() { close(tr.stop) })
	tr.wg.Wait()
}

// checkFailoverReplay compares what the callers saw with what the new
// masters hold (raw reads every key where it lives now). Keys whose
// entries are all there replay exactly through the reference model; keys
// that lost entries (acknowledged by the old master after its replica
// stopped copying it) may over-admit, by at most the entries lost; keys
// with an error whose script may have run are left out (their outcome is
// unknown). It returns the lost entries and the over-admissions.
func checkFailoverReplay(t *testing.T, l *Limiter, results []failoverResult, raw rueidis.Client, start time.Time, what string) (lostEntries, over int) {
	t.Helper()
	p := l.Policy()
	byKey := map[string][]reference.Record{}
	accepted := map[string]int{}
	unknown := map[string]bool{}
	errs := 0
	for _, r := range results {
		if r.err != nil {
			errs++
			if mayHaveRun(r.err) {
				unknown[r.key] = true
			}
			continue
		}
		byKey[r.key] = append(byKey[r.key], record(r.key, 1, r.d))
		if r.d.Allowed {
			accepted[r.key]++
		}
	}
	var exact []reference.Record
	lostKeys, admitted := 0, 0
	lostFrom, lostTo := int64(1<<63-1), int64(0)
	for k, recs := range byKey {
		admitted += accepted[k]
		held := logCount(t, raw, l, k)
		switch {
		case unknown[k]:
		case held < accepted[k]:
			lostKeys++
			for _, r := range recs {
				lostFrom, lostTo = min(lostFrom, r.At), max(lostTo, r.At)
			}
			lostEntries += accepted[k] - held
			over += reference.VerifyLog(p.Limit, int64(p.Window), recs).OverAdmissions
		case held > accepted[k]:
			t.Errorf("key %s: the new master holds %d entries, the callers saw %d accepts and no unknown outcome", k, held, accepted[k])
		default:
			exact = append(exact, recs...)
		}
	}
	rep := reference.VerifyLog(p.Limit, int64(p.Window), exact)
	t.Logf("%s: %d decisions (%d admitted) on %d keys, %d errors (%d keys with an unknown outcome); exact replay of %d keys: %d decisions, %d mismatches, %d over, %d under; %d keys lost %d acknowledged entries, %d over-admissions on them",
		what, len(results)-errs, admitted, len(byKey), errs, len(unknown), len(byKey)-lostKeys-len(unknown), rep.Decisions, rep.Mismatches, rep.OverAdmissions, rep.UnderAdmissions, lostKeys, lostEntries, over)
	if lostKeys > 0 {
		t.Logf("%s: the keys that lost entries were decided from %v to %v after the command", what,
			time.Duration(lostFrom-start.UnixNano()).Round(time.Millisecond), time.Duration(lostTo-start.UnixNano()).Round(time.Millisecond))
	}
	if !rep.OK() || rep.Refused == 0 || rep.Allowed == 0 {
		t.Errorf("%s: keys without loss do not replay exactly: %+v", what, rep)
	}
	if over > lostEntries {
		t.Errorf("%s: %d over-admissions on keys that lost %d entries: more than the loss explains", what, over, lostEntries)
	}
	return lostEntries, over
}

// TestClusterTakeover: CLUSTER FAILOVER TAKEOVER on a replica under
// traffic (the replica takes its master's slots without the master's
// agreement, as after a partition): the store moves that master's keys
// to the replica, whose breaker the old master's errors do not open; keys
// whose entries all survived replay exactly, and what the others lost
// (entries the old master acknowledged after the replica stopped copying
// it) bounds their over-admissions.
func TestClusterTakeover(t *testing.T) {
	nodes := createCluster(t, 3, 1, "--cluster-require-full-coverage", "no")
	var addrs []string
	for _, n := range nodes {
		addrs = append(addrs, n.addr)
	}
	var replica string
	waitFor(t, "replicas in sync", func() bool {
		synced := 0
		for _, a := range addrs {
			out, _ := cli(a, "info", "replication")
			if strings.Contains(out, "role:slave") && strings.Contains(out, "master_link_status:up") {
				synced++
				replica = a
			}
		}
		return synced == 3
	})
	p := engine.Policy{Name: "takeover", Limit: 5, Window: time.Minute}
	st, err := Open("redis-cluster://"+strings.Join(addrs, ","), WithKeyPrefix(testPrefix(t)),
		WithFailurePolicy(FailClosed), WithTimeout(2*time.Second), WithRefusalCache(0),
		WithBreaker(5, 200*time.Millisecond), WithHealthInterval(200*time.Millisecond),
		WithLogger(slog.New(slog.NewTextHandler(io.Discard, nil))))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	l, err := st.Limiter(p)
	if err != nil {
		t.Fatal(err)
	}
	tr := startFailoverTraffic(t, l)
	waitFor(t, "traffic", func() bool { return tr.next.Load() > 400 })
	start := time.Now()
	if out, err := cli(replica, "cluster", "failover", "takeover"); err != nil || !strings.Contains(out, "OK") {
		t.Fatalf("CLUSTER FAILOVER TAKEOVER: %v %s", err, out)
	}
	waitFor(t, "the store on the promoted replica", func() bool {
		for _, n := range st.topo.Load().nodes {
			if n.addr == replica {
				return true
			}
		}
		return false
	})
	t.Logf("CLUSTER FAILOVER TAKEOVER: the store's slot map had the promoted replica %v after the command", time.Since(start).Round(time.Millisecond))
	results := tr.stopAfter(t, 400)
	checkFailoverReplay(t, l, results, rawClient(t, addrs...), start, "CLUSTER FAILOVER TAKEOVER")
	if got := metricValue(st.m.transitions.WithLabelValues(replica, "open")); got != 0 {
		t.Errorf("the promoted replica's breaker opened %v times", got)
	}
}

// TestSentinelAuth: sentinels with a password of their own
// (WithSentinelAuth, store_options sentinel_password) in front of a
// master with another one (the URL's); without the sentinels' password
// Open fails, and no error shows either password.
func TestSentinelAuth(t *testing.T) {
	needRedis(t)
	master := ownRedis(t, "--requirepass", "master-s3cret")
	const set = "slidegate-auth"
	sentinel := startSentinel(t, set, master.addr, "requirepass sentinel-s3cret", "sentinel auth-pass "+set+" master-s3cret")
	url := "redis-sentinel://:master-s3cret@" + sentinel + "?master_set=" + set
	p := engine.Policy{Name: "sauth", Limit: 1, Window: time.Minute}
	_, err := New(url, p, WithDialTimeout(time.Second))
	if !errors.Is(err, ErrConnect) || strings.Contains(err.Error(), "s3cret") {
		t.Errorf("without the sentinels' password: %v, want ErrConnect without a password", err)
	} else {
		t.Logf("without the sentinels' password: %v", err)
	}
	opts, err := OptionsFromMap(map[string]any{"sentinel_password": "sentinel-s3cret", "key_prefix": testPrefix(t)})
	if err != nil {
		t.Fatal(err)
	}
	l, err := New(url, p, opts...)
	if err != nil {
		t.Fatalf("with the sentinels' password: %v", err)
	}
	defer l.Close()
	if d, err := l.Decide(context.Background(), "k", 1); err != nil || !d.Allowed {
		t.Errorf("decision through the sentinel: %+v %v", d, err)
	}
	if _, err := New("redis://"+master.addr, p, WithSentinelAuth("", "x")); !errors.Is(err, ErrInvalidOption) {
		t.Errorf("sentinel credentials on redis://: %v, want ErrInvalidOption", err)
	}
}
