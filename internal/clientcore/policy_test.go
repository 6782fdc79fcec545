package clientcore

import (
	"errors"
	"testing"
	"time"

	"github.com/slidegate/slidegate/engine"
)

var errInvalid = errors.New("invalid")

func TestParse(t *testing.T) {
	for s, want := range map[string]Policy{"": Local, " Local ": Local, "open": Open, "CLOSED": Closed} {
		if got, err := Parse(s, errInvalid); err != nil || got != want {
			t.Errorf("Parse(%q) = %v, %v; want %v", s, got, err, want)
		}
	}
	if _, err := Parse("fallback", errInvalid); !errors.Is(err, errInvalid) {
		t.Errorf("fallback without the alias: %v", err)
	}
	if got, err := Parse("fallback", errInvalid, "fallback"); err != nil || got != Local {
		t.Errorf("fallback with the alias: %v %v", got, err)
	}
	if s := Policy(7).String(); s != "FailurePolicy(7)" {
		t.Errorf("String of an unknown policy: %q", s)
	}
}

func TestEachKeyAndStatic(t *testing.T) {
	refs := []engine.Ref{{Policy: 0, Key: "a"}, {Policy: 1, Key: "a"}, {Policy: 1, Key: "b"}}
	var keys []string
	EachKey(refs, func(k string, _ error) { keys = append(keys, k) }, errInvalid)
	if len(keys) != 2 || keys[0] != "a" || keys[1] != "b" {
		t.Errorf("EachKey: %v, want [a b]", keys)
	}
	limits := []int{3, 5}
	limit := func(p int) int { return limits[p] }
	gd := Static(nil, refs, 2, limit, Verdict{Open: true, RetryAfter: time.Second, Now: 42})
	if !gd.Allowed || len(gd.Limits) != 3 || gd.Limits[2].Remaining != 3 || gd.Limits[0].At != 42 {
		t.Errorf("open: %+v", gd)
	}
	gd = Static(make([]engine.Decision, 0, 3), refs, 1, limit, Verdict{RetryAfter: time.Second, Now: 7})
	if gd.Allowed || gd.Limits[1].RetryAfter != time.Second || gd.Limits[1].Limit != 5 || gd.Limits[1].Allowed {
		t.Errorf("closed: %+v", gd)
	}
}

// TestThrottle: the first event logs, events within the period do not,
// and the next line counts every event since the previous one.
func TestThrottle(t *testing.T) {
	var th Throttle
	t0 := time.Unix(1000, 0)
	if n, ok := th.Note(t0, time.Second); !ok || n != 1 {
		t.Fatalf("first event: %d %v, want 1 true", n, ok)
	}
	for i := range 5 {
		if _, ok := th.Note(t0.Add(time.Duration(i+1)*100*time.Millisecond), time.Second); ok {
			t.Fatalf("event %d within the period was let through", i)
		}
	}
	if n, ok := th.Note(t0.Add(time.Second), time.Second); !ok || n != 6 {
		t.Fatalf("event one period later: %d %v, want 6 true", n, ok)
	}
}
