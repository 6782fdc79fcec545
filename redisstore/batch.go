package redisstore

import (
	"context"
	"crypto/sha1"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"time"
)

// Batching: while a call to Redis is in flight, further decisions for the
// same lane queue, and when it returns the next call carries up to
// batchMax of them, in arrival order, in one batchScript call; a queue
// that reaches batchMax goes at once, beside the calls in flight, while
// fewer than laneDepth are (enter, queued). A lane is
// the one server of a standalone store (or Sentinel), and a master of a
// Redis Cluster (per-node lanes, below), else a cluster slot: every key of
// a batch then lives in one slot, which is what a cluster routes one
// script call by. The script reads TIME
// once and decides each decision in order with the single decision's
// code (logBody, counterBody), so each is decided on the state the
// previous ones left, at the batch's instant: the same decisions as one
// call each, made at one instant. A lone decision goes at once, by the
// single script, with no wait. What batching saves is the fixed cost of
// a script call on the server (the command, the script's entry and exit,
// TIME), paid once per batch instead of once per decision.
//
// A queued decision does not depend on its caller after it is queued: a
// caller whose context ends returns the context's error at once, and its
// decision may still be made (its entry then counts, as with a call whose
// reply was lost). The outcome of a batch's call (the reply, a timeout,
// an error, an open breaker) reaches every decision of the batch, and
// each then goes on as a lone decision would (timedOut, fail).
//
// A script error in the middle of a batch (none is expected: Redis
// refuses a call that may write on a replica or under maxmemory before
// it runs) would reach every decision of the batch, those already made
// included. Group decisions (group.go) share the lanes of a standalone
// server and of cluster slots: a batch that holds one goes by
// groupBatchScript, which decides each group decision in order with the
// group script's code, at the batch's TIME, as one call of its own would
// at that instant. On per-node lanes group decisions go alone, as do
// reservations and the other scripts.
//
// Per-node lanes: uniform keys rarely share a slot, so slot lanes of a
// cluster batch almost nothing. Where every master accepts the script flag
// allow-cross-slot-keys (Redis 7.0 and later, checked at Open), a cluster
// lane is the master that owns the slot, and its batches go to that master
// by address with nodeBatchScript. That script takes its keys as
// arguments: Redis refuses declared keys of several slots (CROSSSLOT)
// whatever the flags, and checks each command's keys instead, so a key
// the master does not serve fails the command that names it. The script
// first asks EXISTS of each decision's keys, with redis.pcall: a refusal
// (the slot moved, or is migrating and a key left) marks the decision
// "not decided here", and nothing of it was written; the atomic script
// then runs nothing for it. Such a decision, and those whose slot the
// store's own map moved to another master before the call, go back to
// their callers, which decide them by a call of their own through the
// cluster client (it follows MOVED and ASK). A server's error reply to
// the batch call (READONLY from a demoted master, CLUSTERDOWN, OOM, BUSY)
// means the script did not run: every decision of the batch goes back the
// same way. A decision that fails inside the script after its check (a
// migrating slot whose key the decision itself deleted) may have written:
// it gets an error, as a lone call that failed would, and is not retried.
// A caller whose context ended before its decision came back returns its
// context's error, and that decision is not made.

// batchMax bounds the decisions of one batch call: 16 decisions are about
// a hundred arguments, and a larger batch would hold the server (which
// runs one script at a time) for longer at no further saving.
const batchMax = 16

// batchScript decides several decisions in order. ARGV: P, the number of
// policies, then per policy its algorithm (0 log, 1 counter), L, W (µs),
// S and TTL (ms); then per decision its policy (1..P), cost n, now (µs,
// or −1 for TIME) and its client key when it has a bucket, else ”.
// KEYS: per decision, its own key, then its bucket if it has one.
// Returns the five values of each decision (as logScript), in order.
var batchScript = newScript(luaPrelude + batchSingles + batchLocals + batchSingle + `
while ARGV[ai] do single() end
out[nout + 1] = nil
return out
`)

// batchSingles defines the single decisions' code as the batch scripts
// call it.
const batchSingles = `
local function LOG1(KEYS, ARGV)
` + logBody + `
end
local function CTR1(KEYS, ARGV)
` + counterBody + `
end
`

// batchLocals is the state of a batch script's walk over its decisions:
// the next key and argument, and the values returned so far.
const batchLocals = `
local P = ARGV[1] + 0
local out, ki, ai, nout = BOUT, 1, 2 + 5 * P, 0
local ks, as = {}, {}
`

// batchSingle is a batch script's step for the single decision at
// ARGV[ai], its keys at KEYS[ki]: it decides it, appends its five values
// to out and moves past its keys and arguments.
const batchSingle = `
local function single()
  local p = 2 + 5 * (ARGV[ai] - 1)
  local f = ARGV[ai + 3]
  ks[1] = KEYS[ki]
  as[1], as[2], as[3], as[4], as[5], as[6] = ARGV[p + 1], ARGV[p + 2], ARGV[ai + 1], ARGV[ai + 2], ARGV[p + 3], ARGV[p + 4]
  if f == '' then
    ks[2], as[7] = nil, nil
    ki = ki + 1
  else
    ks[2], as[7] = KEYS[ki + 1], f
    ki = ki + 2
  end
  -- Each decision starts as a call of its own does (the library resets
  -- BMK per call): what it read of its bucket is fresh. It may write a
  -- ring LM holds: GEN voids LM's records.
  BMK = false
  GEN = GEN + 1
  local r
  if ARGV[p] == '0' then r = LOG1(ks, as) else r = CTR1(ks, as) end
  out[nout + 1], out[nout + 2], out[nout + 3], out[nout + 4], out[nout + 5] = r[1], r[2], r[3], r[4], r[5]
  nout = nout + 5
  ai = ai + 4
end
`

// groupBatchScript is batchScript for a batch that holds group decisions
// (group.go) too. Its single decisions are as batchScript's. A group
// decision is '0', its count of keys nk, its count of buckets nb, then
// its 1 + 3·nk arguments of groupScript; its nk + nb keys are groupScript's,
// in KEYS at its place. Returns each decision's values in order: five for
// a single decision, groupScript's 2 + 4·nk for a group. Group decisions
// of one call on one long ring (a route's limit) share what the call read
// of it and the TTL it gave it (LM in luaPrelude).
var groupBatchScript = newScript(luaPrelude + batchSingles + groupFunc + batchLocals + batchSingle + `
GEN, LON = GEN + 1, true
while ARGV[ai] do
  if ARGV[ai] == '0' then
    BMK = false
    local nk, nb = ARGV[ai + 1] + 0, ARGV[ai + 2] + 0
    local r, m = GRP(KEYS, ARGV, ki - 1, ai + 2, nk)
    for i = 1, m do out[nout + i] = r[i] end
    nout = nout + m
    ki = ki + nk + nb
    ai = ai + 4 + 3 * nk
  else
    single()
  end
end
out[nout + 1] = nil
return out
`)

// nodeBatchScript is batchScript for a per-node lane: the keys of a batch
// live on one master, in any of its slots. ARGV: as batchScript's, except
// that each decision is its policy, cost n, now, its client key or ”, its
// own key, and its bucket or ”: six values. KEYS: none. Returns the five
// values of each decision; a decision whose keys this master does not
// serve gets −1 as its first value (not decided), one that failed inside
// the script −2 (it may have written).
var nodeBatchScript = newFlaggedScript("allow-cross-slot-keys", luaPrelude+batchSingles+`
local P = ARGV[1] + 0
local out, ai, nout = {}, 2 + 5 * P, 0
local ks, as = {}, {}
while ARGV[ai] do
  local p = 2 + 5 * (ARGV[ai] - 1)
  local f = ARGV[ai + 3]
  local here
  ks[1] = ARGV[ai + 4]
  as[1], as[2], as[3], as[4], as[5], as[6] = ARGV[p + 1], ARGV[p + 2], ARGV[ai + 1], ARGV[ai + 2], ARGV[p + 3], ARGV[p + 4]
  if f == '' then
    ks[2], as[7] = nil, nil
    here = redis.pcall('EXISTS', ks[1])
  else
    ks[2], as[7] = ARGV[ai + 5], f
    here = redis.pcall('EXISTS', ks[1], ks[2])
  end
  BMK = false
  local ok, r = false, nil
  if type(here) == 'table' then
    r = {-1, 0, 0, 0, 0}
  else
    if ARGV[p] == '0' then ok, r = pcall(LOG1, ks, as) else ok, r = pcall(CTR1, ks, as) end
    if not ok then r = {-2, 0, 0, 0, 0} end
  end
  out[nout + 1], out[nout + 2], out[nout + 3], out[nout + 4], out[nout + 5] = r[1], r[2], r[3], r[4], r[5]
  nout = nout + 5
  ai = ai + 6
end
return out
`)

// newFlaggedScript is newScript for a script with Redis 7 flags: its
// EVAL body starts with the shebang that declares them, and its function
// is registered with them.
func newFlaggedScript(flags, body string) *script {
	s := newScript(body)
	s.flags = flags
	s.body = "#!lua flags=" + flags + "\n" + s.body
	sum := sha1.Sum([]byte(s.body))
	s.sha = hex.EncodeToString(sum[:])
	return s
}

// errNotDecided is the error of a decision a batch handed back to its
// caller undecided (its key's slot moved): the caller decides it by a
// call of its own.
var errNotDecided = errors.New("redisstore: the key's slot moved off the batch's master: decided by a call of its own")

// errInBatch is the error of a decision that failed inside a per-node
// batch's script; it may have written.
var errInBatch = errors.New("redisstore: the decision's script failed inside its batch")

// lane queues the decisions that wait for a call to one node (see
// Batching above).
type lane struct {
	nd       *node // the master of a per-node lane; nil for the others
	mu       sync.Mutex
	inflight int // calls of this lane in flight, at most laneDepth
	q        []*pending
}

// laneDepth bounds the calls of one lane in flight: the one that went
// at once and the full batches that went beside it (enter, queued).
const laneDepth = 4

// laneFixed, when set (BenchmarkLanePolicy sets it), replaces the lanes'
// rule with the one it was measured against: a decision goes at once
// while fewer than laneFixed calls of its lane are in flight.
var laneFixed int

// enter is called with ln.mu held by a decision about to go, and reports
// whether it goes at once (its call is then counted in flight) or queues
// (the caller then calls enqueue). It goes at once only on
// an idle lane, where waiting would gain nothing: behind a call in
// flight it waits for that call's return and goes in the next batch, so
// a busy lane makes one call per batch instead of one per decision.
func (ln *lane) enter() bool {
	if ln.inflight == 0 || laneFixed > 0 && ln.inflight < laneFixed {
		ln.inflight++
		return true
	}
	return false
}

// queued is called with ln.mu held once a decision queued. A queue that
// holds batchMax decisions goes at once, as a call beside those in
// flight while there are fewer than laneDepth: a full batch gains nothing
// by waiting. It returns that batch, its call counted in flight, or nil.
func (ln *lane) queued() []*pending {
	if laneFixed > 0 || len(ln.q) < batchMax || ln.inflight >= laneDepth {
		return nil
	}
	ln.inflight++
	return ln.take()
}

// enqueue queues p on ln, whose mu the caller holds, and releases it; a
// queue that is now full goes at once (queued).
func (s *Store) enqueue(ln *lane, p *pending) {
	ln.q = append(ln.q, p)
	b := ln.queued()
	ln.mu.Unlock()
	if b != nil {
		s.goDrain(ln, b)
	}
}

// pending is one queued decision and, once its batch's call is over, its
// outcome.
type pending struct {
	l *Limiter
	oneCall
	done chan struct{} // closed when res, err and out are set, or redo
	res  []int64       // its values (size)
	err  error
	out  callOutcome
	redo bool // not decided: its caller decides it by a call of its own
	// A group decision (group.go) has g set, its keys and arguments of
	// groupScript, and its count of distinct keys; l, key, n and sent are
	// then unused.
	g     *Group
	gkeys []string
	gargv []string
	nk    int
}

// size returns the count of values the scripts return for p.
func (p *pending) size() int {
	if p.g != nil {
		return 2 + 4*p.nk
	}
	return 5
}

// laneOf returns the lane of slot: the store's one lane, the lane of the
// slot's master (per-node lanes), or the slot's.
func (s *Store) laneOf(slot int) *lane {
	if !s.cluster {
		return &s.lanes[0]
	}
	if s.nodeLanes {
		if nd := s.nodeOf(slot); nd != s.unserved {
			return &nd.ln
		}
	}
	return &s.lanes[slot]
}

// handBack hands p back to its caller undecided.
func (s *Store) handBack(p *pending) {
	s.redone.Add(1)
	p.redo = true
	close(p.done)
}

// next takes the next batch off the lane, or, with the queue empty, ends
// one call in flight and returns nil.
func (ln *lane) next() []*pending {
	ln.mu.Lock()
	defer ln.mu.Unlock()
	if len(ln.q) == 0 {
		ln.inflight--
		ln.q = nil
		return nil
	}
	return ln.take()
}

// take takes the next batch off the lane's queue, which is not empty.
func (ln *lane) take() []*pending {
	k := min(len(ln.q), batchMax)
	b := make([]*pending, k)
	copy(b, ln.q)
	n := copy(ln.q, ln.q[k:])
	clear(ln.q[n:])
	ln.q = ln.q[:n]
	return b
}

// leave is called by a caller that went at once once its call is over:
// the decisions that queued meanwhile go in batches, from a goroutine of
// their own (the caller returns at once), until the queue is empty.
// After Close that goroutine is the caller's: nothing is left behind.
func (s *Store) leave(ln *lane) {
	if b := ln.next(); b != nil {
		s.goDrain(ln, b)
	}
}

// goDrain runs batch b and the lane's next batches from a goroutine of
// their own, until the lane's queue is empty.
func (s *Store) goDrain(ln *lane, b []*pending) {
	s.batchMu.Lock()
	if s.batchClosed {
		s.batchMu.Unlock()
		s.drain(ln, b)
		return
	}
	s.batchWG.Add(1)
	s.batchMu.Unlock()
	go func() {
		defer s.batchWG.Done()
		s.drain(ln, b)
	}()
}

// drain runs batch b and the lane's next batches until the lane is empty.
func (s *Store) drain(ln *lane, b []*pending) {
	for b != nil {
		s.runBatch(ln, b)
		b = ln.next()
	}
}

// runBatch makes one call for the decisions of b, all of lane ln (one
// node), and hands each its outcome. A batch of one goes by its single
// script.
func (s *Store) runBatch(ln *lane, b []*pending) {
	if ln.nd != nil {
		// The store's map may have moved a slot since its decision
		// queued: that decision is no longer this master's.
		k := 0
		for _, p := range b {
			if s.nodeOf(p.slot) != ln.nd {
				s.handBack(p)
				continue
			}
			b[k] = p
			k++
		}
		b = b[:k]
		if k == 0 {
			return
		}
		if k > 1 {
			s.runNodeBatch(ln.nd, b)
			return
		}
	}
	nd := s.nodeOf(b[0].slot)
	var res []int64
	var err error
	ctx, cancel := context.WithTimeout(context.Background(), s.callTimeout())
	start := time.Now()
	s.calls.Add(1)
	want := 0
	for _, p := range b {
		want += p.size()
	}
	if len(b) == 1 && b[0].g != nil {
		res, err = s.conn.evalKeys(ctx, groupScript, b[0].gkeys, b[0].gargv)
	} else if len(b) == 1 {
		p := b[0]
		call := p.l.callArgs(p.n, p.sent, p.key)
		if bk, ok := p.l.bucketIn(p.slot, p.key); ok {
			res, err = s.conn.evalKeys(ctx, p.l.script, []string{p.l.keyIn(p.slot, p.key), bk}, call[:])
		} else {
			res, err = s.conn.eval(ctx, p.l.script, p.l.keyIn(p.slot, p.key), call[:6])
		}
	} else {
		keys, args, groups := batchArgs(b)
		sc := batchScript
		if groups {
			sc = groupBatchScript
		}
		res, err = s.conn.evalKeys(ctx, sc, keys, args)
	}
	el := time.Since(start)
	cancel()
	if err == nil && len(res) != want {
		err = fmt.Errorf("redisstore: script returned %d values for %d decisions, want %d", len(res), len(b), want)
	}
	// One call: one latency, one breaker outcome; its caller never gives
	// up (each decision's caller may, without ending the call).
	out := s.settle(context.Background(), nd, el, err)
	if err != nil && mayHaveRun(err) {
		s.m.unknown.Add(float64(len(b) - 1))
	}
	at := 0
	for _, p := range b {
		p.out, p.err = out, err
		if err == nil {
			m := p.size()
			p.res = res[at : at+m : at+m]
			at += m
		}
		close(p.done)
	}
}

// runNodeBatch makes one call of nodeBatchScript to nd for the decisions
// of b (see Per-node lanes above).
func (s *Store) runNodeBatch(nd *node, b []*pending) {
	nc := s.conn.(nodeConn)
	ctx, cancel := context.WithTimeout(context.Background(), s.callTimeout())
	start := time.Now()
	s.calls.Add(1)
	res, err := nc.evalOn(ctx, nd.addr, nodeBatchScript, nodeBatchArgs(b))
	el := time.Since(start)
	cancel()
	if err != nil && (isServerErr(err) || errors.Is(err, errNoNode)) {
		// The script did not run (its decisions check their keys first
		// and catch their own errors): each goes by a call of its own.
		s.kickHealth()
		for _, p := range b {
			s.handBack(p)
		}
		return
	}
	if err == nil && len(res) != 5*len(b) {
		err = fmt.Errorf("redisstore: script returned %d values for %d decisions, want %d", len(res), len(b), 5*len(b))
	}
	out := s.settle(context.Background(), nd, el, err)
	if err != nil && mayHaveRun(err) {
		s.m.unknown.Add(float64(len(b) - 1))
	}
	moved := false
	for i, p := range b {
		if err != nil {
			p.out, p.err = out, err
			close(p.done)
			continue
		}
		switch res[5*i] {
		case -1:
			moved = true
			s.handBack(p)
			continue
		case -2:
			s.m.unknown.Inc()
			p.out, p.err = callFailed, errInBatch
		default:
			p.out, p.res = out, res[5*i:5*i+5:5*i+5]
		}
		close(p.done)
	}
	if moved {
		s.kickHealth()
	}
}

// batchArgs returns the keys and arguments of batchScript for b, or of
// groupBatchScript when b holds a group decision (groups).
func batchArgs(b []*pending) (keys, args []string, groups bool) {
	ls, idx := batchPolicies(b)
	keys = make([]string, 0, 2*len(b))
	args = make([]string, 0, 1+5*len(ls)+4*len(b))
	args = appendPolicies(args, ls)
	for i, p := range b {
		if p.g != nil {
			groups = true
			keys = append(keys, p.gkeys...)
			args = append(args, "0", strconv.Itoa(p.nk), strconv.Itoa(len(p.gkeys)-p.nk))
			args = append(args, p.gargv...)
			continue
		}
		call := p.l.callArgs(p.n, p.sent, p.key)
		keys = append(keys, p.l.keyIn(p.slot, p.key))
		field := ""
		if bk, ok := p.l.bucketIn(p.slot, p.key); ok {
			keys = append(keys, bk)
			field = p.key
		}
		args = append(args, strconv.Itoa(idx[i]), call[2], call[3], field)
	}
	return keys, args, groups
}

// nodeBatchArgs returns the arguments of nodeBatchScript for b.
func nodeBatchArgs(b []*pending) []string {
	ls, idx := batchPolicies(b)
	args := make([]string, 0, 1+5*len(ls)+6*len(b))
	args = appendPolicies(args, ls)
	for i, p := range b {
		call := p.l.callArgs(p.n, p.sent, p.key)
		field, bk := "", ""
		if k, ok := p.l.bucketIn(p.slot, p.key); ok {
			field, bk = p.key, k
		}
		args = append(args, strconv.Itoa(idx[i]), call[2], call[3], field, p.l.keyIn(p.slot, p.key), bk)
	}
	return args
}

// batchPolicies returns the limiters of b's single decisions, each once,
// and per decision its limiter's place among them, from 1 (0 for a group
// decision).
func batchPolicies(b []*pending) ([]*Limiter, []int) {
	var ls []*Limiter
	idx := make([]int, len(b))
	for i, p := range b {
		if p.g != nil {
			continue
		}
		j := 0
		for j < len(ls) && ls[j] != p.l {
			j++
		}
		if j == len(ls) {
			ls = append(ls, p.l)
		}
		idx[i] = j + 1
	}
	return ls, idx
}

// appendPolicies appends the policies part of a batch's arguments.
func appendPolicies(args []string, ls []*Limiter) []string {
	args = append(args, strconv.Itoa(len(ls)))
	for _, l := range ls {
		alg := "0"
		if l.script == counterScript {
			alg = "1"
		}
		args = append(args, alg, l.args[0], l.args[1], l.args[4], l.args[5])
	}
	return args
}

// callArgs returns the single script's arguments for a decision of cost n
// sent at sent on key: the first six, and key for a client with a bucket.
func (l *Limiter) callArgs(n int, sent int64, key string) [7]string {
	call := [7]string{l.args[0], l.args[1], "", "-1", l.args[4], l.args[5], key}
	if n < len(l.cost) {
		call[2] = l.cost[n]
	} else {
		call[2] = strconv.Itoa(n)
	}
	if l.st.cfg.clock != nil {
		call[3] = strconv.FormatInt(sent/1000, 10)
	}
	return call
}
