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
// (µs, or −1 for TIME), then three per key: its policy, packed as
// "algorithm L W S TTL" (Limiter.gpol: algorithm 0 log or 1 counter,
// limit L, window W in µs, slot width S, TTL in ms; decoded by pol), the
// client key if the key has a bucket (its field there), else "", and the
// key's cost n.
// Returns {allowed 0|1, at µs, then per key: room 0|1, remaining,
// retry-after µs, reset µs}.
var groupScript = newScript(luaPrelude + groupFunc + `
return GRP(KEYS, ARGV, 0, 0, (#ARGV - 1) / 3)
`)

// groupFunc defines GRP(KEYS, ARGV, KO, AO, nk), groupScript's decision
// of nk keys whose keys start after KEYS[KO] and whose arguments after
// ARGV[AO]: groupBatchScript calls it on its own KEYS and ARGV, which
// costs less than a table of each group's own. It returns GOUT, which
// holds its values followed by nil, and their count: a table made and
// grown per decision costs more than one reused.
const groupFunc = `
local function GRP(KEYS, ARGV, KO, AO, nk)
` + groupBody + `
end
`

// groupBody is GRP's body.
const groupBody = `
local now, treal = clock(ARGV[AO + 1] == '-1' and -1 or ARGV[AO + 1] + 0)
-- The common requests go in straight-line code on locals, as logScript's
-- do: every key a log of cost 1 whose decision needs no eviction, no
-- rebuild beyond a client's second entry, no watermark ahead of now and
-- no reservation ahead. Each key's state goes to GF (GFN slots per key);
-- the first key that does not fit ends the pass, and the general code
-- below decides with what the pass read (rd keys).
local F, fast, allowed, nb, rd = GF, true, 1, nk, 0
for i = 1, nk do
  local a, o = (i - 1) * 3, (i - 1) * GFN
  local b, f = false, false
  if ARGV[AO + a + 3] ~= '' then
    nb = nb + 1
    b, f = KEYS[KO + nb], ARGV[AO + a + 3]
  end
  local P = pol(ARGV[AO + a + 2])
  if P[1] ~= '0' or ARGV[AO + a + 4] ~= '1' then fast = false; break end
  local L, W, S = P[2], P[3], P[4]
  local key = KEYS[KO + i]
  -- m: LM's record of the key; mv: it is of this call.
  local m = LON and LM[key] or false
  local mv, s = m and m[1] == GEN, false
  if mv then s = m[6] else s = RC('GETRANGE', key, '0', RLAST) end
  rd = i
  -- A record's first bytes may hold an older header: the general code
  -- below reads such a key again.
  F[o + 1], F[o + 8], F[o + 10], F[o + 11], F[o + 12], F[o + 13], F[o + 14], F[o + 15], F[o + 16] = not mv and s, false, L, W, S, b, f, P[6], P[5]
  F[o + 17], F[o + 18], F[o + 19] = false, m, mv
  local len, kind = #s, false
  if len > 24 and len < RPRE then
    -- A ring read whole, with live entries only and room to append
    -- without a rebase.
    local base, water, head, count = SU(HDR, s)
    if water <= now and count > 0 and count <= L and now - base < LIM[S] then
      local fmt = FMT[S]
      local cap = (len - 24) / S
      local oldest = base + SU(fmt, s, 25 + head * S)
      local newest = oldest
      if count > 1 then newest = base + SU(fmt, s, 25 + ((head + count - 1) % cap) * S) end
      if oldest > now - W and newest <= now then
        kind = 1
        F[o + 2], F[o + 3], F[o + 4], F[o + 5], F[o + 6], F[o + 7] = base, water, head, count, cap, oldest
        if count == L then allowed = 0 end
      end
    end
  elseif len == RPRE then
    -- A ring longer than what was read (kind 4): it fits when its head
    -- was read, it does not wrap (logPlace), and the slot after its
    -- newest entry exists; those two slots are read (or were), the
    -- latter in the block of slots tailRead reads.
    local base, water, head, count
    if mv then base, water, head, count = m[2], m[3], m[4], m[5] else base, water, head, count = SU(HDR, s) end
    if water <= now and count > 0 and count <= L and now - base < LIM[S] and (head + 1) * S <= RPRE - 24 then
      local fmt = FMT[S]
      local h = SU(fmt, s, 25 + head * S)
      if head == 0 or SU(fmt, s, 25) < h then
        local p = head + count - 1
        -- nw: slot p's offset, when slot p + 1 exists too.
        local nw = false
        if 24 + (p + 2) * S <= RPRE then
          nw = SU(fmt, s, 25 + p * S)
        elseif mv and m[7] and p + 1 < m[7] + m[8] then
          -- The block this call read holds slot p + 1.
          nw = m[9]
        else
          -- q: where slot p starts in t.
          local t, q = tailRead(key, p, S)
          if #t >= q + 2 * S - 1 then nw = SU(fmt, t, q) end
          F[o + 17], F[o + 20] = p - (q - 1) / S, MF(#t / S)
        end
        if nw then
          local oldest = base + h
          if oldest > now - W and base + nw <= now then
            kind = 4
            F[o + 2], F[o + 3], F[o + 4], F[o + 5], F[o + 6], F[o + 7] = base, water, head, count, SF('%d', 24 + (p + 1) * S), oldest
            F[o + 21] = nw
            if count == L then allowed = 0 end
          end
        end
      end
    end
  elseif len == 0 and b and treal >= 0 then
    -- Not in its own key: a new client (kind 2), or a field of its
    -- bucket whose second entry this is (kind 3).
    local hm = RC('HMGET', b, f, '')
    F[o + 8] = hm
    local v = hm[1]
    if not v then
      kind = 2
    else
      local e = v + 0
      if e <= now and e > now - W and L > 1 then
        kind = 3
        F[o + 2] = e
      end
    end
  end
  if not kind then fast = false; break end
  F[o + 9] = kind
end
if fast then
  -- wm: the watermark now as stored, packed once for every key it moves.
  local out, j, wm = GOUT, 2, false
  out[1], out[2] = allowed, now
  for i = 1, nk do
    local o = (i - 1) * GFN
    local key, kind, ttl = KEYS[KO + i], F[o + 9], F[o + 15]
    local L, W = F[o + 10], F[o + 11]
    local room, rem, retry, reset = 1, 0, 0, 0
    if kind == 1 or kind == 4 then
      local s, base, water, head, count, cap, oldest = F[o + 1], F[o + 2], F[o + 3], F[o + 4], F[o + 5], F[o + 6], F[o + 7]
      reset = oldest + W - now
      if allowed == 1 and kind == 4 then
        -- cap: the offset of the slot after the newest entry.
        local S, m, mv = F[o + 12], F[o + 18], F[o + 19]
        RC('SETRANGE', key, cap, SP(FMT[S], now - base))
        RC('SETRANGE', key, '0', SP(HDR, base, now, head, count + 1))
        if not (mv and m[10] == ttl) then RC('PEXPIRE', key, ttl) end
        if not LON then
        elseif 24 + (head + count + 1) * S <= RPRE then
          -- The entry went into the first bytes the record holds.
          if m then m[1] = -1 end
        else
          memoNote(key, m, mv, s, F[o + 17], F[o + 20], base, now, head, count + 1, now - base, treal >= 0 and ttl)
        end
        rem = L - count - 1
      elseif allowed == 1 then
        local S = F[o + 12]
        local e = SP(FMT[S], now - base)
        if count < cap then
          local pos = (head + count) % cap
          RC('SET', key, SP(HDR, base, now, head, count + 1) .. SS(s, 25, 24 + pos * S) ..
            e .. SS(s, 25 + (pos + 1) * S), 'PX', ttl)
        else
          -- A full ring grows to twice its capacity (at most L), its
          -- entries from slot 0, on the same base.
          RC('SET', key, SP(HDR, base, now, 0, count + 1) .. SS(s, 25 + head * S) ..
            SS(s, 25, 24 + head * S) .. e .. string.rep('\0', (math.min(L, 2 * cap) - count - 1) * S), 'PX', ttl)
        end
        rem = L - count - 1
      else
        if now > water then
          if not wm then wm = SP('<i8', now) end
          RC('SETRANGE', key, '8', wm)
        end
        if LON and kind == 4 then
          local m, mv = F[o + 18], F[o + 19]
          memoNote(key, m, mv, s, F[o + 17], F[o + 20], base, now > water and now or water, head, count, F[o + 21], mv and m[10])
        end
        rem = L - count
        if count == L then room, retry = 0, reset end
      end
    elseif kind == 2 then
      if allowed == 1 then
        local k, b = KL, F[o + 13]
        -- The bucket's state read above is fresh unless an earlier key of
        -- this request wrote the same bucket since (bucketAdd).
        local fresh = true
        for j = 1, i - 1 do
          if F[(j - 1) * GFN + 13] == b then fresh = false; break end
        end
        k.bkey, k.field, k.meta, k.inbucket, k.ttl0, k.fresh = b, F[o + 14], F[o + 8][2], false, F[o + 16], fresh
        local put = bucketAdd(k, now, ttl, F[o + 16])
        k.fresh = false
        if not put then RC('SET', key, SF('%d', now), 'PX', ttl) end
        rem, reset = L - 1, W
      else
        -- Nothing held: the key keeps the watermark alone.
        RC('SET', key, SP(HDR, now, now, 0, 0), 'PX', ttl)
        rem = L
      end
    else
      local e, b, f = F[o + 2], F[o + 13], F[o + 14]
      reset = e + W - now
      if allowed == 1 then
        RC('HDEL', b, f)
        RC('SET', key, SP(ring2(F[o + 12]), e, now, 0, 2, 0, now - e), 'PX', ttl)
        rem = L - 2
      else
        if now > e then
          -- The client leaves its bucket for its own key, which holds
          -- the watermark (logRaise).
          RC('HDEL', b, f)
          RC('SET', key, SP(cfmt(F[o + 12]), e, now, 0, 1, 0), 'PX', ttl)
        end
        rem = L - 1
      end
    end
    out[j + 1], out[j + 2], out[j + 3], out[j + 4] = room, rem, retry, reset
    j = j + 4
  end
  out[j + 1] = nil
  return out, j
end
nb = nk
-- What follows may write any key of the request: GEN voids LM's records.
GEN = GEN + 1
local ks = {}
for i = 1, nk do
  local a = 1 + (i - 1) * 3
  local P = pol(ARGV[AO + a + 1])
  -- Every field in the constructor: the table is sized once.
  local k = {alg = P[1], L = P[2], W = P[3], S = P[4], ttl0 = P[5], ttls = P[6], lo = 0,
    n = ARGV[AO + a + 3] + 0, bkey = false, field = false, water = 0, exists = false, inbucket = false, s = false,
    fmt = false, compact = false, part = false, key = false, base = 0, head = 0, count = 0, cap = 0, oldest = 0,
    idx = 0, prev = 0, cur = 0, e = 0, raised = false, room = 0, rem = 0, retry = 0, reset = 0}
  if ARGV[AO + a + 2] ~= '' then
    nb = nb + 1
    k.bkey, k.field = KEYS[KO + nb], ARGV[AO + a + 2]
  end
  if k.alg == '0' then
    k.fmt = FMT[k.S]
    if i <= rd then
      local o = (i - 1) * GFN
      logLoad(k, KEYS[KO + i], true, F[o + 1], F[o + 8] or nil)
    else
      logLoad(k, KEYS[KO + i], true)
    end
  else
    ctrLoad()
    local s = RC('GET', KEYS[KO + i])
    if s then k.exists = true; k.idx, k.prev, k.cur, k.water = SU(CTR, s) end
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
local out, j = GOUT, 2
out[1], out[2] = allowed, now
if allowed == 1 then
  for i = 1, nk do
    local k, key = ks[i], KEYS[KO + i]
    local L, W, n = k.L, k.W, k.n
    local ttl = k.ttls
    if ttlx > 0 then ttl = SF('%d', k.ttl0 + ttlx) end
    if k.alg == '0' then
      local need = logAppend(k, key, now, n, L, ttl)
      k.rem = L - need
      k.reset = k.oldest + W - now
    else
      k.cur = k.cur + n
      RC('SET', key, SP(CTR, k.idx, k.prev, k.cur, now), 'PX', ttl)
      k.rem = ctrRemaining(k, L, W)
      k.reset = ctrReset(k, W)
    end
    out[j + 1], out[j + 2], out[j + 3], out[j + 4] = 1, k.rem, 0, k.reset
    j = j + 4
  end
  out[j + 1] = nil
  return out, j
end
for i = 1, nk do
  local k, key = ks[i], KEYS[KO + i]
  if now > k.water then
    local ttl = k.ttls
    if ttlx > 0 then ttl = SF('%d', k.ttl0 + ttlx) end
    if k.alg == '0' then
      logRaise(k, key, now, ttl)
    elseif not k.exists then
      -- Nothing held: keep the watermark alone.
      RC('SET', key, SP(CTR, k.idx, 0, 0, now), 'PX', ttl)
    else
      RC('SETRANGE', key, '24', SP('<i8', now))
    end
  end
  out[j + 1], out[j + 2], out[j + 3], out[j + 4] = k.room, k.rem, k.retry, k.reset
  j = j + 4
end
out[j + 1] = nil
return out, j
`

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
local s = RC('GET', key)
if not s then return {0, L, -1, 0, now} end
ctrLoad()
local k = {idx = 0, prev = 0, cur = 0, water = 0, e = 0}
k.idx, k.prev, k.cur, k.water = SU(CTR, s)
if now < k.water then now = k.water end
ctrRoll(k, now, W)
return {1, ctrRemaining(k, L, W), -1, ctrReset(k, W), now}
`)
