package redisstore

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/redis/rueidis"
	"github.com/slidegate/slidegate/engine"
	"github.com/slidegate/slidegate/internal/reference"
)

// placement says where a log client's state is: "bucket" (its field in
// its bucket), "own" (its own key) or "none"; "both" would break the
// scripts' invariant that the state is in one place.
func placement(t *testing.T, raw rueidis.Client, l *Limiter, client string) string {
	t.Helper()
	ctx := context.Background()
	own, err := raw.Do(ctx, raw.B().Exists().Key(l.Key(client)).Build()).AsInt64()
	if err != nil {
		t.Fatal(err)
	}
	var field int64
	if b, ok := l.bucketIn(slotOf(client), client); ok {
		if field, err = raw.Do(ctx, raw.B().Hexists().Key(b).Field(client).Build()).AsInt64(); err != nil {
			t.Fatal(err)
		}
	}
	switch {
	case own == 1 && field == 1:
		return "both"
	case own == 1:
		return "own"
	case field == 1:
		return "bucket"
	}
	return "none"
}

// bucketStep is one decision of a transition test: at clock t, cost n,
// and where the client's state must be afterwards.
type bucketStep struct {
	t     time.Duration
	n     int
	where string
}

// TestBucketTransitions walks a log client across every change of place,
// under a caller clock, every decision compared field by field with the
// reference model: one request (its bucket) → a second accepted one (a
// ring in its own key) → every entry expired and one request (its bucket
// again) → a refusal that raises its watermark (its own key: the compact
// form has no separate watermark) → the clock stepping back (decided at
// the watermark) → expiry → a request of cost 2 straight from the bucket
// → a group decision, allowed and refused. Inspect and reset read and drop
// the field.
func TestBucketTransitions(t *testing.T) {
	url := standaloneURL(t)
	raw := rawClient(t, standaloneAddr(t))
	ctx := context.Background()
	clk := engine.NewManualClock()
	p := engine.Policy{Name: "moves", Limit: 3, Window: time.Second}
	st, err := Open(url, WithClock(clk), WithKeyPrefix(testPrefix(t)), WithRefusalCache(0), WithTimeout(5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	l, err := st.Limiter(p)
	if err != nil {
		t.Fatal(err)
	}
	model := reference.NewLog(p.Limit, int64(p.Window))
	var wm int64
	check := func(i int, client string, d engine.Decision, s bucketStep) {
		t.Helper()
		at := max(int64(s.t), wm)
		wm = at
		want := model.Decide(client, s.n, at)
		if d.Allowed != want.Allowed || d.At != at || d.Remaining != want.Remaining ||
			int64(d.RetryAfter) != want.RetryAfter || int64(d.Reset) != want.Reset {
			t.Fatalf("step %d %+v: got %+v, model %+v at %d", i, s, d, want, at)
		}
		if got := placement(t, raw, l, client); got != s.where {
			t.Fatalf("step %d %+v (%+v): state in %q, want %q", i, s, d, got, s.where)
		}
	}
	ms := time.Millisecond
	steps := []bucketStep{
		{0, 1, "bucket"},         // one request: a field
		{100 * ms, 1, "own"},     // a second accepted: a ring
		{1200 * ms, 1, "bucket"}, // both expired, one more: a field again
		{1300 * ms, 3, "own"},    // refused (1 + 3 > 3): the watermark moves it
		{1250 * ms, 1, "own"},    // the clock steps back: decided at 1.3 s
		{3 * time.Second, 1, "bucket"},
		{5 * time.Second, 2, "own"}, // expired, cost 2: straight to a ring
		{7 * time.Second, 1, "bucket"},
		// Refused at the watermark's own instant: nothing to raise, nothing
		// written, so it stays in its bucket.
		{7 * time.Second, 3, "bucket"},
	}
	for i, s := range steps {
		clk.Set(s.t)
		d, err := l.Decide(ctx, "a", s.n)
		if err != nil {
			t.Fatalf("step %d: %v", i, err)
		}
		check(i, "a", d, s)
	}
	ks, ok, err := l.InspectKey(ctx, "a")
	if err != nil || !ok || ks.Used != 1 || ks.At != int64(7*time.Second) {
		t.Fatalf("inspect of a client in its bucket: %+v %v %v, want 1 used at 7 s", ks, ok, err)
	}
	if held, err := l.ResetKey(ctx, "a"); err != nil || !held {
		t.Fatalf("reset of a client in its bucket: %v %v, want held", held, err)
	}
	if got := placement(t, raw, l, "a"); got != "none" {
		t.Fatalf("after reset the state is in %q", got)
	}
	if _, ok, err := l.InspectKey(ctx, "a"); err != nil || ok {
		t.Fatalf("inspect after reset: %v %v, want nothing held", ok, err)
	}

	// Groups: the log "moves" beside a counter of limit 1.
	c, err := st.Limiter(engine.Policy{Name: "one", Limit: 1, Window: time.Second, Algorithm: engine.SlidingCounter})
	if err != nil {
		t.Fatal(err)
	}
	g, err := NewGroup(l, c)
	if err != nil {
		t.Fatal(err)
	}
	refs := []engine.Ref{{Policy: 0, Key: "b"}, {Policy: 1, Key: "b"}}
	clk.Set(10 * time.Second)
	if _, err := l.Decide(ctx, "b", 1); err != nil {
		t.Fatal(err)
	}
	if got := placement(t, raw, l, "b"); got != "bucket" {
		t.Fatalf("b after one request: %q", got)
	}
	clk.Set(10*time.Second + 10*ms)
	gd, err := g.DecideGroup(ctx, nil, engine.GroupRequest{Refs: refs, N: 1})
	if err != nil || !gd.Allowed || gd.Limits[0].Remaining != 1 {
		t.Fatalf("group, allowed: %+v %v", gd, err)
	}
	if got := placement(t, raw, l, "b"); got != "own" {
		t.Fatalf("b after a group's second request: %q, want its own key", got)
	}
	// A client in its bucket refused by the group's other limit: its
	// watermark moves, so it moves to its own key.
	clk.Set(12 * time.Second)
	if _, err := l.Decide(ctx, "b", 1); err != nil {
		t.Fatal(err)
	}
	if got := placement(t, raw, l, "b"); got != "bucket" {
		t.Fatalf("b after its entries expired and one request: %q", got)
	}
	if gd, err := g.DecideGroup(ctx, nil, engine.GroupRequest{Refs: refs, N: 1}); err != nil || !gd.Allowed {
		t.Fatalf("group at 12 s: %+v %v", gd, err)
	}
	clk.Set(14 * time.Second)
	if _, err := l.Decide(ctx, "b", 1); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Decide(ctx, "b", 1); err != nil {
		t.Fatal(err)
	}
	clk.Set(14*time.Second + 5*ms)
	gd, err = g.DecideGroup(ctx, nil, engine.GroupRequest{Refs: refs, N: 1})
	if err != nil || gd.Allowed || !gd.Limits[0].Allowed || gd.Limits[1].Allowed {
		t.Fatalf("group refused by the counter: %+v %v", gd, err)
	}
	if got := placement(t, raw, l, "b"); got != "own" {
		t.Fatalf("b after a refusal that raised its watermark: %q, want its own key", got)
	}
	clk.Set(14 * time.Second) // steps back: the log decides at the watermark
	d, err := l.Decide(ctx, "b", 1)
	if err != nil || d.At != int64(14*time.Second+5*ms) || !d.Allowed || d.Remaining != 1 {
		t.Fatalf("b after the clock stepped back: %+v %v, want allowed at 14.005 s with 1 remaining", d, err)
	}
}

// TestBucketSweep: under Redis TIME, a new field in a bucket forgets the
// fields there that are past their TTL, and only those; the bucket's TTL
// covers its newest field.
func TestBucketSweep(t *testing.T) {
	url := standaloneURL(t)
	raw := rawClient(t, standaloneAddr(t))
	ctx := context.Background()
	p := engine.Policy{Name: "sweep", Limit: 2, Window: 50 * time.Millisecond}
	const ttl = 51 * time.Millisecond // W in whole ms, plus 1
	l := newTestLimiter(t, url, p, WithRefusalCache(0))
	// Three clients of one bucket.
	var clients []string
	for i := 0; len(clients) < 3; i++ {
		k := "c" + strconv.Itoa(i)
		if slotOf(k) == slotOf("c0") {
			clients = append(clients, k)
		}
	}
	old, kept, fresh := clients[0], clients[1], clients[2]
	if _, err := l.Decide(ctx, old, 1); err != nil {
		t.Fatal(err)
	}
	time.Sleep(3 * ttl) // old is past its TTL
	dk, err := l.Decide(ctx, kept, 1)
	if err != nil {
		t.Fatal(err)
	}
	// HRANDFIELD 2 of a bucket of two fields samples both.
	if got := placement(t, raw, l, old); got != "none" {
		t.Fatalf("a field past its TTL is still in %q after a new field", got)
	}
	df, err := l.Decide(ctx, fresh, 1)
	if err != nil {
		t.Fatal(err)
	}
	tm, err := raw.Do(ctx, raw.B().Time().Build()).AsIntSlice()
	if err != nil {
		t.Fatal(err)
	}
	// The sweep ran at a TIME no later than this one: if kept was within
	// its TTL then, it must have been kept.
	if age := time.Duration(tm[0]*1e9 + tm[1]*1e3 - dk.At); age < ttl {
		if got := placement(t, raw, l, kept); got != "bucket" {
			t.Fatalf("a field %v old (TTL %v) was forgotten: in %q", age, ttl, got)
		}
	} else {
		t.Logf("kept was %v old when fresh arrived: not checked", age)
	}
	b, _ := l.bucketIn(slotOf(fresh), fresh)
	pttl, err := raw.Do(ctx, raw.B().Pttl().Key(b).Build()).AsInt64()
	if err == nil && pttl == -2 {
		// Gone: right only if its TTL, counted from fresh's instant, has run out.
		tm, err := raw.Do(ctx, raw.B().Time().Build()).AsIntSlice()
		if err != nil {
			t.Fatal(err)
		}
		if age := time.Duration(tm[0]*1e9 + tm[1]*1e3 - df.At); age < ttl {
			t.Fatalf("bucket gone %v after its newest field (TTL %v)", age, ttl)
		}
		t.Logf("the bucket expired before its TTL was read (%v after fresh): not checked", time.Duration(tm[0]*1e9+tm[1]*1e3-df.At))
	} else if maxTTL := ttl.Milliseconds() + ttl.Milliseconds()/4; err != nil || pttl <= 0 || pttl > maxTTL {
		// The bucket's expiry is set a quarter of the TTL past its
		// newest field's need (BSLACK), so that one PEXPIRE covers the
		// new fields of that long.
		t.Fatalf("bucket PTTL %d %v, want 1..%d ms (the policy's TTL and a quarter)", pttl, err, maxTTL)
	}
	d, err := l.Decide(ctx, old, 1)
	if err != nil || !d.Allowed || d.Remaining != 1 {
		t.Fatalf("the forgotten client decides as a new one: %+v %v", d, err)
	}
}

// sameBucket returns n distinct client keys whose buckets (and own keys)
// are in one slot.
func sameBucket(prefix string, n int) []string {
	var out []string
	want := -1
	for i := 0; len(out) < n; i++ {
		k := prefix + strconv.Itoa(i)
		s := slotOf(k)
		if want < 0 {
			want = s
		}
		if s == want {
			out = append(out, k)
		}
	}
	return out
}

// fillBucket sends one request for each client through l's log script
// in one pipeline (Redis TIME), as Decide would.
func fillBucket(t *testing.T, raw rueidis.Client, l *Limiter, clients []string) {
	t.Helper()
	args := []string{l.args[0], l.args[1], "1", "-1", l.args[4], l.args[5]}
	cmds := make(rueidis.Commands, 0, len(clients))
	for _, k := range clients {
		b, _ := l.bucketIn(slotOf(k), k)
		cmds = append(cmds, raw.B().Eval().Script(logScript.body).Numkeys(2).Key(l.Key(k), b).Arg(args...).Arg(k).Build())
	}
	for _, r := range raw.DoMulti(context.Background(), cmds...) {
		if err := r.Error(); err != nil {
			t.Fatal(err)
		}
	}
}

// TestBucketFull: a bucket holds at most 512 fields (a listpack at
// Redis's default hash-max-listpack-entries), whatever clients hashing to
// one slot are made to pile up there; the next client keeps the compact
// form in its own key, and comes back when there is room. Under Redis
// TIME a client finding its bucket full first forgets expired fields.
func TestBucketFull(t *testing.T) {
	url := standaloneURL(t)
	raw := rawClient(t, standaloneAddr(t))
	ctx := context.Background()
	clients := sameBucket("f", 514)
	hlen := func(l *Limiter) (int64, string) {
		t.Helper()
		b, _ := l.bucketIn(slotOf(clients[0]), clients[0])
		n, err := raw.Do(ctx, raw.B().Hlen().Key(b).Build()).AsInt64()
		if err != nil {
			t.Fatal(err)
		}
		enc, _ := raw.Do(ctx, raw.B().ObjectEncoding().Key(b).Build()).ToString()
		return n, enc
	}
	t.Run("caller clock", func(t *testing.T) {
		clk := engine.NewManualClock()
		// Keys expire on Redis's own clock a window after each write: a
		// minute's window outlasts any stall of a loaded machine.
		p := engine.Policy{Name: "full", Limit: 3, Window: time.Minute}
		l := newTestLimiter(t, url, p, WithClock(clk), WithRefusalCache(0), WithFailurePolicy(FailClosed))
		model := reference.NewLog(p.Limit, int64(p.Window))
		decide := func(k string, where string) {
			t.Helper()
			d, err := l.Decide(ctx, k, 1)
			at := clk.Now() - clk.Now()%1000
			want := model.Decide(k, 1, at)
			if err != nil || d.Allowed != want.Allowed || d.Remaining != want.Remaining || d.At != at {
				t.Fatalf("%s at %d: %+v %v, model %+v", k, at, d, err, want)
			}
			if got := placement(t, raw, l, k); got != where {
				t.Fatalf("%s at %d: state in %q, want %q", k, at, got, where)
			}
		}
		for _, k := range clients[:512] {
			decide(k, "bucket")
		}
		if n, enc := hlen(l); n != 512 || enc != "listpack" {
			t.Fatalf("bucket of 512 one-request clients: %d fields, %s", n, enc)
		}
		decide(clients[512], "own") // full: its own key
		if enc, _ := raw.Do(ctx, raw.B().ObjectEncoding().Key(l.Key(clients[512])).Build()).ToString(); enc != "int" {
			t.Fatalf("a one-request client beside a full bucket: own key encoded %s, want int", enc)
		}
		clk.Set(time.Millisecond)
		decide(clients[0], "own") // its second request: a ring, room made
		if n, _ := hlen(l); n != 511 {
			t.Fatalf("after a client left, the bucket holds %d", n)
		}
		clk.Set(2 * time.Minute) // everything expired
		decide(clients[512], "bucket")
		decide(clients[513], "own") // full again
		if n, enc := hlen(l); n != 512 || enc != "listpack" {
			t.Fatalf("bucket: %d fields, %s", n, enc)
		}
	})
	t.Run("redis time", func(t *testing.T) {
		p := engine.Policy{Name: "fulltime", Limit: 3, Window: time.Second}
		l := newTestLimiter(t, url, p, WithRefusalCache(0))
		tm := func() time.Duration {
			v, err := raw.Do(ctx, raw.B().Time().Build()).AsIntSlice()
			if err != nil {
				t.Fatal(err)
			}
			return time.Duration(v[0])*time.Second + time.Duration(v[1])*time.Microsecond
		}
		// Under Redis TIME the bucket's own state is one of its 512
		// fields: 510 clients, the live one and the state fill it.
		fillBucket(t, raw, l, clients[:510])
		// Every field of the fill is at tf or before: the fill may take
		// a while on a loaded machine.
		tf := tm()
		time.Sleep(500 * time.Millisecond)
		// A later field keeps the bucket alive past the others' TTL.
		d, err := l.Decide(ctx, clients[511], 1)
		if err != nil || !d.Allowed {
			t.Fatalf("%+v %v", d, err)
		}
		live := time.Duration(d.At)
		// Past the TTL (1,001 ms) of every field of the fill, within the
		// live field's.
		time.Sleep(tf + 1050*time.Millisecond - tm())
		if n, _ := hlen(l); n != 512 || tm()-live > 900*time.Millisecond {
			t.Skipf("the machine was too slow for the timing this needs (%d fields, the live one %v old)", n, tm()-live)
		}
		if d, err := l.Decide(ctx, clients[512], 1); err != nil || !d.Allowed || d.Remaining != 2 {
			t.Fatalf("%+v %v", d, err)
		}
		// The 510 first fields were past their TTL (1,001 ms): the full
		// bucket forgot those of its 16 samples (SWEEP_MANY, distinct)
		// that were neither the live field nor the state, 14 to 16.
		if got := placement(t, raw, l, clients[512]); got != "bucket" {
			t.Fatalf("a client finding its bucket full of expired fields: state in %q, want its bucket", got)
		}
		if got := placement(t, raw, l, clients[511]); got != "bucket" {
			t.Fatalf("the live field was forgotten: state in %q", got)
		}
		if n, _ := hlen(l); n < 512+1-16 || n > 512+1-14 {
			t.Fatalf("bucket holds %d fields, want 512 + 1 less 14 to 16 forgotten", n)
		}
	})
}

// TestBucketCommands: under Redis TIME a new field of a bucket that has
// its state costs one HSET (field and state), and what a bucket needs now
// and then is decided from that state, never at random: its length is
// never read (the first field writes the state), its expiry is set once
// (a quarter of an hour's TTL covers the run), and its sweep runs on
// every eighth new field. Every decision is the reference model's. The state bounds the
// bucket's clients from above, also after resets remove fields, and the
// bucket lasts at least until the state's expiry.
func TestBucketCommands(t *testing.T) {
	srv := ownRedis(t)
	raw := rawClient(t, srv.addr)
	ctx := context.Background()
	p := engine.Policy{Name: "cmds", Limit: 2, Window: time.Hour}
	const ttlMs = 3600*1000 + 1
	l := newTestLimiter(t, "redis://"+srv.addr, p, WithRefusalCache(0), WithFailurePolicy(FailClosed))
	clients := sameBucket("n", 72)
	b, _ := l.bucketIn(slotOf(clients[0]), clients[0])
	names := []string{"hset", "hmget", "hlen", "hrandfield", "pexpire", "pexpireat"}
	calls := func() map[string]int64 {
		m := map[string]int64{}
		for _, c := range names {
			m[c] = cmdCalls(t, srv.addr, c)
		}
		return m
	}
	model := reference.NewLog(p.Limit, int64(p.Window))
	var last int64
	decide := func(k string) {
		t.Helper()
		d, err := l.Decide(ctx, k, 1)
		if err != nil {
			t.Fatal(err)
		}
		want := model.Decide(k, 1, d.At)
		if d.Allowed != want.Allowed || d.Remaining != want.Remaining || int64(d.Reset) != want.Reset {
			t.Fatalf("%s: %+v, model %+v", k, d, want)
		}
		if got := placement(t, raw, l, k); got != "bucket" {
			t.Fatalf("%s after one request: state in %q", k, got)
		}
		last = d.At
	}
	// state returns the bucket's state: its expiry (ms) and its bound.
	state := func() (int64, int64) {
		t.Helper()
		v, err := raw.Do(ctx, raw.B().Hget().Key(b).Field("").Build()).AsInt64()
		if err != nil {
			t.Fatalf("the bucket's state: %v", err)
		}
		return v / 1024, v % 1024
	}
	check := func(wantU int64) {
		t.Helper()
		e, u := state()
		n, err := raw.Do(ctx, raw.B().Hlen().Key(b).Build()).AsInt64()
		if err != nil {
			t.Fatal(err)
		}
		if u != wantU || u < n-1 {
			t.Fatalf("state bound %d with %d fields (the state one of them), want %d", u, n, wantU)
		}
		if e < last/1e6+ttlMs {
			t.Fatalf("state expiry %d ms, before the newest field's need %d", e, last/1e6+ttlMs)
		}
		// PEXPIRETIME: the expiry itself, not a TTL read at one instant
		// and a TIME at another.
		end, err := raw.Do(ctx, raw.B().Pexpiretime().Key(b).Build()).AsInt64()
		if err != nil || end <= 0 {
			t.Fatalf("bucket PEXPIRETIME %d %v", end, err)
		}
		if end < e {
			t.Fatalf("the bucket expires at %d ms, before its state's %d", end, e)
		}
	}
	before := calls()
	for _, k := range clients[:64] {
		decide(k)
	}
	after := calls()
	want := map[string]int64{"hset": 64, "hmget": 64, "hlen": 0, "hrandfield": 8, "pexpire": 1, "pexpireat": 0}
	for _, c := range names {
		if got := after[c] - before[c]; got != want[c] {
			t.Errorf("64 new fields in one bucket: %d %s, want %d (all: %v → %v)", got, c, want[c], before, after)
		}
	}
	check(64)
	// Resets remove fields: the bound stays above the count.
	for _, k := range clients[:10] {
		if held, err := l.ResetKey(ctx, k); err != nil || !held {
			t.Fatalf("reset %s: %v %v", k, held, err)
		}
	}
	check(64)
	for _, k := range clients[64:72] {
		decide(k)
	}
	// The 72nd field sampled 16, forgot none (all live), and kept the bound.
	check(72)
	if n := cmdCalls(t, srv.addr, "hrandfield") - after["hrandfield"]; n != 1 {
		t.Errorf("8 more new fields: %d sweeps, want 1", n)
	}
	// One group call adds two new fields to the bucket: the second
	// counts from the state the first wrote.
	g, err := NewGroup(l)
	if err != nil {
		t.Fatal(err)
	}
	more := sameBucket("n", 74)[72:]
	gd, err := g.DecideGroup(ctx, nil, engine.GroupRequest{Refs: []engine.Ref{{Policy: 0, Key: more[0]}, {Policy: 0, Key: more[1]}}, N: 1})
	if err != nil || !gd.Allowed {
		t.Fatalf("group of two new clients: %+v %v", gd, err)
	}
	for _, k := range more {
		if got := placement(t, raw, l, k); got != "bucket" {
			t.Fatalf("%s after a group's request: state in %q", k, got)
		}
	}
	last = gd.Limits[0].At
	check(74)
}

// TestBucketTTLPerPolicy: under Redis TIME, a new bucket's TTL is its own
// policy's TTL and a quarter, whatever bucket of another policy the same
// server made before it (the library keeps that argument by TTL).
func TestBucketTTLPerPolicy(t *testing.T) {
	url := standaloneURL(t)
	raw := rawClient(t, standaloneAddr(t))
	ctx := context.Background()
	var ls []*Limiter
	var ttls []time.Duration
	for i, w := range []time.Duration{time.Hour, 3 * time.Hour} {
		p := engine.Policy{Name: "bttl" + strconv.Itoa(i), Limit: 5, Window: w}
		ls = append(ls, newTestLimiter(t, url, p, WithRefusalCache(0)))
		ttls = append(ttls, w+time.Millisecond)
	}
	// Clients of distinct slots, so that each makes a new bucket; the
	// policies take turns.
	seen := map[int]bool{}
	for i, n := 0, 0; n < 8; i++ {
		k := "t" + strconv.Itoa(i)
		if seen[slotOf(k)] {
			continue
		}
		seen[slotOf(k)] = true
		j := n % 2
		n++
		l := ls[j]
		if d, err := l.Decide(ctx, k, 1); err != nil || !d.Allowed {
			t.Fatalf("%s: %+v %v", k, d, err)
		}
		if got := placement(t, raw, l, k); got != "bucket" {
			t.Fatalf("%s in %q, want its bucket", k, got)
		}
		b, _ := l.bucketIn(slotOf(k), k)
		pttl, err := raw.Do(ctx, raw.B().Pttl().Key(b).Build()).AsInt64()
		ttl := ttls[j].Milliseconds()
		// A minute of slack below: the decision's TIME precedes the PTTL.
		if lo, hi := ttl-60_000, ttl+ttl/4; err != nil || pttl < lo || pttl > hi {
			t.Fatalf("policy %d, client %s: bucket PTTL %d %v, want %d..%d ms", j, k, pttl, err, lo, hi)
		}
	}
}
