package redisstore

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
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

// moveSlot moves slot from the master at src to the master at dst as
// redis-cli --cluster reshard does: IMPORTING on dst, MIGRATING on src,
// MIGRATE of its keys in rounds, then SETSLOT NODE on every master.
// pause runs between the steps (decisions meet each state).
func moveSlot(t *testing.T, slot int, src, dst string, masters []string, pause func()) {
	t.Helper()
	run := func(addr string, args ...string) string {
		t.Helper()
		out, err := cli(addr, args...)
		if err != nil || strings.HasPrefix(out, "ERR") {
			t.Fatalf("%s %v: %v %s", addr, args, err, out)
		}
		return strings.TrimSpace(out)
	}
	s := strconv.Itoa(slot)
	srcID, dstID := run(src, "cluster", "myid"), run(dst, "cluster", "myid")
	run(dst, "cluster", "setslot", s, "importing", srcID)
	run(src, "cluster", "setslot", s, "migrating", dstID)
	pause()
	host, port, _ := net.SplitHostPort(dst)
	for {
		keys := strings.Fields(run(src, "cluster", "getkeysinslot", s, "10"))
		if len(keys) == 0 {
			break
		}
		run(src, append([]string{"migrate", host, port, "", "0", "5000", "keys"}, keys...)...)
		pause()
	}
	run(dst, "cluster", "setslot", s, "node", dstID)
	run(src, "cluster", "setslot", s, "node", dstID)
	for _, m := range masters {
		if m != src && m != dst {
			run(m, "cluster", "setslot", s, "node", dstID)
		}
	}
}

// nodeLanesStore opens a store on the cluster of nodes, with batching per
// master, and returns it with one log limiter and the slot map.
func nodeLanesStore(t *testing.T, nodes []*redisProc, p engine.Policy, opts ...Option) (*Limiter, []string, map[int64]string) {
	t.Helper()
	var addrs []string
	for _, n := range nodes {
		addrs = append(addrs, n.addr)
	}
	st, err := Open("redis-cluster://"+strings.Join(addrs, ","), append([]Option{WithKeyPrefix(testPrefix(t)), WithRefusalCache(0), WithTimeout(5 * time.Second)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	if !st.nodeLanes {
		t.Fatal("the store batches per slot on Redis 7: per-node lanes are off")
	}
	l, err := st.Limiter(p)
	if err != nil {
		t.Fatal(err)
	}
	rc := rawClient(t, addrs...)
	return l, addrs, slotOwners(t, rc)
}

// TestBatchSlotMovedWhileQueued: eight decisions queue on one master's
// lane, four for a key whose slot then moves to another master (keys
// and all) before the batch's call, four for keys in other slots of that
// master. The four of the moved slot come back undecided and are decided
// by calls of their own on the new master, each once, in sequence with
// the key's earlier decision; the other four are decided by the batch.
// No decision errs, none is lost, none counts twice.
func TestBatchSlotMovedWhileQueued(t *testing.T) {
	nodes := ownCluster(t, 3)
	p := engine.Policy{Name: "bmoved", Limit: 10, Window: time.Minute}
	l, addrs, owners := nodeLanesStore(t, nodes, p)
	const hot = "hot"
	slot := slotOf(hot)
	src := owners[int64(slot)]
	dst := addrs[0]
	if dst == src {
		dst = addrs[1]
	}
	var others []string
	for i := 0; len(others) < 4; i++ {
		k := fmt.Sprintf("o-%d", i)
		if s := slotOf(k); s != slot && owners[int64(s)] == src {
			others = append(others, k)
		}
	}
	if d, err := l.Decide(context.Background(), hot, 1); err != nil || !d.Allowed || d.Remaining != 9 {
		t.Fatalf("the first decision: %+v %v", d, err)
	}
	ln, queued := holdLane(t, l, hot)
	type result struct {
		key string
		d   engine.Decision
		err error
	}
	res := make(chan result, 8)
	for _, k := range append([]string{hot, hot, hot, hot}, others...) {
		go func() {
			d, err := l.Decide(context.Background(), k, 1)
			res <- result{k, d, err}
		}()
	}
	queued(8)
	moveSlot(t, slot, src, dst, addrs, func() {})
	redone0 := l.st.redone.Load()
	leaveAll(l.st, ln)
	seen := map[int]int{}
	for range 8 {
		r := <-res
		if r.err != nil || r.d.Fallback || !r.d.Allowed {
			t.Fatalf("%s: %+v %v, want allowed by Redis", r.key, r.d, r.err)
		}
		if r.key == hot {
			seen[r.d.Remaining]++
		} else if r.d.Remaining != 9 {
			t.Errorf("%s: %d remaining, want 9 (decided once)", r.key, r.d.Remaining)
		}
	}
	for rem := 5; rem <= 8; rem++ {
		if seen[rem] != 1 {
			t.Errorf("the moved key's decisions saw remaining %v, want 8, 7, 6, 5 once each", seen)
			break
		}
	}
	if n := l.st.redone.Load() - redone0; n != 4 {
		t.Errorf("%d decisions handed back by the batch, want the moved slot's 4", n)
	}
	d, err := l.Decide(context.Background(), hot, 1)
	if err != nil || !d.Allowed || d.Remaining != 4 {
		t.Fatalf("the sixth decision of the moved key: %+v %v, want allowed with 4 remaining", d, err)
	}
	if out, _ := cli(dst, "exists", l.Key(hot)); strings.TrimSpace(out) != "1" {
		t.Errorf("the moved key's state is not on its new master (EXISTS: %q)", out)
	}
}

// TestBatchSlotMigratesUnderLoad: 48 callers decide on a hot key and 100
// others while the hot key's slot migrates to another master, key by key,
// and the slot map changes under the store. Every decision returns; those
// Redis answered replay exactly through the reference model (no decision
// made twice, none over-admitted, none missing); the others are errors of
// calls the server refused before running anything (TRYAGAIN while the
// slot's keys are split), under FailClosed.
func TestBatchSlotMigratesUnderLoad(t *testing.T) {
	nodes := ownCluster(t, 3)
	p := engine.Policy{Name: "bmig", Limit: 40, Window: time.Minute}
	l, addrs, owners := nodeLanesStore(t, nodes, p, WithFailurePolicy(FailClosed))
	const hot = "hot"
	slot := slotOf(hot)
	src := owners[int64(slot)]
	dst := addrs[0]
	if dst == src {
		dst = addrs[1]
	}
	const callers, each = 48, 80
	var done atomic.Int64
	var mu sync.Mutex
	var recs []reference.Record
	var errs []error
	var wg sync.WaitGroup
	for g := range callers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := rand.New(rand.NewPCG(uint64(g), 11))
			for range each {
				key := hot
				if r.IntN(3) != 0 {
					key = fmt.Sprintf("k-%d", r.IntN(100))
				}
				ctx, cancel := context.WithTimeout(context.Background(), time.Minute) // a hang bound
				d, err := l.Decide(ctx, key, 1)
				cancel()
				mu.Lock()
				if err != nil || d.Fallback {
					errs = append(errs, fmt.Errorf("%s: %+v: %w", key, d, err))
				} else {
					recs = append(recs, record(key, 1, d))
				}
				mu.Unlock()
				done.Add(1)
			}
		}()
	}
	for done.Load() < callers*each/5 {
		time.Sleep(time.Millisecond)
	}
	redone0 := l.st.redone.Load()
	moveSlot(t, slot, src, dst, addrs, func() { time.Sleep(20 * time.Millisecond) })
	wg.Wait()
	if got := len(recs) + len(errs); got != callers*each {
		t.Fatalf("%d decisions returned, want %d", got, callers*each)
	}
	for _, err := range errs {
		var re *rueidis.RedisError
		if !errors.Is(err, ErrUnavailable) || !errors.As(err, &re) {
			t.Errorf("a decision failed with %v: not a call the server refused before running it", err)
		}
	}
	rep := reference.VerifyLog(p.Limit, int64(p.Window), recs)
	if !rep.OK() {
		t.Errorf("replay: %+v", rep)
	}
	if rep.Refused == 0 {
		t.Errorf("the hot key was not driven to its limit: %d allowed, %d refused", rep.Allowed, rep.Refused)
	}
	t.Logf("%d decisions by Redis (%d allowed, %d refused), %d refused calls, %d handed back by a batch",
		len(recs), rep.Allowed, rep.Refused, len(errs), l.st.redone.Load()-redone0)
	if out, _ := cli(dst, "exists", l.Key(hot)); strings.TrimSpace(out) != "1" {
		t.Errorf("the hot key's state is not on its new master (EXISTS: %q)", out)
	}
}

// TestBatchNodeLanesRefused: where a master refuses the per-node script
// (here an ACL without SCRIPT; Redis 6.2 refuses its flag), the store
// keeps lanes per slot and decides exactly.
func TestBatchNodeLanesRefused(t *testing.T) {
	nodes := ownCluster(t, 3)
	var addrs []string
	for _, n := range nodes {
		if out, err := n.cli("acl", "setuser", "noscript", "on", ">pw", "~*", "+@all", "-script"); err != nil || !strings.Contains(out, "OK") {
			t.Fatalf("ACL SETUSER: %v: %s", err, out)
		}
		addrs = append(addrs, n.addr)
	}
	l := newTestLimiter(t, "redis-cluster://noscript:pw@"+strings.Join(addrs, ","), engine.Policy{Name: "norefl", Limit: 4, Window: time.Minute}, WithRefusalCache(0))
	if l.st.nodeLanes {
		t.Fatal("per-node lanes on although a master refused their script")
	}
	if ln := l.st.laneOf(slotOf("k")); ln.nd != nil {
		t.Fatal("a decision's lane is its master's")
	}
	decideExact(t, l, "k")
}
