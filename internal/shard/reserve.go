package shard

import (
	"fmt"
	"slices"
	"strings"
)

// Reservations: log entries at instants that may lie in the future.
//
// A reservation of cost n made at instant t appends n entries of
// R = max(t, the newest entry, e + W), where e is the entry whose expiry
// makes room for n among the ring's entries (the (c+n−L)-th oldest of c):
// the earliest instant ≥ every entry at which the request fits. Entries
// stay sorted, so waiters of a key are served in the order they reserved,
// and the usual argument bounds every window: each entry was appended at
// an instant no earlier than any entry already there, after checking the
// window that ends at it, and removing entries never adds to a window.
//
// While a key's newest entry lies after its latest decision instant (a
// reservation whose time has not come), its block is reserved: ctl has
// ctlReserved set, wm holds the newest entry (so that every reader decodes
// every narrow slot, and readers that know nothing of reservations, such
// as Peek and sweeps, decide no earlier than it), and the latest decision
// instant is kept beside the store, in Store.resv. Every decision on a
// reserved block (Decide, DecideGroup, DecideGroupCosts, Reserve, Cancel)
// takes the block's busy bit and runs decideHeld, so reserved keys are
// serialized and the lock-free paths of other keys are untouched: Decide
// tests ctlReserved together with ctlBusy, in the same instruction.
//
// On a reserved block, a request decided without reserving (Decide) at an
// instant t before the newest entry is refused, RetryAfter saying when it
// would fit: admitting it would log t before a later entry, and a request
// of the caller that goes now while its entry claims a later instant
// could put more than L sends in a window. So a key with waiters admits
// no request ahead of them.
//
// A reservation keeps every entry live at its decision instant t, not only
// the last L: cancelling it must leave the log as it would have been, and
// the entries older than the last L still count for decisions made before
// the reservation's instant. The ring can then hold more than L entries
// (at most L live ones, plus the reserved ones), up to L + MaxQueued.
//
// Cancel removes a reservation's entries while its instant is after the
// cancel's decision instant; the later reservations keep their instants
// (they only had less room when they were placed), and removing entries
// never adds to a window. Cancelling the newest reservation is a pop: the
// next one may take its place. Cancelling one at R in the middle gives
// its room back to the windows that held it, those ending before R + W:
// the next reservation still goes at or after the newest entry, so it uses
// that room only when it fits before R + W, and a new waiter never goes
// ahead of an earlier one. When no entry is left after the decision
// instant the block is an ordinary one again.

const (
	// MaxReserveAhead bounds how far after its decision instant a
	// reservation may be placed (2^47 ns, about 39 hours): with narrow
	// slots every entry must lie less than 2^48 ns before the watermark,
	// and it keeps instant arithmetic far from overflow.
	MaxReserveAhead = 1<<47 - 1
	// MaxQueued bounds the entries a key may hold beyond its limit while
	// reservations are outstanding: 65,536 waiters of cost 1 cost about
	// 384 KiB for that key, and a waiter that would need more is refused.
	MaxQueued = 1 << 16

	// maxRing is the largest ring meta can describe.
	maxRing = metaMask
)

const (
	modeAllow = iota
	modeReserve
	modeCancel
)

var errNotLog = fmt.Errorf("%w: reservations need the sliding window log", ErrInvalid)

// ReserveStatus says how a reservation attempt ended.
type ReserveStatus int

const (
	// Reserved: the entries are logged at the returned instant.
	Reserved ReserveStatus = iota
	// TooLate: the earliest instant at which the request fits is after
	// the caller's maxAt (or more than MaxReserveAhead ahead); nothing was
	// reserved.
	TooLate
	// QueueFull: a key would hold more than its limit plus MaxQueued
	// entries; nothing was reserved.
	QueueFull
	// Overflow: a key is new and its store is full (Config.MaxKeys), and
	// the store refuses overflow; nothing was reserved.
	Overflow
)

// Reserve reserves cost n (1..Limit) for key at the earliest instant at
// which it fits that is no earlier than now (≥ 0) and the key's latest
// decision instant, if that instant is ≤ maxAt. clock, when not nil, is a
// monotonic clock read once the key's bit is held, and the decision is
// made no earlier than its reading: pass it when now came from it. It returns the instant
// and Reserved, or the instant the request would have had and why nothing
// was reserved. *r gets the decision: At its instant, Allowed whether
// entries were logged, RetryAfter the reserved instant minus At, and
// Remaining and Reset as they are at At. Only the sliding window log
// reserves; other stores return an error wrapping ErrInvalid, as do bad
// arguments.
func (s *Store) Reserve(key string, n int, now, maxAt int64, clock func() int64, r *Result) (int64, ReserveStatus, error) {
	if r == nil {
		return 0, TooLate, errResult
	}
	rs := [1]Result{}
	at, st, err := ReserveGroup(Claim{[]*Store{s}, []string{key}, []int{n}}, now, maxAt, clock, rs[:])
	*r = rs[0]
	return at, st, err
}

// Claim is a group request's cost on each of its stores: Ns[i] on Keys[i]
// of Stores[i], in the group's order (as for DecideGroupCosts).
type Claim struct {
	Stores []*Store
	Keys   []string
	Ns     []int
}

// ReserveGroup reserves c, all or nothing, at the earliest instant at
// which every limit fits (the latest of each limit's own earliest
// instant), under the conditions and with the results of Reserve.
func ReserveGroup(c Claim, now, maxAt int64, clock func() int64, rs []Result) (int64, ReserveStatus, error) {
	if err := checkReserve(c.Stores, c.Keys, c.Ns, now, rs, false); err != nil {
		return 0, TooLate, err
	}
	hs := acquireAll(c.Stores, c.Keys, c.Ns)
	return decideHeld(c, hs, heldOp{mode: modeReserve, now: now, maxAt: maxAt, clock: clock}, rs)
}

// Cancel gives back a reservation of cost n for key at instant at, made by
// Reserve, if at is still after the key's latest decision instant and
// now; it reports whether it did, whatever the limit in force (a SetPolicy
// since may have lowered it below n). The later reservations keep their
// instants. It returns an error wrapping ErrInvalid for bad arguments.
func (s *Store) Cancel(key string, n int, at, now int64, clock func() int64) (bool, error) {
	rs := [1]Result{}
	return CancelGroup(Claim{[]*Store{s}, []string{key}, []int{n}}, at, now, clock, rs[:])
}

// CancelGroup is Cancel for a reservation made by ReserveGroup: all of its
// entries are given back, or none (when its instant has come).
func CancelGroup(c Claim, at, now int64, clock func() int64, rs []Result) (bool, error) {
	if err := checkReserve(c.Stores, c.Keys, c.Ns, now, rs, true); err != nil {
		return false, err
	}
	hs := acquireAll(c.Stores, c.Keys, slices.Repeat([]int{1}, len(c.Ns)))
	_, st, _ := decideHeld(c, hs, heldOp{mode: modeCancel, now: now, at: at, clock: clock}, rs)
	return st == Reserved, nil
}

// checkReserve checks the arguments of a reservation, or of a cancel,
// whose cost need not fit the limit in force (a SetPolicy since may have
// lowered it).
func checkReserve(stores []*Store, keys []string, ns []int, now int64, rs []Result, cancel bool) error {
	if len(ns) != len(stores) {
		return fmt.Errorf("%w: %d costs for %d stores", ErrInvalid, len(ns), len(stores))
	}
	for i, s := range stores {
		if s == nil {
			continue // checkGroup names it
		}
		if s.alg != Log {
			return errNotLog
		}
		limit := s.pol.Load().limit
		if i < len(keys) { // checkGroup checks the count
			limit = s.pol.Load().of(keys[i]).limit
		}
		if cancel {
			limit = maxRing
		}
		if uint(ns[i]-1) >= uint(limit) {
			return errCost
		}
	}
	return checkGroup(stores, keys, 1, now, rs)
}

// acquireAll takes the busy bit of every key's block in the group order.
func acquireAll(stores []*Store, keys []string, ns []int) []held {
	hs := make([]held, 0, len(stores))
	for i, s := range stores {
		hs = append(hs, s.acquire(keys[i], ns[i]))
	}
	return hs
}

// decideReserved is Decide for a key whose block was reserved when Decide
// looked: it takes the block's bit and decides in decideHeld.
func (s *Store) decideReserved(key string, n int, now int64, r *Result) error {
	hs := [1]held{s.acquire(key, n)}
	ns := [1]int{n}
	rs := [1]Result{}
	ks := [1]string{key}
	_, _, err := decideHeld(Claim{[]*Store{s}, ks[:], ns[:]}, hs[:], heldOp{mode: modeAllow, now: now}, rs[:])
	*r = rs[0]
	return err
}

// release clears the busy bits of hs, which changed nothing.
func release(hs []held) {
	for _, h := range hs {
		if !h.over {
			h.b.ctl.Store(h.v + ctlVersion)
		}
	}
}

// anyReserved reports whether a held block of hs is reserved.
func anyReserved(hs []held) bool {
	for _, h := range hs {
		if !h.over && h.v&ctlReserved != 0 {
			return true
		}
	}
	return false
}

// resvState is what Store.resv holds for a reserved key: its latest
// decision instant.
type resvState struct {
	last int64
}

// state returns h's reservation state; an ordinary block's latest
// decision instant is its watermark. Precondition: the caller holds the
// block's busy bit.
func (s *Store) state(h *held) resvState {
	if h.v&ctlReserved == 0 {
		return resvState{last: h.b.wm.Load()}
	}
	if v, ok := s.resv.Load(h.k); ok {
		return v.(resvState)
	}
	return resvState{} // unreachable: a reserved block always has its state
}

// entriesAfter returns the entries of h's ring that are > cutoff, oldest
// first. Precondition: the caller holds the busy bit.
func (s *Store) entriesAfter(h *held, cutoff int64) []int64 {
	rg := s.ringOf(h.b, h.b.words(h.k.kw()), h.b.wm.Load())
	es := make([]int64, 0, rg.count+1)
	for i := range rg.count {
		if e := rg.at(i); e > cutoff {
			es = append(es, e)
		}
	}
	return es
}

// fitAt returns the earliest instant ≥ the newest of es (sorted) at which
// n more entries fit a limit of limit per window w, or 0 for an empty es.
func fitAt(es []int64, n, limit int, w int64) int64 {
	var f int64
	if len(es) > 0 {
		f = es[len(es)-1]
	}
	if k := len(es) + n - limit; k > 0 {
		f = max(f, es[k-1]+w)
	}
	return f
}

// heldOp is what decideHeld does: a request (modeAllow), a reservation
// no later than maxAt (modeReserve) or the cancellation of the
// reservation at instant at (modeCancel), at now, or with clock no
// earlier than its reading once every bit is held.
type heldOp struct {
	mode      int
	now       int64
	maxAt, at int64
	clock     func() int64
}

// decideHeld decides op for c on blocks whose busy bits the caller holds
// (hs, in the group order), writes each store's decision to rs, and
// releases the bits. It returns the reservation's instant and its status;
// modeAllow and modeCancel report Reserved when the request was admitted
// or the reservation given back. Counter stores are decided only in
// modeAllow.
func decideHeld(c Claim, hs []held, op heldOp, rs []Result) (int64, ReserveStatus, error) {
	stores, keys, ns := c.Stores, c.Keys, c.Ns
	now, maxAt, at, mode, clock := op.now, op.maxAt, op.at, op.mode, op.clock
	if clock != nil {
		// Read with every bit held: a refusal of cost 1 that did not
		// raise a watermark (Store.Decide) read its monotonic clock
		// before the bit was taken, so this decision is dated no earlier.
		now = max(now, clock())
	}
	cost := ns
	if mode == modeCancel {
		// A cancel needs no room: it is decided as a cost of 1, so that a
		// limit lowered below the reservation's cost since cannot keep it.
		cost = slices.Repeat([]int{1}, len(ns))
	}
	t := now
	sts := make([]resvState, len(hs))
	for i, s := range stores {
		h := &hs[i]
		// The policy as it is now that every bit is held (see SetPolicy).
		if h.p = s.pol.Load().of(keys[i]); uint(cost[i]-1) >= uint(h.p.limit) {
			release(hs)
			return 0, TooLate, errCost
		}
		t = max(t, h.p.from)
		if h.over {
			t = max(t, h.sh.horizon.Load())
		} else {
			sts[i] = s.state(h)
			t = max(t, sts[i].last)
		}
	}
	es := make([][]int64, len(hs))
	fits := make([]bool, len(hs))
	status := Reserved
	at0 := t
	for i, s := range stores {
		h := &hs[i]
		switch {
		case h.over:
			fits[i] = s.admitOverflow
			if !fits[i] && mode == modeReserve {
				status = Overflow
			}
		case s.alg == Counter:
			s.counterDecide(h.p, h.b, h.b.words(h.k.kw()), cost[i], t, &rs[i])
			fits[i] = rs[i].Allowed
		default:
			es[i] = s.entriesAfter(h, t-h.p.window)
			f := fitAt(es[i], cost[i], h.p.limit, h.p.window)
			fits[i] = f <= t
			at0 = max(at0, f)
			if mode == modeReserve && (len(es[i])+cost[i] > h.p.limit+MaxQueued || len(es[i])+cost[i] > maxRing) {
				status = QueueFull
			}
		}
	}
	ok := true
	switch mode {
	case modeAllow:
		for _, f := range fits {
			ok = ok && f
		}
		at0 = t
	case modeReserve:
		if status == Reserved && (at0 > maxAt || at0-t > MaxReserveAhead) {
			status = TooLate
		}
		ok = status == Reserved
	case modeCancel:
		ok = at > t
		at0 = at
	}
	for i, s := range stores {
		h := &hs[i]
		r := &rs[i]
		if h.over {
			s.overflow(h.p, h.sh, cost[i], t, r)
			r.Allowed = ok && (mode != modeCancel)
			continue
		}
		if s.alg == Counter {
			if ok {
				s.counterAppend(h.p, h.b, h.b.words(h.k.kw()), cost[i], t)
			} else if rs[i].Allowed {
				s.unlogged(h.p, h, cost[i], t, r)
				r.Allowed = false
			}
			raise(&h.b.wm, t)
			h.b.ctl.Store(h.v + ctlVersion)
			continue
		}
		e := es[i]
		st := &sts[i]
		st.last = t
		s.logResult(h.p, e, cost[i], t, r)
		if ok {
			switch mode {
			case modeAllow:
				e = appendN(e, at0, cost[i])
				r.Remaining -= cost[i]
				if len(e) == cost[i] {
					r.Reset = h.p.window
				}
			case modeReserve:
				e = appendN(e, at0, cost[i]) // at0 is no earlier than every entry (fitAt)
				r.Remaining = max(0, r.Remaining-cost[i])
				r.RetryAfter = at0 - t
			case modeCancel:
				e = removeN(e, at0, ns[i])
			}
		} else if mode == modeReserve {
			r.RetryAfter = at0 - t
		}
		r.Allowed = ok && mode != modeCancel
		s.writeBack(h, e, *st)
	}
	if !ok && status == Reserved {
		status = TooLate
	}
	return at0, status, nil
}

// logResult fills r with the decision fields of a request of cost n at t
// that is not logged, over es (the entries > t − W): Remaining counts the
// entries after t as used, RetryAfter is when the request fits.
func (s *Store) logResult(p *policy, es []int64, n int, t int64, r *Result) {
	*r = Result{Limit: p.limit, At: t, Remaining: max(0, p.limit-len(es))}
	if len(es) > 0 {
		r.Reset = es[0] + p.window - t
	}
	if f := fitAt(es, n, p.limit, p.window); f > t {
		r.RetryAfter = f - t
	} else {
		r.Allowed = true
	}
}

func appendN(es []int64, e int64, n int) []int64 {
	for range n {
		es = append(es, e)
	}
	return es
}

// removeN removes up to n entries equal to e from es (sorted).
func removeN(es []int64, e int64, n int) []int64 {
	out := es[:0]
	for i := len(es) - 1; i >= 0; i-- {
		if es[i] == e && n > 0 {
			n--
			es[i] = -1
		}
	}
	for _, x := range es {
		if x >= 0 {
			out = append(out, x)
		}
	}
	return out
}

// writeBack stores es (sorted, all > t − W) as h's ring after a decision
// at st.last, sets the block reserved iff an entry is after it, and
// releases the busy bit. Precondition: the caller holds it, taken from ctl
// value h.v.
func (s *Store) writeBack(h *held, es []int64, st resvState) {
	b := h.b
	t := st.last
	wasReserved := h.v&ctlReserved != 0
	reserved := len(es) > 0 && es[len(es)-1] > t
	var flag uint64
	wm := t
	if reserved {
		flag = ctlReserved
		wm = es[len(es)-1]
		if wasReserved {
			s.resv.Store(h.k, st) // h.k is the key the side table already holds
		} else {
			k := h.k
			k.s = strings.Clone(k.s) // h.k.s shares the block's bytes
			s.resv.Store(k, st)
		}
	} else if wasReserved {
		s.resv.Delete(h.k)
	}
	// A refusal that validated before the bit was taken may still raise
	// wm (block.go); it then fails its version check and retries.
	if wasReserved {
		b.wm.Store(wm)
	} else {
		raise(&b.wm, wm)
	}
	d := b.words(h.k.kw())
	m := b.meta.Load()
	capacity, _, count := unpackMeta(m)
	sh := h.sh
	grow := len(es) > capacity
	// A limit lowered by SetPolicy can leave more live entries than it:
	// the ring keeps them all.
	shrink := !reserved && capacity > max(h.p.limit, len(es))
	if !grow && !shrink {
		for i, e := range es {
			m = slotSet(d, m, i, e, s.narrow)
		}
		b.meta.Store(repack(m, capacity, 0, len(es)))
		sh.instants.Add(int64(len(es) - count))
		b.ctl.Store(h.v&^ctlReserved | flag + ctlVersion)
		return
	}
	c, maxC := max(h.p.limit, len(es)), h.p.limit
	if grow {
		c, maxC = min(max(2*capacity, len(es)), maxRing), maxRing
	}
	kw := h.k.kw()
	nb, nc, ks := newLogBlock(c, maxC, h.k.s, s.narrow, nil, &s.stock)
	nr := ring{d: nb.words(kw), m: nb.meta.Load(), capacity: nc, narrow: s.narrow}
	for i, e := range es {
		nr.fill(i, e)
	}
	nb.meta.Store(repack(nr.m, nc, 0, len(es)))
	nb.wm.Store(b.wm.Load())
	nb.ctl.Store(nb.ctl.Load() | flag)
	nk := h.k
	nk.s = ks
	sh.store(nk, nb)
	sh.bytes.Add(s.blockBytes(nb, kw) - s.blockBytes(b, kw))
	sh.instants.Add(int64(len(es) - count))
	b.ctl.Store(h.v&^ctlReserved | flag + ctlVersion | ctlDead)
}
