package redisstore

import (
	"sync"

	"github.com/cespare/xxhash/v2"
)

// refusalCache remembers recent refusals so that an abusive client is
// refused locally, without a round trip, until its RetryAfter has passed.
//
// Safety: Redis refused cost n at its instant At with RetryAfter r, so a
// request of cost ≥ n cannot fit before At + r (accepts meanwhile only take
// room). Under a caller clock, Redis and the cache share one timeline and
// the entry lasts until exactly At + r. Under Redis TIME the entry's
// deadline is sent + r on the local clock, where sent is the reading when
// the call was sent, which came no later in real time than Redis's At: the
// cache can only release a key early (and then Redis decides), never late.
// A cached refusal is dated with the latest At Redis reported for its key,
// and that date must still be before At + r: Redis reports instants in
// whole microseconds, truncated, so a report from the last microsecond
// before the local deadline can already be At + r, where the cost fits.
// An entry is therefore also dropped once its date reaches At + r (fitAt),
// whatever the local clock says.
//
// It never holds an allow. It holds at most about size keys: a full shard
// drops an arbitrary entry (Go's map iteration order is random) to make
// room.
//
// Decision instants stay monotonic per key: an entry keeps the latest At
// reported for its key (by Redis, seen, or by the cache itself), and a
// cached refusal is never dated before it.
type refusalCache struct {
	shards [cacheShards]cacheShard
	per    int // entries per shard
}

const cacheShards = 16

type cacheShard struct {
	mu   sync.Mutex
	m    map[string]cacheEntry
	hits uint32   // entries found, for lookup's yield
	_    [36]byte // keep neighbouring shard mutexes off one cache line
}

// cacheYieldEvery is how many entries found in one shard make a caller
// yield the processor once (lookup).
const cacheYieldEvery = 8

type cacheEntry struct {
	cost      int   // the refused cost
	until     int64 // limiter clock: refused until then (exclusive)
	fitAt     int64 // Redis's timeline: At + RetryAfter of the refusal, when the cost fits
	at        int64 // the latest Decision.At reported for the key
	remaining int
	resetAt   int64 // limiter clock: when the refusal's Reset ends
}

func newRefusalCache(size int) *refusalCache {
	c := &refusalCache{per: max(1, (size+cacheShards-1)/cacheShards)}
	for i := range c.shards {
		c.shards[i].m = make(map[string]cacheEntry)
	}
	return c
}

func (c *refusalCache) shard(key string) *cacheShard {
	return &c.shards[xxhash.Sum64String(key)%cacheShards]
}

// get returns the cached refusal of key at now, if one is in force; it
// answers a request of cost n iff n ≥ its cost. With advance (a caller
// clock: the cache and Redis share the timeline), the entry's instant
// moves up to now, as Redis would decide at max(now, the key's watermark).
func (c *refusalCache) get(key string, now int64, advance bool) (cacheEntry, bool) {
	e, ok, _ := c.lookup(key, now, advance)
	return e, ok
}

// lookup is get, and also reports whether the caller should yield the
// processor: once per cacheYieldEvery entries found in the shard.
func (c *refusalCache) lookup(key string, now int64, advance bool) (cacheEntry, bool, bool) {
	s := c.shard(key)
	s.mu.Lock()
	e, ok := s.m[key]
	if ok && (now >= e.until || e.at >= e.fitAt) {
		delete(s.m, key)
		ok = false
	}
	if ok && advance && now > e.at {
		e.at = now
		s.m[key] = e
	}
	yield := false
	if ok {
		s.hits++
		yield = s.hits%cacheYieldEvery == 0
	}
	s.mu.Unlock()
	return e, ok, yield
}

// put remembers a refusal.
func (c *refusalCache) put(key string, e cacheEntry) {
	s := c.shard(key)
	s.mu.Lock()
	defer s.mu.Unlock()
	old, ok := s.m[key]
	e.at = max(e.at, old.at)
	if e.at >= e.fitAt {
		// A report already dates the key at or after the instant the
		// refused cost fits: this refusal has nothing left to cache. An
		// entry already there stays, dated with the report.
		s.date(key, e.at)
		return
	}
	if !ok && len(s.m) >= c.per {
		for k := range s.m {
			delete(s.m, k)
			break
		}
	}
	s.m[key] = e
}

// seen records that Redis decided key at instant at (an allow of a
// smaller cost while a refusal is cached), so that later cached refusals
// are not dated earlier.
func (c *refusalCache) seen(key string, at int64) {
	s := c.shard(key)
	s.mu.Lock()
	s.date(key, at)
	s.mu.Unlock()
}

// date raises the date of key's entry, if it has one, to at. The caller
// holds s.mu.
func (s *cacheShard) date(key string, at int64) {
	if e, ok := s.m[key]; ok && at > e.at {
		e.at = at
		s.m[key] = e
	}
}

// len returns the number of cached keys.
func (c *refusalCache) len() int {
	n := 0
	for i := range c.shards {
		s := &c.shards[i]
		s.mu.Lock()
		n += len(s.m)
		s.mu.Unlock()
	}
	return n
}

// drop forgets key's cached refusal.
func (c *refusalCache) drop(key string) {
	s := c.shard(key)
	s.mu.Lock()
	delete(s.m, key)
	s.mu.Unlock()
}
