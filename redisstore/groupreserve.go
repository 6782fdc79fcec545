package redisstore

import (
	"context"
	"fmt"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/slidegate/slidegate/engine"
)

// groupReserveScript is reserveScript over several logs at once, all or
// nothing: the slot is the earliest instant at which every limit fits (the
// latest of each one's own), and a cancel gives it back to every limit.
// Each key is rewritten as reserveScript rewrites one.
//
// KEYS are groupScript's, and per key its first six arguments (no cost:
// every key is charged n); ARGV before them: now (µs
// or −1 for TIME), cost n, the longest delay accepted (µs, −1 for none),
// the mode ("r" or "c") and, to cancel, the slot (µs). Returns as
// reserveScript, and {−2, 0, now} when a limit is a counter.
var groupReserveScript = newScript(luaPrelude + `
local now, treal = clock(tonumber(ARGV[1]))
local n = tonumber(ARGV[2])
local maxd = tonumber(ARGV[3])
local mode = ARGV[4]
local nk = (#ARGV - 5) / 6
local nb = nk
local ks = {}
for i = 1, nk do
  local a = 5 + (i - 1) * 6
  local k = {alg = tonumber(ARGV[a + 1]), L = tonumber(ARGV[a + 2]), W = tonumber(ARGV[a + 3]),
    S = tonumber(ARGV[a + 4]), ttl = tonumber(ARGV[a + 5]), ttl0 = tonumber(ARGV[a + 5]),
    bkey = false, field = false, water = 0, exists = false, inbucket = false, s = false,
    fmt = '<I' .. ARGV[a + 4], compact = false, base = 0, head = 0, count = 0, cap = 0, oldest = 0}
  if k.alg ~= 0 then return {-2, 0, now} end
  if ARGV[a + 6] ~= '' then
    nb = nb + 1
    k.bkey, k.field = KEYS[nb], ARGV[a + 6]
  end
  logLoad(k, KEYS[i])
  if now < k.water then now = k.water end
  ks[i] = k
end
local ttlx = 0
if now > treal and treal >= 0 then ttlx = math.ceil((now - treal) / 1000) end
local at = now
for i = 1, nk do
  local k = ks[i]
  local es = {}
  for j = 0, k.count - 1 do
    local e = logAt(k, j)
    if e > now - k.W then es[#es + 1] = e end
  end
  k.es = es
  if #es > 0 and es[#es] > at then at = es[#es] end
  local j = #es + n - k.L
  if j > 0 and es[j] + k.W > at then at = es[j] + k.W end
end
if mode == 'r' then
  for i = 1, nk do
    local k = ks[i]
    local base = now
    if #k.es > 0 and k.es[1] < now then base = k.es[1] end
    if #k.es + n > k.L + 65536 or at - base >= 2 ^ (8 * k.S) then return {-1, at - now, now} end
  end
  if maxd >= 0 and at - now > maxd then
    for i = 1, nk do
      if now > ks[i].water then logRaise(ks[i], KEYS[i], now, ks[i].ttl + ttlx) end
    end
    return {0, at - now, now}
  end
  for i = 1, nk do
    for j = 1, n do ks[i].es[#ks[i].es + 1] = at end
  end
else
  at = tonumber(ARGV[5])
  if at <= now then return {0, 0, now} end
  for i = 1, nk do
    local es, left = ks[i].es, n
    for j = #es, 1, -1 do
      if left > 0 and es[j] == at then table.remove(es, j); left = left - 1 end
    end
  end
end
for i = 1, nk do
  local k, es = ks[i], ks[i].es
  if k.inbucket then RC('HDEL', k.bkey, k.field) end
  local base = now
  if #es > 0 and es[1] < now then base = es[1] end
  local parts = {}
  for j = 1, #es do parts[#parts + 1] = SP(k.fmt, es[j] - base) end
  local newest = now
  if #es > 0 and es[#es] > now then newest = es[#es] end
  local px = k.ttl + ttlx + math.ceil((newest - now) / 1000)
  RC('SET', KEYS[i], SP(HDR, base, now, 0, #es) .. table.concat(parts), 'PX', px)
end
return {1, at - now, now}
`)

// GroupReservation is a slot reserved on every limit of a group request.
type GroupReservation struct {
	g     *Group
	keys  []string
	argv  []string // the reservation's arguments; Cancel reuses the per-key part
	at    int64    // µs
	made  int64    // µs
	local time.Time
	done  atomic.Bool
}

// At returns the reserved instant in nanoseconds, as Reservation.At.
func (r *GroupReservation) At() int64 { return r.at * 1000 }

// Made returns the instant the script decided at, in nanoseconds.
func (r *GroupReservation) Made() int64 { return r.made * 1000 }

// Delay returns how long after the script's instant the slot comes.
func (r *GroupReservation) Delay() time.Duration {
	return time.Duration(r.at-r.made) * time.Microsecond
}

// Due returns the local instant the slot comes (see Reservation.Due).
func (r *GroupReservation) Due() time.Time { return r.local.Add(r.Delay()) }

// ReserveRefsN reserves, all or nothing, a slot of cost n on every ref's
// limit at the earliest instant of Redis's clock at which every limit
// fits, placing the keys as DecideGroup does (so on a cluster the refs must
// carry one client key; use ReserveRefsTagged otherwise). maxDelay is as
// for Limiter.ReserveN. Every limit must be a sliding window log.
func (g *Group) ReserveRefsN(ctx context.Context, refs []engine.Ref, n int, maxDelay time.Duration) (*GroupReservation, error) {
	return g.reserve(ctx, refs, n, maxDelay, "", false)
}

// ReserveRefsTagged is ReserveRefsN with every key placed by tag, as
// DecideGroup places them with a Tag on a cluster.
func (g *Group) ReserveRefsTagged(ctx context.Context, refs []engine.Ref, n int, maxDelay time.Duration, tag string) (*GroupReservation, error) {
	return g.reserve(ctx, refs, n, maxDelay, tag, true)
}

func (g *Group) reserve(ctx context.Context, refs []engine.Ref, n int, maxDelay time.Duration, tag string, tagged bool) (*GroupReservation, error) {
	slot, _, err := g.place(refs, n, tag, tagged, true, "ReserveRefsTagged")
	if err != nil {
		return nil, err
	}
	keys, argv := []string{}, make([]string, 5)
	var buckets []string
	seen := map[engine.Ref]bool{}
	for _, r := range refs {
		if seen[r] {
			continue
		}
		seen[r] = true
		keys, argv, buckets = g.appendRef(keys, argv, buckets, r, slot, tagged)
	}
	keys = append(keys, buckets...)
	md := int64(-1)
	if maxDelay >= 0 {
		md = int64(maxDelay / time.Microsecond)
	}
	argv[1], argv[2], argv[3], argv[4] = strconv.Itoa(n), strconv.FormatInt(md, 10), "r", "0"
	res, err := g.reserveCall(ctx, keys, argv)
	if err != nil {
		return nil, err
	}
	switch res[0] {
	case -2:
		return nil, engine.ErrNotReservable
	case -1:
		return nil, engine.ErrQueueFull
	case 0:
		return nil, fmt.Errorf("%w (in %v): %w", engine.ErrWaitTooLong, time.Duration(res[1])*time.Microsecond, context.DeadlineExceeded)
	}
	return &GroupReservation{g: g, keys: keys, argv: argv, at: res[2] + res[1], made: res[2], local: time.Now()}, nil
}

func (g *Group) reserveCall(ctx context.Context, keys, argv []string) ([]int64, error) {
	st := g.st
	select {
	case <-st.closed:
		return nil, ErrClosed
	default:
	}
	argv[0] = "-1"
	if st.cfg.clock != nil {
		now := st.now()
		if now < 0 {
			return nil, fmt.Errorf("%w: clock reads %d, before its epoch", engine.ErrInvalidInstant, now)
		}
		argv[0] = strconv.FormatInt(now/1000, 10)
	}
	cctx, cancel := context.WithTimeout(ctx, st.cfg.timeout)
	defer cancel()
	res, err := st.conn.evalKeys(cctx, groupReserveScript, keys, argv)
	if err == nil && len(res) != 3 {
		err = fmt.Errorf("redisstore: group reserve script returned %d values, want 3", len(res))
	}
	if err != nil {
		return nil, fmt.Errorf("redisstore: group reserve: %w", err)
	}
	return res, nil
}

// Cancel gives the slot back to every limit if its instant has not come
// on Redis's clock, and reports whether it did. Only the first Cancel can
// succeed.
func (r *GroupReservation) Cancel(ctx context.Context) (bool, error) {
	if !r.done.CompareAndSwap(false, true) {
		return false, nil
	}
	argv := append([]string(nil), r.argv...)
	argv[2], argv[3], argv[4] = "-1", "c", strconv.FormatInt(r.at, 10)
	res, err := r.g.reserveCall(ctx, r.keys, argv)
	if err != nil {
		return false, err
	}
	return res[0] == 1, nil
}

// WaitRefsN blocks until a request of cost n over refs is admitted by
// every limit, as Limiter.WaitN does for one.
func (g *Group) WaitRefsN(ctx context.Context, refs []engine.Ref, n int) error {
	_, err := waitSlot(ctx, g.st.cfg.timeout, func(maxDelay time.Duration) (*GroupReservation, error) {
		return g.ReserveRefsN(ctx, refs, n, maxDelay)
	})
	return err
}
