package shard

import (
	"fmt"
	"unsafe"
)

// Internals exposed to the package's tests only.

var GrowCap = growCap

// NewBlockCap returns the capacity newBlock gives a ring after key's bytes
// (none for the empty key, as for hashed and long keys).
func NewBlockCap(capacity, maxCapacity int, key string) int {
	return newBlockCap(capacity, maxCapacity, key, false)
}

// NewNarrowLogBlockCap returns the capacity newLogBlock gives a ring of
// 6-byte slots (a small ring's slot 0 in meta included), and whether the
// ring is small; the key as for NewBlockCap.
func NewNarrowLogBlockCap(capacity, maxCapacity int, key string) (int, bool) {
	b, c, k := newLogBlock(capacity, maxCapacity, key, true, nil, nil)
	if k != key {
		panic("newLogBlock lost the key")
	}
	return c, b.meta.Load()&metaSmall != 0
}

func newBlockCap(capacity, maxCapacity int, key string, narrow bool) int {
	_, c, k := newBlock(capacity, maxCapacity, key, narrow, nil, nil)
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
// each block sits in a slot its key's probe reaches (no bucket between its
// home bucket and its own has an empty slot), under its key's tag, is not
// dead, no key has two blocks, deleted slots hold no block, the counts of
// keys and used slots match the table, the table is not past its load,
// and the keys' count (Stats.Keys, less the long keys) matches too. Call
// it while no decision and no sweep runs.
func (s *Store) CheckIndex() error {
	if s.hashed {
		return nil
	}
	linked := int64(0)
	for i := range s.shards {
		sh := &s.shards[i]
		ix := &sh.ix
		t := ix.tab.Load()
		seen := map[string]bool{}
		used := 0
		for j := range t.buckets {
			bk := &t.buckets[j]
			w := bk.tags.Load()
			if w>>56 != 0 {
				return fmt.Errorf("shard %d bucket %d: tag word %#x has its top byte set", i, j, w)
			}
			for sl := range bucketSlots {
				c, b := w>>(8*sl)&0xff, bk.slots[sl].Load()
				if c != tagEmpty {
					used++
				}
				if c&tagFull == 0 {
					if b != nil {
						return fmt.Errorf("shard %d bucket %d slot %d: tag %#x holds a block", i, j, sl, c)
					}
					continue
				}
				v := b.ctl.Load()
				key := b.linkedKey(v)
				h := ix.kh.hash(key)
				switch {
				case v&(ctlBusy|ctlDead) != 0:
					return fmt.Errorf("key %q: ctl %#x is busy or dead in the index", key, v)
				case seen[key]:
					return fmt.Errorf("key %q has two blocks", key)
				case c != tagOf(h):
					return fmt.Errorf("key %q: tag %#x, its hash's is %#x", key, c, tagOf(h))
				case &s.shards[s.kh.hash(key)&s.mask] != sh:
					return fmt.Errorf("key %q is in shard %d, its hash picks another", key, i)
				}
				for k := t.home(h); k != j; k = (k + 1) % len(t.buckets) {
					if hasEmpty(t.buckets[k].tags.Load()) {
						return fmt.Errorf("key %q is in bucket %d, past bucket %d (home %d), which has an empty slot", key, j, k, t.home(h))
					}
				}
				seen[key] = true
			}
		}
		switch {
		case int64(len(seen)) != ix.n.Load():
			return fmt.Errorf("shard %d: %d blocks in the table, count %d", i, len(seen), ix.n.Load())
		case used != t.used:
			return fmt.Errorf("shard %d: %d slots used, count %d", i, used, t.used)
		case used > maxUsed(len(t.buckets)):
			return fmt.Errorf("shard %d: %d slots of %d used", i, used, slotsOf(len(t.buckets)))
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

// Heads returns the slots of shard i's index.
func (s *Store) Heads(i int) int { return slotsOf(len(s.shards[i].ix.tab.Load().buckets)) }

// LockIndex locks shard i's index, as a decision creating, growing or
// dropping a key does, and returns its unlock.
func (s *Store) LockIndex(i int) (unlock func()) {
	ix := &s.shards[i].ix
	ix.mu.Lock()
	return ix.mu.Unlock
}

// LoadedPolicy is a store's policy as a decision loaded it.
type LoadedPolicy struct{ p *policy }

// PolicyOf returns the policy a decision on key loads now.
func (s *Store) PolicyOf(key string) LoadedPolicy { return LoadedPolicy{s.pol.Load().of(key)} }

// DecideNewUnder decides as Decide does when it loaded p and then found
// key without a block: it publishes a fresh block and decides the key's
// first request. It fails when the key has a block.
func (s *Store) DecideNewUnder(p LoadedPolicy, key string, n int, now int64, r *Result) error {
	k, sh := s.keyOf(key)
	nb, bk, created := s.create(p.p, sh, k, n)
	if !created {
		return fmt.Errorf("key %q has a block, or the store is full", key)
	}
	return s.decideNew(req{p: p.p, r: r, n: n}, sh, bk, nb, now, key)
}

// PairWords is the size in words of a block allocated in pairs.
const PairWords = pairWords

// Spare is a shard's spare half, for AllocWords.
type Spare = spare

// AllocWords returns allocWords' words: their address and capacity.
func AllocWords(n int, sp *Spare) (uintptr, int) {
	w := allocWords(n, sp, nil)
	return uintptr(unsafe.Pointer(&w[0])), cap(w)
}

// ShortWords is shortWords, for the test that checks it against the
// key's bytes.
func ShortWords(key string) (uint64, uint64) { return shortWords(key) }

// ShortKeyBytes is shortKeyBytes.
const ShortKeyBytes = shortKeyBytes

// BlockHoldsShort reports whether the linked block made for key matches
// other by the index's word comparison (holdsShort).
func BlockHoldsShort(key, other string) bool {
	b, _, _ := newBlock(1, 1, key, true, nil, nil)
	w0, w1 := shortWords(other)
	return b.holdsShort(len(other), w0, w1)
}

// RingCap returns the capacity of key's ring (a small ring's slot in meta
// included), or 0 when key has no block.
func (s *Store) RingCap(key string) int {
	k, sh := s.keyOf(key)
	b, ok := sh.load(k)
	if !ok {
		return 0
	}
	c, _, _ := unpackMeta(b.meta.Load())
	return c
}

// KeyStates describes every key's block left in s: its control flags
// and watermark, for a test's failure message.
func (s *Store) KeyStates() []string {
	var out []string
	for i := range s.shards {
		s.shards[i].rangeKeys(func(_ mkey, b *block) bool {
			v := b.ctl.Load()
			w := b.wm.Load()
			out = append(out, fmt.Sprintf("busy %t, dead %t, reserved %t, watermark %d (holds an entry %t)", v&ctlBusy != 0, v&ctlDead != 0, v&ctlReserved != 0, wmTime(w), w < 0))
			return true
		})
	}
	return out
}

// WMHoldsEntry reports whether key's watermark holds its ring's newest
// entry (block.go, "The entry in wm").
func (s *Store) WMHoldsEntry(key string) bool {
	k, sh := s.keyOf(key)
	b, ok := sh.load(k)
	return ok && b.wm.Load() < 0
}

// HeldInstants counts the entries of every log ring in s, wm's entries
// included, for comparison with Stats().StoredInstants once no decision
// runs.
func (s *Store) HeldInstants() int64 {
	var n int64
	for i := range s.shards {
		s.shards[i].rangeKeys(func(k mkey, b *block) bool {
			n += int64(s.ringOf(b, b.words(k.kw()), b.wm.Load()).count)
			return true
		})
	}
	return n
}

// StockTake takes a block of n words from s's stock (stock.go): nil when
// the stock has none, after counting the miss as allocWords does.
func (s *Store) StockTake(n int) []uint64 {
	if w := s.stock.take(n); w != nil {
		return w
	}
	s.stock.missed(n, append([]uint64(nil), make([]uint64, n)...))
	return nil
}

// StockTakeOr is allocWords' use of the stock with the allocation left
// out: it takes a block of n words from s's stock, or counts a miss as
// if w had been allocated instead.
func (s *Store) StockTakeOr(n int, w []uint64) []uint64 {
	if b := s.stock.take(n); b != nil {
		return b
	}
	s.stock.missed(n, w)
	return nil
}
