package engine

import (
	"fmt"
)

// SetOverrides gives some keys a limit of their own in the limiter's
// window: each key of limits is limited to its value, every other key to
// the policy's limit. It replaces the overrides in force; nil removes
// them all. It is the per-key counterpart of SetPolicy and keeps every
// key's state the same way: a key's log holds its accepted instants
// whatever limit applies, so a key whose limit drops below what it holds
// is refused until enough of them leave the window, and one whose limit
// rises gets exactly the difference. Keys whose limit does not change
// keep deciding as before.
//
// Each limit must be 1..MaxLogLimit for the log, 1..MaxCounterLimit for
// the counter; otherwise SetOverrides returns an error and changes
// nothing. The limiter keeps a copy of limits. SetPolicy keeps the
// overrides, so that they follow a changed window.
//
// Decision.Limit reports the limit a decision applied. A cost may go up
// to the key's own limit in AllowN, AllowNAt, ReserveN and WaitN; a Group
// keeps the cost bound of its policies. A cost above a key's own limit
// returns ErrInvalidCost. SetOverrides is safe to call while other goroutines
// decide, with SetPolicy's guarantees: each decision applies the
// overrides before or after the call whole, and ordering a key's
// decisions by At replays them, each with its own limit. A limiter
// without overrides pays one nil check per decision for them; with
// overrides, every decision looks its key up in a map.
func (l *Limiter) SetOverrides(limits map[string]int) error {
	l.setMu.Lock()
	defer l.setMu.Unlock()
	most := MaxLogLimit
	if l.pol.Load().Algorithm == SlidingCounter {
		most = MaxCounterLimit
	}
	for _, n := range limits {
		if n < 1 || n > most {
			return policyErr("overrides", "an override's limit %d is outside 1..%d", n, most)
		}
	}
	if err := l.store.SetOverrides(limits, l.Now); err != nil {
		return fmt.Errorf("%w: %w", ErrPolicyChange, err) // checked above
	}
	return nil
}

// Overrides returns a copy of the overrides in force (SetOverrides), or
// nil for none.
func (l *Limiter) Overrides() map[string]int { return l.store.Overrides() }
