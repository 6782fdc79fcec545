// Package shard is the low-level concurrent store behind the engine: keys
// hashed once under secret per-store words (hash.go) into a power-of-two
// array of cache-line-padded shards, an index per shard from key to that
// key's state block (index.go; xsync maps for hashed and long keys), and, per key, a
// ring of accepted instants (nanotime offsets, 6 bytes each for windows up
// to 39 hours) or a pair of window counts, read and written with atomics.
//
// Most programs want package engine, which owns the clock, the policy, the
// background sweeper and the public types, and decides through this
// package. Use shard directly only to build a limiter of your own on the
// same store: it never reads a clock (every call is handed the instant),
// starts no goroutine, and checks its own input, returning an error that
// wraps [ErrInvalid] for a configuration or an argument outside the ranges
// its documentation gives. See block.go for the per-key protocol and
// docs/design.md for why the decisions it makes are linearizable.
package shard

import (
	"errors"
	"fmt"
	"hash/maphash"
	"math/bits"
	"runtime"
	"sync"
	"sync/atomic"
	"unsafe"

	"github.com/puzpuzpuz/xsync/v3"
)

// Algorithm selects how a store decides. It mirrors engine.Algorithm.
type Algorithm int

const (
	// Log is the exact sliding window log.
	Log Algorithm = iota
	// Counter is the approximate sliding window counter.
	Counter
)

// CacheLineSize is the padding unit of a shard header. 64 bytes is the line
// of every x86-64 and most arm64 cores; on cores with 128-byte lines
// (Apple M-series) two adjacent shard headers can share a line, which costs
// some throughput but never correctness. 64 keeps 256 shards in 32 KiB.
const CacheLineSize = 64

// DefaultShards is the shard count when Config.Shards is zero: enough that
// two cores rarely land on one shard header, few enough that an idle store
// costs little (each shard's empty map is about 1 KiB).
const DefaultShards = 64

// Config describes one store. New checks every field and returns an error
// wrapping ErrInvalid for a value outside the ranges below.
type Config struct {
	Algorithm Algorithm
	Limit     int   // at most Limit accepted requests per Window: 1..MaxLogLimit (Log), 1..MaxCounterLimit (Counter)
	Window    int64 // nanoseconds, 1..MaxWindow
	Shards    int   // a power of two up to MaxShards; 0 means DefaultShards
	Presize   int   // expected number of keys, spread over the shards: 0 (none) to MaxPresize
	// MaxKeys caps the keys the store tracks (≥ 0); 0 means no cap. When the
	// store is full, a request for a new key is decided without state
	// (Result.Overflow): admitted if AdmitOverflow, refused otherwise.
	MaxKeys       int
	AdmitOverflow bool
	// HashedKeys keeps only a seeded 64-bit hash of each key instead of
	// its bytes (see mkey): a key costs about 32 bytes less (its first
	// ring lives in the block's header, see block.go), and two keys whose
	// hashes collide share one state, so one limit. Without it, only keys
	// longer than LongKeyBytes are kept as a digest (see LongKeyBytes).
	HashedKeys bool
}

// LongKeyBytes is the longest key a store keeps a copy of. A longer key is
// kept as a 127-bit digest instead (two 64-bit maphash sums under seeds
// drawn at random per store and never shown, one bit forced to mark the
// digest), in the block layout of HashedKeys, so a key costs the same
// bytes whatever its length: a client cannot grow the store by sending
// long keys. Two long keys whose digests collide share one state, so one
// limit; among n long keys the chance that any two collide is about
// n²/2¹²⁸, 3·10⁻²³ at a billion keys, and the seeds are secret, so a
// client cannot aim for a collision. Keys of up to LongKeyBytes never
// share state with any other key.
const LongKeyBytes = 64

// Result is one decision. All durations are nanoseconds.
type Result struct {
	Allowed bool
	Limit   int // the limit the decision applied (see SetPolicy)
	// Remaining is Limit minus the live entries (and the cost, when
	// allowed); for the log it is negative when SetPolicy lowered the
	// limit below what a key holds (the engine reports 0).
	Remaining  int
	At         int64 // the instant the decision was made at
	RetryAfter int64 // refusals: how long until the same request fits
	Reset      int64 // how long until the key's state is empty again (log: the oldest live entry leaves)
	// Overflow: the key was new and the store held MaxKeys keys, so the
	// request was decided without state (see Config.AdmitOverflow).
	Overflow bool
}

// shardHeader is what a decision reads: the map, and on a key's creation
// the horizon.
type shardHeader struct {
	ix index                        // keys by their bytes (the default; index.go)
	hm *xsync.MapOf[uint64, *block] // keys by their hash (Config.HashedKeys)
	// lm holds the keys longer than LongKeyBytes by their digest (without
	// HashedKeys); made on the shard's first long key.
	lm atomic.Pointer[xsync.MapOf[digest, *block]]
	// horizon is the latest free instant of a key a sweep dropped from this
	// shard: the instant from which that key's state was empty (its newest
	// entry + W for the log). A key created in this shard afterwards
	// decides no earlier than the horizon, so a key dropped and re-created
	// never decides on an empty log at an instant its old log was full (see
	// sweep.go).
	horizon atomic.Int64
}

// shardCounters are the shard's statistics, kept on the write path so that
// Stats costs O(shards), not O(keys). They change when a key is created,
// grows, accepts or is dropped.
type shardCounters struct {
	keys      atomic.Int64 // keys in the map
	bytes     atomic.Int64 // block bytes allocated and not yet dropped
	instants  atomic.Int64 // log entries held in rings (some may have expired since)
	swept     atomic.Int64 // keys dropped by sweeps
	overflows atomic.Int64 // new keys the key cap turned away
	spare     spare        // the unused half of the shard's last pair of blocks (allocWords)
}

// shard pads its header and its counters to a cache line each, so that two
// cores deciding keys of neighbouring shards do not false-share, and the
// counters an accept bumps do not evict the map pointer every decision
// reads from other cores' caches.
// shardSize is pinned by a test.
const shardSize = unsafe.Sizeof(shard{})

type shard struct {
	shardHeader
	_ [CacheLineSize - unsafe.Sizeof(shardHeader{})]byte
	shardCounters
	_ [CacheLineSize - unsafe.Sizeof(shardCounters{})]byte
}

// Store is a sharded, concurrent map from key to sliding window state. All
// methods are safe for concurrent use. A Store must not be copied.
type Store struct {
	id     uint64 // orders stores for group requests (see group.go)
	shards []shard
	mask   uint64
	alg    Algorithm
	// pol is the limit and window in force (SetPolicy changes them); a
	// decision loads it once and applies it whole.
	pol atomic.Pointer[policy]

	maxKeys       int64
	admitOverflow bool
	hashed        bool
	narrow        bool         // log with Window ≤ maxNarrowWindow: 6-byte slots (block.go)
	kh            keyHasher    // keys of up to LongKeyBytes without HashedKeys (hash.go)
	seed          maphash.Seed // hashed and long keys: the keys' hash seed
	seed2         maphash.Seed // long keys: the digest's second seed
	shift         uint         // hashed: a hash's top bits pick its shard
	hashMask      uint64       // hashed: all ones; tests narrow it to force collisions
	// resv holds the latest decision instant of each reserved key (an
	// mkey to an int64), read and written under the key's busy bit.
	resv sync.Map
	// total counts keys across shards, kept only when maxKeys > 0. It is
	// written on key creation and drop only, on its own cache line.
	_     [CacheLineSize]byte
	total atomic.Int64
	_     [CacheLineSize - 8]byte
	// stock holds blocks allocated ahead of the decisions that create or
	// grow keys (stock.go); each of its classes has a line of its own.
	stock stock
}

// policy is a store's limit and window, replaced whole by SetPolicy.
// from is the instant SetPolicy read when it stored the policy: decisions
// under it are made no earlier. sealed marks the old policy while
// SetPolicy replaces it.
type policy struct {
	limit  int
	window int64
	from   int64
	sealed bool
	// limits are the keys with a limit of their own (SetOverrides), and
	// over their policies: this one's with the key's limit (override.go).
	// base is the store's policy a key's policy was made from (itself,
	// for the store's).
	limits map[string]int
	over   map[string]*policy
	base   *policy
}

// ErrLayout is wrapped by SetPolicy's error for a policy the store's
// layout cannot take in place: a counter's other window (its counts belong
// to fixed windows of the old length), or a window over maxNarrowWindow for
// a log made with one at most that long (its slots are 6 bytes). Such a
// change needs a new store, which starts empty.
var ErrLayout = errors.New("shard: the store's layout cannot take this policy")

// SetPolicy changes the limit and window in force, keeping every key's
// state: the log holds the accepted instants whatever the limit, so a
// lowered limit holds at once against them, and a raised one admits only
// what the new limit leaves room for. A window change applies to the
// entries logged: a longer window counts them for longer, but entries
// that had already expired under the old window when the change was made
// may have been dropped (each accept drops the expired entries, and the
// sweeper drops keys whose entries all expired), so they are not counted
// again. It returns an error wrapping ErrInvalid for a limit or window out
// of Config's ranges, or ErrLayout (see there), and changes nothing then.
//
// now is the caller's clock (the one its decisions read): decisions made
// after SetPolicy are made no earlier than its reading, as Result.At
// shows, the way a swept key's successor waits for its horizon.
//
// It is safe to call concurrently with every other method: each decision
// applies one policy whole (Result.Limit reports its limit), a decision
// that starts after SetPolicy returns applies the new one, and ordering a
// key's decisions by At still replays them (with each one's own policy)
// through the reference model. Three rules keep that last promise, which
// a decision under the old limit and one under the new could otherwise
// break (a refusal at t under a limit of 5, then an accept at t' < t under
// a limit of 10 that read its clock first):
//   - an accept checks, once it holds the key's bit, that the policy is
//     still the one it decided under, and decides again if not, so no
//     accept under an old policy lands after a decision under a new one;
//   - SetPolicy first seals the old policy, under which every refusal
//     raises the key's watermark (Decide's shortcut for the hot refused
//     key is off), then reads now and stores the new policy with that
//     instant, under which every decision is made at or after it: a
//     refusal that took the shortcut read its clock before the seal, so
//     no later accept is dated before it;
//   - a sweep checks that a key is idle under the policy in force once
//     it holds the key's bit.
//
// Calls to SetPolicy itself must not race each other.
func (s *Store) SetPolicy(limit int, window int64, now func() int64) error {
	if err := s.CheckPolicy(limit, window); err != nil {
		return err
	}
	old := s.pol.Load()
	s.pol.Store(newPolicy(old.limit, old.window, old.from, true, old.limits))
	s.pol.Store(newPolicy(limit, window, max(now(), old.from), false, old.limits))
	return nil
}

// CheckPolicy returns the error SetPolicy would return for limit and
// window, changing nothing.
func (s *Store) CheckPolicy(limit int, window int64) error {
	cfg := Config{Algorithm: s.alg, Limit: limit, Window: window}
	if err := cfg.check(); err != nil {
		return err
	}
	old := s.pol.Load()
	switch {
	case s.alg == Counter && window != old.window:
		return fmt.Errorf("%w: a counter's window changes from %d to %d ns", ErrLayout, old.window, window)
	case s.narrow && window > maxNarrowWindow:
		return fmt.Errorf("%w: a window of %d ns needs 8-byte slots; the store has 6-byte ones (windows up to %d ns)", ErrLayout, window, int64(maxNarrowWindow))
	}
	return nil
}

// MaxKeys returns the key cap (Config.MaxKeys; 0: none).
func (s *Store) MaxKeys() int { return int(s.maxKeys) }

// Limit returns the limit in force.
func (s *Store) Limit() int { return s.pol.Load().limit }

// ErrInvalid is wrapped by every error the store returns: a Config field or
// an argument outside the range its documentation gives. The engine checks
// its own input first, so its callers see the engine's errors instead.
var ErrInvalid = errors.New("shard: invalid input")

// Bounds on a Config. MaxCounterLimit keeps a window's count in the 32 bits
// the counter packs it in; MaxWindow keeps instant arithmetic (an instant
// plus two windows) far from int64's range; MaxShards bounds the shard
// array (each shard is two cache lines and an empty map).
const (
	MaxCounterLimit = 1 << 30
	MaxWindow       = int64(366 * 24 * 3600 * 1e9) // 366 days in nanoseconds
	MaxShards       = 1 << 16
	// MaxPresize bounds Config.Presize: a billion keys' worth of map
	// buckets (about 17 GiB) is already more than one process should
	// reserve up front, and xsync sizes its tables in 32 bits.
	MaxPresize = 1 << 30
)

// Errors for a decision's arguments, made once: Decide is on the hot path
// and its argument check must not allocate.
var (
	errCost    = fmt.Errorf("%w: cost must be 1 to the store's limit", ErrInvalid)
	errInstant = fmt.Errorf("%w: instant must be ≥ 0", ErrInvalid)
	errResult  = fmt.Errorf("%w: nil *Result", ErrInvalid)
)

// argError returns the error for a decision's arguments that failed the
// check in Decide, DecideGroup or Peek.
func argError(now int64, r *Result) error {
	switch {
	case r == nil:
		return errResult
	case now < 0:
		return errInstant
	}
	return errCost
}

// New returns an empty store, or an error wrapping ErrInvalid when cfg is
// outside the ranges Config documents.
func New(cfg Config) (*Store, error) {
	if err := cfg.check(); err != nil {
		return nil, err
	}
	n := cfg.Shards
	if n == 0 {
		n = DefaultShards
	}
	s := &Store{
		id:     lastID.Add(1),
		shards: make([]shard, n),
		mask:   uint64(n - 1),
		alg:    cfg.Algorithm,

		maxKeys:       int64(cfg.MaxKeys),
		admitOverflow: cfg.AdmitOverflow,
		hashed:        cfg.HashedKeys,
		narrow:        cfg.Algorithm == Log && cfg.Window <= maxNarrowWindow,
		kh:            newKeyHasher(maphash.MakeSeed()),
		seed:          maphash.MakeSeed(),
		seed2:         maphash.MakeSeed(),
		shift:         uint(64 - bits.TrailingZeros(uint(n))),
		hashMask:      ^uint64(0),
	}
	s.pol.Store(newPolicy(cfg.Limit, cfg.Window, 0, false, nil))
	var opts []func(*xsync.MapConfig)
	if cfg.Presize > 0 {
		opts = append(opts, xsync.WithPresize(cfg.Presize/n+1))
	}
	for i := range s.shards {
		if s.hashed {
			s.shards[i].hm = xsync.NewMapOfWithHasher[uint64, *block](hashedKeyHash, opts...)
		} else {
			s.shards[i].ix.init(&s.kh, cfg.Presize/n)
		}
	}
	return s, nil
}

// check reports the first field of c outside its range.
func (c Config) check() error {
	switch {
	case c.Algorithm != Log && c.Algorithm != Counter:
		return fmt.Errorf("%w: unknown algorithm %d", ErrInvalid, c.Algorithm)
	case c.Limit < 1:
		return fmt.Errorf("%w: limit %d is below 1", ErrInvalid, c.Limit)
	case c.Algorithm == Log && c.Limit > MaxLogLimit:
		return fmt.Errorf("%w: limit %d exceeds %d for the log", ErrInvalid, c.Limit, MaxLogLimit)
	case c.Limit > MaxCounterLimit:
		return fmt.Errorf("%w: limit %d exceeds %d", ErrInvalid, c.Limit, MaxCounterLimit)
	case c.Window < 1 || c.Window > MaxWindow:
		return fmt.Errorf("%w: window %d ns is outside 1..%d", ErrInvalid, c.Window, MaxWindow)
	case c.Shards < 0 || c.Shards > MaxShards || c.Shards&(c.Shards-1) != 0:
		return fmt.Errorf("%w: shard count %d is not a power of two up to %d (or 0 for %d)", ErrInvalid, c.Shards, MaxShards, DefaultShards)
	case c.Presize < 0 || c.Presize > MaxPresize:
		return fmt.Errorf("%w: presize %d is outside 0..%d", ErrInvalid, c.Presize, MaxPresize)
	case c.MaxKeys < 0:
		return fmt.Errorf("%w: max keys %d is negative", ErrInvalid, c.MaxKeys)
	}
	return nil
}

// hashedKeyHash is the map's hash of a hashed key: the key itself, already
// a seeded hash. Its top bits chose the shard and the map uses the low
// ones, so the key is hashed once.
func hashedKeyHash(h, _ uint64) uint64 { return h }

// mkey is a key as the maps hold it: by default its bytes (s), in a
// linked block (linked; h is its hash under the store's seed, which picks
// its shard and its chain in the index); with HashedKeys, only its seeded
// hash (h), and s is empty, so no key bytes are copied into its block
// either; a key longer than LongKeyBytes in a store without HashedKeys,
// only its digest (h, h2; h2 is odd, so never 0, which marks every other
// key), with s empty as well.
type mkey struct {
	s      string
	h, h2  uint64
	linked bool
}

// kw is how many words k takes in its block (keyWords).
func (k mkey) kw() int { return keyWords(len(k.s)) }

// digest is a long key's map key (mkey's h and h2).
type digest struct{ a, b uint64 }

// digestHash is the long keys' map hash: the digest's second half, as
// random as the first, whose top bits chose the shard.
func digestHash(d digest, _ uint64) uint64 { return d.b }

// keyOf returns key's map key and shard.
func (s *Store) keyOf(key string) (mkey, *shard) {
	if s.hashed {
		h := maphash.String(s.seed, key) & s.hashMask
		return mkey{h: h}, &s.shards[h>>s.shift&s.mask]
	}
	if len(key) > LongKeyBytes {
		return s.longKey(key)
	}
	h := s.kh.hash(key)
	return mkey{s: key, h: h, linked: true}, &s.shards[h&s.mask]
}

// longKey is keyOf for a key longer than LongKeyBytes: its digest.
func (s *Store) longKey(key string) (mkey, *shard) {
	h := maphash.String(s.seed, key) & s.hashMask
	h2 := maphash.String(s.seed2, key)&s.hashMask | 1
	return mkey{h: h, h2: h2}, &s.shards[h>>s.shift&s.mask]
}

// longMap returns sh's map of long keys, making it if create is set;
// otherwise nil when sh has none yet.
func (sh *shard) longMap(create bool) *xsync.MapOf[digest, *block] {
	if lm := sh.lm.Load(); lm != nil || !create {
		return lm
	}
	sh.lm.CompareAndSwap(nil, xsync.NewMapOfWithHasher[digest, *block](digestHash))
	return sh.lm.Load()
}

func (sh *shard) load(k mkey) (*block, bool) {
	if k.linked {
		return sh.ix.load(k.s, k.h)
	}
	if sh.hm != nil {
		return sh.hm.Load(k.h)
	}
	if lm := sh.longMap(false); lm != nil {
		return lm.Load(digest{k.h, k.h2})
	}
	return nil, false
}

func (sh *shard) loadOrStore(k mkey, b *block) (*block, bool) {
	switch {
	case k.linked:
		return sh.ix.loadOrStore(k.s, k.h, b)
	case sh.hm != nil:
		return sh.hm.LoadOrStore(k.h, b)
	}
	return sh.longMap(true).LoadOrStore(digest{k.h, k.h2}, b)
}

func (sh *shard) store(k mkey, b *block) {
	switch {
	case k.linked:
		sh.ix.replace(k.s, k.h, b)
	case sh.hm != nil:
		sh.hm.Store(k.h, b)
	default:
		sh.longMap(true).Store(digest{k.h, k.h2}, b)
	}
}

func (sh *shard) delete(k mkey) {
	switch {
	case k.linked:
		sh.ix.remove(k.s, k.h)
	case sh.hm != nil:
		sh.hm.Delete(k.h)
	default:
		sh.longMap(true).Delete(digest{k.h, k.h2})
	}
}

// rangeKeys calls f for every key of sh until f returns false.
func (sh *shard) rangeKeys(f func(k mkey, b *block) bool) {
	if sh.hm != nil {
		sh.hm.Range(func(h uint64, b *block) bool { return f(mkey{h: h}, b) })
		return
	}
	more := sh.ix.rangeKeys(func(key string, b *block) bool {
		return f(mkey{s: key, h: sh.ix.kh.hash(key), linked: true}, b)
	})
	if lm := sh.longMap(false); lm != nil && more {
		lm.Range(func(d digest, b *block) bool { return f(mkey{h: d.a, h2: d.b}, b) })
	}
}

// lastID numbers stores in creation order.
var lastID atomic.Uint64

// ID returns the store's number, unique in the process: group requests
// over several stores take their keys' write bits in (ID, key) order.
func (s *Store) ID() uint64 { return s.id }

// HashedKeys reports whether the store keeps only hashes of its keys
// (Config.HashedKeys).
func (s *Store) HashedKeys() bool { return s.hashed }

// Shards returns the number of shards.
func (s *Store) Shards() int { return len(s.shards) }

// Decide decides a request of cost n (1 ≤ n ≤ Limit) for key at instant
// now (≥ 0); it returns an error wrapping ErrInvalid, and changes nothing,
// for any other n or now, or a nil r. The instant used is max(now, the key's
// watermark), so per key time never goes backwards; Result.At reports it.
//
// Refused requests never touch the log. They raise the key's watermark to
// their instant (one CAS, when the instant is new; or, when the watermark
// holds the ring's newest entry, a move of that entry into a grown block
// first, see block.go) unless n == 1 and
// monotonic is true: the caller read now from a monotonic clock after the
// call began. Such a refusal can only be overtaken by decisions it
// overlaps in real time, and docs/design.md ("Refusals of cost 1") shows
// that ordering them by At is then still a valid linearization, so the hot
// refused key costs reads only. Instants supplied by a caller (AllowNAt, a
// manual clock set backwards) carry no such promise and always raise it.
// The decision is written to *r.
func (s *Store) Decide(key string, n int, now int64, monotonic bool, r *Result) error {
	p := s.pol.Load().of(key)
	if uint(n-1) >= uint(p.limit) || now < 0 || r == nil {
		return argError(now, r)
	}
	// *r rather than a return value: results pass through several frames
	// on the hot path, and copying a 40-byte struct at each one measurably
	// cost more than the decision itself.
	// keyOf and shard.load for a short key, written out: a key's words
	// (shortWords) are read once, for the hash and the index's
	// comparison, and the calls and their five-word results cost more
	// than the hash (docs/design.md, "A short key is compared as two
	// words").
	var k mkey
	var sh *shard
	var w0, w1 uint64
	short := !s.hashed && len(key) <= shortKeyBytes
	if short {
		w0, w1 = shortWords(key)
		h := s.kh.short(len(key), w0, w1)
		k, sh = mkey{s: key, h: h, linked: true}, &s.shards[h&s.mask]
	} else {
		k, sh = s.keyOf(key)
	}
	q := req{p: p, r: r, n: n}
	spins := 0
	for {
		var b *block
		var ok bool
		if short {
			b, ok = sh.ix.probe(key, k.h, w0, w1)
		} else {
			b, ok = sh.load(k)
		}
		if !ok {
			nb, bk, created := s.create(p, sh, k, n)
			if created {
				return s.decideNew(q, sh, bk, nb, now, key)
			}
			if nb == nil {
				s.overflow(p, sh, n, now, r)
				return nil
			}
			b = nb
		}
		v := b.ctl.Load()
		if v&ctlDead != 0 {
			continue // retired: the map has (or will have) its successor
		}
		if v&(ctlBusy|ctlReserved) != 0 {
			if v&ctlBusy == 0 {
				return s.decideReserved(key, n, now, r) // rare: see reserve.go
			}
			backoff(&spins)
			continue
		}
		w := b.wm.Load()
		wm := wmTime(w)
		t := max(now, wm, p.from)
		q.t = t
		d := b.words(k.kw())
		j := s.decide(q, b, d, w)
		if !r.Allowed {
			// A refusal linearizes at the second ctl load. Raise the
			// watermark first, when needed, so that no later decision on
			// this key can carry an earlier At; but only once the read is
			// known to be consistent: a torn read may have refused at an
			// instant the ring does not justify, and narrow slots decode
			// only against a watermark less than 2W ahead of the ring
			// (block.go).
			if (n > 1 || !monotonic || p.sealed) && t > wm {
				if w < 0 {
					// wm holds the ring's newest entry, which a CAS
					// would move: move it into the ring first
					// (block.go, "The entry in wm"), then decide
					// again.
					if b.ctl.CompareAndSwap(v, v|ctlBusy) {
						s.unflag(sh, k, b, v, p.limit)
					}
					continue
				}
				if b.ctl.Load() != v || !b.wm.CompareAndSwap(w, t) {
					continue
				}
			}
			if b.ctl.Load() != v {
				continue // a writer ran: what we read may be torn
			}
			return nil
		}
		if !b.ctl.CompareAndSwap(v, v|ctlBusy) {
			continue
		}
		if p2 := s.pol.Load(); p2 != p.base {
			// SetPolicy ran since p was loaded: decide again under the
			// policy in force (see SetPolicy for why).
			b.ctl.Store(v)
			if p = p2.of(key); uint(n-1) >= uint(p.limit) {
				return errCost
			}
			q.p = p
			continue
		}
		// We are the only writer and the ring is exactly what we read.
		// Refusals may have raised the watermark since (see above); an
		// allowed request stays allowed at a later instant, so decide again
		// at the raised one.
		// A wm that holds an entry (negative) changed with ctl only, so
		// it is w, and t ≥ its instant: logAppend moves it on.
		if wm2 := b.wm.Load(); wm2 > t {
			t = wm2
			q.t = t
			j = s.decide(q, b, d, w)
		} else if wm2 >= 0 && wm2 < t {
			raise(&b.wm, t)
		}
		if s.alg == Log {
			s.logAppend(q, sh, k, b, d, j)
		} else {
			s.counterAppend(p, b, d, n, t)
			b.ctl.Store(v + ctlVersion)
		}
		return nil
	}
}

// overflow decides a request for a new key while the store is full: without
// state, at max(now, the shard's horizon). An admitted request is not
// logged; a refused one is told to retry after one window, an estimate (the
// store has room again once idle keys are swept).
func (s *Store) overflow(p *policy, sh *shard, n int, now int64, r *Result) {
	sh.overflows.Add(1)
	*r = Result{Limit: p.limit, At: max(now, sh.horizon.Load()), Overflow: true}
	if s.admitOverflow {
		r.Allowed = true
		r.Remaining = p.limit - n
		return
	}
	r.RetryAfter = p.window
}

// req is one decision in flight: the policy it applies, where its result
// goes, its cost and the instant it is made at. It is four words, passed
// by value in registers. A struct passed by pointer must be stored in
// memory first: one that also held the key and its shard cost about 30
// more instructions per refusal (callgrind).
type req struct {
	p *policy
	r *Result
	n int
	t int64
}

// decide runs the store's algorithm at q.t into *q.r and returns
// logDecide's oldest live index. w is the block's watermark word, read
// with its state.
func (s *Store) decide(q req, b *block, d data, w int64) int {
	if s.alg == Log {
		return s.logDecide(q, b, d, w)
	}
	s.counterDecide(q.p, b, d, q.n, q.t, q.r)
	return 0
}

// backoff spins a little, then yields, while another writer holds a key.
// It stays out of line: only a loop that waits calls it, and ready fits
// the inlining budget without it.
//
//go:noinline
func backoff(spins *int) {
	if *spins < 16 {
		*spins++
		return
	}
	runtime.Gosched()
	*spins = 0
}

// ready loads b's control word and reports whether a writer may take b's
// bit. It reports false while b is retired or a writer holds the bit. It
// has then taken a step of backoff on *spins, and the caller loads the
// key's block again. It stays within the inlining budget, because Group
// decisions call it.
func (b *block) ready(spins *int) (v uint64, ok bool) {
	v = b.ctl.Load()
	if ok = v&(ctlBusy|ctlDead) == 0; !ok {
		backoff(spins)
	}
	return
}

// ready loads k's block and waits while the block is retired or a writer
// holds its bit, taking steps of backoff on *spins. It returns the block
// and the control word it read, or false when k has no block. The
// operators' Peek and Drop wait through it. Decisions (Decide, acquire)
// write the same wait out beside the creation of a new key's block: the
// extra call costs a group decision about 27 instructions a key, 2 %.
func (sh *shard) ready(k mkey, spins *int) (*block, uint64, bool) {
	for {
		b, ok := sh.load(k)
		if !ok {
			return nil, 0, false
		}
		if v, ok := b.ready(spins); ok {
			return b, v, true
		}
	}
}

// raise sets w to max(w, t).
func raise(w *atomic.Int64, t int64) {
	for {
		old := w.Load()
		if old >= t || w.CompareAndSwap(old, t) {
			return
		}
	}
}

// create makes a fresh block for k, which had none when the caller
// looked, and publishes it in sh's map. It returns the block with created
// true, and the map key that shares the block's copy of the key's bytes
// (none with HashedKeys). The block is counted, and busy: the caller holds
// its write bit (see decideNew). It returns the block another goroutine
// published first, with created false; or a nil block when the store holds
// MaxKeys keys. One function rather than a few: this is a new key's path
// in Decide, where each call costs.
func (s *Store) create(p *policy, sh *shard, k mkey, n int) (b *block, bk mkey, created bool) {
	if s.maxKeys > 0 && s.total.Add(1) > s.maxKeys {
		s.total.Add(-1)
		return nil, k, false
	}
	bk = k
	// A key's first block may be half of a pair (allocWords): most keys
	// of a big population never grow out of it.
	sp := &sh.spare
	switch {
	case s.alg == Counter:
		b, _, bk.s = newBlock(1, 1, k.s, false, sp, &s.stock)
	case s.narrow && n <= smallMaxCap:
		// A small ring holds one instant in meta: ask for one slot less,
		// so that a cost-1 request's block is the header and the key
		// alone (newLogBlock makes the ring small whenever it holds fewer
		// than smallMaxCap instants, so it still holds n).
		b, _, bk.s = newLogBlock(n-1, p.limit, k.s, true, sp, &s.stock)
	default:
		b, _, bk.s = newLogBlock(n, p.limit, k.s, s.narrow, sp, &s.stock)
	}
	b.ctl.Store(b.ctl.Load() | ctlBusy)
	if actual, loaded := sh.loadOrStore(bk, b); loaded {
		if s.maxKeys > 0 {
			s.total.Add(-1) // another goroutine created the key
		}
		return actual, k, false
	}
	sh.bytes.Add(s.blockBytes(b, bk.kw()))
	sh.keys.Add(1)
	return b, bk, true
}

// decideNew decides the first request q (whose instant it sets) of key k
// at max(now, the shard's horizon); b is k's fresh block, which create
// has just published in sh's map, and k the map key that shares b's copy
// of the key.
// Precondition: create won the map's LoadOrStore with b, so the caller holds
// b's busy bit (create sets it), and every other decision on the key
// waits for it.
//
// The block's watermark is read from the shard's horizon only now, after
// the publication. A sweep raises the horizon before it deletes a key, and
// the map orders that delete before this LoadOrStore, so the horizon read
// here covers every earlier incarnation of the key: its log was empty from
// the horizon on. Reading the horizon before LoadOrStore instead would
// leave a gap in which another goroutine could create the key, accept, and
// have a sweep drop it, so that this goroutine decided on an empty log at
// an instant when the dropped log was full.
//
// The policy too is the one in force after the publication, as for an
// accept after its ctl CAS: a sweep under a newer policy may have dropped
// the key's earlier incarnation while entries of it still counted under
// q.p, the policy Decide loaded first. It returns errCost, leaving the
// block empty for the sweeper, when the cost is above the new limit.
func (s *Store) decideNew(q req, sh *shard, k mkey, b *block, now int64, key string) error {
	// The watermark holds the horizon before the bit can be released: a
	// block left empty is decided on as an existing one, which reads no
	// horizon (as in acquire).
	hz := sh.horizon.Load()
	b.wm.Store(hz)
	if p := s.pol.Load(); p != q.p.base {
		if q.p = p.of(key); uint(q.n-1) >= uint(q.p.limit) {
			b.ctl.Store(b.ctl.Load()&^ctlBusy + ctlVersion)
			return errCost
		}
	}
	t := max(now, hz, q.p.from)
	q.t = t
	b.wm.Store(t)
	d := b.words(k.kw())
	// An empty state admits any cost 1..limit.
	j := s.decide(q, b, d, t)
	if s.alg == Log {
		s.logAppend(q, sh, k, b, d, j)
	} else {
		s.counterAppend(q.p, b, d, q.n, t)
		b.ctl.Store(b.ctl.Load()&^ctlBusy + ctlVersion)
	}
	return nil
}

func (s *Store) blockBytes(b *block, kw int) int64 {
	if s.alg == Counter {
		return blockBytes(1, kw, false)
	}
	m := b.meta.Load()
	c, _, _ := unpackMeta(m)
	if m&metaSmall != 0 {
		c-- // slot 0 is in meta
	}
	return blockBytes(c, kw, s.narrow)
}
