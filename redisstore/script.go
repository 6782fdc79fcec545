package redisstore

import (
	"crypto/sha1"
	"encoding/hex"
)

// script is a Lua script with its SHA1, for EVALSHA.
type script struct {
	body string
	sha  string
}

func newScript(body string) *script {
	sum := sha1.Sum([]byte(body))
	return &script{body: body, sha: hex.EncodeToString(sum[:])}
}

// Log layout: one Redis string per (policy, client key). A key holding
// exactly one entry whose instant is also its watermark (a client that
// sent one request, the common case at a million clients) is stored in
// the compact form: the instant in decimal, which Redis encodes as an
// integer inside the object header (no value allocation). Any other state
// is a ring of fixed-width offsets behind a 24-byte header:
//
//	offset  size  field
//	0       8     base: µs instant every slot is an offset from (int64 LE)
//	8       8     watermark: the key's latest decision instant, µs (int64 LE)
//	16      4     head: ring index of the oldest entry (uint32 LE)
//	20      4     count: entries held, live or not yet evicted (uint32 LE)
//	24      S·cap slots: entry − base, S-byte unsigned LE, oldest at head
//
// S is 4 bytes for windows up to 7/8 of 2^32 µs (62.6 min, so one hour
// fits), 5 up to 7/8 of 2^40 µs (11.1 days), 6 beyond (7.8 years >
// engine.MaxWindow). The capacity cap starts at the first request's cost
// and grows by doubling (or to the need, if more) up to the limit L, so a
// key holding k entries costs 24 + S·cap bytes with cap < 2k: a client
// that sent one request costs 28 bytes of value (see docs/distributed.md
// for the per-key totals). Entries are kept sorted (appends are at the
// newest instant, which never decreases), so the first live entry is found
// by binary search: eviction is O(log L) whatever the number of expired
// entries. When the newest instant no longer fits S bytes above base, the
// ring is rebased on its oldest live entry, which is within W of now: that
// leaves at least 2^(8S) − W ≥ 2^(8S)/8 µs of headroom (8.9 min for 4-byte
// slots), so a key is rebased, an O(L) rewrite, at most once per that long.
//
// See docs/distributed.md for the measurements behind this choice.
//
// KEYS[1]: the key. ARGV: limit L, window W (µs), cost n, now (µs, or −1
// to read the server's TIME), slot width S, TTL (ms).
// Returns {allowed 0|1, remaining, retry-after µs, reset µs, at µs}.
var logScript = newScript(`
local key = KEYS[1]
local L = tonumber(ARGV[1])
local W = tonumber(ARGV[2])
local n = tonumber(ARGV[3])
local now = tonumber(ARGV[4])
local S = tonumber(ARGV[5])
local ttl = tonumber(ARGV[6])
local treal = -1
if now < 0 then
  local tm = redis.call('TIME')
  now = tonumber(tm[1]) * 1000000 + tonumber(tm[2])
  treal = now
end
local fmt = '<I' .. S
local HDR = '<i8i8I4I4'
local s = redis.call('GET', key)
local base, water, head, count, cap = now, 0, 0, 0, 0
local compact = false
if s and #s < 24 then
  -- The compact form: one entry, which is also the watermark, stored as
  -- its decimal instant. Decode it as a ring of capacity 1.
  local e = tonumber(s)
  s = struct.pack(HDR, e, e, 0, 1) .. struct.pack(fmt, 0)
  compact = true
end
if s then
  base, water, head, count = struct.unpack(HDR, s)
  cap = (#s - 24) / S
end
local water0 = water
if now < water then now = water end
-- Redis expires keys on its own clock: when the watermark is ahead of
-- TIME (the clock stepped back), the key must last that much longer.
if now > treal and treal >= 0 then ttl = ttl + math.ceil((now - treal) / 1000) end
-- at(i): the i-th oldest entry (0-based), decoded from the stored string.
local function at(i)
  local p = (head + i) % cap
  return base + struct.unpack(fmt, s, 25 + p * S)
end
-- Evict entries <= now - W: the first live one by binary search.
local dead = now - W
if count > 0 and at(0) <= dead then
  local lo, hi = 0, count
  while lo < hi do
    local mid = math.floor((lo + hi) / 2)
    if at(mid) <= dead then lo = mid + 1 else hi = mid end
  end
  head = (head + lo) % cap
  count = count - lo
end
local oldest = now
if count > 0 then oldest = at(0) end
if count + n > L then
  -- Refused: nothing is written but the watermark, so that no later
  -- decision on the key is made at an earlier instant, whatever the
  -- clock does next.
  local retry = at(count + n - L - 1) + W - now
  if now > water0 then
    if compact then
      redis.call('SET', key, string.sub(s, 1, 8) .. struct.pack('<i8', now) .. string.sub(s, 17), 'KEEPTTL')
    else
      redis.call('SETRANGE', key, 8, struct.pack('<i8', now))
    end
  end
  return {0, L - count, retry, oldest + W - now, now}
end
if count == 0 then base = now; head = 0 end
local need = count + n
if need == 1 then
  -- One entry, at now, which is then the watermark too: the compact
  -- form, an integer, which Redis keeps in the object header.
  redis.call('SET', key, string.format('%d', now), 'PX', ttl)
  return {1, L - 1, 0, W, now}
end
local lim = 2 ^ (8 * S)
if need > cap or now - base >= lim then
  -- Rebuild: linearize the ring, grow it, rebase it if needed.
  local newcap = cap
  if need > newcap then
    newcap = math.min(L, cap * 2)
    if newcap < need then newcap = need end
  end
  local newbase = base
  if now - base >= lim then newbase = oldest end
  local parts = {}
  for i = 0, count - 1 do parts[#parts + 1] = struct.pack(fmt, at(i) - newbase) end
  local e = struct.pack(fmt, now - newbase)
  parts[#parts + 1] = string.rep(e, n)
  parts[#parts + 1] = string.rep('\0', (newcap - need) * S)
  redis.call('SET', key, struct.pack(HDR, newbase, now, 0, need) .. table.concat(parts), 'PX', ttl)
else
  local e = struct.pack(fmt, now - base)
  local pos = (head + count) % cap
  local first = math.min(n, cap - pos)
  redis.call('SETRANGE', key, 24 + pos * S, string.rep(e, first))
  if n > first then redis.call('SETRANGE', key, 24, string.rep(e, n - first)) end
  redis.call('SETRANGE', key, 0, struct.pack(HDR, base, now, head, need))
  redis.call('PEXPIRE', key, ttl)
end
return {1, L - need, 0, oldest + W - now, now}
`)

// slotWidth returns the bytes per log entry for a window of wus µs: the
// smallest S ≥ 4 with wus ≤ 7/8 · 2^(8S).
func slotWidth(wus int64) int {
	for s := 4; s < 8; s++ {
		if wus <= 1<<(8*s)-1<<(8*s-3) {
			return s
		}
	}
	return 8
}

// Counter layout: one 32-byte Redis string per (policy, client key):
// window index, previous and current window counts and the watermark, each
// int64 LE. Windows are aligned to instant 0 of the timeline (the Unix
// epoch under Redis TIME), as in the engine.
//
// The arithmetic is the engine's (shard.counterDecide) in Lua doubles,
// exact because Limit·W ≤ 2^52 µs is enforced at construction; each
// division is corrected by integer checks so that floor and ceil are exact.
//
// KEYS[1]: the key. ARGV: limit L, window W (µs), cost n, now (µs, or −1
// for TIME), unused, TTL (ms). Returns as the log script.
var counterScript = newScript(`
local key = KEYS[1]
local L = tonumber(ARGV[1])
local W = tonumber(ARGV[2])
local n = tonumber(ARGV[3])
local now = tonumber(ARGV[4])
local ttl = tonumber(ARGV[6])
local treal = -1
if now < 0 then
  local tm = redis.call('TIME')
  now = tonumber(tm[1]) * 1000000 + tonumber(tm[2])
  treal = now
end
local s = redis.call('GET', key)
local idx, prev, cur, water = 0, 0, 0, 0
if s then idx, prev, cur, water = struct.unpack('<i8i8i8i8', s) end
local water0 = water
if now < water then now = water end
if now > treal and treal >= 0 then ttl = ttl + math.ceil((now - treal) / 1000) end
-- floor(a / b) for integers a >= 0, b > 0 with a < 2^53.
local function fdiv(a, b)
  local q = math.floor(a / b)
  while q * b > a do q = q - 1 end
  while (q + 1) * b <= a do q = q + 1 end
  return q
end
local ni = fdiv(now, W)
if ni == idx + 1 then prev = cur; cur = 0 elseif ni ~= idx then prev = 0; cur = 0 end
local e = now - ni * W
local weighted = prev * (W - e)
local allowed = 0
if cur + n <= L and weighted <= (L - cur - n) * W then
  allowed = 1
  cur = cur + n
end
local q = fdiv(weighted, W)
if q * W < weighted then q = q + 1 end
local remaining = 0
if cur + q < L then remaining = L - cur - q end
local reset = 0
if cur > 0 then reset = 2 * W - e elseif prev > 0 then reset = W - e end
if allowed == 1 then
  redis.call('SET', key, struct.pack('<i8i8i8i8', ni, prev, cur, now), 'PX', ttl)
  return {1, remaining, 0, reset, now}
end
local retry
if cur + n <= L then
  local f = fdiv((L - cur - n) * W, prev)
  retry = W - e - math.min(f, W - e)
else
  local f = fdiv((L - n) * W, cur)
  retry = (W - e) + (W - math.min(f, W))
end
if now > water0 and s then
  redis.call('SETRANGE', key, 24, struct.pack('<i8', now))
end
return {0, remaining, retry, reset, now}
`)
