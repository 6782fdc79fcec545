package shard

import "fmt"

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
// Before it deletes a key, a sweep raises the shard's horizon to the key's
// free instant f: the instant from which its state is empty (for the log,
// its newest entry + W; for the counter, the start of the second window
// after its stored one), and f ≤ the sweep's instant. Every decision the
// key ever made has At < f: a refusal because the state was not empty at
// its instant, an accept because the state holds it until f.
// A fresh block reads the horizon after it is published in the map (see
// Store.decideNew), so the key's next incarnation decides at instants ≥ f,
// where the old state and the fresh one are the same: the key decides as
// if it had never been dropped. docs/design.md ("Sweeps and re-created
// keys") gives the whole argument.
//
// The horizon is per shard, so it also holds back other keys of the shard:
// a key created after the drop decides no earlier than f. With the
// monotonic clock that is never visible (f is at most the sweep's reading,
// which a later clock read has passed). With caller-given instants
// (AllowNAt, a manual clock set back) it is: a new key's decision at t < f
// is made at f instead. The sweep also skips keys whose watermark is ahead
// of its own instant.

// SweepShard drops the idle keys of shard i as of instant now and returns
// how many it dropped. It is safe to call concurrently with decisions and
// with other sweeps. It returns an error wrapping ErrInvalid when i is not
// in 0..Shards()-1.
func (s *Store) SweepShard(i int, now int64) (int, error) {
	if uint(i) >= uint(len(s.shards)) {
		return 0, fmt.Errorf("%w: shard %d is outside 0..%d", ErrInvalid, i, len(s.shards)-1)
	}
	sh := &s.shards[i]
	dropped := 0
	sh.rangeKeys(func(k mkey, b *block) bool {
		d := b.words(k.kw())
		v := b.ctl.Load()
		p := s.pol.Load()
		if v&(ctlBusy|ctlDead) != 0 || wmTime(b.wm.Load()) > now || !s.idle(p, b, d, now) {
			return true
		}
		if !b.ctl.CompareAndSwap(v, v|ctlBusy) {
			return true // a writer got there first: the key is not idle
		}
		// The ring is as we read it; only the watermark and the policy
		// may have moved (a longer window may have made it live again).
		p2 := s.pol.Load()
		if wmTime(b.wm.Load()) > now || p2 != p && !s.idle(p2, b, d, now) {
			b.ctl.Store(v)
			return true
		}
		raise(&sh.horizon, s.freeAt(p2, b, d))
		if v&ctlReserved != 0 {
			s.resv.Delete(k) // before the map forgets k (reserve.go)
		}
		// b is the key's current block: only the holder of its busy bit
		// replaces or removes it, and that is us.
		s.remove(sh, k, b)
		sh.swept.Add(1)
		b.ctl.Store(v + ctlVersion | ctlDead)
		dropped++
		return true
	})
	return dropped, nil
}

// Sweep drops the idle keys of every shard as of now.
func (s *Store) Sweep(now int64) int {
	total := 0
	for i := range s.shards {
		n, _ := s.SweepShard(i, now) // i is in range
		total += n
	}
	return total
}

// idle reports whether b's state is equivalent to a fresh key's at now.
// Unsynchronised read: the caller validates under the busy bit or accepts
// a stale answer.
func (s *Store) idle(p *policy, b *block, d data, now int64) bool {
	if s.alg == Counter {
		prev, cur := counterState(b, d, now/p.window)
		return prev == 0 && cur == 0
	}
	rg := s.ringOf(b, d, b.wm.Load())
	return rg.count == 0 || rg.at(rg.count-1) <= now-p.window
}

// freeAt returns the instant from which b's state is empty, or b's
// watermark if that is later (a group request refused by another limit
// raises it on an empty state): every decision on b so far was made at an
// instant no later than it. Precondition: the caller holds b's busy bit.
func (s *Store) freeAt(p *policy, b *block, d data) int64 {
	w := b.wm.Load()
	wm := wmTime(w)
	if s.alg == Counter {
		return max(wm, (int64(b.meta.Load())+2)*p.window)
	}
	rg := s.ringOf(b, d, w)
	if rg.count == 0 {
		return wm
	}
	return max(wm, rg.at(rg.count-1)+p.window)
}

// Stats is a snapshot of a store's size.
type Stats struct {
	Keys           int   // keys with state
	StoredInstants int64 // log: instants held in rings (some may have expired since); counter: 0
	Bytes          int64 // approximate heap bytes: blocks (with the keys' bytes), map entries, map buckets
	Swept          int64 // keys dropped by sweeps since the store was made
	Overflows      int64 // requests for new keys decided without state because the store was full
}

// Approximate per-key costs of an xsync MapOf entry, for the keys the
// index does not hold (HashedKeys, long keys): the immutable entry (a
// 16-byte digest and a pointer, 24 B, or a uint64 and a pointer) and a
// share of a 64-byte, 5-entry bucket at the map's 0.75 load factor. The
// index's keys cost their block and the shard's table of buckets, counted
// whole.
const (
	entryBytes       = 24
	bucketShareBytes = 64 * 4 / (5 * 3) // 64 B / (5 × 0.75) ≈ 17
	// hashedEntryBytes: with HashedKeys the entry is a uint64 and a pointer.
	hashedEntryBytes = 16
)

// Stats adds up the shards' counters: it costs O(shards), whatever the
// number of keys. Concurrent decisions may or may not be reflected.
func (s *Store) Stats() Stats {
	var st Stats
	for i := range s.shards {
		sh := &s.shards[i]
		st.Keys += int(sh.keys.Load())
		st.Bytes += sh.bytes.Load()
		st.Swept += sh.swept.Load()
		st.Overflows += sh.overflows.Load()
		if s.alg == Log {
			st.StoredInstants += sh.instants.Load()
		}
	}
	if s.hashed {
		st.Bytes += int64(st.Keys) * (hashedEntryBytes + bucketShareBytes)
		return st
	}
	var linked int64
	for i := range s.shards {
		ix := &s.shards[i].ix
		linked += ix.n.Load()
		st.Bytes += ix.headBytes()
	}
	st.Bytes += max(int64(st.Keys)-linked, 0) * (entryBytes + bucketShareBytes)
	return st
}
