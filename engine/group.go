package engine

import (
	"cmp"
	"errors"
	"fmt"
	"reflect"
	"slices"
	"time"

	"github.com/slidegate/slidegate/internal/shard"
)

// ErrInvalidKeys is returned for a group request whose number of keys is
// not the group's number of policies.
var ErrInvalidKeys = errors.New("engine: invalid keys")

// ErrNeedsTag is wrapped by the error a backend that keeps keys in
// partitions (GroupBackend.NeedsTag) returns for a request whose keys
// differ and that names no tag, when it cannot decide such a request: its
// keys would lie in different partitions, which one atomic call cannot
// reach. It is the caller's mistake, not a store failure.
var ErrNeedsTag = errors.New("engine: the keys of this request differ and need a tag to be decided together")

// GroupDecision is the outcome of one request decided against several
// limits at once.
type GroupDecision struct {
	// Allowed is true iff every limit had room; then each limit logged the
	// request. When false, no limit changed.
	Allowed bool
	// Limits holds each limit's own decision, in policy order, all made at
	// one instant (every At is the same).
	Limits []Decision
	// Binding is the index of the limit that decided: for a refusal, the
	// refusing limit with the largest RetryAfter (waiting that long makes
	// every limit fit, absent other traffic); for an allowed request, the
	// limit with the least Remaining. Ties go to the earlier policy.
	Binding int
}

// Decision returns the binding limit's decision: the one to report in
// Retry-After and RateLimit headers.
func (g GroupDecision) Decision() Decision { return g.Limits[g.Binding] }

// Group decides requests that count against several limits at once, all or
// nothing: a request of cost n carries one key per policy (keys[i] counts
// against policies[i]); it is allowed iff every limit has room for n at the
// same instant t, and then n entries of t are logged by every limit; if any
// limit refuses, no limit's log changes. Typical groups: 10 per second and
// 1,000 per hour on one API key; a per-user and a per-IP limit.
//
// Each policy has its own store, so the same key under two policies is two
// separate logs. Decisions take no mutex: a request holds the write bits of
// its keys' blocks, taken in policy order, for the few dozen nanoseconds it
// takes to decide and append. Requests on
// overlapping keys are linearizable: sorted by At they replay exactly
// through a plain log per limit.
//
// A Group of one policy decides exactly as a Limiter does. A Group is safe
// for concurrent use and must not be copied; Close stops its sweeper.
type Group struct {
	policies []Policy
	stores   []*shard.Store
	// ordered: the stores' IDs increase with the policy index, so AllowN's
	// keys are already in the global order of the write bits.
	ordered  bool
	minLimit int
	clock    Clock
	mono     bool
	epoch    time.Time
	wall     time.Time

	sweep sweep
}

// NewGroup returns a Group over policies (at least one), or an error naming
// the policy or option at fault. The options are those of New and apply to
// every policy's store; one background sweeper serves them all.
func NewGroup(policies []Policy, opts ...Option) (*Group, error) {
	if len(policies) == 0 {
		return nil, fmt.Errorf("%w: a group needs at least one policy", ErrInvalidPolicy)
	}
	cfg, err := newConfig(opts)
	if err != nil {
		return nil, err
	}
	if cfg.hashed {
		return nil, errHashedGroup
	}
	g := &Group{policies: append([]Policy(nil), policies...), minLimit: policies[0].Limit}
	var longest time.Duration
	for i, p := range policies {
		if err := p.Validate(); err != nil {
			return nil, fmt.Errorf("policy %d (%q): %w", i, p.Name, err)
		}
		g.minLimit = min(g.minLimit, p.Limit)
		longest = max(longest, p.Window)
	}
	for _, p := range policies {
		st, err := cfg.store(p)
		if err != nil {
			return nil, err
		}
		g.stores = append(g.stores, st)
	}
	g.ordered = true // made in index order
	g.clock, g.mono, g.epoch, g.wall = cfg.timeSource()
	// The longest window sets the pass: shorter-window keys go idle sooner
	// but cost nothing extra while they wait.
	if interval := cfg.sweepInterval(longest); interval > 0 {
		g.sweep.start(g.stores, g.Now, interval)
	}
	return g, nil
}

// NewGroupOf returns a Group over existing limiters, in order, sharing
// their state: a request decided by the group counts in each limiter's own
// log, and a request decided by one limiter counts in the group's. It is
// how a server combines per-policy limiters (each with its own options,
// WithMaxKeys say) into per-route groups. The limiters must read one clock:
// pass the same Clock to each with WithClock (a shared NewMonotonicClock
// keeps the monotonic clock's fast paths). Groups over overlapping
// limiters, in any order, never deadlock.
//
// The group does not own the limiters: each keeps its sweeper, and Close
// on the group does nothing; close the limiters instead.
func NewGroupOf(limiters ...*Limiter) (*Group, error) {
	if len(limiters) == 0 {
		return nil, fmt.Errorf("%w: a group needs at least one limiter", ErrInvalidPolicy)
	}
	first := limiters[0]
	if first == nil {
		return nil, fmt.Errorf("%w: limiter 0 is nil", ErrInvalidOption)
	}
	g := &Group{minLimit: first.Policy().Limit, ordered: true,
		clock: first.clock, mono: first.mono, epoch: first.epoch, wall: first.wall}
	for i, l := range limiters {
		if l == nil {
			return nil, fmt.Errorf("%w: limiter %d is nil", ErrInvalidOption, i)
		}
		for _, o := range limiters[:i] {
			if o == l {
				return nil, fmt.Errorf("%w: limiter %d (%q) appears twice", ErrInvalidOption, i, l.Policy().Name)
			}
		}
		if l.store.HashedKeys() {
			return nil, fmt.Errorf("limiter %d (%q): %w", i, l.Policy().Name, errHashedGroup)
		}
		if !sameClock(l.clock, first.clock) {
			return nil, fmt.Errorf("%w: limiter %d (%q) reads another clock than limiter 0; pass one Clock to every limiter with WithClock", ErrInvalidOption, i, l.Policy().Name)
		}
		if i > 0 && l.store.ID() < limiters[i-1].store.ID() {
			g.ordered = false
		}
		g.policies = append(g.policies, l.Policy())
		g.stores = append(g.stores, l.store)
		g.minLimit = min(g.minLimit, l.Policy().Limit)
	}
	return g, nil
}

// errHashedGroup: a group takes its keys' write bits in key order, one
// order of blocks only when every key has its own block. With
// WithHashedKeys two keys may share one, and a request naming both would
// wait for itself.
var errHashedGroup = fmt.Errorf("%w: limiters with WithHashedKeys cannot form a group (two keys may share one state, which the group's lock order does not allow)", ErrInvalidOption)

// sameClock reports whether a and b are one clock.
func sameClock(a, b Clock) bool {
	ta, tb := reflect.TypeOf(a), reflect.TypeOf(b)
	return ta == tb && ta.Comparable() && a == b
}

// Policies returns a copy of the group's policies, in order.
func (g *Group) Policies() []Policy { return append([]Policy(nil), g.policies...) }

// Now returns the group's current instant. A Clock's reading before 0 is
// taken as 0, as Limiter.Now does.
func (g *Group) Now() int64 {
	if g.mono {
		return int64(time.Since(g.epoch))
	}
	return max(g.clock.Now(), 0)
}

// WallTime maps an instant of the group's clock to wall time, for display
// only.
func (g *Group) WallTime(at int64) time.Time { return g.wall.Add(time.Duration(at)) }

// AllowN decides a request of cost n at the clock's current instant. It
// returns an error, and changes nothing, when len(keys) is not the number
// of policies or n is outside 1..the smallest limit.
func (g *Group) AllowN(keys []string, n int) (GroupDecision, error) {
	if err := g.check(keys, n); err != nil {
		return GroupDecision{}, err
	}
	return g.decide(nil, keys, n, g.Now(), g.mono)
}

// AllowNAt is AllowN at an explicit instant of the group's clock (≥ 0). As
// with Limiter.AllowNAt, a key's instants never go backwards: the request is
// decided at the latest of now and its keys' latest decision instants.
func (g *Group) AllowNAt(keys []string, n int, now int64) (GroupDecision, error) {
	if err := g.check(keys, n); err != nil {
		return GroupDecision{}, err
	}
	if now < 0 {
		return GroupDecision{}, fmt.Errorf("%w: %d is before the clock's epoch", ErrInvalidInstant, now)
	}
	return g.decide(nil, keys, n, now, false)
}

// Ref names one limit of a GroupRequest: the index of one of the
// backend's policies, and the key counted against it.
type Ref struct {
	Policy int
	Key    string
}

// allowRefs decides, all or nothing, a request of cost n that counts each
// ref's key against its policy, at instant now (DecideGroup). Limits in
// the result follow refs' order. A ref repeated exactly (same policy, same
// key) is decided once: a request counts at most once against one key of
// one policy. It returns an error, and changes nothing, when refs is
// empty, a policy index is out of range, or n is outside 1..the smallest
// referenced limit.
func (g *Group) allowRefs(dst []Decision, refs []Ref, n int, now int64, mono bool) (GroupDecision, error) {
	if len(refs) == 0 {
		return GroupDecision{}, fmt.Errorf("%w: no limits", ErrInvalidKeys)
	}
	least := 0
	for i, r := range refs {
		if r.Policy < 0 || r.Policy >= len(g.policies) {
			return GroupDecision{}, fmt.Errorf("%w: ref %d names policy %d of %d", ErrInvalidKeys, i, r.Policy, len(g.policies))
		}
		if l := g.policies[r.Policy].Limit; i == 0 || l < least {
			least = l
		}
	}
	if n < 1 || n > least {
		return GroupDecision{}, fmt.Errorf("%w: %d is outside 1..%d (the smallest limit of the request)", ErrInvalidCost, n, least)
	}
	// The write bits are taken in one global order, (store ID, key), so
	// that requests over overlapping refs cannot deadlock; see
	// shard.DecideGroup.
	var obuf [8]int
	order := obuf[:0]
	if len(refs) > len(obuf) {
		order = make([]int, 0, len(refs))
	}
	for i := range refs {
		order = append(order, i)
	}
	slices.SortFunc(order, func(a, b int) int {
		if c := cmp.Compare(g.stores[refs[a].Policy].ID(), g.stores[refs[b].Policy].ID()); c != 0 {
			return c
		}
		return cmp.Compare(refs[a].Key, refs[b].Key)
	})
	var (
		sbuf [8]*shard.Store
		kbuf [8]string
		rbuf [8]shard.Result
	)
	stores, keys := sbuf[:0], kbuf[:0]
	for j, i := range order {
		if j > 0 && refs[i] == refs[order[j-1]] {
			continue
		}
		stores = append(stores, g.stores[refs[i].Policy])
		keys = append(keys, refs[i].Key)
	}
	var rs []shard.Result
	if len(keys) <= len(rbuf) {
		rs = rbuf[:len(keys)]
	} else {
		rs = make([]shard.Result, len(keys))
	}
	allowed, err := shard.DecideGroup(stores, keys, n, now, mono, rs)
	if err != nil {
		// The engine's own checks leave a limit lowered by SetPolicy since
		// the group was made, and long keys sharing a digest (LongKeyBytes).
		return GroupDecision{}, fmt.Errorf("%w: %w", ErrInvalidCost, err)
	}
	return spread(dst, refs, order, rs, allowed), nil
}

// spread is the group decision whose distinct refs, sorted by order, had
// results rs: each ref's decision is its distinct ref's, in dst (grown
// when it is short).
func spread(dst []Decision, refs []Ref, order []int, rs []shard.Result, allowed bool) GroupDecision {
	if cap(dst) < len(refs) {
		dst = make([]Decision, len(refs))
	}
	gd := GroupDecision{Allowed: allowed, Limits: dst[:len(refs)]}
	u := -1 // index into rs of the current distinct ref
	for j, i := range order {
		if j == 0 || refs[i] != refs[order[j-1]] {
			u++
		}
		gd.Limits[i].set(&rs[u])
	}
	gd.Binding = BindingLimit(gd.Limits, allowed)
	return gd
}

// BindingLimit returns the index among ds of the binding limit of a
// request that was allowed or not, as [GroupDecision.Binding] defines it.
// A [GroupBackend] other than the engine's fills Binding with it, so that
// every backend names the same limit.
func BindingLimit(ds []Decision, allowed bool) int {
	b := 0
	for i := range ds {
		d, cur := &ds[i], &ds[b]
		switch {
		case allowed && d.Remaining < cur.Remaining:
			b = i
		case !allowed && !d.Allowed && (cur.Allowed || d.RetryAfter > cur.RetryAfter):
			b = i
		}
	}
	return b
}

func (g *Group) check(keys []string, n int) error {
	if len(keys) != len(g.policies) {
		return fmt.Errorf("%w: %d keys for %d policies", ErrInvalidKeys, len(keys), len(g.policies))
	}
	if n < 1 || n > g.minLimit {
		return fmt.Errorf("%w: %d is outside 1..%d (the group's smallest limit)", ErrInvalidCost, n, g.minLimit)
	}
	return nil
}

func (g *Group) decide(dst []Decision, keys []string, n int, now int64, mono bool) (GroupDecision, error) {
	if len(keys) == 1 {
		// A group of one decides as a Limiter does, at the same cost.
		var r shard.Result
		if g.stores[0].Decide(keys[0], n, now, mono, &r) != nil {
			// The caller checked n against the limits the group was made
			// with; a SetPolicy since may have lowered one.
			return GroupDecision{}, fmt.Errorf("%w: %d is outside 1..%d", ErrInvalidCost, n, g.stores[0].Limit())
		}
		if cap(dst) < 1 {
			dst = make([]Decision, 1)
		}
		dst = dst[:1]
		dst[0].set(&r)
		return GroupDecision{Allowed: r.Allowed, Limits: dst}, nil
	}
	if !g.ordered {
		var buf [8]Ref
		refs := buf[:0]
		for i, k := range keys {
			refs = append(refs, Ref{Policy: i, Key: k})
		}
		return g.allowRefs(dst, refs, n, now, mono)
	}
	var buf [4]shard.Result
	var rs []shard.Result
	if len(keys) > len(buf) {
		rs = make([]shard.Result, len(keys))
	} else {
		rs = buf[:len(keys)]
	}
	allowed, err := shard.DecideGroup(g.stores, keys, n, now, mono, rs)
	if err != nil {
		// The engine's own checks leave a limit lowered by SetPolicy since
		// the group was made, and long keys sharing a digest (LongKeyBytes).
		return GroupDecision{}, fmt.Errorf("%w: %w", ErrInvalidCost, err)
	}
	if cap(dst) < len(keys) {
		dst = make([]Decision, len(keys))
	}
	gd := GroupDecision{Allowed: allowed, Limits: dst[:len(keys)]}
	for i := range rs {
		gd.Limits[i].set(&rs[i])
	}
	gd.Binding = BindingLimit(gd.Limits, allowed)
	return gd, nil
}

// Stats adds up the stores of every policy.
func (g *Group) Stats() Stats {
	var st Stats
	for _, s := range g.stores {
		st = st.add(s.Stats())
	}
	return st
}

// Sweep drops every idle key of every policy now and returns how many it
// dropped.
func (g *Group) Sweep() int { return g.SweepAt(g.Now()) }

// SweepAt is Sweep at an explicit instant.
func (g *Group) SweepAt(now int64) int {
	total := 0
	for _, s := range g.stores {
		total += s.Sweep(now)
	}
	return total
}

// Close stops the background sweeper and waits for it (a group from
// NewGroupOf has none: its limiters sweep). The group still decides
// afterwards. Close is idempotent and returns nil.
func (g *Group) Close() error {
	g.sweep.close()
	return nil
}
