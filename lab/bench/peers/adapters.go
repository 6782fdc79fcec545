package peers

import (
	"context"
	"fmt"
	"math"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/cespare/xxhash/v2"
	"github.com/go-chi/httprate"
	"github.com/puzpuzpuz/xsync/v3"
	sethlimiter "github.com/sethvargo/go-limiter"
	"github.com/sethvargo/go-limiter/memorystore"
	"github.com/slidegate/slidegate/engine"
	"github.com/slidegate/slidegate/lab/bench"
	"github.com/slidegate/slidegate/lab/internal/floor"
	"github.com/throttled/throttled/v2"
	"github.com/throttled/throttled/v2/store/memstore"
	ulule "github.com/ulule/limiter/v3"
	ululememory "github.com/ulule/limiter/v3/drivers/store/memory"
	"golang.org/x/time/rate"
)

// Limiter is what a scenario needs from a rate limiter: one decision for
// one request of cost 1, now.
type Limiter interface {
	Allow(key string) bool
	Close() error
}

// Peer describes one limiter of the comparison.
type Peer struct {
	// Name is the row name in the table.
	Name string
	// Design is the algorithm, as the table's second column says it.
	Design string
	// Exact reports whether the design promises at most L in every window
	// of length W (the sliding window logs). The others over-admit by
	// design, up to about 2L.
	Exact bool
	// New builds a limiter for limit requests per window.
	New func(limit int, window time.Duration) (Limiter, error)
}

// Baseline is the name of the peer every ratio is relative to.
const Baseline = "slidegate"

// All returns every peer, slidegate's exact log first.
func All() []Peer {
	return []Peer{
		{Baseline, "exact sliding log", true, newSlidegate(engine.SlidingLog)},
		{"slidegate-hashed", "exact sliding log, 64-bit key hashes", true, newSlidegate(engine.SlidingLog, engine.WithHashedKeys())},
		{"slidegate-counter", "sliding counter", false, newSlidegate(engine.SlidingCounter)},
		{"textbook", "exact sliding log, 1 mutex", true, newTextbook},
		{"textbook64", "exact sliding log, 64 mutexes", true, newTextbook64},
		{"x/time/rate+mutex", "token bucket", false, newRateMutex},
		{"x/time/rate+xsync", "token bucket", false, newRateXsync},
		{"httprate", "sliding counter", false, newHTTPRate},
		{"ulule", "fixed window", false, newUlule},
		{"go-limiter", "fixed window", false, newGoLimiter},
		{"throttled", "GCRA", false, newThrottled},
	}
}

// Find returns the peer called name.
func Find(name string) (Peer, error) {
	for _, p := range All() {
		if p.Name == name {
			return p, nil
		}
	}
	return Peer{}, fmt.Errorf("peers: no peer %q", name)
}

func checkPolicy(limit int, window time.Duration) error {
	if limit < 1 || window <= 0 {
		return fmt.Errorf("peers: limit %d and window %v must be positive", limit, window)
	}
	return nil
}

// ---- slidegate, with its defaults (background sweeper on); slidegate-hashed
// adds WithHashedKeys (a seeded hash per key instead of its bytes) ----

type slidegateLimiter struct{ l *engine.Limiter }

func newSlidegate(alg engine.Algorithm, opts ...engine.Option) func(int, time.Duration) (Limiter, error) {
	return adapt(func(limit int, window time.Duration) (*engine.Limiter, error) {
		return engine.New(engine.Policy{Limit: limit, Window: window, Algorithm: alg}, opts...)
	}, func(l *engine.Limiter) Limiter { return slidegateLimiter{l} })
}

func (s slidegateLimiter) Allow(key string) bool { return s.l.Allow(key).Allowed }
func (s slidegateLimiter) Close() error          { return s.l.Close() }

// adapt returns a Peer's New: open makes the limiter, wrap makes it a
// Limiter. The wrappers stay concrete types, so a decision costs what it
// did without adapt.
func adapt[T any](open func(limit int, window time.Duration) (T, error), wrap func(T) Limiter) func(int, time.Duration) (Limiter, error) {
	return func(limit int, window time.Duration) (Limiter, error) {
		l, err := open(limit, window)
		if err != nil {
			return nil, err
		}
		return wrap(l), nil
	}
}

// ---- the in-repo textbook logs ----

type textbookLimiter struct{ t *bench.Textbook }

var newTextbook = adapt(bench.NewTextbook, func(t *bench.Textbook) Limiter { return textbookLimiter{t} })

func (t textbookLimiter) Allow(key string) bool { return t.t.Allow(key).Allowed }
func (t textbookLimiter) Close() error          { return nil }

type textbook64Limiter struct{ t *bench.ShardedTextbook }

var newTextbook64 = adapt(bench.NewShardedTextbook, func(t *bench.ShardedTextbook) Limiter { return textbook64Limiter{t} })

func (t textbook64Limiter) Allow(key string) bool { return t.t.Allow(key).Allowed }
func (t textbook64Limiter) Close() error          { return nil }

// ---- golang.org/x/time/rate: a token bucket per key ----

// tokenBucket returns the per-key bucket of the usual translation of
// "limit per window": refill limit/window per second, burst limit.
func tokenBucket(limit int, window time.Duration) *rate.Limiter {
	return rate.NewLimiter(rate.Limit(float64(limit)/window.Seconds()), limit)
}

// rateMutex is the pattern of x/time/rate's README and countless
// middlewares: a map of per-key limiters behind one mutex.
type rateMutex struct {
	mu     sync.Mutex
	m      map[string]*rate.Limiter
	limit  int
	window time.Duration
}

func newRateMutex(limit int, window time.Duration) (Limiter, error) {
	if err := checkPolicy(limit, window); err != nil {
		return nil, err
	}
	return &rateMutex{m: make(map[string]*rate.Limiter), limit: limit, window: window}, nil
}

func (r *rateMutex) Allow(key string) bool {
	r.mu.Lock()
	l := r.m[key]
	if l == nil {
		l = tokenBucket(r.limit, r.window)
		r.m[key] = l
	}
	r.mu.Unlock()
	return l.Allow()
}

func (r *rateMutex) Close() error { return nil }

// rateXsync is the same with a concurrent map (xsync v3) instead.
type rateXsync struct {
	m      *xsync.MapOf[string, *rate.Limiter]
	limit  int
	window time.Duration
}

func newRateXsync(limit int, window time.Duration) (Limiter, error) {
	if err := checkPolicy(limit, window); err != nil {
		return nil, err
	}
	return &rateXsync{m: xsync.NewMapOf[string, *rate.Limiter](), limit: limit, window: window}, nil
}

func (r *rateXsync) Allow(key string) bool {
	l, ok := r.m.Load(key)
	if !ok {
		l, _ = r.m.LoadOrCompute(key, func() *rate.Limiter { return tokenBucket(r.limit, r.window) })
	}
	return l.Allow()
}

func (r *rateXsync) Close() error { return nil }

// ---- github.com/go-chi/httprate: its local counter ----

// httprateLimiter is httprate's in-memory limiter without the HTTP
// plumbing: its local counter (httprate.NewLocalLimitCounter) and the
// decision of RateLimiter.OnLimit in v0.16.1, step for step: under one
// mutex, read the current and previous window counts, estimate
// prev·(W−elapsed)/W + cur, round it, refuse if estimate + 1 > limit,
// else increment. What is left out is only the response headers
// OnLimit writes, which need an http.ResponseWriter.
type httprateLimiter struct {
	mu      sync.Mutex
	counter httprate.LimitCounter
	limit   int
	window  time.Duration
	offset  time.Duration
}

func newHTTPRate(limit int, window time.Duration) (Limiter, error) {
	if err := checkPolicy(limit, window); err != nil {
		return nil, err
	}
	start := time.Now().UTC()
	return &httprateLimiter{
		counter: httprate.NewLocalLimitCounter(window),
		limit:   limit,
		window:  window,
		// NewRateLimiter aligns windows to its start, not the wall clock.
		offset: start.Sub(start.Truncate(window)),
	}, nil
}

func (h *httprateLimiter) Allow(key string) bool {
	now := time.Now().UTC()
	cur := now.Add(-h.offset).Truncate(h.window).Add(h.offset)
	prev := cur.Add(-h.window)
	h.mu.Lock()
	defer h.mu.Unlock()
	// calculateRate reads its own time.Now; OnLimit's window is from the
	// instant above. The two differ by nanoseconds.
	c, p, err := h.counter.Get(key, cur, prev)
	if err != nil {
		return false
	}
	elapsed := now.Sub(cur)
	est := float64(p)*(float64(h.window)-float64(elapsed))/float64(h.window) + float64(c)
	if int(math.Round(est))+1 > h.limit {
		return false
	}
	return h.counter.IncrementBy(key, cur, 1) == nil
}

func (h *httprateLimiter) Close() error { return nil }

// ---- github.com/ulule/limiter/v3, memory store ----

type ululeLimiter struct{ l *ulule.Limiter }

func newUlule(limit int, window time.Duration) (Limiter, error) {
	if err := checkPolicy(limit, window); err != nil {
		return nil, err
	}
	return ululeLimiter{ulule.New(ululememory.NewStore(), ulule.Rate{Period: window, Limit: int64(limit)})}, nil
}

func (u ululeLimiter) Allow(key string) bool {
	c, err := u.l.Get(context.Background(), key)
	return err == nil && !c.Reached
}

// Close: the memory store's cleaner goroutine stops when the store is
// garbage collected (a finalizer); the library offers nothing else.
func (u ululeLimiter) Close() error { return nil }

// ---- github.com/sethvargo/go-limiter, memory store ----

type goLimiter struct{ s sethlimiter.Store }

func newGoLimiter(limit int, window time.Duration) (Limiter, error) {
	if err := checkPolicy(limit, window); err != nil {
		return nil, err
	}
	s, err := memorystore.New(&memorystore.Config{Tokens: uint64(limit), Interval: window})
	if err != nil {
		return nil, err
	}
	return goLimiter{s}, nil
}

func (g goLimiter) Allow(key string) bool {
	_, _, _, ok, err := g.s.Take(context.Background(), key)
	return err == nil && ok
}

func (g goLimiter) Close() error { return g.s.Close(context.Background()) }

// ---- github.com/throttled/throttled/v2, GCRA on its memory store ----

type throttledLimiter struct{ l *throttled.GCRARateLimiterCtx }

func newThrottled(limit int, window time.Duration) (Limiter, error) {
	if err := checkPolicy(limit, window); err != nil {
		return nil, err
	}
	st, err := memstore.NewCtx(0) // no key limit: a plain map, no LRU
	if err != nil {
		return nil, err
	}
	// limit per window sustained, a burst of limit (MaxBurst counts the
	// requests beyond the first).
	l, err := throttled.NewGCRARateLimiterCtx(st, throttled.RateQuota{
		MaxRate:  throttled.PerDuration(limit, window),
		MaxBurst: limit - 1,
	})
	if err != nil {
		return nil, err
	}
	return throttledLimiter{l}, nil
}

func (t throttledLimiter) Allow(key string) bool {
	limited, _, err := t.l.RateLimitCtx(context.Background(), key, 1)
	return err == nil && !limited
}

func (t throttledLimiter) Close() error { return nil }

// ---- the floor: not a limiter ----

// Floor returns the floor row of the table: not a limiter, but what any
// design of slidegate's shape pays at least. Its decision is one read of
// the monotonic clock, a bare xsync.MapOf Load of the key (on a map filled
// with the same keys as the limiters'), and one load from the value's
// memory. A miss stores a fresh value, so the fills build a map of the
// same size as every limiter's. It is measured in every round beside the
// peers and never takes part in the exactness scenarios.
//
// The clock is read first, as slidegate's engine reads it: read after the
// Load, it waits for the lookup's cache misses instead of letting them
// overlap the previous decision's, so that order would not be a floor.
func Floor() Peer {
	return Peer{FloorName, "clock + xsync.MapOf Load + 1 load (not a limiter)", false, newFloor}
}

// FloorName is the floor row's name.
const FloorName = "floor"

// floorLimiter is the floor (package floor) as a row: its Allow, with
// every key inserted on its first decision.
type floorLimiter struct{ floor.Map }

var newFloor = onFloor(func(f floorLimiter) Limiter { return &f })

// onFloor returns the constructor of a row built on the floor's state: an
// empty map and an epoch, which wrap turns into the row's Limiter. The
// floor and the diagnostic rows on it share it.
func onFloor(wrap func(floorLimiter) Limiter) func(limit int, window time.Duration) (Limiter, error) {
	return func(limit int, window time.Duration) (Limiter, error) {
		if err := checkPolicy(limit, window); err != nil {
			return nil, err
		}
		return wrap(floorLimiter{*floor.New(nil)}), nil
	}
}

// The diagnostic rows each spell out the floor's lookup (Load,
// LoadOrStore on a miss) instead of sharing a helper: a helper that does
// both is too large for the inliner, and the call it would add is not
// part of what these rows measure.

func (f *floorLimiter) Close() error { return nil }

// ---- diagnostic rows: not limiters either ----

// Diagnostics returns rows that, like the floor, are not limiters: steps
// between the floor and slidegate's decision, for splitting slidegate's
// time over the floor (docs/design.md, "Where the time goes").
// `peerbench -diag` measures them after the floor, in every round;
// they never take part in the exactness scenarios or the fastest-peer
// lines.
func Diagnostics() []Peer {
	return []Peer{
		{DiagClockAfter, "the floor, reading the clock after its Load (not a limiter)", false, newFloorClockAfter},
		{DiagWrite, "the floor plus a CAS and a store on the value (not a limiter)", false, newFloorWrite},
		{DiagShape, "the key's copy in a 96-byte block behind 64 xxhash-picked xsync maps, one header load (not a limiter)", false, newShape},
	}
}

// The diagnostic rows' names.
const (
	DiagClockAfter = "floor, clock after"
	DiagWrite      = "floor + write"
	DiagShape      = "shape, read-only"
)

// notLimiter reports whether the row called name is the floor or a
// diagnostic row.
func notLimiter(name string) bool {
	if name == FloorName {
		return true
	}
	for _, d := range Diagnostics() {
		if d.Name == name {
			return true
		}
	}
	return false
}

// floorClockAfter is the floor with the clock read after the Load, to
// show what that order costs.
type floorClockAfter struct{ floorLimiter }

var newFloorClockAfter = onFloor(func(f floorLimiter) Limiter { return &floorClockAfter{f} })

func (f *floorClockAfter) Allow(key string) bool {
	v, ok := f.Words.Load(key)
	if !ok {
		v, _ = f.Words.LoadOrStore(key, new(atomic.Int64))
	}
	return int64(time.Since(f.Epoch)) >= v.Load()
}

// floorWrite is the floor plus the least an accept of an exact log
// writes: a CAS that takes the value and a store that releases it.
type floorWrite struct{ floorLimiter }

var newFloorWrite = onFloor(func(f floorLimiter) Limiter { return &floorWrite{f} })

func (f *floorWrite) Allow(key string) bool {
	now := int64(time.Since(f.Epoch))
	v, ok := f.Words.Load(key)
	if !ok {
		v, _ = f.Words.LoadOrStore(key, new(atomic.Int64))
	}
	old := v.Load()
	if v.CompareAndSwap(old, old|1) {
		v.Store(now &^ 1)
	}
	return now >= old
}

// shapeShards is how many maps the shape row spreads keys over, as many
// as the engine's default shards.
const shapeShards = 64

// shapeWords is the shape row's block: 96 bytes, the size of slidegate's
// block for a short key holding 6 to 10 instants.
const shapeWords = 12

// shape is slidegate's layout without its decision: keys picked into
// xsync maps by xxhash, each map key a copy of the key inside the value's
// block (as the engine keeps it), and a decision that reads the block's
// first word.
type shape struct {
	maps  [shapeShards]*xsync.MapOf[string, *atomic.Int64]
	epoch time.Time
}

func newShape(limit int, window time.Duration) (Limiter, error) {
	if err := checkPolicy(limit, window); err != nil {
		return nil, err
	}
	s := &shape{epoch: time.Now()}
	for i := range s.maps {
		s.maps[i] = xsync.NewMapOf[string, *atomic.Int64]()
	}
	return s, nil
}

func (s *shape) Allow(key string) bool {
	now := int64(time.Since(s.epoch))
	m := s.maps[xxhash.Sum64String(key)%shapeShards]
	v, ok := m.Load(key)
	if !ok {
		// One allocation holds the header word and the key's copy.
		kw := (len(key) + 7) / 8
		words := make([]uint64, max(shapeWords, 1+kw))
		p := (*byte)(unsafe.Pointer(&words[1]))
		copy(unsafe.Slice(p, len(key)), key)
		v, _ = m.LoadOrStore(unsafe.String(p, len(key)), (*atomic.Int64)(unsafe.Pointer(&words[0])))
	}
	return now >= v.Load()
}

func (s *shape) Close() error { return nil }
