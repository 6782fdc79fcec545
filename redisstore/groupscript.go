package redisstore

// groupScript decides one request over several limits at once, all or
// nothing, with the layouts and arithmetic of logScript and counterScript
// (see them for the state each key holds). Every key of the request is
// read first; the request's instant is the latest of now and every key's
// watermark, so that no key ever decides at an earlier instant than it did
// before. Each limit is then evaluated at that instant. If every limit has
// room, n entries are appended to every log and n counted in every counter;
// otherwise nothing is logged anywhere, and only the watermarks move up to
// the instant (a key that held nothing is created holding its watermark
// alone, a 24-byte ring of capacity 0 or a counter at zero, with the
// policy's TTL), so that a later decision on any of the keys, alone or in
// a group, replays after this one.
//
// Each limit reports its own fields at the instant: when the request is
// allowed, its state after the append; otherwise its state unchanged, with
// a RetryAfter only if it had no room.
//
// KEYS: the distinct keys of the request (one per (policy, client key)).
// ARGV: now (µs, or −1 for TIME), cost n, then five per key: algorithm (0
// log, 1 counter), limit L, window W (µs), slot width S (log), TTL (ms).
// Returns {allowed 0|1, at µs, then per key: room 0|1, remaining,
// retry-after µs, reset µs}.
var groupScript = newScript(`
local now = tonumber(ARGV[1])
local n = tonumber(ARGV[2])
local treal = -1
if now < 0 then
  local tm = redis.call('TIME')
  now = tonumber(tm[1]) * 1000000 + tonumber(tm[2])
  treal = now
end
local HDR = '<i8i8I4I4'
local CTR = '<i8i8i8i8'
local nk = #KEYS
local ks = {}
for i = 1, nk do
  local a = 2 + (i - 1) * 5
  -- Every field in the constructor: the table is sized once.
  local k = {alg = tonumber(ARGV[a + 1]), L = tonumber(ARGV[a + 2]), W = tonumber(ARGV[a + 3]),
    S = tonumber(ARGV[a + 4]), ttl = tonumber(ARGV[a + 5]), water = 0, exists = false, s = false,
    fmt = false, compact = false, base = 0, head = 0, count = 0, cap = 0, oldest = 0,
    idx = 0, prev = 0, cur = 0, e = 0, weighted = 0, room = 0, rem = 0, retry = 0, reset = 0}
  local s = redis.call('GET', KEYS[i])
  k.exists = s and true or false
  if k.alg == 0 then
    k.fmt = '<I' .. k.S
    k.base, k.head, k.count, k.cap = 0, 0, 0, 0
    if s and #s < 24 then
      local e = tonumber(s)
      s = struct.pack(HDR, e, e, 0, 1) .. struct.pack(k.fmt, 0)
      k.compact = true
    end
    if s then
      k.base, k.water, k.head, k.count = struct.unpack(HDR, s)
      k.cap = (#s - 24) / k.S
    end
    k.s = s
  else
    k.idx, k.prev, k.cur = 0, 0, 0
    if s then k.idx, k.prev, k.cur, k.water = struct.unpack(CTR, s) end
  end
  if now < k.water then now = k.water end
  ks[i] = k
end
local ttlx = 0
if now > treal and treal >= 0 then ttlx = math.ceil((now - treal) / 1000) end
local function at(k, i)
  local p = (k.head + i) % k.cap
  return k.base + struct.unpack(k.fmt, k.s, 25 + p * k.S)
end
local function fdiv(a, b)
  local q = math.floor(a / b)
  while q * b > a do q = q - 1 end
  while (q + 1) * b <= a do q = q + 1 end
  return q
end
local function cdiv(a, b)
  local q = fdiv(a, b)
  if q * b < a then q = q + 1 end
  return q
end
-- Evaluate every limit at now, changing nothing yet.
local allowed = 1
for i = 1, nk do
  local k = ks[i]
  local L, W = k.L, k.W
  if k.alg == 0 then
    local dead = now - W
    if k.count > 0 and at(k, 0) <= dead then
      local lo, hi = 0, k.count
      while lo < hi do
        local mid = math.floor((lo + hi) / 2)
        if at(k, mid) <= dead then lo = mid + 1 else hi = mid end
      end
      k.head = (k.head + lo) % k.cap
      k.count = k.count - lo
    end
    k.oldest = now
    if k.count > 0 then k.oldest = at(k, 0) end
    k.rem, k.retry, k.reset = L - k.count, 0, 0
    if k.count > 0 then k.reset = k.oldest + W - now end
    if k.count + n > L then
      k.room = 0
      k.retry = at(k, k.count + n - L - 1) + W - now
    else
      k.room = 1
    end
  else
    local ni = fdiv(now, W)
    if ni == k.idx + 1 then k.prev = k.cur; k.cur = 0 elseif ni ~= k.idx then k.prev = 0; k.cur = 0 end
    k.idx = ni
    local e = now - ni * W
    k.e = e
    local weighted = k.prev * (W - e)
    k.weighted = weighted
    local q = cdiv(weighted, W)
    k.rem = 0
    if k.cur + q < L then k.rem = L - k.cur - q end
    k.reset = 0
    if k.cur > 0 then k.reset = 2 * W - e elseif k.prev > 0 then k.reset = W - e end
    k.retry = 0
    if k.cur + n <= L and weighted <= (L - k.cur - n) * W then
      k.room = 1
    else
      k.room = 0
      if k.cur + n <= L then
        local f = fdiv((L - k.cur - n) * W, k.prev)
        k.retry = W - e - math.min(f, W - e)
      else
        local f = fdiv((L - n) * W, k.cur)
        k.retry = (W - e) + (W - math.min(f, W))
      end
    end
  end
  if k.room == 0 then allowed = 0 end
end
local out = {allowed, now}
if allowed == 1 then
  for i = 1, nk do
    local k, key = ks[i], KEYS[i]
    local L, W = k.L, k.W
    local ttl = k.ttl + ttlx
    if k.alg == 0 then
      if k.count == 0 then k.base = now; k.head = 0 end
      local need = k.count + n
      local S, fmt = k.S, k.fmt
      if need == 1 then
        redis.call('SET', key, string.format('%d', now), 'PX', ttl)
      elseif need > k.cap or now - k.base >= 2 ^ (8 * S) then
        local newcap = k.cap
        if need > newcap then
          newcap = math.min(L, k.cap * 2)
          if newcap < need then newcap = need end
        end
        local newbase = k.base
        if now - k.base >= 2 ^ (8 * S) then newbase = k.oldest end
        local parts = {}
        for j = 0, k.count - 1 do parts[#parts + 1] = struct.pack(fmt, at(k, j) - newbase) end
        parts[#parts + 1] = string.rep(struct.pack(fmt, now - newbase), n)
        parts[#parts + 1] = string.rep('\0', (newcap - need) * S)
        redis.call('SET', key, struct.pack(HDR, newbase, now, 0, need) .. table.concat(parts), 'PX', ttl)
      else
        local e = struct.pack(fmt, now - k.base)
        local pos = (k.head + k.count) % k.cap
        local first = math.min(n, k.cap - pos)
        redis.call('SETRANGE', key, 24 + pos * S, string.rep(e, first))
        if n > first then redis.call('SETRANGE', key, 24, string.rep(e, n - first)) end
        redis.call('SETRANGE', key, 0, struct.pack(HDR, k.base, now, k.head, need))
        redis.call('PEXPIRE', key, ttl)
      end
      k.rem = L - need
      k.reset = k.oldest + W - now
    else
      k.cur = k.cur + n
      redis.call('SET', key, struct.pack(CTR, k.idx, k.prev, k.cur, now), 'PX', ttl)
      local q = cdiv(k.weighted, W)
      k.rem = 0
      if k.cur + q < L then k.rem = L - k.cur - q end
      k.reset = 2 * W - k.e
    end
    out[#out + 1] = 1
    out[#out + 1] = k.rem
    out[#out + 1] = 0
    out[#out + 1] = k.reset
  end
  return out
end
for i = 1, nk do
  local k, key = ks[i], KEYS[i]
  if now > k.water then
    if not k.exists then
      -- Nothing held: keep the watermark alone.
      local v
      if k.alg == 0 then v = struct.pack(HDR, now, now, 0, 0) else v = struct.pack(CTR, k.idx, 0, 0, now) end
      redis.call('SET', key, v, 'PX', k.ttl + ttlx)
    elseif k.alg == 1 then
      redis.call('SETRANGE', key, 24, struct.pack('<i8', now))
    elseif k.compact then
      redis.call('SET', key, string.sub(k.s, 1, 8) .. struct.pack('<i8', now) .. string.sub(k.s, 17), 'KEEPTTL')
    else
      redis.call('SETRANGE', key, 8, struct.pack('<i8', now))
    end
  end
  out[#out + 1] = k.room
  out[#out + 1] = k.rem
  out[#out + 1] = k.retry
  out[#out + 1] = k.reset
end
return out
`)

// inspectScript reads one key's state at now without changing it, for
// operators (Limiter.InspectKey). KEYS[1]: the key. ARGV: algorithm (0
// log, 1 counter), limit L, window W (µs), slot width S, now (µs, or −1
// for TIME). Returns {exists 0|1, remaining, oldest µs (log: the oldest
// live entry's instant, else −1), reset µs, at µs}, where at is the latest
// of now and the key's watermark, as a decision would be made.
var inspectScript = newScript(`
local key = KEYS[1]
local alg = tonumber(ARGV[1])
local L = tonumber(ARGV[2])
local W = tonumber(ARGV[3])
local S = tonumber(ARGV[4])
local now = tonumber(ARGV[5])
if now < 0 then
  local tm = redis.call('TIME')
  now = tonumber(tm[1]) * 1000000 + tonumber(tm[2])
end
local s = redis.call('GET', key)
if not s then return {0, L, -1, 0, now} end
if alg == 0 then
  local HDR = '<i8i8I4I4'
  local fmt = '<I' .. S
  if #s < 24 then
    local e = tonumber(s)
    s = struct.pack(HDR, e, e, 0, 1) .. struct.pack(fmt, 0)
  end
  local base, water, head, count = struct.unpack(HDR, s)
  local cap = (#s - 24) / S
  if now < water then now = water end
  local function at(i)
    return base + struct.unpack(fmt, s, 25 + ((head + i) % cap) * S)
  end
  local dead = now - W
  local lo, hi = 0, count
  while lo < hi do
    local mid = math.floor((lo + hi) / 2)
    if at(mid) <= dead then lo = mid + 1 else hi = mid end
  end
  local live = count - lo
  if live == 0 then return {1, L, -1, 0, now} end
  local oldest = at(lo)
  return {1, L - live, oldest, oldest + W - now, now}
end
local idx, prev, cur, water = struct.unpack('<i8i8i8i8', s)
if now < water then now = water end
local ni = math.floor(now / W)
while ni * W > now do ni = ni - 1 end
while (ni + 1) * W <= now do ni = ni + 1 end
if ni == idx + 1 then prev = cur; cur = 0 elseif ni ~= idx then prev = 0; cur = 0 end
local e = now - ni * W
local weighted = prev * (W - e)
local q = math.floor(weighted / W)
while q * W > weighted do q = q - 1 end
while (q + 1) * W <= weighted do q = q + 1 end
if q * W < weighted then q = q + 1 end
local rem = 0
if cur + q < L then rem = L - cur - q end
local reset = 0
if cur > 0 then reset = 2 * W - e elseif prev > 0 then reset = W - e end
return {1, rem, -1, reset, now}
`)
