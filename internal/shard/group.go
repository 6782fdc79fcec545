package shard

import "fmt"

// Several limits per request, all or nothing.
//
// A group request of cost n counts keys[i] against stores[i]. It is allowed
// iff every store has room for n at one instant t; then each store's log
// gets n entries of t; otherwise no store changes (beyond the watermarks,
// which only record that t was used).
//
// # Protocol
//
// The request takes the write (busy) bit of each key's block in one global
// order: by store ID, then by key (the caller passes them sorted so). Every
// group request takes its bits in that order, whatever stores it spans,
// and single-key decisions and sweeps hold one bit at a time and never wait
// while holding it, so no cycle of waits, and no deadlock, can form. Holding every bit, it reads the watermarks, decides
// each store at t = max(now, every watermark), and then either appends to
// each (releasing each bit as it goes) or raises each watermark to t and
// releases. While the bits are held no writer can change any of the blocks,
// so the decisions see one consistent state, and the request linearizes
// while it holds them all.
//
// A key with no block gets a fresh one, published busy (as in Decide), so
// the request holds its bit from the start; its watermark is the shard's
// horizon read after the publication, as in decideNew. A refused request
// may leave such a block empty in the map; the sweeper drops it.
//
// Watermarks: a single-key refusal that started before this request took a
// bit may raise that block's watermark after the request read it; such a
// refusal fails its version check (the request bumps the version on
// release) and retries at its raised instant, so it returns nothing earlier
// than the request's own At. One that validated before the request took the
// bit raised the watermark before that, so the request reads it. That is
// why watermarks are read only after every bit is held.

// groupMax is how many limits a group request keeps its working state for
// on the stack; larger groups allocate it.
const groupMax = 8

// checkGroup checks DecideGroup's arguments.
func checkGroup(stores []*Store, keys []string, n int, now int64, rs []Result) error {
	if len(stores) == 0 || len(keys) != len(stores) || len(rs) != len(stores) {
		return fmt.Errorf("%w: a group needs as many keys and results as stores, at least one (%d stores, %d keys, %d results)",
			ErrInvalid, len(stores), len(keys), len(rs))
	}
	if now < 0 {
		return errInstant
	}
	for i, s := range stores {
		switch {
		case s == nil:
			return fmt.Errorf("%w: store %d is nil", ErrInvalid, i)
		case uint(n-1) >= uint(s.pol.Load().of(keys[i]).limit):
			return errCost
		case s.hashed && len(stores) > 1:
			return fmt.Errorf("%w: a store with HashedKeys cannot be grouped", ErrInvalid)
		case i > 0 && !less(stores[i-1], keys[i-1], s, keys[i]):
			return fmt.Errorf("%w: the pairs (store, key) must be distinct and sorted by (store ID, key)", ErrInvalid)
		case len(keys[i]) > LongKeyBytes && sharesDigest(stores, keys, i):
			// Both would name one block, whose bit the request would
			// wait for while holding it.
			return fmt.Errorf("%w: two keys of one store share a digest", ErrInvalid)
		}
	}
	return nil
}

// sharesDigest reports whether keys[i], a long key, has the digest of an
// earlier key of the same store in the group.
func sharesDigest(stores []*Store, keys []string, i int) bool {
	k, _ := stores[i].keyOf(keys[i])
	for j := range i {
		if stores[j] == stores[i] && len(keys[j]) > LongKeyBytes {
			if kj, _ := stores[j].keyOf(keys[j]); kj == k {
				return true
			}
		}
	}
	return false
}

// less orders the pairs of a group: by store ID, then key.
func less(s1 *Store, k1 string, s2 *Store, k2 string) bool {
	if s1.id != s2.id {
		return s1.id < s2.id
	}
	return k1 < k2
}

// held is one limit of a group request: the block whose busy bit it holds
// (taken from ctl value v), or over when the store was full and the key had
// no block.
type held struct {
	p    *policy // the store's policy, loaded once for the request
	sh   *shard
	k    mkey
	b    *block
	v    uint64
	j    int
	over bool
}

// DecideGroup decides a request of cost n that counts keys[i] against
// stores[i], all or nothing, at instant now (≥ 0), writing each store's
// decision to rs[i], and reports whether it was allowed. Every rs[i].At is
// the same instant. It checks its arguments first and returns an error
// wrapping ErrInvalid, changing nothing, unless len(keys) == len(stores) ==
// len(rs) ≥ 1, no store is nil, the pairs (stores[i], keys[i]) are
// distinct and sorted by (store ID, key), 1 ≤ n ≤ each key's limit in its store (SetOverrides),
// now ≥ 0, and a group of more than one names no store with HashedKeys.
//
// A group of one store decides exactly as Decide does. Larger groups always
// raise the watermarks of their keys, as Decide does for instants a caller
// supplies (monotonic is false).
//
// Stores with HashedKeys cannot be grouped: two keys whose hashes collide
// share one block, so sorting by key would no longer be one order of
// blocks, and a group naming both would wait for its own bit.
func DecideGroup(stores []*Store, keys []string, n int, now int64, monotonic bool, rs []Result) (bool, error) {
	if err := checkGroup(stores, keys, n, now, rs); err != nil {
		return false, err
	}
	if len(stores) == 1 {
		err := stores[0].Decide(keys[0], n, now, monotonic, &rs[0])
		return rs[0].Allowed, err
	}
	return decideGroup(stores, keys, n, nil, now, rs)
}

// decideGroup decides a checked group of two or more stores, each with
// cost ns[i], or n for all when ns is nil.
func decideGroup(stores []*Store, keys []string, n int, ns []int, now int64, rs []Result) (bool, error) {
	cost := func(i int) int {
		if ns != nil {
			return ns[i]
		}
		return n
	}
	var buf [groupMax]held
	hs := buf[:0]
	if len(stores) > groupMax {
		hs = make([]held, 0, len(stores))
	}
	t := now
	for i, s := range stores {
		h := s.acquire(keys[i], cost(i))
		if h.over {
			t = max(t, h.sh.horizon.Load())
		}
		hs = append(hs, h)
	}
	// The policies as they are now that every bit is held (an accept
	// under an older one could land after another's decision under a
	// newer one; see SetPolicy).
	for i, s := range stores {
		h := &hs[i]
		if h.p = s.pol.Load().of(keys[i]); uint(cost(i)-1) >= uint(h.p.limit) {
			for _, h := range hs {
				if !h.over {
					h.b.ctl.Store(h.v + ctlVersion)
				}
			}
			return false, errCost
		}
		t = max(t, h.p.from)
	}
	if anyReserved(hs) {
		var nbuf [groupMax]int
		cs := nbuf[:0]
		for i := range hs {
			cs = append(cs, cost(i))
		}
		_, st, err := decideHeld(Claim{stores, keys, cs}, hs, heldOp{mode: modeAllow, now: now}, rs)
		return st == Reserved, err
	}
	for _, h := range hs {
		if !h.over {
			t = max(t, h.b.wm.Load())
		}
	}
	allowed := true
	for i, s := range stores {
		h := &hs[i]
		if h.over {
			s.overflow(h.p, h.sh, cost(i), t, &rs[i])
		} else {
			h.j = s.decide(req{p: h.p, r: &rs[i], n: cost(i), t: t}, h.b, h.b.words(h.k.kw()), h.b.wm.Load())
		}
		allowed = allowed && rs[i].Allowed
	}
	for i, s := range stores {
		h := &hs[i]
		if !allowed && rs[i].Allowed {
			s.unlogged(h.p, h, cost(i), t, &rs[i])
		}
		if h.over {
			continue
		}
		d := h.b.words(h.k.kw())
		if !allowed {
			if s.alg == Log {
				// The entries that expired by t go before wm moves to t,
				// for narrow slots (block.go).
				s.logDropExpired(h.sh, h.b, d, h.j)
			}
			raise(&h.b.wm, t)
			h.b.ctl.Store(h.v + ctlVersion)
			continue
		}
		raise(&h.b.wm, t)
		if s.alg == Log {
			s.logAppend(req{p: h.p, r: &rs[i], n: cost(i), t: t}, h.sh, h.k, h.b, d, h.j)
		} else {
			s.counterAppend(h.p, h.b, d, cost(i), t)
			h.b.ctl.Store(h.v + ctlVersion)
		}
	}
	return allowed, nil
}

// acquire returns key's block with its busy bit held, creating the block if
// the key has none, or over set when the key has none and the store is
// full. It may wait for another writer of the key, which never waits while
// holding a bit, so the wait ends.
func (s *Store) acquire(key string, n int) held {
	p := s.pol.Load().of(key)
	k, sh := s.keyOf(key)
	spins := 0
	for {
		b, ok := sh.load(k)
		if !ok {
			nb, bk, created := s.create(p, sh, k, n)
			if created {
				// Read after the publication: see decideNew.
				nb.wm.Store(sh.horizon.Load())
				return held{p: p, sh: sh, k: bk, b: nb, v: nb.ctl.Load() &^ ctlBusy}
			}
			if nb == nil {
				return held{p: p, sh: sh, k: k, over: true}
			}
			b = nb
		}
		v, ready := b.ready(&spins)
		if !ready {
			continue
		}
		if b.ctl.CompareAndSwap(v, v|ctlBusy) {
			if b.wm.Load() < 0 {
				// wm holds the ring's newest entry: the callers
				// read and raise wm as a plain watermark, so move
				// the entry into the ring first (block.go, "The
				// entry in wm").
				s.unflag(sh, k, b, v, p.limit)
				continue
			}
			return held{p: p, sh: sh, k: k, b: b, v: v}
		}
	}
}

// unlogged turns r, a decision that allowed n at t, into the report of a
// request that had room but was not logged because another limit of its
// group refused: Remaining and Reset describe the state as it is.
// Precondition: the caller holds h's busy bit (or h.over).
func (s *Store) unlogged(p *policy, h *held, n int, t int64, r *Result) {
	r.Remaining += n
	if h.over {
		return
	}
	if s.alg == Log {
		if r.Remaining == p.limit { // nothing live
			r.Reset = 0
		}
		return
	}
	idx := t / p.window
	e := t - idx*p.window
	prev, cur := counterState(h.b, h.b.words(h.k.kw()), idx)
	r.Reset = counterReset(prev, cur, p.window, e)
}
