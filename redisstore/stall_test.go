package redisstore

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/slidegate/slidegate/engine"
)

// stalledBatchScript runs the log decision (logBody) twice at one instant
// of Redis TIME, as a batch decides two decisions on one key, after
// spinning until ARGV[8] µs have passed since that instant: what a batch
// whose server was descheduled, or whose earlier decisions took long,
// does. ARGV[1..7]: the single script's. Returns allowed and remaining of
// each decision.
var stalledBatchScript = luaPrelude + `
local function LOG1(KEYS, ARGV)
` + logBody + `
end
local t0 = clock(-1)
local i = 0
repeat
  local u = redis.call('TIME')
  i = i + 1
until u[1] * 1000000 + u[2] >= t0 + ARGV[8] or i > 100000000
local out = {}
for j = 1, 2 do
  BMK = false
  local r = LOG1(KEYS, ARGV)
  out[2 * j - 1], out[2 * j] = r[1], r[2]
end
return out
`

// TestBatchStalledBucket decides a new client twice in one script at the
// script's one TIME, read longer than the key's TTL before its first
// write: a batch on a loaded server. The first decision puts the client
// in its bucket; the second must find it there and leave room for L−2.
// An expiry set at an absolute instant computed from the stale TIME is
// already past when the command runs, and Redis deletes the bucket at
// once: the second decision then finds nothing and admits as if the
// client were new (an over-admission).
func TestBatchStalledBucket(t *testing.T) {
	p := engine.Policy{Name: "stall", Limit: 3, Window: 2 * time.Millisecond}
	l := newTestLimiter(t, standaloneURL(t), p, WithRefusalCache(0))
	raw := rawClient(t, standaloneAddr(t))
	client := "c"
	slot := slotOf(client)
	bk, ok := l.bucketIn(slot, client)
	if !ok {
		t.Fatal("the client has no bucket")
	}
	ttl, err := strconv.Atoi(l.args[5])
	if err != nil {
		t.Fatal(err)
	}
	call := l.callArgs(1, 0, client)
	// Past the bucket's expiry, a quarter of the TTL beyond the TTL, by a
	// whole TTL more.
	stall := strconv.Itoa(2 * (ttl + 1) * 1000)
	args := append(call[:], stall)
	res, err := raw.Do(context.Background(), raw.B().Eval().Script(stalledBatchScript).Numkeys(2).
		Key(l.keyIn(slot, client), bk).Arg(args...).Build()).AsIntSlice()
	if err != nil {
		t.Fatal(err)
	}
	want := []int64{1, int64(p.Limit - 1), 1, int64(p.Limit - 2)}
	if len(res) != len(want) {
		t.Fatalf("script returned %v, want %v", res, want)
	}
	for i := range want {
		if res[i] != want[i] {
			t.Fatalf("two decisions of cost 1 at one instant returned (allowed, remaining) %v, want %v: the first one's entry was lost", res, want)
		}
	}
}
