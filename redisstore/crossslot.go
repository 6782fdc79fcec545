package redisstore

import (
	"context"
	"fmt"
	"strconv"

	"github.com/slidegate/slidegate/engine"
)

// A group request on Redis Cluster whose keys live in different slots
// cannot be one script call. It is decided across slots, exactly:
//
//  1. Each slot's keys are decided by one group script call, all or
//     nothing within the slot, at that slot's instant (keys placed by their
//     own client key, where Limiter.Decide keeps them).
//  2. If every slot admitted, the request is allowed. Otherwise each slot
//     that admitted gives its entries back (givebackScript removes the
//     request's entries at that slot's instant), and the request is
//     refused.
//
// Every admission was checked by a script that saw every entry in force,
// so no window ever holds more than L: a request's entries held between
// the two steps can only make another request be refused (an
// under-admission while they are held), never admitted. A give-back that
// fails (Redis down or slow between the two steps) leaves the entries in
// place: a refused request then counts against its limits until they
// expire, an under-admission, never an over-admission; such failures are
// counted in slidegate_redis_givebacks_total{result="failed"}.

// givebackScript removes the entries a request of cost n logged at instant
// at (µs) from one key. KEYS[1]: the key; KEYS[2], if given, its bucket.
// ARGV: now (µs, or −1 for TIME), algorithm (0 log, 1 counter), W (µs), S,
// TTL (ms), the client key if the key has a bucket (else ""), n, at.
// Returns how much was given back (0 when the entries have already left
// the window). A log is rewritten whole, as reserveScript's cancel does; a
// counter takes n off the count of the window that holds at.
var givebackScript = newScript(luaPrelude + luaRewrite + `
local now, treal = clock(ARGV[1] + 0)
local alg = ARGV[2]
local W = ARGV[3] + 0
local S = ARGV[4] + 0
local ttl = ARGV[5] + 0
local n = ARGV[7] + 0
local at = ARGV[8] + 0
local key = KEYS[1]
if alg == '1' then
  ctrLoad()
  local s = RC('GET', key)
  if not s then return {0} end
  local k = {idx = 0, prev = 0, cur = 0, water = 0, e = 0}
  k.idx, k.prev, k.cur, k.water = SU(CTR, s)
  local ai = fdiv(at, W)
  local g = 0
  if ai == k.idx then
    g = math.min(n, k.cur)
    k.cur = k.cur - g
  elseif ai == k.idx - 1 then
    g = math.min(n, k.prev)
    k.prev = k.prev - g
  end
  if g > 0 then RC('SETRANGE', key, '0', SP(CTR, k.idx, k.prev, k.cur, k.water)) end
  return {g}
end
local k = {s = false, S = S, fmt = '<I' .. ARGV[4], bkey = KEYS[2] or false, field = ARGV[6],
  ttl0 = ttl, exists = false, inbucket = false, compact = false,
  base = 0, water = 0, head = 0, count = 0, cap = 0, oldest = 0}
logLoad(k, key)
if not k.exists then return {0} end
if now < k.water then now = k.water end
if at <= now - W then return {0} end
if now > treal and treal >= 0 then ttl = ttl + math.ceil((now - treal) / 1000) end
local es = logLive(k, now, W)
local g = logDrop(es, at, n)
if g == 0 then return {0} end
logRewrite(k, key, es, now, ttl)
return {g}
`)

// crossSlot reports whether refs, untagged on a cluster, carry different
// client keys, each placed by its own key: possibly in several slots.
func (g *Group) crossSlot(refs []engine.Ref) bool {
	if !g.st.cluster || len(refs) == 0 {
		return false
	}
	for _, r := range refs[1:] {
		if r.Key != refs[0].Key {
			return true
		}
	}
	return false
}

// decideAcross decides an untagged request whose keys live in several
// cluster slots (see the comment at the top of this file): one group call
// per slot, then, unless every slot admitted, the admitted slots' entries
// given back. Limits in the result follow refs; each limit's At is its
// slot's instant.
func (g *Group) decideAcross(ctx context.Context, dst []engine.Decision, refs []engine.Ref, n int, costs []int) (engine.GroupDecision, error) {
	pn := n
	if costs != nil {
		pn = 1
	}
	// The checks DecideGroup makes, before anything is sent.
	if _, _, err := g.place(refs, pn, refs[0].Key, true, false, ""); err != nil {
		return engine.GroupDecision{}, err
	}
	for i, c := range costs {
		if l := g.lims[refs[i].Policy].policy.Limit; c < 1 || c > l {
			return engine.GroupDecision{}, fmt.Errorf("%w: ref %d's cost %d is outside 1..%d", engine.ErrInvalidCost, i, c, l)
		}
	}
	if cap(dst) < len(refs) {
		dst = make([]engine.Decision, len(refs))
	}
	gd := engine.GroupDecision{Allowed: true, Limits: dst[:len(refs)]}
	// Refs by slot, in first-seen order.
	var slots []int
	bySlot := map[int][]int{}
	for i, r := range refs {
		s := slotOf(r.Key)
		if _, ok := bySlot[s]; !ok {
			slots = append(slots, s)
		}
		bySlot[s] = append(bySlot[s], i)
	}
	var done []admitted
	var firstErr error
	for _, s := range slots {
		idx := bySlot[s]
		sub := make([]engine.Ref, len(idx))
		var subCosts []int
		if costs != nil {
			subCosts = make([]int, len(idx))
		}
		each := make([]int, len(idx)) // each ref's cost, for a give-back
		for j, i := range idx {
			sub[j] = refs[i]
			each[j] = g.costOf(refs, i, n, costs)
			if costs != nil {
				subCosts[j] = costs[i]
			}
		}
		// The slot's keys are placed by their own client key: tagging
		// them with the first one's (same slot) keeps them where
		// Limiter.Decide keeps them.
		sgd, err := g.decide(ctx, groupReq{refs: sub, n: n, costs: subCosts}, sub[0].Key, true)
		if err != nil && len(sgd.Limits) != len(sub) {
			// No decision (the caller's context, a closed store): give
			// back what was admitted and return the error.
			g.giveBack(done)
			return engine.GroupDecision{}, err
		}
		if err != nil && firstErr == nil {
			firstErr = err
		}
		for j, i := range idx {
			gd.Limits[i] = sgd.Limits[j]
		}
		if !sgd.Allowed {
			gd.Allowed = false
		} else if !sgd.Limits[0].Fallback {
			done = append(done, admitted{sub, each, sgd.Limits[0].At / 1000})
		}
	}
	if !gd.Allowed {
		g.giveBack(done)
		// Each slot's own answer says whether its limits had room; an
		// admitted slot's limits now hold nothing of the request.
		for i := range gd.Limits {
			if gd.Limits[i].Allowed {
				gd.Limits[i].Remaining += g.costOf(refs, i, n, costs)
			}
		}
	}
	gd.Binding = engine.BindingLimit(gd.Limits, gd.Allowed)
	return gd, firstErr
}

// costOf returns ref i's cost.
func (g *Group) costOf(refs []engine.Ref, i, n int, costs []int) int {
	if costs != nil {
		return costs[i]
	}
	return n
}

// admitted is one slot's part of a request decideAcross admitted.
type admitted struct {
	refs  []engine.Ref
	costs []int // per ref
	at    int64 // the slot's instant, µs
}

// giveBack removes the entries of admitted slots (decideAcross), each
// distinct ref's key in its own call, under the store's context (a
// caller that gave up still gets its entries given back), each call
// bounded by the liveness probe's grace.
func (g *Group) giveBack(done []admitted) {
	st := g.st
	for _, a := range done {
		// Distinct refs, each at the largest of its costs, as the group
		// script charged them.
		var uniq []engine.Ref
		var cost []int
		for j, r := range a.refs {
			k := 0
			for k < len(uniq) && uniq[k] != r {
				k++
			}
			if k == len(uniq) {
				uniq, cost = append(uniq, r), append(cost, a.costs[j])
			} else {
				cost[k] = max(cost[k], a.costs[j])
			}
		}
		for k, r := range uniq {
			l := g.lims[r.Policy]
			slot := slotOf(r.Key)
			keys := []string{l.keyIn(slot, r.Key)}
			field := ""
			if b, ok := l.bucketIn(slot, r.Key); ok {
				keys, field = append(keys, b), r.Key
			}
			now := "-1"
			if st.cfg.clock != nil {
				now = strconv.FormatInt(st.now()/1000, 10)
			}
			argv := []string{now, l.group[0], l.group[2], l.group[3], l.group[4], field,
				strconv.Itoa(cost[k]), strconv.FormatInt(a.at, 10)}
			ctx, cancel := context.WithTimeout(st.ctx, st.probeGrace())
			res, err := st.conn.evalKeys(ctx, givebackScript, keys, argv)
			cancel()
			switch {
			case err != nil || len(res) != 1:
				st.m.givebacks.WithLabelValues("failed").Inc()
				st.cfg.logger.Warn("redisstore: could not give back a cross-slot request's entries: they count until they expire",
					"key", r.Key, "policy", l.policy.Name, "err", err, "store", st.name)
			case res[0] == 0:
				st.m.givebacks.WithLabelValues("expired").Inc()
			default:
				st.m.givebacks.WithLabelValues("ok").Inc()
			}
		}
	}
}
