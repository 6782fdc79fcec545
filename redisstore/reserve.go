package redisstore

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/slidegate/slidegate/engine"
)

// Reservations on Redis: the engine's rules (docs/outgoing.md), decided in
// one script on Redis's clock, so that every process sharing a key is
// paced by one log. A reservation of cost n appends n entries at
// R = max(now, the newest entry, e + W), e the entry whose expiry makes
// room; entries stay sorted, the decision scripts refuse while an entry
// lies after now (the check at the top of logScript's refusal), and a
// cancel removes the entries while R is still ahead. The key is rewritten
// whole (an O(entries) rebuild, as a rebase is), and lasts until R + W.
//
// KEYS[1]: the client's own key; KEYS[2], if given, its bucket. ARGV: L,
// W µs, n, now (µs or −1 for TIME), S, TTL ms, the client key (the bucket
// field), the longest delay accepted (µs, −1 for none), the mode ("r"
// reserve, "c" cancel) and, to cancel, the reservation's instant (µs).
// Returns {status, R − now µs, now µs}: status 1 reserved (or given
// back), 0 too late (the delay is above the bound; a cancel whose instant
// has come), −1 too many entries queued.
var reserveScript = newScript(luaPrelude + luaRewrite + `
local key = KEYS[1]
local L = tonumber(ARGV[1])
local W = tonumber(ARGV[2])
local n = tonumber(ARGV[3])
local S = tonumber(ARGV[5])
local ttl = tonumber(ARGV[6])
local maxd = tonumber(ARGV[8])
local mode = ARGV[9]
local now, treal = clock(tonumber(ARGV[4]))
local k = {s = false, S = S, fmt = '<I' .. S, bkey = KEYS[2] or false, field = ARGV[7],
  ttl0 = ttl, exists = false, inbucket = false, compact = false,
  base = 0, water = 0, head = 0, count = 0, cap = 0, oldest = 0}
logLoad(k, key)
local water0 = k.water
if now < k.water then now = k.water end
if now > treal and treal >= 0 then ttl = ttl + math.ceil((now - treal) / 1000) end
local es = logLive(k, now, W)
local at
if mode == 'r' then
  at = now
  if #es > 0 and es[#es] > at then at = es[#es] end
  local j = #es + n - L
  if j > 0 and es[j] + W > at then at = es[j] + W end
  local base = now
  if #es > 0 and es[1] < now then base = es[1] end
  if #es + n > L + 65536 or at - base >= 2 ^ (8 * S) then return {-1, at - now, now} end
  if maxd >= 0 and at - now > maxd then
    if now > water0 then logRaise(k, key, now, ttl) end
    return {0, at - now, now}
  end
  for i = 1, n do es[#es + 1] = at end
else
  at = tonumber(ARGV[10])
  if at <= now then return {0, 0, now} end
  logDrop(es, at, n)
end
logRewrite(k, key, es, now, ttl)
return {1, at - now, now}
`)

// luaRewrite holds what the scripts that rewrite a log whole share
// (reserveScript, givebackScript): it follows luaPrelude in their text
// only, so the scripts that decide do not make its closures.
const luaRewrite = `
-- logLive(k, now, W): the live entries of k (after now - W), oldest first.
local function logLive(k, now, W)
  local es = {}
  for i = 0, k.count - 1 do
    local e = logAt(k, i)
    if e > now - W then es[#es + 1] = e end
  end
  return es
end
-- logDrop removes up to n entries at instant at from es, the newest
-- first, and returns how many it removed.
local function logDrop(es, at, n)
  local left = n
  for i = #es, 1, -1 do
    if left > 0 and es[i] == at then table.remove(es, i); left = left - 1 end
  end
  return n - left
end
-- logRewrite writes es (sorted) as the whole log of key, watermark now;
-- a client in its bucket leaves it. The key lasts ttl ms past its newest
-- entry or now, whichever is later.
local function logRewrite(k, key, es, now, ttl)
  if k.inbucket then RC('HDEL', k.bkey, k.field) end
  local base = now
  if #es > 0 then base = math.min(es[1], now) end
  local parts = {}
  for i = 1, #es do parts[#parts + 1] = SP(k.fmt, es[i] - base) end
  local newest = now
  if #es > 0 and es[#es] > now then newest = es[#es] end
  local px = ttl + math.ceil((newest - now) / 1000)
  RC('SET', key, SP(HDR, base, now, 0, #es) .. table.concat(parts), 'PX', px)
end
`

// Reservation is a slot reserved on Redis for a request: its entries are
// in the key's log at an instant of Redis's clock, Delay after the script
// ran.
type Reservation struct {
	l     *Limiter
	key   string
	n     int
	at    int64 // µs, Redis's clock (or the caller's)
	made  int64 // µs
	local time.Time
	done  atomic.Bool
}

// At returns the reserved instant in nanoseconds on the store's timeline
// (Redis TIME as Unix nanoseconds, or the caller clock), as Decision.At.
func (r *Reservation) At() int64 { return r.at * 1000 }

// Made returns the instant the script decided at, in nanoseconds as At.
func (r *Reservation) Made() int64 { return r.made * 1000 }

// Delay returns how long after the script's instant the slot comes.
func (r *Reservation) Delay() time.Duration { return time.Duration(r.at-r.made) * time.Microsecond }

// Due returns the local instant the slot comes: the instant the script's
// reply arrived plus Delay (a little after the slot on Redis's clock, by
// the reply's latency).
func (r *Reservation) Due() time.Time { return r.local.Add(r.Delay()) }

// ReserveN reserves a slot of cost n for key at the earliest instant of
// Redis's clock at which it fits, after every slot already reserved on the
// key by any process: the processes sharing a key are served in the order
// their reservations reached Redis. maxDelay < 0 means no bound; otherwise
// a slot further ahead is not reserved and the error wraps
// engine.ErrWaitTooLong. Store failures are returned as errors (the
// failure policy applies to decisions, not to reservations).
func (l *Limiter) ReserveN(ctx context.Context, key string, n int, maxDelay time.Duration) (*Reservation, error) {
	if n < 1 || n > l.policy.Limit {
		return nil, fmt.Errorf("%w: %d is outside 1..%d", engine.ErrInvalidCost, n, l.policy.Limit)
	}
	if l.policy.Algorithm != engine.SlidingLog {
		return nil, engine.ErrNotReservable
	}
	md := int64(-1)
	if maxDelay >= 0 {
		md = int64(maxDelay / time.Microsecond)
	}
	res, err := l.reserveCall(ctx, key, n, md, "r", 0)
	if err != nil {
		return nil, err
	}
	switch res[0] {
	case -1:
		return nil, engine.ErrQueueFull
	case 0:
		return nil, fmt.Errorf("%w (in %v): %w", engine.ErrWaitTooLong, time.Duration(res[1])*time.Microsecond, context.DeadlineExceeded)
	}
	return &Reservation{l: l, key: key, n: n, at: res[2] + res[1], made: res[2], local: time.Now()}, nil
}

// Cancel gives the slot back if its instant has not come on Redis's
// clock, and reports whether it did. Only the first Cancel can succeed.
func (r *Reservation) Cancel(ctx context.Context) (bool, error) {
	if !r.done.CompareAndSwap(false, true) {
		return false, nil
	}
	res, err := r.l.reserveCall(ctx, r.key, r.n, -1, "c", r.at)
	if err != nil {
		return false, err
	}
	return res[0] == 1, nil
}

func (l *Limiter) reserveCall(ctx context.Context, key string, n int, maxDelay int64, mode string, at int64) ([]int64, error) {
	st := l.st
	select {
	case <-st.closed:
		return nil, ErrClosed
	default:
	}
	call := []string{l.args[0], l.args[1], strconv.Itoa(n), "-1", l.args[4], l.args[5], key,
		strconv.FormatInt(maxDelay, 10), mode, strconv.FormatInt(at, 10)}
	if st.cfg.clock != nil {
		now := st.now()
		if now < 0 {
			return nil, fmt.Errorf("%w: clock reads %d, before its epoch", engine.ErrInvalidInstant, now)
		}
		call[3] = strconv.FormatInt(now/1000, 10)
	}
	slot := slotOf(key)
	cctx, cancel := context.WithTimeout(ctx, st.cfg.timeout)
	defer cancel()
	var res []int64
	var err error
	if b, ok := l.bucketIn(slot, key); ok {
		res, err = st.conn.evalKeys(cctx, reserveScript, []string{l.keyIn(slot, key), b}, call)
	} else {
		res, err = st.conn.evalKeys(cctx, reserveScript, []string{l.keyIn(slot, key)}, call)
	}
	if err == nil && len(res) != 3 {
		err = fmt.Errorf("redisstore: reserve script returned %d values, want 3", len(res))
	}
	if err != nil {
		return nil, fmt.Errorf("redisstore: reserve: %w", err)
	}
	return res, nil
}

// Wait blocks until a request of cost 1 for key is admitted; see WaitN.
func (l *Limiter) Wait(ctx context.Context, key string) error { return l.WaitN(ctx, key, 1) }

// WaitN blocks until a request of cost n for key is admitted by the log
// every process sharing the key writes to, and returns nil; as
// engine.Limiter.WaitN, it returns at once when the slot would come after
// ctx's deadline, and gives the slot back when ctx ends first.
func (l *Limiter) WaitN(ctx context.Context, key string, n int) error {
	_, err := l.WaitReserved(ctx, key, n)
	return err
}

// WaitReserved is WaitN that also returns the reservation waited for.
func (l *Limiter) WaitReserved(ctx context.Context, key string, n int) (*Reservation, error) {
	return waitSlot(ctx, l.st.cfg.timeout, func(maxDelay time.Duration) (*Reservation, error) {
		return l.ReserveN(ctx, key, n, maxDelay)
	})
}

// waitSlot is a wait on a reservation of Limiter or Group. It reserves
// through reserve, which is given the longest delay ctx's deadline leaves
// (−1 for none), and sleeps until the slot is due. When ctx ends first it
// gives the slot back, within timeout, and returns ctx.Err(); or the
// reservation, when the slot came first.
func waitSlot[R interface {
	Due() time.Time
	Cancel(context.Context) (bool, error)
}](ctx context.Context, timeout time.Duration, reserve func(maxDelay time.Duration) (R, error)) (R, error) {
	var none R
	if ctx == nil {
		return none, engine.ErrNilContext
	}
	if err := ctx.Err(); err != nil {
		return none, err
	}
	maxDelay := time.Duration(-1)
	if dl, ok := ctx.Deadline(); ok {
		maxDelay = max(0, time.Until(dl))
	}
	r, err := reserve(maxDelay)
	if err != nil {
		return none, err
	}
	d := time.Until(r.Due())
	if d <= 0 {
		return r, nil
	}
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case <-timer.C:
		return r, nil
	case <-ctx.Done():
		// The cancel must reach Redis although ctx is done.
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), timeout)
		defer cancel()
		ok, err := r.Cancel(cctx)
		if err != nil {
			return none, errors.Join(ctx.Err(), err)
		}
		if !ok {
			return r, nil // the slot came first
		}
		return none, ctx.Err()
	}
}
