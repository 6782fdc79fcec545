package redisstore

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/slidegate/slidegate/engine"
	"github.com/slidegate/slidegate/internal/clientcore"
)

// ErrCrossSlot wraps engine.ErrNeedsTag for callers that test for it.
// A Group no longer returns it: a request whose keys differ and that names
// no tag is decided across its keys' slots (Group).
var ErrCrossSlot = fmt.Errorf("redisstore: the keys of a multi-limit request differ and no tag places them in one cluster slot: %w", engine.ErrNeedsTag)

// Group decides requests that count against several of a store's limits at
// once, all or nothing, as engine.Group does in memory
// (docs/semantics.md, "Several limits per request"): a request of cost n
// is allowed iff every limit has room for n at one instant t, and then
// each limit logs n entries of t; if any limit refuses, no limit's state
// changes. Each request is decided inside one script call, atomic on the
// server, on Redis TIME (or the store's caller clock); requests that wait
// behind calls in flight share a call (batch.go). It implements
// engine.GroupBackend.
//
// A Group shares its limiters' keys: a request decided by the group counts
// in each limiter's state, and one decided by a limiter alone counts in
// the group's, provided both place the key alike (Decide and a request
// whose refs all carry that client key use the key's own slot tag;
// DecideTagged and a GroupRequest with a Tag use the tag given).
//
// On Redis Cluster one script call reaches one slot. A request whose refs
// all carry the same client key is placed by that key, as Limiter.Decide
// places it, and is one call. A request that names a tag with
// GroupRequest.Tag (a gateway passes, say, the API key) is one call in the
// tag's slot. Any other request is decided across its keys' own slots:
// one group call per slot (all or nothing within it, at its own instant),
// and if any slot refuses, the slots that admitted give the request's
// entries back, so the request is still all or nothing and no limit ever
// admits beyond L. Between the two steps the held entries can make another
// request be refused (an under-admission, never an over-admission); a
// give-back that fails leaves them counted until they expire. Such a
// request costs one round trip per slot, and one more per key to give
// back. A standalone server needs no tag.
//
// When Redis cannot decide, the store's failure policy decides the whole
// request: FailLocal with an engine.Group over the limiters' local
// fallback limiters, FailOpen allows every limit, FailClosed refuses with
// an error wrapping ErrUnavailable. The refusal cache is not consulted: a
// group's answer needs every limit's state.
//
// A Group is safe for concurrent use. It owns nothing: Close does nothing,
// and the limiters and their store close on their own.
type Group struct {
	st       *Store
	lims     []*Limiter
	policies []engine.Policy
	local    *engine.Group // FailLocal only
}

var _ engine.GroupBackend = (*Group)(nil)

// names is the group's policies, joined by commas, for the call hook (WithCallHook).
func (g *Group) names() string {
	names := make([]string, len(g.policies))
	for i, p := range g.policies {
		names[i] = p.Name
	}
	return strings.Join(names, ",")
}

// NewGroup returns a Group over limiters, in order (Ref.Policy indexes
// them), which must be distinct limiters of one store.
func NewGroup(limiters ...*Limiter) (*Group, error) {
	if len(limiters) == 0 {
		return nil, fmt.Errorf("%w: a group needs at least one limiter", ErrInvalidOption)
	}
	g := &Group{}
	for i, l := range limiters {
		if l == nil {
			return nil, fmt.Errorf("%w: limiter %d is nil", ErrInvalidOption, i)
		}
		if i == 0 {
			g.st = l.st
		} else if l.st != g.st {
			return nil, fmt.Errorf("%w: limiter %d (%q) is on another store than limiter 0", ErrInvalidOption, i, l.policy.Name)
		}
		for j, o := range limiters[:i] {
			if o.prefix == l.prefix {
				return nil, fmt.Errorf("%w: limiters %d and %d (%q) would share keys", ErrInvalidOption, j, i, l.policy.Name)
			}
		}
		g.lims = append(g.lims, l)
		g.policies = append(g.policies, l.policy)
	}
	if g.st.cfg.failure == FailLocal {
		locals := make([]*engine.Limiter, len(g.lims))
		for i, l := range g.lims {
			locals[i] = l.local
		}
		local, err := engine.NewGroupOf(locals...)
		if err != nil {
			return nil, err
		}
		g.local = local
	}
	return g, nil
}

// Policies returns a copy of the group's policies, in order.
func (g *Group) Policies() []engine.Policy { return append([]engine.Policy(nil), g.policies...) }

// WallTime maps a Decision.At to wall time, as Limiter.WallTime does.
func (g *Group) WallTime(at int64) time.Time { return g.lims[0].WallTime(at) }

// NeedsTag reports whether a request whose refs carry different client
// keys needs a tag (GroupRequest.Tag) to be one atomic call: true on Redis
// Cluster. Without a tag such a request is still decided, all or nothing,
// across its keys' slots (see Group).
func (g *Group) NeedsTag() bool { return g.st.cluster }

// Close does nothing and returns nil: the group owns nothing.
func (g *Group) Close() error { return nil }

// DecideGroup decides req, all or nothing, counting each ref's key
// against its policy at its cost (req.N, or req.Costs[i]), inside one
// script call. Limits in the result follow req.Refs; a ref repeated
// exactly (same policy, same key) is decided once, at the largest of its
// costs. dst is as for engine.GroupBackend. It returns an error, and
// changes nothing, for empty refs, a policy index out of range, a Costs
// of another length than Refs or a cost outside 1..its limit (wrapping
// engine.ErrInvalidKeys or engine.ErrInvalidCost).
//
// On a cluster, a non-empty req.Tag places every key of the request by
// the tag's hash instead of by its client key, so that requests over
// different client keys (a user and an IP) share a slot: as for
// Limiter.DecideTagged, the tag is part of where the state lives, and a
// (policy, client key) must always be decided with the same tag. Without
// a tag, refs whose keys differ are decided across their slots (see
// Group): each limit's At is then its slot's instant. A standalone server
// ignores the tag. Failures of Redis go to the failure policy, as for
// Limiter.Decide. Each distinct ref is one key (two with a log client's
// bucket) and six arguments of the call, and the script's work grows with
// them: the caller bounds how many refs a client can put in one request
// (a server, by its configuration).
func (g *Group) DecideGroup(ctx context.Context, dst []engine.Decision, req engine.GroupRequest) (engine.GroupDecision, error) {
	refs, n, costs := req.Refs, req.N, req.Costs
	if costs != nil {
		if len(costs) != len(refs) {
			return engine.GroupDecision{}, fmt.Errorf("%w: %d refs, %d costs", engine.ErrInvalidKeys, len(refs), len(costs))
		}
		n = 0
	}
	tagged := req.Tag != "" && g.st.cluster
	if !tagged && g.crossSlot(refs) {
		return g.decideAcross(ctx, dst, refs, n, costs)
	}
	return g.decide(ctx, groupReq{dst, refs, n, costs}, req.Tag, tagged)
}

// groupMax is how many distinct keys a request decides without allocating
// its bookkeeping.
const groupMax = 8

// groupReq is a group request as decide and its fallbacks see it: the
// caller's dst, and refs at cost n each, or at costs[i] each when costs
// is not nil.
type groupReq struct {
	dst   []engine.Decision
	refs  []engine.Ref
	n     int
	costs []int
}

// decide decides q.
func (g *Group) decide(ctx context.Context, q groupReq, tag string, tagged bool) (engine.GroupDecision, error) {
	dst, refs, n, costs := q.dst, q.refs, q.n, q.costs
	pn := n
	if costs != nil {
		pn = 1 // each cost is checked against its own limit below
	}
	slot, wus, err := g.place(refs, pn, tag, tagged, false, "GroupRequest.Tag")
	if err != nil {
		return engine.GroupDecision{}, err
	}
	for i, c := range costs {
		if l := g.lims[refs[i].Policy].policy.Limit; c < 1 || c > l {
			return engine.GroupDecision{}, fmt.Errorf("%w: ref %d's cost %d is outside 1..%d", engine.ErrInvalidCost, i, c, l)
		}
	}
	st := g.st
	sent, err := st.sendTime(wus)
	if err != nil {
		return engine.GroupDecision{}, err
	}
	one := true
	for _, r := range refs[1:] {
		one = one && r == refs[0]
	}
	if one {
		c := oneCall{slot: slotOfKey(tagged, slot, st.cluster, refs[0].Key), key: refs[0].Key, n: n, sent: sent}
		for _, x := range costs {
			c.n = max(c.n, x)
		}
		return g.decideOne(ctx, q, c)
	}
	// Distinct (policy, key) pairs, in first-seen order; at[i] is ref i's.
	var (
		abuf [groupMax]int
		ubuf [groupMax]int
		cbuf [groupMax]int
	)
	at, uniq, ucost := abuf[:0], ubuf[:0], cbuf[:0]
	// keys and argv go to the client: one allocation for both slices, and
	// one string holding every key. keys: the own keys, then the buckets
	// of those that have one, in the order of their bytes in kb.
	all := make([]string, 2*len(refs)+1+3*len(refs))
	keys, argv := all[:0:2*len(refs)], all[2*len(refs):2*len(refs)+1]
	var (
		kbuf  [512]byte
		ebuf  [2 * groupMax]int
		bsbuf [groupMax]int
	)
	// bslot[j]: the slot of distinct ref j's bucket, -1 when it has none.
	kb, ends, bslot := kbuf[:0], ebuf[:0], bsbuf[:0]
	for i, r := range refs {
		c := n
		if costs != nil {
			c = costs[i]
		}
		j := 0
		for j < len(uniq) && refs[uniq[j]] != r {
			j++
		}
		if j < len(uniq) {
			ucost[j] = max(ucost[j], c)
		} else {
			uniq, ucost = append(uniq, i), append(ucost, c)
			l := g.lims[r.Policy]
			ks := slotOfKey(tagged, slot, g.st.cluster, r.Key)
			kb = l.appendKey(kb, ks, r.Key)
			ends = append(ends, len(kb))
			argv = append(argv, l.gpol)
			if l.bucketed(r.Key) {
				bslot, argv = append(bslot, ks), append(argv, r.Key)
			} else {
				bslot, argv = append(bslot, -1), append(argv, "")
			}
			argv = append(argv, "") // the cost, once every repeat is seen
		}
		at = append(at, j)
	}
	for j, i := range uniq {
		if bslot[j] >= 0 {
			kb = g.lims[refs[i].Policy].appendBucket(kb, bslot[j])
			ends = append(ends, len(kb))
		}
	}
	ks, from := string(kb), 0
	for _, e := range ends {
		keys = append(keys, ks[from:e])
		from = e
	}
	for j, c := range ucost {
		argv[3+3*j] = strconv.Itoa(c)
	}
	argv[0] = "-1"
	if st.cfg.clock != nil {
		argv[0] = strconv.FormatInt(sent/1000, 10)
	}
	nd := st.nodeOf(slot)
	if !nd.br.Allow() {
		return g.fail(q, ErrBreakerOpen)
	}
	res, out, err := g.call(ctx, nd, slot, keys, argv, len(uniq))
	if out != callAnswered {
		return g.unanswered(ctx, nd, q, out, err)
	}
	if cap(dst) < len(refs) {
		dst = make([]engine.Decision, len(refs))
	}
	gd := engine.GroupDecision{Allowed: res[0] == 1, Limits: dst[:len(refs)]}
	instant := res[1] * 1000
	for i, r := range refs {
		v := res[2+4*at[i]:]
		gd.Limits[i] = engine.Decision{
			Allowed:    v[0] == 1,
			Limit:      g.lims[r.Policy].policy.Limit,
			Remaining:  int(v[1]),
			RetryAfter: time.Duration(v[2]) * time.Microsecond,
			Reset:      time.Duration(v[3]) * time.Microsecond,
			At:         instant,
		}
	}
	// Cached refusals of these keys must not be dated before this instant.
	for _, i := range uniq {
		if c := g.lims[refs[i].Policy].cache; c != nil {
			c.seen(refs[i].Key, instant)
		}
	}
	gd.Binding = engine.BindingLimit(gd.Limits, gd.Allowed)
	return gd, nil
}

// decideOne decides a request whose refs are all one (policy, key) with
// the limiter's single script, batched as the limiter's decisions are:
// the same decision as the group script's, for less of Redis's CPU (its
// straight-line code on one key). The refusal cache is not consulted, as
// for any group request, and learns the decision's instant. c is the
// one decision: its key's slot, the key, the refs' largest cost.
func (g *Group) decideOne(ctx context.Context, q groupReq, c oneCall) (engine.GroupDecision, error) {
	dst, refs := q.dst, q.refs
	st := g.st
	r := refs[0]
	l := g.lims[r.Policy]
	nd := st.nodeOf(c.slot)
	if !nd.br.Allow() {
		return g.fail(q, ErrBreakerOpen)
	}
	nd, res, out, err := l.viaLane(ctx, nd, c, g.names())
	if out != callAnswered {
		return g.unanswered(ctx, nd, q, out, err)
	}
	if cap(dst) < len(refs) {
		dst = make([]engine.Decision, len(refs))
	}
	d := l.decision(res)
	gd := engine.GroupDecision{Allowed: d.Allowed, Limits: dst[:len(refs)]}
	for i := range gd.Limits {
		gd.Limits[i] = d
	}
	if c := l.cache; c != nil {
		c.seen(r.Key, d.At)
	}
	gd.Binding = engine.BindingLimit(gd.Limits, gd.Allowed)
	return gd, nil
}

// call decides a group request (keys and argv of groupScript, nk distinct
// keys) on nd and settles it. On a lane without a node (a standalone
// server, a cluster slot) it goes as a single decision does: at once on
// an idle lane, else in a later batch (batch.go).
func (g *Group) call(ctx context.Context, nd *node, slot int, keys, argv []string, nk int) ([]int64, callOutcome, error) {
	st := g.st
	if ln := st.laneOf(slot); ln.nd == nil {
		ln.mu.Lock()
		if !ln.enter() {
			p := &pending{g: g, oneCall: oneCall{slot: slot}, gkeys: keys, gargv: argv, nk: nk, done: make(chan struct{})}
			st.enqueue(ln, p)
			var done func(bool, error)
			if h := st.cfg.callHook; h != nil {
				_, done = h(ctx, st.kind(), nd.addr, g.names())
			}
			select {
			case <-p.done:
			case <-ctx.Done():
				// The decision may still be made (batch.go).
				if done != nil {
					done(false, ctx.Err())
				}
				return nil, callAbandoned, ctx.Err()
			}
			if done != nil {
				done(p.err == nil && p.res[0] == 1, p.err)
			}
			return p.res, p.out, p.err
		}
		ln.mu.Unlock()
		defer st.leave(ln)
	}
	cctx, cancel := st.callCtx(ctx)
	var done func(bool, error)
	if h := st.cfg.callHook; h != nil {
		cctx, done = h(cctx, st.kind(), nd.addr, g.names())
	}
	start := time.Now()
	st.calls.Add(1)
	res, err := st.conn.evalKeys(cctx, groupScript, keys, argv)
	el := time.Since(start)
	cancel()
	if err == nil && len(res) != 2+4*nk {
		err = fmt.Errorf("redisstore: group script returned %d values, want %d", len(res), 2+4*nk)
	}
	if done != nil {
		done(err == nil && res[0] == 1, err)
	}
	return res, st.settle(ctx, nd, el, err), err
}

// place checks a group request's refs and cost (logOnly: every limit
// must be a sliding window log) and returns the slot its keys live in and
// its longest window in µs; tagMethod is the method named when the keys
// need a tag.
func (g *Group) place(refs []engine.Ref, n int, tag string, tagged, logOnly bool, tagMethod string) (int, int64, error) {
	if len(refs) == 0 {
		return 0, 0, fmt.Errorf("%w: no limits", engine.ErrInvalidKeys)
	}
	least, wus := 0, int64(0)
	same := true
	for i, r := range refs {
		if r.Policy < 0 || r.Policy >= len(g.lims) {
			return 0, 0, fmt.Errorf("%w: ref %d names policy %d of %d", engine.ErrInvalidKeys, i, r.Policy, len(g.lims))
		}
		l := g.lims[r.Policy]
		if logOnly && l.policy.Algorithm != engine.SlidingLog {
			return 0, 0, engine.ErrNotReservable
		}
		if i == 0 || l.policy.Limit < least {
			least = l.policy.Limit
		}
		wus = max(wus, l.wus)
		same = same && r.Key == refs[0].Key
	}
	if n < 1 || n > least {
		return 0, 0, fmt.Errorf("%w: %d is outside 1..%d (the smallest limit of the request)", engine.ErrInvalidCost, n, least)
	}
	switch {
	case tagged:
		return slotOf(tag), wus, nil
	case same || !g.st.cluster:
		return slotOf(refs[0].Key), wus, nil
	}
	return 0, 0, fmt.Errorf("%w: keys %q and %q; name a tag with %s", ErrCrossSlot, refs[0].Key, firstOther(refs), tagMethod)
}

// appendRef appends ref r's key to keys, its bucket's (if it has one) to
// buckets and its arguments of a group script to argv.
func (g *Group) appendRef(keys, argv, buckets []string, r engine.Ref, slot int, tagged bool) ([]string, []string, []string) {
	l := g.lims[r.Policy]
	ks := slotOfKey(tagged, slot, g.st.cluster, r.Key)
	keys = append(keys, l.keyIn(ks, r.Key))
	argv = append(argv, l.group[:]...)
	if b, ok := l.bucketIn(ks, r.Key); ok {
		return keys, append(argv, r.Key), append(buckets, b)
	}
	return keys, append(argv, ""), buckets
}

// slotOfKey returns the slot a key of a group request lives in: the tag's
// (or, for one client key, that key's) on a cluster or when tagged; on a
// standalone server, untagged keys keep their own slot tag, so that they
// are the keys Limiter.Decide uses.
func slotOfKey(tagged bool, slot int, cluster bool, key string) int {
	if tagged || cluster {
		return slot
	}
	return slotOf(key)
}

// firstOther returns the first ref key that differs from the first.
func firstOther(refs []engine.Ref) string {
	for _, r := range refs {
		if r.Key != refs[0].Key {
			return r.Key
		}
	}
	return refs[0].Key
}

// fail decides the whole request by the failure policy; cause is why
// Redis did not. Every limit's decision has Fallback set.
func (g *Group) fail(q groupReq, cause error) (engine.GroupDecision, error) {
	dst, refs, n, costs := q.dst, q.refs, q.n, q.costs
	st := g.st
	st.noteFallback(cause)
	clientcore.EachKey(refs, st.cfg.onFallback, cause)
	if st.cfg.failure == FailLocal {
		var gd engine.GroupDecision
		var err error
		if costs != nil {
			gd, err = g.local.DecideGroup(context.Background(), dst, engine.GroupRequest{Refs: refs, Costs: costs})
		} else {
			gd, err = g.local.DecideGroup(context.Background(), dst, engine.GroupRequest{Refs: refs, N: n})
		}
		markFallback(gd)
		return gd, err
	}
	open := st.cfg.failure == FailOpen
	gd := clientcore.Static(dst, refs, n, func(p int) int { return g.lims[p].policy.Limit }, clientcore.Verdict{Open: open, RetryAfter: st.cfg.cooldown, Now: st.now()})
	if open && costs != nil {
		for i, c := range costs {
			gd.Limits[i].Remaining -= c // Static charged n, which is 0 here
		}
	}
	markFallback(gd)
	if !open {
		return gd, fmt.Errorf("%w: %w", ErrUnavailable, cause)
	}
	return gd, nil
}

// unanswered decides q, whose call to nd came back without a reply that
// decides (out), as out says: err is the call's error.
func (g *Group) unanswered(ctx context.Context, nd *node, q groupReq, out callOutcome, err error) (engine.GroupDecision, error) {
	switch out {
	case callAbandoned:
		return engine.GroupDecision{}, ctx.Err()
	case callLate:
		return g.timedOut(ctx, nd, q, err)
	}
	return g.fail(q, err)
}

// timedOut decides a group request whose call missed the store's
// deadline, as Limiter.timedOut does: under FailLocal, a node that
// answers its liveness probe gets the whole request refused (the script
// may have run), one that does not opens its breaker and the failure
// policy decides.
func (g *Group) timedOut(ctx context.Context, nd *node, q groupReq, err error) (engine.GroupDecision, error) {
	st := g.st
	if st.cfg.failure != FailLocal {
		st.probeNode(nd)
		return g.fail(q, err)
	}
	alive, cerr := st.awaitProbe(ctx, nd)
	if cerr != nil {
		return engine.GroupDecision{}, cerr
	}
	if !alive {
		return g.fail(q, err)
	}
	st.noteSlow(err)
	clientcore.EachKey(q.refs, st.cfg.onFallback, fmt.Errorf("%w: %w", ErrSlow, err))
	gd := clientcore.Static(q.dst, q.refs, q.n, func(p int) int { return g.lims[p].policy.Limit }, clientcore.Verdict{RetryAfter: st.cfg.cooldown, Now: st.now()})
	markFallback(gd)
	return gd, nil
}

// markFallback sets Fallback on every limit's decision of gd.
func markFallback(gd engine.GroupDecision) {
	for i := range gd.Limits {
		gd.Limits[i].Fallback = true
	}
}
