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
// room). The entry's deadline is sent + r, where sent is the limiter
// clock's reading when the call was sent, which is no later than At: the
// cache can only release a key early (and then Redis decides), never late.
// It never holds an allow. It holds at most about size keys: a full shard
// drops an arbitrary entry (Go's map iteration order is random) to make
// room.
type refusalCache struct {
	shards [cacheShards]cacheShard
	per    int // entries per shard
}

const cacheShards = 16

type cacheShard struct {
	mu sync.Mutex
	m  map[string]cacheEntry
	_  [40]byte // keep neighbouring shard mutexes off one cache line
}

type cacheEntry struct {
	cost      int   // the refused cost
	until     int64 // limiter clock: refused until then (exclusive)
	sent      int64 // limiter clock when the refused call was sent
	at        int64 // Decision.At of the refusal
	remaining int
	resetAt   int64 // limiter clock: sent + Reset
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

// get returns the cached refusal of key for a request of cost n at now.
func (c *refusalCache) get(key string, n int, now int64) (cacheEntry, bool) {
	s := c.shard(key)
	s.mu.Lock()
	e, ok := s.m[key]
	if ok && now >= e.until {
		delete(s.m, key)
		ok = false
	}
	s.mu.Unlock()
	return e, ok && n >= e.cost
}

// put remembers a refusal.
func (c *refusalCache) put(key string, e cacheEntry) {
	s := c.shard(key)
	s.mu.Lock()
	if _, ok := s.m[key]; !ok && len(s.m) >= c.per {
		for k := range s.m {
			delete(s.m, k)
			break
		}
	}
	s.m[key] = e
	s.mu.Unlock()
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
