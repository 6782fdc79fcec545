package redisstore

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"time"
)

// Batching: while laneDepth calls to Redis are in flight, further
// decisions for the same lane queue, and the next call carries up to
// batchMax of them, in arrival order, in one batchScript call. A lane is
// the one server of a standalone store (or Sentinel), and a cluster slot
// of a Redis Cluster: every key of a batch then lives in one slot, which
// is what a cluster routes one script call by. The script reads TIME
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
// included. Group decisions (group.go), reservations and the other
// scripts go alone.

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
var batchScript = newScript(luaPrelude + `
local function LOG1(KEYS, ARGV)
` + logBody + `
end
local function CTR1(KEYS, ARGV)
` + counterBody + `
end
local P = ARGV[1] + 0
local out, ki, ai, nout = {}, 1, 2 + 5 * P, 0
local ks, as = {}, {}
while ARGV[ai] do
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
  -- BMK per call): what it read of its bucket is fresh.
  BMK = false
  local r
  if ARGV[p] == '0' then r = LOG1(ks, as) else r = CTR1(ks, as) end
  out[nout + 1], out[nout + 2], out[nout + 3], out[nout + 4], out[nout + 5] = r[1], r[2], r[3], r[4], r[5]
  nout = nout + 5
  ai = ai + 4
end
return out
`)

// lane queues the decisions that wait for a call to one node (see
// Batching above).
type lane struct {
	mu       sync.Mutex
	inflight int // calls of this lane in flight, at most laneDepth
	q        []*pending
}

// laneDepth bounds the calls of one lane in flight: a decision goes at
// once while fewer are, and queues otherwise. With one call in flight a
// lane would decide at most batchMax decisions per round trip, and a busy
// host stretches round trips; a few calls keep the connection's pipeline
// full while replies are on their way back.
const laneDepth = 4

// pending is one queued decision and, once its batch's call is over, its
// outcome.
type pending struct {
	l    *Limiter
	slot int
	key  string
	n    int
	sent int64
	done chan struct{} // closed when res, err and out are set
	res  []int64       // its five values
	err  error
	out  callOutcome
}

// laneOf returns the lane of slot.
func (s *Store) laneOf(slot int) *lane {
	if !s.cluster {
		return &s.lanes[0]
	}
	return &s.lanes[slot]
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
	b := ln.next()
	if b == nil {
		return
	}
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
		s.runBatch(b)
		b = ln.next()
	}
}

// runBatch makes one call for the decisions of b, all of one lane (one
// node), and hands each its outcome. A batch of one goes by its single
// script.
func (s *Store) runBatch(b []*pending) {
	nd := s.nodeOf(b[0].slot)
	var res []int64
	var err error
	ctx, cancel := context.WithTimeout(context.Background(), s.callTimeout())
	start := time.Now()
	if len(b) == 1 {
		p := b[0]
		call := p.l.callArgs(p.n, p.sent, p.key)
		if bk, ok := p.l.bucketIn(p.slot, p.key); ok {
			res, err = s.conn.evalKeys(ctx, p.l.script, []string{p.l.keyIn(p.slot, p.key), bk}, call[:])
		} else {
			res, err = s.conn.eval(ctx, p.l.script, p.l.keyIn(p.slot, p.key), call[:6])
		}
	} else {
		keys, args := batchArgs(b)
		res, err = s.conn.evalKeys(ctx, batchScript, keys, args)
	}
	el := time.Since(start)
	cancel()
	if err == nil && len(res) != 5*len(b) {
		err = fmt.Errorf("redisstore: script returned %d values for %d decisions, want %d", len(res), len(b), 5*len(b))
	}
	// One call: one latency, one breaker outcome; its caller never gives
	// up (each decision's caller may, without ending the call).
	out := s.settle(context.Background(), nd, el, err)
	if err != nil && mayHaveRun(err) {
		s.m.unknown.Add(float64(len(b) - 1))
	}
	for i, p := range b {
		p.out, p.err = out, err
		if err == nil {
			p.res = res[5*i : 5*i+5 : 5*i+5]
		}
		close(p.done)
	}
}

// batchArgs returns the keys and arguments of batchScript for b.
func batchArgs(b []*pending) (keys, args []string) {
	var ls []*Limiter
	idx := make([]int, len(b))
	for i, p := range b {
		j := 0
		for j < len(ls) && ls[j] != p.l {
			j++
		}
		if j == len(ls) {
			ls = append(ls, p.l)
		}
		idx[i] = j + 1
	}
	keys = make([]string, 0, 2*len(b))
	args = make([]string, 0, 1+5*len(ls)+4*len(b))
	args = append(args, strconv.Itoa(len(ls)))
	for _, l := range ls {
		alg := "0"
		if l.script == counterScript {
			alg = "1"
		}
		args = append(args, alg, l.args[0], l.args[1], l.args[4], l.args[5])
	}
	for i, p := range b {
		call := p.l.callArgs(p.n, p.sent, p.key)
		keys = append(keys, p.l.keyIn(p.slot, p.key))
		field := ""
		if bk, ok := p.l.bucketIn(p.slot, p.key); ok {
			keys = append(keys, bk)
			field = p.key
		}
		args = append(args, strconv.Itoa(idx[i]), call[2], call[3], field)
	}
	return keys, args
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
