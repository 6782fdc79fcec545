package redisstore

import "testing"

// TestRefusalCacheDate: a cached refusal is served only while the instant
// it is dated with (the latest At Redis reported for the key) is before
// At + RetryAfter of the refusal, where the refused cost fits, however far
// the local deadline is. Redis truncates instants to the microsecond, so
// under Redis TIME a report from just before the local deadline can date
// the key at exactly that instant; serving the refusal then is an
// under-admission (seen in TestStressTopologyRefresh under load).
func TestRefusalCacheDate(t *testing.T) {
	const far = 1 << 62 // a local deadline that never passes here
	c := newRefusalCache(16)
	c.put("k", cacheEntry{cost: 2, until: far, at: 1000, fitAt: 6000})
	if _, ok := c.get("k", 0, false); !ok {
		t.Fatal("refusal at 1000, fits at 6000: not cached")
	}
	c.seen("k", 5999)
	if e, ok := c.get("k", 0, false); !ok || e.at != 5999 {
		t.Fatalf("dated 5999, fits at 6000: got %+v, %v; want a hit at 5999", e, ok)
	}
	c.seen("k", 6000)
	if e, ok := c.get("k", 0, false); ok {
		t.Fatalf("dated 6000, where the cost fits: served %+v", e)
	}
	if c.len() != 0 {
		t.Fatalf("%d entries left, want the spent one dropped", c.len())
	}

	// A refusal reported after a later instant of the same key is not
	// cached when that instant is already at or past where it fits, and
	// leaves the entry that is there alone.
	c.put("k", cacheEntry{cost: 3, until: far, at: 7000, fitAt: 9000})
	c.put("k", cacheEntry{cost: 1, until: far, at: 6500, fitAt: 7000})
	if e, ok := c.get("k", 0, false); !ok || e.cost != 3 || e.at != 7000 {
		t.Fatalf("got %+v, %v; want the cost-3 refusal dated 7000", e, ok)
	}
	// When that later instant is newer than the entry's date, the entry
	// takes it: a refusal served from the cache is never dated before an
	// instant Redis reported for the key.
	c.put("k", cacheEntry{cost: 1, until: far, at: 8000, fitAt: 8000})
	if e, ok := c.get("k", 0, false); !ok || e.cost != 3 || e.at != 8000 {
		t.Fatalf("got %+v, %v; want the cost-3 refusal dated 8000", e, ok)
	}
}
