package shard

// Operations on one key for operators: read its state, drop it. They are
// rare (a support request), so they keep to the simple side of the
// protocol: Peek is a reader, Drop a writer that waits for the key's bit.

// Peek writes to *r the state of key at max(now, its watermark), as a
// request that changes nothing would see it: Allowed reports whether a
// request of cost 1 would fit, Remaining and Reset describe the state as it
// is. It returns the instant of the oldest live entry (log; 0 for the
// counter or an empty log) and false, leaving *r zero, when the key holds
// no state. It writes nothing. It returns an error wrapping ErrInvalid for
// now < 0 or a nil r.
func (s *Store) Peek(key string, now int64, r *Result) (oldest int64, ok bool, err error) {
	if now < 0 || r == nil {
		return 0, false, argError(now, r)
	}
	p := s.pol.Load().of(key)
	k, sh := s.keyOf(key)
	spins := 0
	for {
		b, v, ok := sh.ready(k, &spins)
		if !ok {
			*r = Result{}
			return 0, false, nil
		}
		w := b.wm.Load()
		t := max(now, wmTime(w))
		d := b.words(k.kw())
		j := s.decide(req{p: p, r: r, n: 1, t: t}, b, d, w)
		if r.Allowed {
			s.unlogged(p, &held{sh: sh, b: b, k: k}, 1, t, r)
		}
		oldest = 0
		if s.alg == Log {
			if rg := s.ringOf(b, d, w); j < rg.count {
				oldest = rg.at(j)
			}
		}
		if b.ctl.Load() != v {
			continue // a writer ran: what we read may be torn
		}
		return oldest, true, nil
	}
}

// Drop removes key's state, as if it had never made a request, and
// reports whether it had any. Its next decision is made no earlier than
// now (the caller's current instant) or its latest decision instant, so
// that its instants never go back; that is also a lower bound for keys
// created afterwards in its shard (see sweep.go). It returns an error
// wrapping ErrInvalid for now < 0.
func (s *Store) Drop(key string, now int64) (bool, error) {
	if now < 0 {
		return false, errInstant
	}
	k, sh := s.keyOf(key)
	spins := 0
	for {
		b, v, ok := sh.ready(k, &spins)
		if !ok {
			return false, nil
		}
		if !b.ctl.CompareAndSwap(v, v|ctlBusy) {
			backoff(&spins)
			continue
		}
		raise(&sh.horizon, max(now, wmTime(b.wm.Load())))
		if v&ctlReserved != 0 {
			s.resv.Delete(k)
		}
		s.remove(sh, k, b)
		b.ctl.Store(v + ctlVersion | ctlDead)
		return true, nil
	}
}

// remove deletes b, k's current block, from the map and the counters.
// Precondition: the caller holds b's busy bit and has raised the horizon.
func (s *Store) remove(sh *shard, k mkey, b *block) {
	sh.delete(k)
	if s.maxKeys > 0 {
		s.total.Add(-1)
	}
	sh.keys.Add(-1)
	sh.bytes.Add(-s.blockBytes(b, k.kw()))
	if s.alg == Log {
		_, _, count := unpackMeta(b.meta.Load())
		sh.instants.Add(-int64(count + wmExtra(b.wm.Load())))
	}
}
