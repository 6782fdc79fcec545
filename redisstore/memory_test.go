package redisstore

import (
	"context"
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/rueidis"
	"github.com/slidegate/slidegate/engine"
)

// layoutBytes is what Redis reports (MEMORY USAGE key SAMPLES 0: the key,
// its value, the dict entry and the object header) per stored entry for a
// log of l entries in each candidate layout, with a realistic key name.
type layoutBytes struct {
	zset, list, ring8, ring4, script float64
}

func measureLayouts(t testing.TB, addr string, l int) layoutBytes {
	t.Helper()
	c := rawClient(t, addr)
	ctx := context.Background()
	base := int64(1_764_000_000_000_000) // µs, a 2025 Unix instant
	run := rand.Uint32() & 0xffff        // keys unique to this run, of one length
	key := func(kind string) string { return fmt.Sprintf("m%04x:%s:free:{client-%06d}", run, kind, l) }
	usage := func(k string) float64 {
		n, err := c.Do(ctx, c.B().MemoryUsage().Key(k).Samples(0).Build()).AsInt64()
		if err != nil {
			t.Fatalf("MEMORY USAGE %s: %v", k, err)
		}
		c.Do(ctx, c.B().Del().Key(k).Build())
		return float64(n) / float64(l)
	}
	var cmds rueidis.Commands
	zk, lk := key("zset"), key("list")
	for i := range l {
		at := strconv.FormatInt(base+int64(i)*997, 10)
		cmds = append(cmds,
			c.B().Zadd().Key(zk).ScoreMember().ScoreMember(float64(base+int64(i)*997), at).Build(),
			c.B().Rpush().Key(lk).Element(at).Build())
	}
	ring8 := make([]byte, 8*l)
	ring4 := make([]byte, 4*l)
	for i := range l {
		binary.LittleEndian.PutUint64(ring8[8*i:], uint64(base+int64(i)*997))
		binary.LittleEndian.PutUint32(ring4[4*i:], uint32(i*997))
	}
	cmds = append(cmds,
		c.B().Set().Key(key("ring8")).Value(string(ring8)).Build(),
		c.B().Set().Key(key("ring4")).Value(string(ring4)).Build())
	for _, r := range c.DoMulti(ctx, cmds...) {
		if err := r.Error(); err != nil {
			t.Fatal(err)
		}
	}
	var out layoutBytes
	out.zset, out.list = usage(zk), usage(lk)
	out.ring8, out.ring4 = usage(key("ring8")), usage(key("ring4"))

	// The package's own layout, filled through the script one request at
	// a time as traffic would (growth by doubling included).
	clk := engine.NewManualClock()
	lim, err := New("redis://"+addr, engine.Policy{Name: "free", Limit: l, Window: time.Minute},
		WithClock(clk), WithKeyPrefix(fmt.Sprintf("m%04x:script:", run)), WithRefusalCache(0), WithTimeout(10*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer lim.Close()
	k := fmt.Sprintf("client-%06d", l)
	for i := range l {
		clk.Set(time.Duration(i) * 997 * time.Microsecond)
		if d, err := lim.Decide(ctx, k, 1); err != nil || !d.Allowed {
			t.Fatalf("fill %d: %+v %v", i, d, err)
		}
	}
	out.script = usage(lim.Key(k))
	return out
}

// TestMemoryPerEntry measures the candidate layouts and holds the chosen
// one to its targets: ≤ 6 bytes per entry at L = 100, ≤ 5 at L = 1,000,
// and no cliff beyond (≤ 5 at L = 10,000). docs/distributed.md has the
// numbers.
func TestMemoryPerEntry(t *testing.T) {
	addr := standaloneAddr(t)
	targets := map[int]float64{100: 6, 1000: 5, 10000: 5}
	t.Logf("%8s %8s %8s %8s %8s %8s  (bytes per entry, MEMORY USAGE)", "L", "zset", "list", "ring8", "ring4", "script")
	for _, l := range []int{100, 1000, 10000} {
		m := measureLayouts(t, addr, l)
		t.Logf("%8d %8.2f %8.2f %8.2f %8.2f %8.2f", l, m.zset, m.list, m.ring8, m.ring4, m.script)
		if m.script > targets[l] {
			t.Errorf("L=%d: %.2f bytes per entry, target %.0f", l, m.script, targets[l])
		}
	}
}

// keyBytes is the memory per key of n one-request clients in two designs,
// measured in one run on one server: slidegate's log (through the script)
// and the textbook sorted set (one ZSET per client holding the request's
// instant, with the same key names and TTL).
type keyBytes struct {
	n                       int
	log, zset               float64 // used_memory growth per key
	ring8                   float64 // the earlier layout: a ring of 8 slots from the first request
	logUsage, zsetUsage     int64   // MEMORY USAGE of one key (the log: a bucket)
	logEncoding, zsetEncode string
	buckets                 int64 // Redis keys holding the log's n clients
}

func dbSize(t testing.TB, c rueidis.Client) int64 {
	t.Helper()
	n, err := c.Do(context.Background(), c.B().Dbsize().Build()).AsInt64()
	if err != nil {
		t.Fatal(err)
	}
	return n
}

func usedMemory(t testing.TB, c rueidis.Client) int64 {
	t.Helper()
	s, err := c.Do(context.Background(), c.B().Info().Section("memory").Build()).ToString()
	if err != nil {
		t.Fatal(err)
	}
	v, err := strconv.ParseInt(infoFields(s)["used_memory"], 10, 64)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// measureKeys writes n one-request clients in each design on the server at
// addr (which it flushes: give it a server of its own) and reports the
// growth of used_memory per key.
func measureKeys(t testing.TB, addr string, n int) keyBytes {
	t.Helper()
	c := rawClient(t, addr)
	ctx := context.Background()
	if err := c.Do(ctx, c.B().Flushall().Build()).Error(); err != nil {
		t.Fatal(err)
	}
	p := engine.Policy{Name: "free", Limit: 100, Window: time.Minute}
	// The warm-up below must reach Redis to load the script: a generous
	// round-trip bound, and an error rather than a local fallback.
	l, err := New("redis://"+addr, p, WithKeyPrefix("slidegate:"), WithTimeout(10*time.Second), WithFailurePolicy(FailClosed))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	// Both designs use keys of the same length: the limiter's, and the
	// same with "slidegate:" spelled "textbook:z".
	client := func(i int) string { return fmt.Sprintf("client-%07d", i) }
	args := []string{l.args[0], l.args[1], "1", "-1", l.args[4], l.args[5]}
	load := func(cmd func(i int) rueidis.Completed) float64 {
		// Each design starts from an empty database, so that each pays
		// the same growth of Redis's key tables (they double by steps).
		if err := c.Do(ctx, c.B().Flushall().Build()).Error(); err != nil {
			t.Fatal(err)
		}
		before := usedMemory(t, c)
		const batch = 5000
		for lo := 0; lo < n; lo += batch {
			cmds := make(rueidis.Commands, 0, batch)
			for i := lo; i < min(n, lo+batch); i++ {
				cmds = append(cmds, cmd(i))
			}
			for _, r := range c.DoMulti(ctx, cmds...) {
				if err := r.Error(); err != nil {
					t.Fatal(err)
				}
			}
		}
		return float64(usedMemory(t, c)-before) / float64(n)
	}
	// Load the script once (EVALSHA below): the store may run FCALL.
	if _, err := l.Decide(ctx, "warm", 1); err != nil {
		t.Fatal(err)
	}
	if err := c.Do(ctx, c.B().ScriptLoad().Script(logScript.body).Build()).Error(); err != nil {
		t.Fatal(err)
	}
	out := keyBytes{n: n}
	usage := func(k string) (int64, string) {
		u, err := c.Do(ctx, c.B().MemoryUsage().Key(k).Samples(0).Build()).AsInt64()
		if err != nil {
			t.Fatal(err)
		}
		enc, _ := c.Do(ctx, c.B().ObjectEncoding().Key(k).Build()).ToString()
		return u, enc
	}
	bucket := func(i int) string {
		b, ok := l.bucketIn(slotOf(client(i)), client(i))
		if !ok {
			t.Fatalf("client %q has no bucket", client(i))
		}
		return b
	}
	out.log = load(func(i int) rueidis.Completed {
		return c.B().Evalsha().Sha1(logScript.sha).Numkeys(2).Key(l.Key(client(i)), bucket(i)).Arg(args...).Arg(client(i)).Build()
	})
	// Where one client's state is: its bucket, shared with others.
	out.logUsage, out.logEncoding = usage(bucket(0))
	out.buckets = dbSize(t, c)
	zkey := func(i int) string { return "textbook:z" + strings.TrimPrefix(l.Key(client(i)), "slidegate:") }
	now := time.Now().UnixMicro()
	ttl := p.Window.Milliseconds()
	out.zset = load(func(i int) rueidis.Completed {
		// The textbook's state after one request: ZADD key now now; PEXPIRE.
		at := strconv.FormatInt(now+int64(i), 10)
		return c.B().Arbitrary("EVAL").Args("redis.call('ZADD', KEYS[1], ARGV[1], ARGV[1]); return redis.call('PEXPIRE', KEYS[1], ARGV[2])", "1", zkey(i), at, strconv.FormatInt(ttl, 10)).Build()
	})
	out.zsetUsage, out.zsetEncode = usage(zkey(0))
	rkey := func(i int) string { return "earlier:ri" + strings.TrimPrefix(l.Key(client(i)), "slidegate:") }
	ring := make([]byte, 24+8*4)
	binary.LittleEndian.PutUint64(ring, uint64(now))
	binary.LittleEndian.PutUint64(ring[8:], uint64(now))
	binary.LittleEndian.PutUint32(ring[20:], 1)
	out.ring8 = load(func(i int) rueidis.Completed {
		return c.B().Set().Key(rkey(i)).Value(string(ring)).Px(p.Window).Build()
	})
	return out
}

// TestMemoryOneRequestKeys measures 20,000 one-request clients in the
// log and in the textbook sorted set, in one run on a server of its own
// (BenchmarkMemoryPerKey does a million, for docs/distributed.md). The log
// must cost at most 0.7× the sorted set per client, with its buckets in
// the compact listpack encoding; the figures are logged. (20,000 clients
// in 16,384 buckets is near the least sharing: the ratio falls as clients
// grow, 0.17 at a million.)
func TestMemoryOneRequestKeys(t *testing.T) {
	srv := ownRedis(t)
	m := measureKeys(t, srv.addr, 20000)
	t.Logf("%d one-request clients: log %.1f B/client (%d buckets, one of them MEMORY USAGE %d, %s), sorted set %.1f B/client (MEMORY USAGE %d, %s): ratio %.2f; the earlier 8-slot ring %.1f B/client",
		m.n, m.log, m.buckets, m.logUsage, m.logEncoding, m.zset, m.zsetUsage, m.zsetEncode, m.log/m.zset, m.ring8)
	if m.logEncoding != "listpack" {
		t.Errorf("a bucket of one-request clients is stored as %s, want listpack", m.logEncoding)
	}
	if m.log > 0.7*m.zset {
		t.Errorf("log %.1f B/client, sorted set %.1f: ratio %.2f, want at most 0.7", m.log, m.zset, m.log/m.zset)
	}
}

// BenchmarkMemoryPerKey measures a million one-request clients in the log
// and in the textbook sorted set, in one run on a server of its own, and
// reports used_memory growth per key for each (docs/distributed.md).
//
//	scripts/redis-env.sh go test -run '^$' -bench MemoryPerKey -benchtime 1x ./redisstore/
func BenchmarkMemoryPerKey(b *testing.B) {
	srv := ownRedis(b)
	n := 1_000_000
	if s := os.Getenv("SLIDEGATE_MEMORY_KEYS"); s != "" {
		n, _ = strconv.Atoi(s)
	}
	var m keyBytes
	for b.Loop() {
		m = measureKeys(b, srv.addr, n)
	}
	b.ReportMetric(m.log, "log-B/key")
	b.ReportMetric(m.zset, "zset-B/key")
	b.ReportMetric(m.log/m.zset, "ratio")
	b.ReportMetric(m.ring8, "ring8-B/key")
	b.Logf("%d one-request clients: log %.1f B/client (%d buckets, one of them MEMORY USAGE %d, %s), sorted set %.1f B/client (MEMORY USAGE %d, %s): ratio %.2f; the earlier 8-slot ring %.1f B/client",
		m.n, m.log, m.buckets, m.logUsage, m.logEncoding, m.zset, m.zsetUsage, m.zsetEncode, m.log/m.zset, m.ring8)
}
