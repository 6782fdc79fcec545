package redisstore

// groupScript decides one request over several limits at once, all or
// nothing, with the layouts and arithmetic of logScript and counterScript
// (see them for the state each key holds). Every key of the request is
// read first; the request's instant is the latest of now and every key's
// watermark, so that no key ever decides at an earlier instant than it did
// before. Each limit is then evaluated at that instant. If every limit has
// room, every log appends its key's cost n in entries and every counter adds it;
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
// Each key is charged its own cost: a request of refs of different costs
// is decided in this one call, all or nothing, exactly.
//
// KEYS: the distinct keys of the request (one per (policy, client key)),
// then the buckets of those that have one, in the same order. ARGV: now
// (µs, or −1 for TIME), then seven per key: algorithm (0 log, 1 counter),
// limit L, window W (µs), slot width S (log), TTL (ms), the client key if
// the key has a bucket (its field there), else "", and the key's cost n.
// Returns {allowed 0|1, at µs, then per key: room 0|1, remaining,
// retry-after µs, reset µs}.
var groupScript = newScript(luaPrelude + `
local now, treal = clock(ARGV[1] + 0)
local nk = (#ARGV - 1) / 7
local nb = nk
local ks = {}
for i = 1, nk do
  local a = 1 + (i - 1) * 7
  -- Every field in the constructor: the table is sized once.
  local ttl = ARGV[a + 5] + 0
  local k = {alg = ARGV[a + 1], L = ARGV[a + 2] + 0, W = ARGV[a + 3] + 0,
    S = ARGV[a + 4] + 0, ttl0 = ttl, ttls = ARGV[a + 5], lo = 0,
    n = ARGV[a + 7] + 0, bkey = false, field = false, water = 0, exists = false, inbucket = false, s = false,
    fmt = false, compact = false, part = false, key = false, base = 0, head = 0, count = 0, cap = 0, oldest = 0,
    idx = 0, prev = 0, cur = 0, e = 0, raised = false, room = 0, rem = 0, retry = 0, reset = 0}
  if ARGV[a + 6] ~= '' then
    nb = nb + 1
    k.bkey, k.field = KEYS[nb], ARGV[a + 6]
  end
  if k.alg == '0' then
    k.fmt = '<I' .. ARGV[a + 4]
    logLoad(k, KEYS[i], true)
  else
    ctrLoad()
    local s = redis.call('GET', KEYS[i])
    if s then k.exists = true; k.idx, k.prev, k.cur, k.water = struct.unpack(CTR, s) end
  end
  if now < k.water then now = k.water end
  ks[i] = k
end
local ttlx = 0
if now > treal and treal >= 0 then ttlx = math.ceil((now - treal) / 1000) end
-- Evaluate every limit at now, changing nothing yet.
local allowed = 1
for i = 1, nk do
  local k = ks[i]
  local L, W, n = k.L, k.W, k.n
  if k.alg == '0' then
    logEvict(k, now, W, n)
    k.rem, k.retry, k.reset = L - k.count, 0, 0
    if k.count > 0 then k.reset = k.oldest + W - now end
    if k.count + n > L then
      k.room = 0
      k.retry = logAt(k, k.count + n - L - 1) + W - now
    else
      k.room = 1
    end
    if k.count > 0 and logAt(k, k.count - 1) > now then
      -- A reservation lies ahead (reserve.go): no request goes before it.
      k.room = 0
      k.retry = math.max(k.retry, logAt(k, k.count - 1) - now)
      if k.rem < 0 then k.rem = 0 end
    end
  else
    ctrRoll(k, now, W)
    k.rem, k.reset, k.retry = ctrRemaining(k, L, W), ctrReset(k, W), 0
    if ctrRoom(k, n, L, W) then
      k.room = 1
    else
      k.room = 0
      k.retry = ctrRetry(k, n, L, W)
    end
  end
  if k.room == 0 then allowed = 0 end
end
local out = {allowed, now}
if allowed == 1 then
  for i = 1, nk do
    local k, key = ks[i], KEYS[i]
    local L, W, n = k.L, k.W, k.n
    local ttl = k.ttls
    if ttlx > 0 then ttl = string.format('%d', k.ttl0 + ttlx) end
    if k.alg == '0' then
      local need = logAppend(k, key, now, n, L, ttl)
      k.rem = L - need
      k.reset = k.oldest + W - now
    else
      k.cur = k.cur + n
      redis.call('SET', key, struct.pack(CTR, k.idx, k.prev, k.cur, now), 'PX', ttl)
      k.rem = ctrRemaining(k, L, W)
      k.reset = ctrReset(k, W)
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
    local ttl = k.ttls
    if ttlx > 0 then ttl = string.format('%d', k.ttl0 + ttlx) end
    if k.alg == '0' then
      logRaise(k, key, now, ttl)
    elseif not k.exists then
      -- Nothing held: keep the watermark alone.
      redis.call('SET', key, struct.pack(CTR, k.idx, 0, 0, now), 'PX', ttl)
    else
      redis.call('SETRANGE', key, '24', struct.pack('<i8', now))
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
// operators (Limiter.InspectKey). KEYS[1]: the key; KEYS[2], if given,
// its bucket. ARGV: algorithm (0 log, 1 counter), limit L, window W (µs),
// slot width S, now (µs, or −1 for TIME), and with a bucket the client
// key. Returns {exists 0|1, remaining, oldest µs (log: the oldest
// live entry's instant, else −1), reset µs, at µs}, where at is the latest
// of now and the key's watermark, as a decision would be made.
var inspectScript = newScript(luaPrelude + `
local key = KEYS[1]
local alg = ARGV[1]
local L = ARGV[2] + 0
local W = ARGV[3] + 0
local S = ARGV[4] + 0
local now = clock(ARGV[5] + 0)
if alg == '0' then
  local k = {s = false, S = S, fmt = '<I' .. ARGV[4], bkey = KEYS[2] or false, field = ARGV[6] or false,
    ttl0 = 0, exists = false, inbucket = false, compact = false,
    base = 0, water = 0, head = 0, count = 0, cap = 0, oldest = 0}
  logLoad(k, key)
  if not k.exists then return {0, L, -1, 0, now} end
  if now < k.water then now = k.water end
  logEvict(k, now, W)
  if k.count == 0 then return {1, L, -1, 0, now} end
  return {1, L - k.count, k.oldest, k.oldest + W - now, now}
end
local s = redis.call('GET', key)
if not s then return {0, L, -1, 0, now} end
ctrLoad()
local k = {idx = 0, prev = 0, cur = 0, water = 0, e = 0}
k.idx, k.prev, k.cur, k.water = struct.unpack(CTR, s)
if now < k.water then now = k.water end
ctrRoll(k, now, W)
return {1, ctrRemaining(k, L, W), -1, ctrReset(k, W), now}
`)
