package clientcore

import (
	"errors"
	"testing"
	"time"
)

// TestSetters: each option check refuses what its option refuses, with an
// error wrapping the caller's, and leaves the setting unchanged; it sets
// what it accepts.
func TestSetters(t *testing.T) {
	p := Local
	if err := SetPolicy(&p, Policy(3), errInvalid); !errors.Is(err, errInvalid) || p != Local {
		t.Errorf("SetPolicy(3): %v, policy %v", err, p)
	}
	if err := SetPolicy(&p, Closed, errInvalid); err != nil || p != Closed {
		t.Errorf("SetPolicy(Closed): %v, policy %v", err, p)
	}

	th, cd := 5, time.Second
	for _, c := range []struct {
		threshold int
		cooldown  time.Duration
	}{{-1, time.Second}, {1, 0}, {1, -time.Second}} {
		if err := SetBreaker(&th, &cd, c.threshold, c.cooldown, errInvalid); !errors.Is(err, errInvalid) || th != 5 || cd != time.Second {
			t.Errorf("SetBreaker(%d, %v): %v; settings %d %v", c.threshold, c.cooldown, err, th, cd)
		}
	}
	if err := SetBreaker(&th, &cd, 0, 0, errInvalid); err != nil || th != 0 || cd != 0 {
		t.Errorf("SetBreaker(0, 0) (off): %v; settings %d %v", err, th, cd)
	}
	if err := SetBreaker(&th, &cd, 3, time.Minute, errInvalid); err != nil || th != 3 || cd != time.Minute {
		t.Errorf("SetBreaker(3, 1m): %v; settings %d %v", err, th, cd)
	}

	d := time.Second
	for _, bad := range []time.Duration{0, -time.Millisecond} {
		err := Positive(&d, bad, "dial timeout", errInvalid)
		if !errors.Is(err, errInvalid) || d != time.Second {
			t.Errorf("Positive(%v): %v; setting %v", bad, err, d)
		}
		if want := "invalid: dial timeout " + bad.String() + " must be positive"; err == nil || err.Error() != want {
			t.Errorf("Positive(%v): %v, want %q", bad, err, want)
		}
	}
	if err := Positive(&d, time.Millisecond, "timeout", errInvalid); err != nil || d != time.Millisecond {
		t.Errorf("Positive(1ms): %v; setting %v", err, d)
	}

	var hook func(string, error)
	if err := SetHook(&hook, nil, errInvalid); !errors.Is(err, errInvalid) || hook != nil {
		t.Errorf("SetHook(nil): %v", err)
	}
	called := false
	if err := SetHook(&hook, func(string, error) { called = true }, errInvalid); err != nil || hook == nil {
		t.Fatalf("SetHook: %v", err)
	}
	hook("k", nil)
	if !called {
		t.Error("SetHook set another function")
	}
}

// TestAtLeast: a count below its least is refused and leaves the setting.
func TestAtLeast(t *testing.T) {
	n := 7
	if err := AtLeast(&n, 0, 1, "max idle connections", errInvalid); !errors.Is(err, errInvalid) || n != 7 ||
		err.Error() != "invalid: max idle connections 0 must be at least 1" {
		t.Errorf("AtLeast(0, 1): %v; setting %d", err, n)
	}
	if err := AtLeast(&n, 0, 0, "refusal cache size", errInvalid); err != nil || n != 0 {
		t.Errorf("AtLeast(0, 0): %v; setting %d", err, n)
	}
}

type testOption func(*[]string) error

// TestApply: options apply in order, nil ones are skipped, and the first
// error stops the rest.
func TestApply(t *testing.T) {
	add := func(s string) testOption { return func(c *[]string) error { *c = append(*c, s); return nil } }
	var got []string
	if err := Apply(&got, []testOption{add("a"), nil, add("b")}); err != nil || len(got) != 2 || got[0] != "a" || got[1] != "b" {
		t.Fatalf("Apply: %v %v", got, err)
	}
	got = nil
	fail := testOption(func(*[]string) error { return errInvalid })
	if err := Apply(&got, []testOption{add("a"), fail, add("b")}); !errors.Is(err, errInvalid) || len(got) != 1 {
		t.Fatalf("Apply with a failing option: %v %v", got, err)
	}
}

// TestUnavailable names the backend and its server, and unwraps to the
// cause.
func TestUnavailable(t *testing.T) {
	var err error = &Unavailable{Backend: "slidegate", Server: "http://127.0.0.1:8080", Cause: errInvalid}
	if !errors.Is(err, errInvalid) || err.Error() != "slidegate at http://127.0.0.1:8080 did not decide: invalid" {
		t.Errorf("%v", err)
	}
}

// TestNonZero: a nil interface, a nil pointer or an empty string is
// refused with the option's words and leaves the setting.
func TestNonZero(t *testing.T) {
	s := "kept"
	if err := NonZero(&s, "", "empty TLS server name", errInvalid); !errors.Is(err, errInvalid) || s != "kept" ||
		err.Error() != "invalid: empty TLS server name" {
		t.Errorf("NonZero(\"\"): %v; setting %q", err, s)
	}
	if err := NonZero(&s, "redis.internal", "empty TLS server name", errInvalid); err != nil || s != "redis.internal" {
		t.Errorf("NonZero(name): %v; setting %q", err, s)
	}
	var e error = errInvalid
	if err := NonZero(&e, nil, "nil cause", errInvalid); err == nil || e != errInvalid {
		t.Errorf("NonZero(nil interface): %v; setting %v", err, e)
	}
	p := new(int)
	if err := NonZero(&p, nil, "nil pointer", errInvalid); err == nil || p == nil {
		t.Errorf("NonZero(nil pointer): %v", err)
	}
}
