package redisstore

import (
	"context"
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"strconv"
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
