package shard

// Idle keys.
//
// A key whose newest entry is ≤ now − W has an empty live log, so dropping
// its state cannot change any later decision: a fresh key decides the same.
// (For the counter: a key whose previous and current counts are both zero
// as of now.) SweepShard drops exactly those keys, one shard at a time, so
// that the engine's background sweeper spreads the work out.
//
// Dropping a key is a write under the block's busy bit: no decision can be
// appending to it meanwhile. The block is marked dead, so a decision that
// still holds it goes back to the map and finds either nothing (it creates
// a fresh block) or the fresh block another decision created.
//
// A fresh block starts its watermark at the shard's horizon, the latest
// instant a sweep dropped a key at. A decision that read its clock before
// the sweep and reaches the map after it is therefore decided at the
// sweep's instant, not at its own older one: without this, a re-created key
// could hand out an At older than one it handed out before it was dropped.
// The sweep also skips keys whose watermark is ahead of its own instant.

// SweepShard drops the idle keys of shard i as of instant now and returns
// how many it dropped. It is safe to call concurrently with decisions and
// with other sweeps.
func (s *Store) SweepShard(i int, now int64) int {
	sh := &s.shards[i]
	dropped := 0
	sh.m.Range(func(key string, b *block) bool {
		v := b.ctl.Load()
		if v&(ctlBusy|ctlDead) != 0 || b.wm.Load() > now || !s.idle(b, b.words(len(key)), now) {
			return true
		}
		if !b.ctl.CompareAndSwap(v, v|ctlBusy) {
			return true // a writer got there first: the key is not idle
		}
		// The ring is as we read it; only the watermark may have moved.
		if b.wm.Load() > now {
			b.ctl.Store(v)
			return true
		}
		raise(&sh.horizon, now)
		// b is the key's current block: only the holder of its busy bit
		// replaces or removes it, and that is us.
		sh.m.Delete(key)
		sh.bytes.Add(-s.blockBytes(b, len(key)))
		sh.swept.Add(1)
		b.ctl.Store(v + ctlVersion | ctlDead)
		dropped++
		return true
	})
	return dropped
}

// Sweep drops the idle keys of every shard as of now.
func (s *Store) Sweep(now int64) int {
	total := 0
	for i := range s.shards {
		total += s.SweepShard(i, now)
	}
	return total
}

// idle reports whether b's state is equivalent to a fresh key's at now.
// Unsynchronised read: the caller validates under the busy bit or accepts
// a stale answer.
func (s *Store) idle(b *block, d data, now int64) bool {
	if s.alg == Counter {
		prev, cur := counterState(b, d, now/s.window)
		return prev == 0 && cur == 0
	}
	capacity, head, count := unpackMeta(b.meta.Load())
	return count == 0 || at(d, capacity, head, count-1) <= now-s.window
}

// Stats is a snapshot of a store's size.
type Stats struct {
	Keys           int   // keys with state
	StoredInstants int64 // log: instants held in rings (some may have expired since); counter: 0
	Bytes          int64 // approximate heap bytes: blocks (with the keys' bytes), map entries, map buckets
	Swept          int64 // keys dropped by sweeps since the store was made
}

// Approximate per-key costs of an xsync MapOf[string, *block] entry: the
// immutable entry (string header + pointer, 24 B) and a share of a 64-byte,
// 5-entry bucket at the map's 0.75 load factor.
const (
	entryBytes       = 24
	bucketShareBytes = 64 * 4 / (5 * 3) // 64 B / (5 × 0.75) ≈ 17
)

// Stats walks every shard: it costs O(keys) and is meant for metrics
// scrapes and reports, not for the request path. Concurrent decisions may
// or may not be reflected.
func (s *Store) Stats() Stats {
	var st Stats
	for i := range s.shards {
		sh := &s.shards[i]
		st.Bytes += sh.bytes.Load()
		st.Swept += sh.swept.Load()
		sh.m.Range(func(key string, b *block) bool {
			st.Keys++
			st.Bytes += entryBytes + bucketShareBytes
			if s.alg == Log {
				_, _, count := unpackMeta(b.meta.Load())
				st.StoredInstants += int64(count)
			}
			return true
		})
	}
	return st
}
