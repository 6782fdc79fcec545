package engine

import (
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/slidegate/slidegate/internal/shard"
)

// Algorithm selects how a Limiter decides.
type Algorithm int

const (
	// SlidingLog is the exact sliding window log, the default: at most
	// Limit accepted requests in any window (t−W, t].
	SlidingLog Algorithm = iota
	// SlidingCounter is the sliding window counter: O(1) state per key, an
	// estimate of the log that errs both ways (see docs/algorithms.md).
	SlidingCounter
)

// String returns "log" or "counter", the names configuration files use.
func (a Algorithm) String() string {
	switch a {
	case SlidingLog:
		return "log"
	case SlidingCounter:
		return "counter"
	}
	return fmt.Sprintf("Algorithm(%d)", int(a))
}

// ParseAlgorithm parses "log" (also "" and "sliding-log") or "counter"
// ("sliding-counter").
func ParseAlgorithm(s string) (Algorithm, error) {
	switch strings.ToLower(strings.TrimSpace(s)) {
	case "", "log", "sliding-log", "sliding_log":
		return SlidingLog, nil
	case "counter", "sliding-counter", "sliding_counter":
		return SlidingCounter, nil
	}
	return 0, fmt.Errorf("engine: unknown algorithm %q (want log or counter)", s)
}

// Limits on policies. A log ring of MaxLogLimit instants costs 8 MiB for one
// busy key; limits beyond it are what the counter is for.
const (
	MaxLogLimit     = shard.MaxLogLimit
	MaxCounterLimit = shard.MaxCounterLimit
	MaxWindow       = time.Duration(shard.MaxWindow)
)

// LongKeyBytes is the longest key a limiter keeps a copy of. A longer key
// is kept as a 127-bit digest under secret per-limiter seeds, so it costs
// the same bytes as a short one whatever its length (docs/operations.md,
// "Memory"); two long keys whose digests collide would share one limit,
// and among n long keys the chance that any two do is about n²/2¹²⁸
// (3·10⁻²³ at a billion keys).
const LongKeyBytes = shard.LongKeyBytes

// Policy is a limit over a sliding window: at most Limit accepted requests
// (counting a request of cost n as n) in any window of length Window.
type Policy struct {
	Name      string        // shown in headers and metrics; optional
	Limit     int           // ≥ 1
	Window    time.Duration // > 0
	Algorithm Algorithm     // zero value: SlidingLog
}

// Validate reports whether p is usable: nil, or a *PolicyError naming the
// field at fault.
func (p Policy) Validate() error {
	switch {
	case p.Algorithm != SlidingLog && p.Algorithm != SlidingCounter:
		return policyErr("algorithm", "algorithm %d is neither SlidingLog nor SlidingCounter", int(p.Algorithm))
	case p.Limit < 1:
		return policyErr("limit", "limit %d must be at least 1", p.Limit)
	case p.Algorithm == SlidingLog && p.Limit > MaxLogLimit:
		return policyErr("limit", "limit %d exceeds %d for the log (use the counter)", p.Limit, MaxLogLimit)
	case p.Limit > MaxCounterLimit:
		return policyErr("limit", "limit %d exceeds %d", p.Limit, MaxCounterLimit)
	case p.Window <= 0:
		return policyErr("window", "window %v must be positive", p.Window)
	case p.Window > MaxWindow:
		return policyErr("window", "window %v exceeds %v", p.Window, MaxWindow)
	}
	return nil
}

// policyErr returns a *PolicyError for field with a formatted reason.
func policyErr(field, format string, args ...any) *PolicyError {
	return &PolicyError{Field: field, Reason: fmt.Sprintf(format, args...)}
}

// Decision is the outcome of one request. It is a plain value: a refusal is
// an ordinary outcome, not an error.
type Decision struct {
	Allowed bool
	// Limit is the policy's limit.
	Limit int
	// Remaining is how many more unit requests fit now, after this one.
	Remaining int
	// RetryAfter, on a refusal, is how long until this same request fits
	// if nothing else is accepted meanwhile; 0 when allowed.
	RetryAfter time.Duration
	// Reset is how long until the oldest live entry leaves the window
	// (the log) or the estimate decays to zero (the counter); 0 when the
	// key holds nothing.
	Reset time.Duration
	// At is the instant, in the limiter's clock, the decision was made at:
	// the clock's reading, or the key's latest decision instant if that is
	// later (a caller passing an earlier instant to AllowNAt, a clock set
	// back). Per key, ordering decisions by At is an order in which they
	// took effect, and replaying them in it reproduces them
	// (docs/design.md).
	At int64
	// Overflow reports that the key was new while the limiter already
	// tracked its WithMaxKeys cap of keys: the request was decided without
	// state, and Allowed says what WithOverflow chose. An admitted overflow
	// is not logged; a refused one has RetryAfter one window, an estimate
	// (room for new keys appears as idle keys are swept).
	Overflow bool
	// Fallback reports that a shared backend (Redis, a remote service)
	// did not decide: its failure policy did, or it refused a request
	// whose outcome it could not learn. Such a decision is not the shared
	// limit's.
	Fallback bool
}

// Defaults.
const (
	// DefaultShards is the shard count (a power of two).
	DefaultShards = shard.DefaultShards
	// DefaultMaxSweepInterval caps how long one full sweep pass takes; a
	// pass takes one window for shorter windows, at least MinSweepInterval.
	DefaultMaxSweepInterval = time.Minute
	// MinSweepInterval is the shortest full sweep pass.
	MinSweepInterval = time.Second
)

type config struct {
	clock    Clock
	shards   int
	presize  int
	sweep    time.Duration
	sweepSet bool
	maxKeys  int
	overflow Overflow
	hashed   bool
}

// Overflow is what a limiter does with a request for a new key when it
// already tracks WithMaxKeys keys.
type Overflow int

const (
	// OverflowRefuse refuses the request (the default): a flood of new keys
	// cannot grow the limiter's memory, and keys already tracked keep their
	// exact limits.
	OverflowRefuse Overflow = iota
	// OverflowAllow admits the request without tracking the key: new
	// clients are not locked out by a flood, but are not limited either
	// until the limiter has room again.
	OverflowAllow
)

// String returns "refuse" or "allow", the names configuration files use.
func (o Overflow) String() string {
	switch o {
	case OverflowRefuse:
		return "refuse"
	case OverflowAllow:
		return "allow"
	}
	return fmt.Sprintf("Overflow(%d)", int(o))
}

// ParseOverflow parses "refuse" (also "") or "allow".
func ParseOverflow(s string) (Overflow, error) {
	switch strings.ToLower(strings.TrimSpace(s)) {
	case "", "refuse":
		return OverflowRefuse, nil
	case "allow":
		return OverflowAllow, nil
	}
	return 0, fmt.Errorf("%w: unknown overflow %q (want refuse or allow)", ErrInvalidOption, s)
}

// Option configures a Limiter.
type Option func(*config) error

// checked is the Option of every With function that takes a value: it
// applies set when the value is valid (ok), and otherwise returns an
// error wrapping ErrInvalidOption, whose reason is format and args.
func checked(ok bool, set func(*config), format string, args ...any) Option {
	return func(cfg *config) error {
		if !ok {
			return fmt.Errorf("%w: %s", ErrInvalidOption, fmt.Sprintf(format, args...))
		}
		set(cfg)
		return nil
	}
}

// WithClock sets the clock decisions read. The default is the monotonic
// clock (NewMonotonicClock).
func WithClock(c Clock) Option {
	return checked(c != nil, func(cfg *config) { cfg.clock = c }, "nil clock")
}

// WithShards sets the number of shards, a power of two from 1 to 65536.
func WithShards(n int) Option {
	return checked(n >= 1 && n <= 1<<16 && n&(n-1) == 0, func(cfg *config) { cfg.shards = n },
		"shards %d must be a power of two from 1 to 65536", n)
}

// WithPresize sizes the maps for about n keys up front (0 to 2^30),
// saving the rehashing a growing population pays.
func WithPresize(n int) Option {
	return checked(n >= 0 && n <= shard.MaxPresize, func(cfg *config) { cfg.presize = n },
		"presize %d is outside 0..%d", n, shard.MaxPresize)
}

// WithSweepInterval sets how long one full pass of the background sweeper
// over all shards takes; idle keys are dropped at most about W + d after
// their last accepted request. 0 turns the background sweeper off (Sweep
// can still be called). The default is the window, clamped to
// [MinSweepInterval, DefaultMaxSweepInterval].
func WithSweepInterval(d time.Duration) Option {
	return checked(d >= 0, func(cfg *config) { cfg.sweep, cfg.sweepSet = d, true },
		"sweep interval %v is negative", d)
}

// WithMaxKeys caps the number of keys the limiter tracks at n; 0, the
// default, means no cap. A key counts from its first request until the
// sweeper drops it as idle. When the cap is reached, a request for a new key
// is decided as WithOverflow says and reported with Decision.Overflow; keys
// already tracked keep their exact limits. Each key costs about 100 bytes
// (docs/design.md), so the cap bounds the memory a flood of distinct keys
// can take.
func WithMaxKeys(n int) Option {
	return checked(n >= 0, func(cfg *config) { cfg.maxKeys = n }, "max keys %d is negative", n)
}

// WithOverflow sets what a request for a new key gets when the limiter holds
// WithMaxKeys keys: OverflowRefuse (the default) or OverflowAllow.
func WithOverflow(o Overflow) Option {
	return checked(o == OverflowRefuse || o == OverflowAllow, func(cfg *config) { cfg.overflow = o },
		"overflow %d is neither OverflowRefuse nor OverflowAllow", int(o))
}

// WithHashedKeys keeps only a 64-bit hash of each key, seeded at random per
// limiter, instead of a copy of the key's bytes (by default only keys
// longer than LongKeyBytes are kept as a digest): a key costs about 32
// bytes less (docs/design.md, "Memory"). Two keys whose hashes collide share one state, so one limit: the
// pair is never admitted more than Limit per window together, so neither
// is alone, but each may be refused for the other's requests. Among n
// keys the chance that any two collide is about n²/2⁶⁵: 2.7·10⁻⁶ at ten
// million keys. The seed is secret, so a client cannot aim for a
// collision. The default keeps the bytes and never merges keys. Limiters
// with hashed keys cannot form a Group (NewGroup and NewGroupOf refuse).
func WithHashedKeys() Option {
	return func(cfg *config) error {
		cfg.hashed = true
		return nil
	}
}

// Limiter decides, per key, whether a request fits its Policy.
//
// The default algorithm is the exact sliding window log: for each key it
// keeps the instants of accepted requests, and a request of cost n at t is
// allowed iff the entries in (t−W, t] plus n are at most the limit. Refused
// requests are never logged, so being refused never prolongs a block.
// [Decision] defines every field of the outcome.
//
// Most callers want [Limiter.Allow]; [Limiter.AllowN] charges a cost;
// [Limiter.AllowNAt] takes the instant explicitly, for replays and tests.
//
// State lives in a sharded, mostly lock-free store (package shard): a key
// costs one small block that holds a copy of the key (for a key longer than
// LongKeyBytes, or with WithHashedKeys, only a digest of it, in the map) and grows with the requests it holds, up
// to Limit instants for the log (6 bytes each for windows up to 2^47 ns,
// about 39 hours; 8 bytes beyond), and 32 bytes of state for the counter. A ring that must grow is reallocated: a key's first few
// requests cost an allocation or two each time its ring doubles, and a
// request on a key whose ring has room allocates nothing. A
// background sweeper drops keys whose log is empty; Close stops it.
//
// A Limiter is safe for concurrent use and must not be copied. Any string is
// a valid key, including "" and invalid UTF-8.
type Limiter struct {
	pol   atomic.Pointer[Policy] // the policy in force (SetPolicy)
	setMu sync.Mutex             // one SetPolicy at a time
	store *shard.Store
	clock Clock
	mono  bool
	epoch time.Time // monotonic clock: its epoch; wall mapping for others
	wall  time.Time // wall time at instant 0

	sweep sweep
}

// New returns a Limiter for policy p, or an error naming what is wrong with
// p or an option.
func New(p Policy, opts ...Option) (*Limiter, error) {
	if err := p.Validate(); err != nil {
		return nil, err
	}
	cfg, err := newConfig(opts)
	if err != nil {
		return nil, err
	}
	st, err := cfg.store(p)
	if err != nil {
		return nil, err
	}
	l := &Limiter{store: st}
	l.pol.Store(&p)
	l.clock, l.mono, l.epoch, l.wall = cfg.timeSource()
	if interval := cfg.sweepInterval(p.Window); interval > 0 {
		l.sweep.start([]*shard.Store{l.store}, l.Now, interval)
	}
	return l, nil
}

func newConfig(opts []Option) (config, error) {
	var cfg config
	for _, o := range opts {
		if o == nil {
			continue
		}
		if err := o(&cfg); err != nil {
			return config{}, err
		}
	}
	return cfg, nil
}

// timeSource returns the clock a limiter reads, whether it is the default
// monotonic one, its epoch, and the wall time of instant 0.
func (cfg *config) timeSource() (c Clock, mono bool, epoch, wall time.Time) {
	if cfg.clock == nil {
		mc := NewMonotonicClock().(monoClock)
		return mc, true, mc.epoch, mc.epoch
	}
	if mc, ok := cfg.clock.(monoClock); ok {
		// One monotonic clock shared by several limiters (so that
		// NewGroupOf can combine them) keeps the monotonic fast paths.
		return mc, true, mc.epoch, mc.epoch
	}
	// Map instant 0 to wall time once, so that X-RateLimit-Reset can be
	// printed; decisions never see wall time.
	return cfg.clock, false, time.Time{}, time.Now().Add(-time.Duration(cfg.clock.Now()))
}

// store returns a new store for policy p. p and cfg are validated, so the
// store's own check passes.
func (cfg *config) store(p Policy) (*shard.Store, error) {
	alg := shard.Log
	if p.Algorithm == SlidingCounter {
		alg = shard.Counter
	}
	return shard.New(shard.Config{
		Algorithm: alg,
		Limit:     p.Limit,
		Window:    int64(p.Window),
		Shards:    cfg.shards,
		Presize:   cfg.presize,

		MaxKeys:       cfg.maxKeys,
		AdmitOverflow: cfg.overflow == OverflowAllow,
		HashedKeys:    cfg.hashed,
	})
}

// sweepInterval is how long one full sweep pass takes for window w; 0 for
// none.
func (cfg *config) sweepInterval(w time.Duration) time.Duration {
	if cfg.sweepSet {
		return cfg.sweep
	}
	return min(max(w, MinSweepInterval), DefaultMaxSweepInterval)
}

// Policy returns the limiter's policy: the one New was given, or the
// latest SetPolicy set.
func (l *Limiter) Policy() Policy { return *l.pol.Load() }

// MaxKeys returns the WithMaxKeys cap; 0 means none.
func (l *Limiter) MaxKeys() int { return l.store.MaxKeys() }

// ErrPolicyChange wraps SetPolicy's error for a change a limiter cannot
// make in place; a new Limiter (whose keys start empty) can take it.
var ErrPolicyChange = errors.New("engine: the policy cannot change in place")

// SetPolicy changes the limiter's policy while it serves, keeping every
// key's state, so that a changed limit holds at once: a key that used 10
// of a limit of 10 gets nothing more when the limit drops to 5, and
// nothing more in the same window when it goes back to 10. The log holds
// the accepted instants whatever the limit. A changed window applies to
// the entries logged; entries that had expired under the old window when
// the change was made may already be dropped, so a longer window does not
// count them again. The name may change freely.
//
// What cannot change in place returns an error wrapping ErrPolicyChange
// and changes nothing: the algorithm; the counter's window (its counts
// belong to fixed windows of the old length); and, for the log, a window
// over 2^47 ns (about 39 hours) on a limiter made with a shorter one (it
// stores 6-byte instants). An invalid policy returns its *PolicyError.
//
// SetPolicy is safe to call while other goroutines decide: every decision
// applies one policy whole, the old or the new (Decision.Limit says which
// limit), every decision that starts after SetPolicy returns applies the
// new one and is made no earlier than the clock's reading during the call,
// and ordering a key's decisions by At still replays them, each with its
// own policy (shard.Store.SetPolicy gives the argument). A request of a cost above the new limit that raced the
// change returns ErrInvalidCost. The background sweeper keeps the pass
// interval New chose. A Group made by NewGroupOf keeps the policies (and
// the cost bound) its limiters had when it was made, though each of its
// decisions applies the policy in force; make a new Group after a change.
func (l *Limiter) SetPolicy(p Policy) error {
	l.setMu.Lock()
	defer l.setMu.Unlock()
	if err := l.CheckPolicy(p); err != nil {
		return err
	}
	if err := l.store.SetPolicy(p.Limit, int64(p.Window), l.Now); err != nil {
		return fmt.Errorf("%w: %w", ErrPolicyChange, err) // CheckPolicy has checked
	}
	l.pol.Store(&p)
	return nil
}

// CheckPolicy returns the error SetPolicy would return for p, changing
// nothing: nil when the limiter can take p in place.
func (l *Limiter) CheckPolicy(p Policy) error {
	if err := p.Validate(); err != nil {
		return err
	}
	if old := l.pol.Load(); p.Algorithm != old.Algorithm {
		return fmt.Errorf("%w: the algorithm changes from %v to %v", ErrPolicyChange, old.Algorithm, p.Algorithm)
	}
	if err := l.store.CheckPolicy(p.Limit, int64(p.Window)); err != nil {
		return fmt.Errorf("%w: %w", ErrPolicyChange, err)
	}
	return nil
}

// Now returns the limiter's current instant. A Clock's reading before 0
// is taken as 0: instants are never negative.
func (l *Limiter) Now() int64 {
	if l.mono {
		return int64(time.Since(l.epoch))
	}
	return max(l.clock.Now(), 0)
}

// WallTime maps an instant of the limiter's clock to wall time, for display
// only (X-RateLimit-Reset). The mapping is fixed when the limiter is made.
func (l *Limiter) WallTime(at int64) time.Time { return l.wall.Add(time.Duration(at)) }

// Allow decides a request of cost 1 for key at the clock's current instant.
func (l *Limiter) Allow(key string) (d Decision) {
	l.allow(key, &d)
	return d
}

// AllowN decides a request of cost n. It returns an error, and changes
// nothing, when n < 1 or n > Limit.
func (l *Limiter) AllowN(key string, n int) (d Decision, err error) {
	err = l.allowN(key, n, &d)
	return d, err
}

// AllowNAt is AllowN at an explicit instant of the limiter's clock (≥ 0).
// The key's instants never go backwards: a now earlier than the key's last
// decision is decided at that decision's instant instead, and Decision.At
// says so.
func (l *Limiter) AllowNAt(key string, n int, now int64) (d Decision, err error) {
	err = l.allowNAt(key, n, now, &d)
	return d, err
}

// Allow, AllowN and AllowNAt are small enough to be inlined into their
// callers, and decide through allow, allowN and allowNAt, which write the
// Decision where the caller keeps it: a Decision returned by a call that
// is not inlined reaches the caller in registers that it stores one field
// at a time and then copies in wider loads, which the CPU cannot forward
// from its store buffer and must wait for.

func (l *Limiter) allow(key string, d *Decision) {
	var r shard.Result
	_ = l.store.Decide(key, 1, l.Now(), l.mono, &r) // cost 1 and Now() ≥ 0 are in range
	d.set(&r)
}

// allowN and allowNAt leave the cost check to the store, which makes it
// against the limit the decision applies (see SetPolicy).
func (l *Limiter) allowN(key string, n int, d *Decision) error {
	var r shard.Result
	if l.store.Decide(key, n, l.Now(), l.mono, &r) != nil { // Now() ≥ 0: only n can be out of range
		return l.costError(key, n)
	}
	d.set(&r)
	return nil
}

func (l *Limiter) allowNAt(key string, n int, now int64, d *Decision) error {
	if now < 0 {
		if n < 1 || n > l.store.KeyLimit(key) {
			return l.costError(key, n) // the cost is reported first
		}
		return fmt.Errorf("%w: %d is before the clock's epoch", ErrInvalidInstant, now)
	}
	var r shard.Result
	if l.store.Decide(key, n, now, false, &r) != nil { // now checked above: only n can be out of range
		return l.costError(key, n)
	}
	d.set(&r)
	return nil
}

func (l *Limiter) costError(key string, n int) error {
	return fmt.Errorf("%w: %d is outside 1..%d", ErrInvalidCost, n, l.store.KeyLimit(key))
}

// set fills every field of d from the store's result r, in place:
// building a Decision as a composite literal and copying it would cost
// the same wait as above.
func (d *Decision) set(r *shard.Result) {
	d.Allowed = r.Allowed
	d.Limit = r.Limit
	d.Remaining = max(r.Remaining, 0) // < 0 from the store after SetPolicy lowered the limit
	d.RetryAfter = time.Duration(r.RetryAfter)
	d.Reset = time.Duration(r.Reset)
	d.At = r.At
	d.Overflow = r.Overflow
}

// Stats is a snapshot of a limiter's memory.
type Stats struct {
	Keys           int   // keys holding state
	StoredInstants int64 // log entries held (some may have expired since)
	Bytes          int64 // approximate heap bytes of keys, maps and state
	Swept          int64 // idle keys dropped since New
	Overflows      int64 // requests for new keys decided without state at the WithMaxKeys cap
}

// Stats adds up counters the store keeps as it writes: it costs O(shards),
// not O(keys), so a metrics scrape stays cheap at millions of keys.
func (l *Limiter) Stats() Stats { return Stats{}.add(l.store.Stats()) }

func (st Stats) add(s shard.Stats) Stats {
	st.Keys += s.Keys
	st.StoredInstants += s.StoredInstants
	st.Bytes += s.Bytes
	st.Swept += s.Swept
	st.Overflows += s.Overflows
	return st
}

// Sweep drops every idle key now and returns how many it dropped. The
// background sweeper does this incrementally; Sweep is for tests and for
// callers that turned it off.
func (l *Limiter) Sweep() int { return l.store.Sweep(l.Now()) }

// SweepAt is Sweep at an explicit instant.
func (l *Limiter) SweepAt(now int64) int { return l.store.Sweep(now) }

// sweep is the background sweeper of a Limiter or a Group. Its zero value
// has none; close is idempotent.
type sweep struct {
	stop, done chan struct{}
	once       sync.Once
}

// start runs sweeper over stores until close.
func (s *sweep) start(stores []*shard.Store, now func() int64, interval time.Duration) {
	s.stop, s.done = make(chan struct{}), make(chan struct{})
	go sweeper(stores, now, interval, s.stop, s.done)
}

// close stops the sweeper, if one was started, and waits for it.
func (s *sweep) close() {
	s.once.Do(func() {
		if s.stop != nil {
			close(s.stop)
			<-s.done
		}
	})
}

// sweeper visits one shard (of every store) per tick, so that one full
// pass takes interval, and restocks every store's blocks on each tick,
// until stop is closed; then it closes done.
func sweeper(stores []*shard.Store, now func() int64, interval time.Duration, stop <-chan struct{}, done chan<- struct{}) {
	defer close(done)
	n := stores[0].Shards()
	tick := max(interval/time.Duration(n), time.Millisecond)
	t := time.NewTicker(tick)
	defer t.Stop()
	for i := 0; ; i = (i + 1) % n {
		select {
		case <-stop:
			return
		case <-t.C:
			for _, s := range stores {
				// Blocks for the next tick's new keys and growths,
				// allocated here rather than on their decisions' path
				// (shard's stock.go). A faster restock than the sweep's
				// tick cost the many-key accepts more than it saved
				// (docs/design.md, "The stock").
				s.Restock()
				_, _ = s.SweepShard(i, now()) // i < Shards(), which every store shares
			}
		}
	}
}

// Close stops the background sweeper and waits for it. The limiter still
// decides afterwards; it just no longer drops idle keys by itself. Close is
// idempotent and returns nil.
func (l *Limiter) Close() error {
	l.sweep.close()
	return nil
}
