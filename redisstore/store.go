package redisstore

import (
	"context"
	"errors"
	"fmt"
	"net"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/rueidis"
	"github.com/slidegate/slidegate/engine"
	"github.com/slidegate/slidegate/internal/clientcore"
)

// Errors returned by the package.
var (
	// ErrInvalidOption is wrapped by errors about options.
	ErrInvalidOption = errors.New("redisstore: invalid option")
	// ErrUnavailable is wrapped by the error Decide returns under
	// FailClosed when Redis could not decide.
	ErrUnavailable = errors.New("redisstore: redis unavailable")
	// ErrConnect is wrapped by errors about reaching Redis at Open.
	ErrConnect = errors.New("redisstore: cannot connect")
	// ErrClosed is returned by Decide after Close.
	ErrClosed = errors.New("redisstore: closed")
)

// Store is a connection to one Redis server or Redis Cluster, shared by the
// limiters it makes (one per policy), with one circuit breaker per Redis
// node, one set of metrics, and one background goroutine (the health
// check, stopped by Close). It is safe for concurrent use.
type Store struct {
	cfg     config
	conn    conn
	cluster bool
	refresh bool   // masters move (a cluster, Sentinel): re-read them
	name    string // the URL without its password, for logs
	m       *metrics
	wall    time.Time // caller clock: wall time at its instant 0
	anchor  anchoredClock

	// Per-node breakers: the slot map and the nodes by address.
	topo     atomic.Pointer[topology]
	nodesMu  sync.Mutex
	nodes    map[string]*node
	unserved *node // slots no master serves (mid-failover)
	health   health

	// The limiters the store made, whose fallback limiters Close stops.
	limitersMu sync.Mutex
	limiters   []*Limiter

	ctx       context.Context // cancelled by Close
	cancel    context.CancelFunc
	closeOnce sync.Once
	closed    chan struct{}

	lanes       []lane         // batching (batch.go): one, or one per cluster slot
	nodeLanes   bool           // a cluster's lanes are its masters' (batch.go); set at Open
	redone      atomic.Int64   // decisions a batch handed back undecided (batch.go)
	calls       atomic.Int64   // decision script calls made (one per batch): what batching saves
	batchMu     sync.Mutex     // guards batchClosed and batchWG.Add
	batchClosed bool           // Close began: no more batch goroutines
	batchWG     sync.WaitGroup // batch goroutines, which Close waits for

	probeSet                        // liveness probes of nodes whose calls timed out
	fnOff       bool                // EVALSHA whatever the servers allow (functionsOff at Open)
	fnRefused   bool                // a master refused Functions: EVALSHA (health loop)
	rtt         atomic.Int64        // smoothed round trip of answered calls, ns (observe)
	fallbackLog clientcore.Throttle // decisions of the failure policy
	slowLog     clientcore.Throttle // refusals of requests Redis did not answer in time
}

// anchoredClock reads the monotonic clock as Unix nanoseconds fixed at its
// creation: the timeline of Redis TIME, without following wall-clock steps.
// Fallback decisions and the refusal cache use it when Redis TIME decides.
type anchoredClock struct {
	epoch time.Time
	unix  int64
}

func newAnchoredClock() anchoredClock {
	now := time.Now()
	return anchoredClock{epoch: now, unix: now.UnixNano()}
}

func (c anchoredClock) Now() int64 { return c.unix + int64(time.Since(c.epoch)) }

// Open connects to the store named by rawURL (every form, with examples,
// in docs/distributed.md):
//
//	redis://[user[:password]@]host[:port][/db]
//	rediss://...                                    (TLS)
//	unix://[user[:password]@]/path/to/socket[?db=N]
//	redis-cluster://[user[:password]@]host:port[,host:port...]
//	rediss-cluster://...                            (TLS)
//	redis-sentinel://[user[:password]@]host:port[,host:port...][/db]?master_set=NAME
//	rediss-sentinel://...                           (TLS)
//
// rueidis.ParseURL reads them (the cluster and sentinel host lists become
// its addr parameters); the query may also carry client_name, protocol
// and skip_verify (TLS without verification). TLS verifies servers with
// the system's roots unless tls_ca_file or WithTLSConfig says otherwise.
//
// It fails, with an error saying why, when the URL is malformed, the
// servers cannot be reached within the dial timeout, authentication or
// database selection fails, a server runs Redis older than 6.2
// (ErrConnect), or a server's maxmemory-policy
// may evict limiter keys and WithEvictionAllowed was not given
// (ErrEvictionPolicy).
func Open(rawURL string, opts ...Option) (*Store, error) {
	cfg, err := applyOptions(opts)
	if err != nil {
		return nil, err
	}
	cn := cfg.conn
	name := redact(rawURL)
	k := standalone
	if cn == nil {
		t, err := parseURL(rawURL)
		if err != nil {
			return nil, err
		}
		k = t.kind
		rc, err := dialRueidis(t, &cfg)
		if errors.Is(err, ErrInvalidOption) {
			return nil, err
		}
		if err != nil {
			return nil, fmt.Errorf("%w to %s: %w%s", ErrConnect, name, err, tlsHint(err))
		}
		cn = rc
	} else if t, err := parseURL(rawURL); err == nil {
		k = t.kind
	}
	return openConn(cfg, cn, name, k == cluster, k != standalone)
}

// open is OpenClient's way in: options applied, the deployment read from
// the client's slot map, masters re-read every health interval.
func open(name string, cn conn, opts []Option) (*Store, error) {
	cfg, err := applyOptions(opts)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(context.Background(), cfg.dialTimeout)
	defer cancel()
	_, owner, err := cn.masters(ctx)
	if err != nil {
		return nil, fmt.Errorf("%w to %s: %w", ErrConnect, name, err)
	}
	return openConn(cfg, cn, name, owner != nil, true)
}

func applyOptions(opts []Option) (config, error) {
	cfg := defaultConfig()
	if err := clientcore.Apply(&cfg, opts); err != nil {
		return config{}, err
	}
	return cfg, nil
}

// openConn checks the servers behind cn and starts the store; refresh
// says whether masters can move (a cluster, Sentinel, a caller's client).
func openConn(cfg config, cn conn, name string, cluster, refresh bool) (*Store, error) {
	ctx, cancel := context.WithTimeout(context.Background(), cfg.dialTimeout)
	defer cancel()
	if err := cn.ping(ctx); err != nil {
		cn.close()
		return nil, fmt.Errorf("%w to %s: %w%s", ErrConnect, name, err, tlsHint(err))
	}
	s := &Store{cfg: cfg, conn: cn, cluster: cluster, refresh: refresh, name: name, m: newMetrics(cfg.failure),
		closed: make(chan struct{}), anchor: newAnchoredClock(), nodes: map[string]*node{}, fnOff: functionsOff}
	s.ctx, s.cancel = context.WithCancel(context.Background())
	s.lanes = make([]lane, 1)
	if cluster {
		s.lanes = make([]lane, numSlots)
	}
	if cfg.clock != nil {
		s.wall = time.Now().Add(-time.Duration(cfg.clock.Now()))
	}
	s.nodesMu.Lock()
	s.unserved = s.nodeFor("unserved") // slots no master serves, as one node
	s.nodesMu.Unlock()
	if err := s.refreshTopology(ctx); err != nil {
		s.close()
		return nil, fmt.Errorf("%w to %s: reading the cluster's slots: %w", ErrConnect, name, err)
	}
	if err := s.checkNodes(ctx, true); err != nil {
		s.close()
		if errors.Is(err, ErrEvictionPolicy) {
			return nil, err
		}
		return nil, fmt.Errorf("%w to %s: %w", ErrConnect, name, err)
	}
	if cluster {
		s.warnCoverage(ctx)
	}
	if fc, ok := cn.(functionConn); ok {
		fc.onLost(s.kickHealth)
	}
	s.loadFunctions(ctx, true)
	s.checkNodeLanes(ctx)
	s.health.kick = make(chan struct{}, 1)
	s.health.done.Add(1)
	go s.healthLoop()
	return s, nil
}

// Collector returns the store's metrics, to register on a Prometheus
// registry: call latency, errors by kind, breaker state and transitions,
// refusal cache hits and failure-policy decisions.
func (s *Store) Collector() prometheus.Collector { return s.m }

// Close closes the connection and stops everything the store made: the
// health check and the local fallback limiters of its limiters. The store
// owns its limiters (and any Group over them): they must not be used
// afterwards (their Decide returns ErrClosed), and need no Close of their
// own. Close is idempotent.
func (s *Store) Close() error {
	s.closeOnce.Do(func() {
		close(s.closed)
		s.cancel()
		s.health.done.Wait()
		s.stopProbes()
		s.batchMu.Lock()
		s.batchClosed = true
		s.batchMu.Unlock()
		s.conn.close()
		s.batchWG.Wait()
	})
	s.limitersMu.Lock()
	ls := s.limiters
	s.limiters = nil
	s.limitersMu.Unlock()
	for _, l := range ls {
		if l.local != nil {
			l.local.Close()
		}
	}
	return nil
}

// close releases what Open made before the health loop started.
func (s *Store) close() {
	s.closeOnce.Do(func() {
		close(s.closed)
		s.cancel()
		s.conn.close()
	})
}

// now returns the instant on the limiter's timeline: the caller's clock,
// or the anchored monotonic clock that approximates Redis TIME.
func (s *Store) now() int64 {
	if s.cfg.clock != nil {
		return s.cfg.clock.Now()
	}
	return s.anchor.Now()
}

// kind names the deployment for the call hook (WithCallHook).
func (s *Store) kind() string {
	if s.cluster {
		return "redis-cluster"
	}
	return "redis"
}

// callCtx returns ctx bounded by the deadline of one round trip
// (callTimeout), and its cancel; a ctx whose deadline comes first is
// returned as it is (deriving one would change nothing but cost its
// allocations).
func (s *Store) callCtx(ctx context.Context) (context.Context, context.CancelFunc) {
	d := s.callTimeout()
	if dl, ok := ctx.Deadline(); ok && time.Until(dl) <= d {
		return ctx, func() {}
	}
	return context.WithTimeout(ctx, d)
}

// callTimeout is the deadline of one round trip: the store's timeout, or
// four times the smoothed round trip when that is longer (a busy host or
// a slow Redis), at most the liveness probe's base grace. A call that misses a
// deadline so near the usual round trip would be refused for want of CPU.
func (s *Store) callTimeout() time.Duration {
	return max(s.cfg.timeout, min(4*time.Duration(s.rtt.Load()), s.probeBase()))
}

// observe feeds one answered round trip (a decision, or the PING of a
// probe through a caller's client) into the smoothed round trip, an
// exponential average of weight 1/8.
func (s *Store) observe(d time.Duration) {
	for {
		old := s.rtt.Load()
		if s.rtt.CompareAndSwap(old, old+(int64(d)-old)/8) {
			return
		}
	}
}

// callOutcome says how a decision goes on after its call to Redis.
type callOutcome int

const (
	callAnswered  callOutcome = iota // the reply decides
	callAbandoned                    // the caller's ctx ended: its error is returned
	callLate                         // the call missed its deadline: the timeout path decides
	callFailed                       // the failure policy decides
)

// settle records a finished call to nd (el: its round trip, err: its
// error, nil for a well-formed reply) in the metrics, nd's breaker and
// the smoothed round trip, and says how the decision goes on.
func (s *Store) settle(ctx context.Context, nd *node, el time.Duration, err error) callOutcome {
	s.m.latency.Observe(el.Seconds())
	if err == nil {
		nd.br.Success()
		s.observe(el)
		if nd.probing.Load() {
			nd.answered.Store(true)
		}
		return callAnswered
	}
	if mayHaveRun(err) {
		// The script may have run (or may still run) on the server: its
		// entries count although the caller got no decision.
		s.m.unknown.Inc()
	}
	if ctx.Err() != nil {
		// The caller gave up: that says nothing about Redis.
		nd.br.Abandon()
		return callAbandoned
	}
	s.m.errors.WithLabelValues(errorKind(err)).Inc()
	if isTimeout(ctx, err) {
		return callLate
	}
	s.blame(nd, err).br.Failure(err)
	s.kickHealth()
	return callFailed
}

// clock returns the clock fallback limiters use.
func (s *Store) clock() engine.Clock {
	if s.cfg.clock != nil {
		return s.cfg.clock
	}
	return s.anchor
}

// Limiter is a limiter of one policy on Redis: the exact sliding window
// log (the default) or the sliding window counter, with the engine's
// semantics (docs/semantics.md), one atomic script run per decision
// (decisions that wait for one server share a call: batch.go),
// shared by every replica that uses the same Redis and key prefix. It
// implements engine.Backend, and engine.KeyAdmin for operators; NewGroup
// combines limiters of one store into all-or-nothing multi-limit
// decisions.
//
// Instants are Redis TIME (microseconds since the Unix epoch) unless the
// store has a caller clock; Decision.At is in nanoseconds either way, a
// multiple of 1000. Per key, At never decreases, even if the server's clock
// steps back: the key remembers its latest decision instant. The counter's
// RetryAfter is rounded up to a whole microsecond (the log's is exact).
//
// A Limiter is safe for concurrent use. It belongs to the Store that made
// it (Store.Close stops it), except that New's limiter owns its store.
type Limiter struct {
	st     *Store
	own    bool // made by New: Close closes st
	policy engine.Policy
	script *script // logScript or counterScript
	prefix string  // prefix + name + ":" (":c:" for the counter)
	bucket string  // log: prefix + name + ":1{", the buckets' keys; counter: ""
	tags   *[numSlots]string
	args   [6]string // L, W µs, (cost), (now), S, TTL ms
	group  [5]string // for groupReserveScript: algorithm, L, W µs, S, TTL ms
	gpol   string    // for groupScript: group packed, space-separated (pol in lua.go)
	wus    int64     // W in µs
	cost   []string  // "1".."L" for small costs, preformatted
	cache  *refusalCache
	local  *engine.Limiter // FailLocal only
}

var _ engine.Backend = (*Limiter)(nil)

// New opens the store at rawURL (see Open) and returns a limiter of policy
// p on it that owns the store: closing the limiter closes the store. To
// share one connection among several policies, Open the store and make
// its limiters with Store.Limiter or Store.Limiters; the store then owns
// them.
func New(rawURL string, p engine.Policy, opts ...Option) (*Limiter, error) {
	s, err := Open(rawURL, opts...)
	if err != nil {
		return nil, err
	}
	l, err := s.Limiter(p)
	if err != nil {
		s.Close()
		return nil, err
	}
	l.own = true
	return l, nil
}

// Limiter returns a limiter of policy p on the store, owned by the store
// (Store.Close stops it; its own Close does nothing). Limiters of
// different policies must have different names (the name is part of the
// key); an empty name is replaced by "<limit>/<window>".
func (s *Store) Limiter(p engine.Policy) (*Limiter, error) {
	if err := p.Validate(); err != nil {
		return nil, err
	}
	if p.Window%time.Microsecond != 0 {
		return nil, fmt.Errorf("%w: window %v is not a whole number of microseconds, the resolution of Redis TIME", engine.ErrInvalidPolicy, p.Window)
	}
	name := p.Name
	if strings.ContainsAny(name, "{}") {
		return nil, fmt.Errorf("%w: policy name %q contains a brace, which would choose the Redis Cluster slot of every key", engine.ErrInvalidPolicy, name)
	}
	if name == "" {
		name = fmt.Sprintf("%d/%v", p.Limit, p.Window)
	}
	wus := p.Window.Microseconds()
	// TTLs are whole milliseconds, rounded up, plus one: a key outlives
	// every instant at which its state can still change a decision.
	ttl := ceilMillis(p.Window) + 1
	sc, tag, slot := logScript, ":", strconv.Itoa(slotWidth(wus))
	if p.Algorithm == engine.SlidingCounter {
		// The counter's state lasts 2W.
		ttl = ceilMillis(2*p.Window) + 1
		sc, tag, slot = counterScript, ":c:", "0"
	}
	if s.cfg.clock != nil {
		ttl = ceilMillis(max(2*p.Window, CallerClockTTL))
	}
	l := &Limiter{
		st:     s,
		policy: p,
		wus:    wus,
		script: sc,
		prefix: s.cfg.prefix + name + tag,
		tags:   slotTags(),
		args: [6]string{
			strconv.Itoa(p.Limit), strconv.FormatInt(wus, 10), "", "",
			slot, strconv.FormatInt(ttl, 10),
		},
	}
	alg := "0"
	if p.Algorithm == engine.SlidingCounter {
		alg = "1"
	} else {
		// The first "{" of a bucket's key follows "1", never ":" as in
		// every client's own key: no client key can name a bucket.
		l.bucket = s.cfg.prefix + name + ":1{"
	}
	l.group = [5]string{alg, l.args[0], l.args[1], l.args[4], l.args[5]}
	l.gpol = strings.Join(l.group[:], " ")
	l.cost = make([]string, min(p.Limit, 64)+1)
	for i := range l.cost {
		l.cost[i] = strconv.Itoa(i)
	}
	if s.cfg.cacheSize > 0 {
		l.cache = newRefusalCache(s.cfg.cacheSize)
	}
	if s.cfg.failure == FailLocal {
		local, err := engine.New(p, engine.WithClock(s.clock()))
		if err != nil {
			return nil, err
		}
		l.local = local
	}
	s.limitersMu.Lock()
	defer s.limitersMu.Unlock()
	select {
	case <-s.closed:
		if l.local != nil {
			l.local.Close()
		}
		return nil, ErrClosed
	default:
	}
	s.limiters = append(s.limiters, l)
	return l, nil
}

// ceilMillis returns d in whole milliseconds, rounded up.
func ceilMillis(d time.Duration) int64 {
	return int64((d + time.Millisecond - 1) / time.Millisecond)
}

// Policy returns the limiter's policy.
func (l *Limiter) Policy() engine.Policy { return l.policy }

// Key returns the Redis key that holds key's state (log or counter):
// prefix + policy + ":{" + slot tag + "}" + key (":c:{" for the counter),
// where the slot tag is derived from a hash of key (see DecideTagged).
// A log client of 1 to 40 bytes whose one entry is also its latest
// decision instant (a client that sent one request) is instead, while its
// bucket has room, a field (its client key) of its bucket, prefix + policy
// + ":1{" + slot tag + "}", a hash in the same slot: deleting Key alone
// does not reset it (ResetKey does).
func (l *Limiter) Key(key string) string { return l.keyIn(slotOf(key), key) }

// TaggedKey returns the Redis key that holds key's state when it is
// decided with DecideTagged(ctx, tag, key, n).
func (l *Limiter) TaggedKey(tag, key string) string { return l.keyIn(slotOf(tag), key) }

func (l *Limiter) keyIn(slot int, key string) string {
	return l.prefix + "{" + l.tags[slot] + "}" + key
}

// appendKey appends keyIn(slot, key) to b.
func (l *Limiter) appendKey(b []byte, slot int, key string) []byte {
	b = append(b, l.prefix...)
	b = append(b, '{')
	b = append(b, l.tags[slot]...)
	b = append(b, '}')
	return append(b, key...)
}

// appendBucket appends the bucket in slot (bucketIn's, for a client that
// has one) to b.
func (l *Limiter) appendBucket(b []byte, slot int) []byte {
	b = append(b, l.bucket...)
	b = append(b, l.tags[slot]...)
	return append(b, '}')
}

// maxBucketField bounds the client keys kept in a bucket (see logScript):
// a bucket stays a compact listpack while its fields are at most
// hash-max-listpack-value bytes (64 by default).
const maxBucketField = 40

// bucketIn returns the bucket of a log client of 1..maxBucketField bytes
// whose own key is in slot, and false for other clients and the counter.
func (l *Limiter) bucketIn(slot int, key string) (string, bool) {
	if !l.bucketed(key) {
		return "", false
	}
	return l.bucket + l.tags[slot] + "}", true
}

// bucketed reports whether key is a log client of 1..maxBucketField bytes,
// which has a bucket.
func (l *Limiter) bucketed(key string) bool {
	return l.bucket != "" && len(key) > 0 && len(key) <= maxBucketField
}

// WallTime maps a Decision.At to wall time: At is Unix nanoseconds under
// Redis TIME; under a caller clock the mapping is fixed at Open.
func (l *Limiter) WallTime(at int64) time.Time {
	if l.st.cfg.clock != nil {
		return l.st.wall.Add(time.Duration(at))
	}
	return time.Unix(0, at)
}

// Close closes the store if New made the limiter; a limiter made by
// Store.Limiter or Store.Limiters belongs to its store, and its Close does
// nothing. It is idempotent.
func (l *Limiter) Close() error {
	if l.own {
		return l.st.Close()
	}
	return nil
}

// Decide decides a request of cost n for key: one script call to Redis
// (or a share of one, when calls to its server are in flight: batch.go),
// unless the local refusal cache already knows the answer or the circuit
// breaker is open. A caller whose ctx ends while its decision waits in a
// batch gets ctx's error, and the decision may still be made. When Redis cannot decide (error, lost connection,
// hung node, open breaker), the failure policy does: FailLocal decides
// with the local in-memory limiter, FailOpen allows, FailClosed refuses
// and returns an error wrapping ErrUnavailable; the decision has Fallback
// set. A call that misses the timeout under FailLocal waits for a
// liveness probe of the node (at most five timeouts, at least 250 ms,
// at most the dial timeout): if the node answers, the request is refused
// (Fallback set, RetryAfter the breaker cooldown), since its script may
// have run and a local admit could exceed L; if not, the local limiter
// decides. A caller's cancelled context returns its
// error. n outside 1..Limit returns an error wrapping engine.ErrInvalidCost.
func (l *Limiter) Decide(ctx context.Context, key string, n int) (engine.Decision, error) {
	return l.decide(ctx, slotOf(key), key, n)
}

// DecideTagged is Decide with the key's Redis Cluster slot chosen by tag
// instead of by key: keys decided with one tag share a slot, whatever
// their policies and client keys, so that one script can later decide
// them together (the limits of one multi-limit request, grouped by a tag
// its configuration names). The tag is part of where the state lives: a
// client key must always be decided with the same tag (Decide is
// DecideTagged with the key as its own tag). Spread comes from the tags:
// many distinct tags spread like random keys; one tag is one slot.
func (l *Limiter) DecideTagged(ctx context.Context, tag, key string, n int) (engine.Decision, error) {
	return l.decide(ctx, slotOf(tag), key, n)
}

// decide is Decide with the slot computed.
func (l *Limiter) decide(ctx context.Context, slot int, key string, n int) (engine.Decision, error) {
	if n < 1 || n > l.policy.Limit {
		return engine.Decision{}, fmt.Errorf("%w: %d is outside 1..%d", engine.ErrInvalidCost, n, l.policy.Limit)
	}
	st := l.st
	sent, err := st.sendTime(l.wus)
	if err != nil {
		return engine.Decision{}, err
	}
	if l.cache != nil {
		e, ok, yield := l.cache.lookup(key, sent, st.cfg.clock != nil)
		if ok && n < e.cost && st.cfg.clock != nil {
			// Cached refusals do not reach Redis's watermark: decide no
			// earlier than the latest of them, so that At never goes
			// backwards when the caller's clock does.
			sent = max(sent, e.at)
		}
		if ok && n >= e.cost {
			st.m.cacheHits.Inc()
			// A caller looping on cached refusals would otherwise hold its
			// processor for a whole preemption slice while the replies of
			// callers that went to Redis wait to be read, and miss their
			// deadline. Yielding on every hit would triple a hit's cost.
			if yield {
				runtime.Gosched()
			}
			// Under a caller clock e.at ≥ sent is the instant Redis
			// would decide at; under TIME, durations count down on the
			// local clock and At stays the latest instant Redis reported.
			from := sent
			if st.cfg.clock != nil {
				from = e.at
			}
			return engine.Decision{
				Allowed:    false,
				Limit:      l.policy.Limit,
				Remaining:  e.remaining,
				RetryAfter: time.Duration(e.until - from),
				Reset:      time.Duration(max(e.resetAt-from, 0)),
				At:         e.at,
			}, nil
		}
	}
	nd := st.nodeOf(slot)
	if !nd.br.Allow() {
		return l.fail(key, n, ErrBreakerOpen)
	}
	nd, res, out, err := l.viaLane(ctx, nd, oneCall{slot: slot, key: key, n: n, sent: sent}, l.policy.Name)
	switch out {
	case callAbandoned:
		return engine.Decision{}, ctx.Err()
	case callLate:
		return l.timedOut(ctx, nd, key, n, err)
	case callFailed:
		return l.fail(key, n, err)
	}
	d := l.decision(res)
	if l.cache != nil {
		if d.Allowed {
			l.cache.seen(key, d.At)
		} else {
			// The deadline counts from Redis's instant when it shares
			// the caller's timeline, else from the local send time.
			from := sent
			if st.cfg.clock != nil {
				from = d.At
			}
			l.cache.put(key, cacheEntry{
				cost:      n,
				until:     from + int64(d.RetryAfter),
				fitAt:     d.At + int64(d.RetryAfter),
				at:        d.At,
				remaining: d.Remaining,
				resetAt:   from + int64(d.Reset),
			})
		}
	}
	return d, nil
}

// oneCall is what a single decision's script call needs: the key's slot,
// the key, the cost and the instant the caller sent it (sendTime).
type oneCall struct {
	slot int
	key  string
	n    int
	sent int64
}

// viaLane decides c's key at c's cost by Redis, batched (batch.go): at once
// when the lane of c's slot is idle, else in a later call with the
// decisions queued meanwhile. It returns the node that
// decided (a decision its batch handed back goes by a call of its own to
// the slot's node then), the single script's values, and the call's
// outcome: callAbandoned when ctx ended first, callFailed with
// ErrBreakerOpen when that node's breaker is open. name labels the call
// for the call hook (WithCallHook).
func (l *Limiter) viaLane(ctx context.Context, nd *node, c oneCall, name string) (*node, []int64, callOutcome, error) {
	st := l.st
	ln := st.laneOf(c.slot)
	ln.mu.Lock()
	if ln.enter() {
		ln.mu.Unlock()
		res, out, err := l.call(ctx, nd, c, name)
		st.leave(ln)
		return nd, res, out, err
	}
	p := &pending{l: l, oneCall: c, done: make(chan struct{})}
	st.enqueue(ln, p)
	var done func(bool, error)
	if h := st.cfg.callHook; h != nil {
		_, done = h(ctx, st.kind(), nd.addr, name)
	}
	select {
	case <-p.done:
	case <-ctx.Done():
		// The decision may still be made (batch.go).
		if done != nil {
			done(false, ctx.Err())
		}
		return nd, nil, callAbandoned, ctx.Err()
	}
	res, out, err := p.res, p.out, p.err
	if p.redo {
		// Its batch did not decide it (batch.go): a call of its own
		// does, through the cluster client, which follows MOVED and ASK.
		if done != nil {
			done(false, errNotDecided)
		}
		if ctx.Err() != nil {
			return nd, nil, callAbandoned, ctx.Err()
		}
		if nd = st.nodeOf(c.slot); !nd.br.Allow() {
			return nd, nil, callFailed, ErrBreakerOpen
		}
		res, out, err = l.call(ctx, nd, c, name)
	} else if done != nil {
		done(err == nil && res[0] == 1, err)
	}
	return nd, res, out, err
}

// call makes one decision's own script call to nd and settles it; name
// labels it for the call hook.
func (l *Limiter) call(ctx context.Context, nd *node, c oneCall, name string) ([]int64, callOutcome, error) {
	st := l.st
	// The per-call arguments: the template with cost and instant filled
	// in, on the stack.
	call := l.callArgs(c.n, c.sent, c.key)
	cctx, cancel := st.callCtx(ctx)
	var done func(bool, error)
	if h := st.cfg.callHook; h != nil {
		cctx, done = h(cctx, st.kind(), nd.addr, name)
	}
	start := time.Now()
	var res []int64
	var err error
	st.calls.Add(1)
	if b, ok := l.bucketIn(c.slot, c.key); ok {
		res, err = st.conn.evalKeys(cctx, l.script, []string{l.keyIn(c.slot, c.key), b}, call[:])
	} else {
		res, err = st.conn.eval(cctx, l.script, l.keyIn(c.slot, c.key), call[:6])
	}
	el := time.Since(start)
	cancel()
	if err == nil && len(res) != 5 {
		err = fmt.Errorf("redisstore: script returned %d values, want 5", len(res))
	}
	if done != nil {
		done(err == nil && res[0] == 1, err)
	}
	return res, st.settle(ctx, nd, el, err), err
}

// sendTime returns the instant a call is sent at (Store.now), or
// ErrClosed once the store is closed. Under a caller clock the instant
// must lie in the scripts' exact range for a window of wus µs, and it is
// cut to the whole microsecond: Redis decides at the whole microsecond,
// and so does everything local (the refusal cache's deadlines, At of
// cached refusals).
func (s *Store) sendTime(wus int64) (int64, error) {
	select {
	case <-s.closed:
		return 0, ErrClosed
	default:
	}
	sent := s.now()
	if s.cfg.clock == nil {
		return sent, nil
	}
	if sent < 0 {
		return 0, fmt.Errorf("%w: clock reads %d, before its epoch", engine.ErrInvalidInstant, sent)
	}
	if sent/1000 > maxInstantMicros-wus {
		return 0, fmt.Errorf("%w: clock reads %d µs, beyond 2^53 µs − window, the exact range of the scripts' arithmetic", engine.ErrInvalidInstant, sent/1000)
	}
	return sent - sent%1000, nil
}

// maxInstantMicros bounds the instants the scripts compute with (µs):
// Lua numbers are doubles, exact for integers up to 2^53. A caller clock
// must read at most 2^53 µs − W (285 years less the window), so that every
// instant the scripts derive (up to now + W) stays exact.
const maxInstantMicros = 1 << 53

// ErrBreakerOpen is the cause given to the failure policy while the
// circuit breaker is open.
var ErrBreakerOpen = errors.New("redisstore: circuit breaker open")

// fail decides by the failure policy; cause is why Redis did not. The
// decision has Fallback set.
func (l *Limiter) fail(key string, n int, cause error) (engine.Decision, error) {
	st := l.st
	st.noteFallback(cause)
	if st.cfg.onFallback != nil {
		st.cfg.onFallback(key, cause)
	}
	switch st.cfg.failure {
	case FailOpen:
		return engine.Decision{Allowed: true, Limit: l.policy.Limit, Remaining: l.policy.Limit - n, At: st.now(), Fallback: true}, nil
	case FailClosed:
		return engine.Decision{Allowed: false, Limit: l.policy.Limit, RetryAfter: st.cfg.cooldown, At: st.now(), Fallback: true},
			fmt.Errorf("%w: %w", ErrUnavailable, cause)
	}
	d, err := l.local.AllowN(key, n)
	d.Fallback = true
	return d, err
}

// decision reads the five values of a single decision's script
// (logScript's reply) as a decision of l's policy.
func (l *Limiter) decision(res []int64) engine.Decision {
	return engine.Decision{
		Allowed:    res[0] == 1,
		Limit:      l.policy.Limit,
		Remaining:  int(res[1]),
		RetryAfter: time.Duration(res[2]) * time.Microsecond,
		Reset:      time.Duration(res[3]) * time.Microsecond,
		At:         res[4] * 1000,
	}
}

// timedOut decides a request whose call missed the store's deadline
// (err). Under FailLocal it waits for a liveness probe of the node: if the
// node answers, Redis is up but slow (or this host is busy), the script
// may have run, and a local admit could add up to L to what Redis admits;
// the request is refused (Fallback set, RetryAfter the breaker cooldown)
// and counted in slidegate_redis_slow_refusals_total. If the node does not
// answer, its breaker opens and the failure policy decides. Under FailOpen
// and FailClosed the policy decides at once, and the probe runs in the
// background to open the breaker of a hung node.
func (l *Limiter) timedOut(ctx context.Context, nd *node, key string, n int, err error) (engine.Decision, error) {
	st := l.st
	if st.cfg.failure != FailLocal {
		st.probeNode(nd)
		return l.fail(key, n, err)
	}
	alive, cerr := st.awaitProbe(ctx, nd)
	if cerr != nil {
		return engine.Decision{}, cerr
	}
	if !alive {
		return l.fail(key, n, err)
	}
	st.noteSlow(err)
	if st.cfg.onFallback != nil {
		st.cfg.onFallback(key, fmt.Errorf("%w: %w", ErrSlow, err))
	}
	return engine.Decision{Allowed: false, Limit: l.policy.Limit, RetryAfter: st.cfg.cooldown, At: st.now(), Fallback: true}, nil
}

// ErrSlow is the cause given to the fallback hook for a request refused
// because Redis, which answers its liveness probe, did not answer the
// request in time (FailLocal): its outcome is unknown.
var ErrSlow = errors.New("redisstore: redis answered too late; refused without a local decision")

// fallbackLogEvery is the least time between two log lines about
// decisions made without Redis (of each kind).
const fallbackLogEvery = 10 * time.Second

// noteFallback counts a decision of the failure policy and logs, at most
// once per fallbackLogEvery, how many there were and the latest cause.
func (s *Store) noteFallback(cause error) {
	s.m.fallbacks.WithLabelValues(s.cfg.failure.String()).Inc()
	if k, ok := s.fallbackLog.Note(time.Now(), fallbackLogEvery); ok {
		s.cfg.logger.Warn("redisstore: the failure policy decided without Redis",
			"decisions", k, "failure_policy", s.cfg.failure.String(), "cause", cause, "store", s.name)
	}
}

// noteSlow counts a request refused because Redis answered it too late,
// and logs, at most once per fallbackLogEvery, how many there were.
func (s *Store) noteSlow(cause error) {
	s.m.slow.Inc()
	if k, ok := s.slowLog.Note(time.Now(), fallbackLogEvery); ok {
		s.cfg.logger.Warn("redisstore: refused requests that Redis did not answer within the timeout although it answers probes (overload, not an outage)",
			"refusals", k, "deadline", s.callTimeout(), "cause", cause, "store", s.name)
	}
}

// mayHaveRun reports whether a failed call may have reached the server
// and run there: a deadline or cancellation, or a connection that broke
// after the call was written. An error from Redis itself, or a failure to
// dial, means the script did not run.
func mayHaveRun(err error) bool {
	if isServerErr(err) {
		return false
	}
	var op *net.OpError
	if errors.As(err, &op) && op.Op == "dial" {
		return false
	}
	return true
}

// isServerErr reports whether err is an error reply from Redis: rueidis's,
// or any client's error with a RedisError method (go-redis's redis.Error).
func isServerErr(err error) bool {
	if _, ok := rueidis.IsRedisErr(err); ok {
		return true
	}
	var re interface{ RedisError() }
	return errors.As(err, &re)
}

// errorKind classifies a failed call for the errors metric.
func errorKind(err error) string {
	switch {
	case errors.Is(err, context.DeadlineExceeded):
		return "timeout"
	}
	if isServerErr(err) {
		return "redis"
	}
	return "connection"
}
