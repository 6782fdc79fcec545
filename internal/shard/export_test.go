package shard

import (
	"fmt"
	"hash/maphash"
)

// Internals exposed to the package's tests only.

var GrowCap = growCap

// NewBlockCap returns the capacity newBlock gives a ring: a linked block
// (index.go) for a key that is not empty, the index's layout for every
// key of up to LongKeyBytes; a block without key or link otherwise.
func NewBlockCap(capacity, maxCapacity int, key string) int {
	return newBlockCap(capacity, maxCapacity, key, false)
}

// NewNarrowLogBlockCap returns the capacity newLogBlock gives a ring of
// 6-byte slots (a small ring's slot 0 in meta included), and whether the
// ring is small; linked as for NewBlockCap.
func NewNarrowLogBlockCap(capacity, maxCapacity int, key string) (int, bool) {
	b, c, k := newLogBlock(capacity, maxCapacity, key, key != "", true)
	if k != key {
		panic("newLogBlock lost the key")
	}
	return c, b.meta.Load()&metaSmall != 0
}

func newBlockCap(capacity, maxCapacity int, key string, narrow bool) int {
	_, c, k := newBlock(capacity, maxCapacity, key, key != "", narrow)
	if k != key {
		panic("newBlock lost the key")
	}
	return c
}

func ShardSize() uintptr { return shardSize }

// SetHashMask makes a HashedKeys store keep only the bits of mask of every
// key's hash (and any store, of each half of a long key's digest), so that
// distinct keys collide as often as the test wants.
// Call it before the first decision.
func (s *Store) SetHashMask(mask uint64) { s.hashMask = mask }

// ClassOf names the state key decides on: keys with one class share a
// state (a HashedKeys hash, a long key's digest), others do not.
func (s *Store) ClassOf(key string) string {
	k, _ := s.keyOf(key)
	if k.linked {
		return "key:" + k.s
	}
	return fmt.Sprintf("digest:%x:%x", k.h, k.h2)
}

// HashOf returns the map key a HashedKeys store uses for key.
func (s *Store) HashOf(key string) uint64 {
	k, _ := s.keyOf(key)
	return k.h
}

// CheckReserved returns an error unless the side table of reserved keys
// (Store.resv) holds exactly the keys whose block has ctlReserved set.
// Call it while no decision runs.
func (s *Store) CheckReserved() error {
	inMap := map[mkey]bool{}
	for i := range s.shards {
		var err error
		s.shards[i].rangeKeys(func(k mkey, b *block) bool {
			v := b.ctl.Load()
			_, ok := s.resv.Load(k)
			inMap[k] = true
			switch {
			case v&(ctlBusy|ctlDead) != 0:
				err = fmt.Errorf("key %q: ctl %#x is busy or dead at rest", k.s, v)
			case (v&ctlReserved != 0) != ok:
				err = fmt.Errorf("key %q: reserved bit %v, side table entry %v", k.s, v&ctlReserved != 0, ok)
			}
			return err == nil
		})
		if err != nil {
			return err
		}
	}
	var err error
	s.resv.Range(func(k, _ any) bool {
		if !inMap[k.(mkey)] {
			err = fmt.Errorf("key %q: in the side table, not in the map", k.(mkey).s)
		}
		return err == nil
	})
	return err
}

// CheckIndex returns an error unless every shard's index is well formed:
// each linked block sits in the chain its key's hash picks, is not dead,
// no key has two blocks, the index's count matches its blocks, and the
// keys' count (Stats.Keys, less the long keys) matches too. Call it while
// no decision and no sweep runs.
func (s *Store) CheckIndex() error {
	if s.hashed {
		return nil
	}
	linked := int64(0)
	for i := range s.shards {
		sh := &s.shards[i]
		ix := &sh.ix
		t := ix.tab.Load()
		if ix.seq.Load()&1 != 0 {
			return fmt.Errorf("shard %d: a resize is still running", i)
		}
		seen := map[string]bool{}
		for c := range t.heads {
			for b := t.heads[c].Load(); b != nil; b = b.next().Load() {
				v := b.ctl.Load()
				key := b.linkedKey(v)
				switch {
				case v&(ctlBusy|ctlDead) != 0:
					return fmt.Errorf("key %q: ctl %#x is busy or dead in the index", key, v)
				case seen[key]:
					return fmt.Errorf("key %q has two blocks", key)
				case maphash.String(ix.seed, key)>>chainShift&t.mask != uint64(c):
					return fmt.Errorf("key %q is in chain %d, its hash picks %d", key, c, maphash.String(ix.seed, key)>>chainShift&t.mask)
				case &s.shards[maphash.String(s.seed, key)&s.mask] != sh:
					return fmt.Errorf("key %q is in shard %d, its hash picks another", key, i)
				}
				seen[key] = true
			}
		}
		if int64(len(seen)) != ix.n.Load() {
			return fmt.Errorf("shard %d: %d blocks linked, count %d", i, len(seen), ix.n.Load())
		}
		if len(t.heads) > minHeads && len(seen) > maxLoad*len(t.heads) {
			return fmt.Errorf("shard %d: %d keys on %d heads", i, len(seen), len(t.heads))
		}
		linked += int64(len(seen))
	}
	long := int64(0)
	for i := range s.shards {
		if lm := s.shards[i].longMap(false); lm != nil {
			long += int64(lm.Size())
		}
	}
	if st := s.Stats(); int64(st.Keys) != linked+long {
		return fmt.Errorf("Stats.Keys %d, the index holds %d and the long map %d", st.Keys, linked, long)
	}
	return nil
}

// Heads returns the chain heads of shard i's index.
func (s *Store) Heads(i int) int { return len(s.shards[i].ix.tab.Load().heads) }

// LockIndex locks shard i's index, as a decision creating, growing or
// dropping a key does, and returns its unlock.
func (s *Store) LockIndex(i int) (unlock func()) {
	ix := &s.shards[i].ix
	ix.mu.Lock()
	return ix.mu.Unlock
}
