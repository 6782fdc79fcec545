package main

import (
	"context"
	"fmt"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/go-redis/redis_rate/v10"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"
	"github.com/throttled/throttled/v2"
	goredisstore "github.com/throttled/throttled/v2/store/goredisstore.v9"
	ulule "github.com/ulule/limiter/v3"
	ululeredis "github.com/ulule/limiter/v3/drivers/store/redis"

	"github.com/slidegate/slidegate/engine"
	"github.com/slidegate/slidegate/redisstore"
)

// limiter is one peer through its own public API and client: Allow
// decides one request of key.
type limiter interface {
	Allow(ctx context.Context, key string) (bool, error)
	Close() error
}

// peer names a limiter, its algorithm and how to open it on a deployment.
type peer struct {
	name, algorithm string
	exact           bool // the sliding log: at most L in any window
	open            func(d deployment, limit int, window time.Duration) (limiter, error)
}

// deployment is where the limiters run: one server, or a Cluster.
type deployment struct {
	name    string
	addrs   []string
	cluster bool
}

func (d deployment) slidegateURL() string {
	if d.cluster {
		u := "redis-cluster://" + d.addrs[0]
		for _, a := range d.addrs[1:] {
			u += "," + a
		}
		return u
	}
	return "redis://" + d.addrs[0]
}

func (d deployment) goRedis() redis.UniversalClient {
	var c redis.UniversalClient
	if d.cluster {
		c = redis.NewClusterClient(&redis.ClusterOptions{Addrs: d.addrs, PoolSize: 128})
	} else {
		c = redis.NewClient(&redis.Options{Addr: d.addrs[0], PoolSize: 128})
	}
	c.AddHook(countHook{})
	return c
}

// roundTrips counts the requests the limiter under test sends and waits
// for: a command, a pipeline or a script call each count one. Cells run
// one at a time.
var roundTrips atomic.Int64

// countHook counts a go-redis client's round trips (a Cluster client's
// pipeline counts one: every peer's pipeline is on one key).
type countHook struct{}

func (countHook) DialHook(next redis.DialHook) redis.DialHook { return next }

func (countHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		roundTrips.Add(1)
		return next(ctx, cmd)
	}
}

func (countHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		roundTrips.Add(1)
		return next(ctx, cmds)
	}
}

var peers = []peer{
	{"slidegate", "sliding log", true, openSlidegate},
	{"redis_rate", "GCRA", false, openRedisRate},
	{"ulule", "fixed window", false, openUlule},
	{"throttled", "GCRA", false, openThrottled},
	{"sorted set", "sliding log (textbook)", true, openSortedSet},
}

// ---- slidegate's redisstore, with its defaults ----

type slidegate struct {
	st *redisstore.Store
	l  *redisstore.Limiter
}

func openSlidegate(d deployment, limit int, window time.Duration) (limiter, error) {
	st, err := redisstore.Open(d.slidegateURL(), redisstore.WithKeyPrefix("sg:"))
	if err != nil {
		return nil, err
	}
	l, err := st.Limiter(engine.Policy{Name: "bench", Limit: limit, Window: window})
	if err != nil {
		st.Close()
		return nil, err
	}
	reg := prometheus.NewRegistry()
	if err := reg.Register(st.Collector()); err != nil {
		st.Close()
		return nil, err
	}
	calls := func() int64 { return storeCalls(reg) }
	extraTrips.Store(&calls)
	return slidegate{st, l}, nil
}

// storeCalls returns the script calls a store made: the sample count of
// its call latency histogram, one per call (several decisions that go
// together in one call count one).
func storeCalls(reg *prometheus.Registry) int64 {
	mfs, err := reg.Gather()
	if err != nil {
		return 0
	}
	for _, mf := range mfs {
		if mf.GetName() != "slidegate_redis_call_duration_seconds" {
			continue
		}
		var n int64
		for _, m := range mf.GetMetric() {
			n += int64(m.GetHistogram().GetSampleCount())
		}
		return n
	}
	return 0
}

// extraTrips counts round trips no go-redis hook sees: slidegate's script
// calls, read from its store's metrics.
var extraTrips atomic.Pointer[func() int64]

// trips returns the round trips counted so far.
func trips() int64 {
	n := roundTrips.Load()
	if f := extraTrips.Load(); f != nil {
		n += (*f)()
	}
	return n
}

func (s slidegate) Allow(ctx context.Context, key string) (bool, error) {
	d, err := s.l.Decide(ctx, key, 1)
	return d.Allowed, err
}

func (s slidegate) Close() error {
	extraTrips.Store(nil)
	return s.st.Close()
}

// goRedisPeer is a peer on a go-redis client: allow decides through the
// peer's API, and Close closes the client.
type goRedisPeer struct {
	c     redis.UniversalClient
	allow func(ctx context.Context, key string) (bool, error)
}

func (g goRedisPeer) Allow(ctx context.Context, key string) (bool, error) { return g.allow(ctx, key) }

func (g goRedisPeer) Close() error { return g.c.Close() }

// ---- github.com/go-redis/redis_rate/v10: GCRA ----

func openRedisRate(d deployment, limit int, window time.Duration) (limiter, error) {
	c := d.goRedis()
	l, rate := redis_rate.NewLimiter(c), redis_rate.Limit{Rate: limit, Burst: limit, Period: window}
	return goRedisPeer{c, func(ctx context.Context, key string) (bool, error) {
		res, err := l.Allow(ctx, "rr:"+key, rate)
		if err != nil {
			return false, err
		}
		return res.Allowed > 0, nil
	}}, nil
}

// ---- github.com/ulule/limiter/v3, Redis store: fixed window ----

func openUlule(d deployment, limit int, window time.Duration) (limiter, error) {
	c := d.goRedis()
	st, err := ululeredis.NewStoreWithOptions(c, ulule.StoreOptions{Prefix: "ul", MaxRetry: 3})
	if err != nil {
		return nil, err
	}
	l := ulule.New(st, ulule.Rate{Period: window, Limit: int64(limit)})
	return goRedisPeer{c, func(ctx context.Context, key string) (bool, error) {
		res, err := l.Get(ctx, key)
		if err != nil {
			return false, err
		}
		return !res.Reached, nil
	}}, nil
}

// ---- github.com/throttled/throttled/v2, go-redis v9 store: GCRA ----

func openThrottled(d deployment, limit int, window time.Duration) (limiter, error) {
	c := d.goRedis()
	st, err := goredisstore.NewCtx(c, "th:")
	if err != nil {
		return nil, err
	}
	l, err := throttled.NewGCRARateLimiterCtx(st, throttled.RateQuota{MaxRate: throttled.PerDuration(limit, window), MaxBurst: limit - 1})
	if err != nil {
		return nil, err
	}
	return goRedisPeer{c, func(ctx context.Context, key string) (bool, error) {
		limited, _, err := l.RateLimitCtx(ctx, key, 1)
		return !limited, err
	}}, nil
}

// ---- the textbook sorted-set script: the exact log, one member per
// accepted request, scored by Redis's clock in microseconds ----

const sortedSetLua = `
local t = redis.call('TIME')
local now = t[1] * 1000000 + t[2]
local window = tonumber(ARGV[1])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now - window)
if redis.call('ZCARD', KEYS[1]) < tonumber(ARGV[2]) then
  redis.call('ZADD', KEYS[1], now, now .. '-' .. ARGV[3])
  redis.call('PEXPIRE', KEYS[1], math.ceil(window / 1000))
  return 1
end
return 0
`

func openSortedSet(d deployment, limit int, window time.Duration) (limiter, error) {
	c := d.goRedis()
	script := redis.NewScript(sortedSetLua)
	win, lim := strconv.FormatInt(window.Microseconds(), 10), strconv.Itoa(limit)
	var seq atomic.Uint64 // makes each member unique
	return goRedisPeer{c, func(ctx context.Context, key string) (bool, error) {
		n, err := script.Run(ctx, c, []string{"zs:" + key}, win, lim, seq.Add(1)).Int()
		if err != nil {
			return false, fmt.Errorf("sorted set: %w", err)
		}
		return n == 1, nil
	}}, nil
}
