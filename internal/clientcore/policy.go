// Package clientcore is what redisstore and remote share as clients of a
// backend that decides: the circuit breaker, the failure policies and
// their decisions, and the checks of the options both packages have.
package clientcore

import (
	"fmt"
	"strings"
	"sync/atomic"
	"time"

	"github.com/slidegate/slidegate/engine"
)

// Policy says what a decision does when the backend cannot decide;
// redisstore.FailurePolicy and remote.FailurePolicy are aliases of it.
type Policy int

// The policies, in the order of their exported names' values.
const (
	Local Policy = iota
	Open
	Closed
)

// String returns "local", "open" or "closed", the configuration names.
func (f Policy) String() string {
	switch f {
	case Local:
		return "local"
	case Open:
		return "open"
	case Closed:
		return "closed"
	}
	return fmt.Sprintf("FailurePolicy(%d)", int(f))
}

// Valid reports whether f is one of the three policies.
func (f Policy) Valid() bool { return f == Local || f == Open || f == Closed }

// Parse parses "local" (also "" and each of localAliases), "open" or
// "closed"; an error wraps invalid.
func Parse(s string, invalid error, localAliases ...string) (Policy, error) {
	t := strings.ToLower(strings.TrimSpace(s))
	switch t {
	case "", "local":
		return Local, nil
	case "open":
		return Open, nil
	case "closed":
		return Closed, nil
	}
	for _, a := range localAliases {
		if t == a {
			return Local, nil
		}
	}
	return 0, fmt.Errorf("%w: failure policy %q (want local, open or closed)", invalid, s)
}

// EachKey calls hook once for each distinct key of refs, in their order
// (a key counted against several policies is one fallback); a nil hook
// does nothing.
func EachKey(refs []engine.Ref, hook func(key string, cause error), cause error) {
	if hook == nil {
		return
	}
	for i, r := range refs {
		if !seenKey(refs[:i], r.Key) {
			hook(r.Key, cause)
		}
	}
}

func seenKey(refs []engine.Ref, key string) bool {
	for _, r := range refs {
		if r.Key == key {
			return true
		}
	}
	return false
}

// Verdict is what a static failure policy answers: allow (Open, as
// FailOpen) or refuse, retrying after RetryAfter (FailClosed), at the
// instant Now (engine.Decision.At).
type Verdict struct {
	Open       bool
	RetryAfter time.Duration
	Now        int64
}

// Static is the group decision v gives refs at cost n, in dst (grown when
// it is short); limit gives a ref's policy's limit.
func Static(dst []engine.Decision, refs []engine.Ref, n int, limit func(policy int) int, v Verdict) engine.GroupDecision {
	if cap(dst) < len(refs) {
		dst = make([]engine.Decision, len(refs))
	}
	gd := engine.GroupDecision{Allowed: v.Open, Limits: dst[:len(refs)]}
	for i, r := range refs {
		l := limit(r.Policy)
		if v.Open {
			gd.Limits[i] = engine.Decision{Allowed: true, Limit: l, Remaining: l - n, At: v.Now}
		} else {
			gd.Limits[i] = engine.Decision{Limit: l, RetryAfter: v.RetryAfter, At: v.Now}
		}
	}
	gd.Binding = engine.BindingLimit(gd.Limits, v.Open)
	return gd
}

// Throttle lets one log line through per period and counts the events
// in between, so that a flood of fallback decisions logs a line naming
// its cause without logging each one. Its zero value is ready; it is safe
// for concurrent use.
type Throttle struct {
	last  atomic.Int64 // Unix ns of the latest line let through; 0: none
	count atomic.Int64 // events since that line
}

// Note records one event at now and reports whether a line is due (the
// first event, or the first one period or more after the latest line),
// with the number of events it covers (this one included).
func (t *Throttle) Note(now time.Time, period time.Duration) (int64, bool) {
	t.count.Add(1)
	ns := now.UnixNano()
	last := t.last.Load()
	if last != 0 && ns-last < int64(period) {
		return 0, false
	}
	if !t.last.CompareAndSwap(last, ns) {
		return 0, false
	}
	return t.count.Swap(0), true
}
