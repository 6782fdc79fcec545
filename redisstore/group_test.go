package redisstore

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/slidegate/slidegate/engine"
)

var groupPolicies = []engine.Policy{
	{Name: "per_second", Limit: 2, Window: time.Second},
	{Name: "per_hour", Limit: 3, Window: time.Hour},
}

// TestGroupCrossSlot: on a cluster, a request whose keys differ and that
// names no tag is decided across the keys' own slots, all or nothing: a
// refusal by one slot gives back what the other admitted, whichever slot
// was asked first. The same request with a tag is one call. A standalone
// server needs no tag.
func TestGroupCrossSlot(t *testing.T) {
	ctx := context.Background()
	clk := engine.NewManualClock()
	refs := []engine.Ref{{Policy: 0, Key: "alice"}, {Policy: 1, Key: "10.0.0.1"}}
	t.Run("Cluster", func(t *testing.T) {
		st, ls, g := openGroup(t, clusterURL(t), groupPolicies, suiteOptions(t, clk)...)
		defer st.Close()
		if slotOf("alice") == slotOf("10.0.0.1") {
			t.Fatal("the keys share a slot: the request would not cross slots")
		}
		if !g.NeedsTag() {
			t.Error("NeedsTag is false on a cluster")
		}
		gd, err := g.DecideGroup(ctx, nil, engine.GroupRequest{Refs: refs, N: 1})
		if err != nil || !gd.Allowed || gd.Limits[0].Remaining != 1 || gd.Limits[1].Remaining != 2 {
			t.Fatalf("untagged request over two slots: %+v %v, want allowed", gd, err)
		}
		// The limiters see the group's entries: alice has 1 of 2 left.
		if d, err := ls[0].Decide(ctx, "alice", 1); err != nil || !d.Allowed || d.Remaining != 0 {
			t.Fatalf("alice after the request: %+v %v", d, err)
		}
		// alice's slot refuses. Asked first or second, the IP's slot
		// keeps nothing of the request.
		for _, order := range [][]engine.Ref{refs, {refs[1], refs[0]}} {
			gd, err = g.DecideGroup(ctx, nil, engine.GroupRequest{Refs: order, N: 1})
			if err != nil || gd.Allowed {
				t.Fatalf("alice full: %+v %v, want refused", gd, err)
			}
			s, _, err := ls[1].InspectKey(ctx, "10.0.0.1")
			if err != nil || s.Used != 1 {
				t.Fatalf("the IP holds %d after a refused request (%v), want 1: the entry was not given back", s.Used, err)
			}
		}
		gd, err = g.DecideGroup(ctx, nil, engine.GroupRequest{Refs: refs, N: 1, Tag: "tenant-1"})
		if err != nil || !gd.Allowed {
			t.Fatalf("tagged: %+v %v", gd, err)
		}
		// One client key under both policies needs no tag, and shares
		// the state Limiter.Decide uses: alice's two requests above fill
		// the per-second limit.
		gd, err = g.DecideGroup(ctx, nil, engine.GroupRequest{Refs: []engine.Ref{{Policy: 0, Key: "alice"}, {Policy: 1, Key: "alice"}}, N: 1})
		if err != nil || gd.Allowed || gd.Binding != 0 || gd.Limits[0].Remaining != 0 || gd.Limits[1].Remaining != 3 {
			t.Fatalf("one key, untagged: %+v %v", gd, err)
		}
	})
	t.Run("Standalone", func(t *testing.T) {
		st, ls, g := openGroup(t, standaloneURL(t), groupPolicies, suiteOptions(t, clk)...)
		defer st.Close()
		if g.NeedsTag() {
			t.Error("NeedsTag is true on a standalone server")
		}
		gd, err := g.DecideGroup(ctx, nil, engine.GroupRequest{Refs: refs, N: 1})
		if err != nil || !gd.Allowed {
			t.Fatalf("untagged on standalone: %+v %v", gd, err)
		}
		// The group's keys are the limiters' own.
		if d, err := ls[0].Decide(ctx, "alice", 1); err != nil || d.Remaining != 0 {
			t.Fatalf("alice's limiter after the group's request: %+v %v (want the group's entry counted)", d, err)
		}
	})
}

// TestGroupFailurePolicy: when Redis cannot decide, the failure policy
// decides the whole request: FailLocal all or nothing over the local
// fallback limiters, FailOpen allows every limit, FailClosed refuses with
// ErrUnavailable.
func TestGroupFailurePolicy(t *testing.T) {
	for _, fp := range []FailurePolicy{FailLocal, FailOpen, FailClosed} {
		t.Run(fp.String(), func(t *testing.T) {
			srv := ownRedis(t)
			clk := engine.NewManualClock()
			var hooked []string
			st, _, g := openGroup(t, "redis://"+srv.addr, groupPolicies, WithClock(clk), WithKeyPrefix(testPrefix(t)),
				// A killed server refuses at once: the deadline only has to
				// outlast a loaded machine's scheduling before the kill.
				WithFailurePolicy(fp), WithTimeout(2*time.Second), WithDialTimeout(200*time.Millisecond),
				WithBreaker(1, time.Hour), WithFallbackHook(func(key string, _ error) { hooked = append(hooked, key) }))
			defer st.Close()
			ctx := context.Background()
			refs := []engine.Ref{{Policy: 0, Key: "u"}, {Policy: 1, Key: "u"}, {Policy: 1, Key: "ip"}}
			if gd, err := g.DecideGroup(ctx, nil, engine.GroupRequest{Refs: refs, N: 1}); err != nil || !gd.Allowed {
				t.Fatalf("before the crash: %+v %v", gd, err)
			}
			srv.kill()
			for i := range 4 {
				clk.Advance(time.Millisecond)
				gd, err := g.DecideGroup(ctx, nil, engine.GroupRequest{Refs: refs, N: 1})
				for j, d := range gd.Limits {
					if !d.Fallback {
						t.Fatalf("%s, request %d: limit %d's decision does not say the failure policy made it: %+v", fp, i, j, gd)
					}
				}
				switch fp {
				case FailOpen:
					if err != nil || !gd.Allowed || gd.Limits[1].Remaining != 2 {
						t.Fatalf("open, request %d: %+v %v", i, gd, err)
					}
				case FailClosed:
					if !errors.Is(err, ErrUnavailable) || gd.Allowed || len(gd.Limits) != 3 {
						t.Fatalf("closed, request %d: %+v %v", i, gd, err)
					}
				case FailLocal:
					// Locally: 2 per second binds after two requests, and
					// the refused ones leave the hourly limit untouched.
					if err != nil || gd.Allowed != (i < 2) {
						t.Fatalf("local, request %d: %+v %v", i, gd, err)
					}
					if i == 3 && (gd.Binding != 0 || gd.Limits[1].Remaining != 1) {
						t.Fatalf("local, request %d: %+v (refusals were charged to the hourly limit)", i, gd)
					}
				}
			}
			if len(hooked) != 8 {
				t.Errorf("fallback hook called %d times for 4 requests over 2 distinct keys, want 8: %q", len(hooked), hooked)
			}
		})
	}
}

// TestNewGroupErrors: limiters of one store, distinct, at least one.
func TestNewGroupErrors(t *testing.T) {
	url := standaloneURL(t)
	st1, ls1, _ := openGroup(t, url, groupPolicies, WithKeyPrefix(testPrefix(t)))
	defer st1.Close()
	st2, ls2, _ := openGroup(t, url, groupPolicies, WithKeyPrefix(testPrefix(t)))
	defer st2.Close()
	for _, c := range []struct {
		name string
		ls   []*Limiter
	}{
		{"none", nil},
		{"nil", []*Limiter{ls1[0], nil}},
		{"twice", []*Limiter{ls1[0], ls1[1], ls1[0]}},
		{"two stores", []*Limiter{ls1[0], ls2[1]}},
	} {
		if _, err := NewGroup(c.ls...); !errors.Is(err, ErrInvalidOption) {
			t.Errorf("%s: %v, want ErrInvalidOption", c.name, err)
		}
	}
}

// TestStoreOwnsItsLimiters: the store is the one closer of what it made.
// After Store.Close, its limiters and groups answer ErrClosed; a limiter's
// own Close does nothing to the store; New's limiter closes its store.
// (TestMain's goleak check finds any fallback sweeper left running.)
func TestStoreOwnsItsLimiters(t *testing.T) {
	ctx := context.Background()
	st, ls, g := openGroup(t, standaloneURL(t), groupPolicies, WithKeyPrefix(testPrefix(t)))
	if err := ls[0].Close(); err != nil {
		t.Fatal(err)
	}
	if d, err := ls[0].Decide(ctx, "k", 1); err != nil || !d.Allowed {
		t.Fatalf("after the limiter's own Close: %+v %v (the store owns it)", d, err)
	}
	st.Close()
	st.Close()
	if _, err := ls[1].Decide(ctx, "k", 1); !errors.Is(err, ErrClosed) {
		t.Errorf("limiter after Store.Close: %v, want ErrClosed", err)
	}
	if _, err := g.DecideGroup(ctx, nil, engine.GroupRequest{Refs: []engine.Ref{{Policy: 0, Key: "k"}}, N: 1}); !errors.Is(err, ErrClosed) {
		t.Errorf("group after Store.Close: %v, want ErrClosed", err)
	}
	if _, err := st.Limiter(groupPolicies[0]); !errors.Is(err, ErrClosed) {
		t.Errorf("Store.Limiter after Close: %v, want ErrClosed", err)
	}
	l, err := New(standaloneURL(t), groupPolicies[0], WithKeyPrefix(testPrefix(t)))
	if err != nil {
		t.Fatal(err)
	}
	l.Close()
	if _, err := l.Decide(ctx, "k", 1); !errors.Is(err, ErrClosed) {
		t.Errorf("New's limiter after Close: %v, want ErrClosed", err)
	}
	// Two policies whose keys would coincide: an error, the store open.
	st, err = Open(standaloneURL(t), WithKeyPrefix(testPrefix(t)))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	if _, err := st.Limiters([]engine.Policy{{Name: "a", Limit: 1, Window: time.Second}, {Name: "a", Limit: 2, Window: time.Second}}); !errors.Is(err, engine.ErrInvalidPolicy) {
		t.Errorf("two policies named a: %v", err)
	}
	if _, err := st.Limiter(groupPolicies[0]); err != nil {
		t.Errorf("the store after a failed Limiters: %v", err)
	}
}

// TestKeyAdmin: InspectKey and ResetKey on Redis report what the engine
// reports for the same requests at the same instants (log and counter),
// change nothing when inspecting, and drop the key when resetting.
func TestKeyAdmin(t *testing.T) {
	ctx := context.Background()
	for _, p := range []engine.Policy{
		{Name: "adm-log", Limit: 4, Window: 10 * time.Second},
		{Name: "adm-ctr", Limit: 4, Window: 10 * time.Second, Algorithm: engine.SlidingCounter},
	} {
		for _, url := range []func(testing.TB) string{standaloneURL, clusterURL} {
			clk := engine.NewManualClock()
			l := newTestLimiter(t, url(t), p, WithClock(clk), WithRefusalCache(0), WithTimeout(5*time.Second))
			mem, err := engine.New(p, engine.WithClock(clk), engine.WithSweepInterval(0))
			if err != nil {
				t.Fatal(err)
			}
			defer mem.Close()
			if _, ok, err := l.InspectKey(ctx, "alice"); ok || err != nil {
				t.Fatalf("%s: a key never seen: ok=%v %v", p.Name, ok, err)
			}
			for i, at := range []time.Duration{time.Second, 3 * time.Second, 3 * time.Second, 12 * time.Second, 14 * time.Second} {
				clk.Set(at)
				d, err := l.Decide(ctx, "alice", 1)
				if err != nil {
					t.Fatal(err)
				}
				md, _ := mem.Decide(ctx, "alice", 1)
				if d != md {
					t.Fatalf("%s step %d: redis %+v, engine %+v", p.Name, i, d, md)
				}
				clk.Advance(500 * time.Millisecond)
				got, ok, err := l.InspectKey(ctx, "alice")
				want, _, _ := mem.InspectKey(ctx, "alice")
				if err != nil || !ok || got != want {
					t.Fatalf("%s step %d: InspectKey %+v ok=%v %v, engine %+v", p.Name, i, got, ok, err, want)
				}
				again, _, err := l.InspectKey(ctx, "alice")
				if err != nil {
					t.Fatal(err)
				}
				if again != got {
					t.Fatalf("%s: inspecting twice: %+v then %+v (inspection changed state)", p.Name, got, again)
				}
			}
			had, err := l.ResetKey(ctx, "alice")
			if err != nil || !had {
				t.Fatalf("%s: ResetKey: %v %v", p.Name, had, err)
			}
			if _, ok, _ := l.InspectKey(ctx, "alice"); ok {
				t.Fatalf("%s: key still held after ResetKey", p.Name)
			}
			if had, err := l.ResetKey(ctx, "alice"); err != nil || had {
				t.Fatalf("%s: second ResetKey: %v %v", p.Name, had, err)
			}
			if d, _ := l.Decide(ctx, "alice", p.Limit); !d.Allowed {
				t.Fatalf("%s: after ResetKey the full limit is refused: %+v", p.Name, d)
			}
		}
	}
}

// TestGroupInstantsReachRefusalCache: a limiter's cached refusal is never
// dated before a later group decision on its key, whatever the caller's
// clock does next.
func TestGroupInstantsReachRefusalCache(t *testing.T) {
	ctx := context.Background()
	clk := engine.NewManualClock()
	st, ls, g := openGroup(t, standaloneURL(t), groupPolicies, WithClock(clk), WithKeyPrefix(testPrefix(t)), WithRefusalCache(100))
	defer st.Close()
	clk.Set(10 * time.Second)
	if d, _ := ls[0].Decide(ctx, "k", 2); !d.Allowed {
		t.Fatalf("first: %+v", d)
	}
	d, err := ls[0].Decide(ctx, "k", 1) // refused, and cached until 11 s
	if err != nil || d.Allowed {
		t.Fatalf("second: %+v %v", d, err)
	}
	clk.Set(10*time.Second + 500*time.Millisecond)
	gd, err := g.DecideGroup(ctx, nil, engine.GroupRequest{Refs: []engine.Ref{{Policy: 0, Key: "k"}, {Policy: 1, Key: "k"}}, N: 1})
	if err != nil || gd.Allowed || gd.Limits[0].At != int64(10*time.Second+500*time.Millisecond) {
		t.Fatalf("group: %+v %v", gd, err)
	}
	clk.Set(10*time.Second + 200*time.Millisecond) // the clock steps back
	d, err = ls[0].Decide(ctx, "k", 1)
	if err != nil || d.Allowed || d.At != gd.Limits[0].At {
		t.Fatalf("cached refusal after the group's decision: %+v %v, want At %d", d, err, gd.Limits[0].At)
	}
}
