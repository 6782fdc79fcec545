package redisstore

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/slidegate/slidegate/engine"
)

// TestScriptRepliesAfterLongerOnes: the group and batch scripts fill a
// table the library keeps from call to call (GOUT, BOUT in lua.go), so a
// call that returns fewer values than the one before it must return its
// own values and none of the earlier call's. Each script is called with a
// long request and then a short one, and the short one's reply must have
// exactly its own length and values.
func TestScriptRepliesAfterLongerOnes(t *testing.T) {
	ctx := context.Background()
	l := newTestLimiter(t, standaloneURL(t), engine.Policy{Name: "replies", Limit: 10, Window: time.Minute})
	key := func(i int) string { return l.Key("c" + strconv.Itoa(i)) }
	now := strconv.FormatInt(time.Hour.Microseconds(), 10)
	// group: one groupScript request of nk keys (no buckets), cost 1.
	group := func(nk, from int) []int64 {
		t.Helper()
		keys, args := []string{}, []string{now}
		for i := range nk {
			keys = append(keys, key(from+i))
			args = append(args, l.gpol, "", "1")
		}
		res, err := l.st.conn.evalKeys(ctx, groupScript, keys, args)
		if err != nil {
			t.Fatalf("group of %d: %v", nk, err)
		}
		return res
	}
	// groupBatch: one groupBatchScript call of groups requests of nk keys.
	groupBatch := func(groups, nk, from int) []int64 {
		t.Helper()
		keys, args := []string{}, []string{"0"}
		for g := range groups {
			args = append(args, "0", strconv.Itoa(nk), "0", now)
			for i := range nk {
				keys = append(keys, key(from+g*nk+i))
				args = append(args, l.gpol, "", "1")
			}
		}
		res, err := l.st.conn.evalKeys(ctx, groupBatchScript, keys, args)
		if err != nil {
			t.Fatalf("batch of %d groups: %v", groups, err)
		}
		return res
	}
	// batch: one batchScript call of n single decisions, cost 1.
	batch := func(n, from int) []int64 {
		t.Helper()
		keys := []string{}
		args := append([]string{"1", "0"}, l.args[0], l.args[1], l.args[4], l.args[5])
		for i := range n {
			keys = append(keys, key(from+i))
			args = append(args, "1", "1", now, "")
		}
		res, err := l.st.conn.evalKeys(ctx, batchScript, keys, args)
		if err != nil {
			t.Fatalf("batch of %d: %v", n, err)
		}
		return res
	}
	if r := group(3, 0); len(r) != 14 {
		t.Fatalf("group of 3: %d values %v, want 14", len(r), r)
	}
	if r := group(1, 10); len(r) != 6 || r[0] != 1 || r[2] != 1 || r[3] != 9 {
		t.Fatalf("group of 1 after a group of 3: %v, want 6 values, allowed, 9 left", r)
	}
	if r := groupBatch(3, 2, 20); len(r) != 30 {
		t.Fatalf("batch of 3 groups of 2: %d values %v, want 30", len(r), r)
	}
	if r := groupBatch(1, 1, 30); len(r) != 6 || r[0] != 1 || r[3] != 9 {
		t.Fatalf("batch of 1 group of 1 after a longer one: %v, want 6 values, allowed, 9 left", r)
	}
	if r := batch(4, 40); len(r) != 20 {
		t.Fatalf("batch of 4: %d values %v, want 20", len(r), r)
	}
	if r := batch(1, 50); len(r) != 5 || r[0] != 1 || r[1] != 9 {
		t.Fatalf("batch of 1 after a batch of 4: %v, want 5 values, allowed, 9 left", r)
	}
}
