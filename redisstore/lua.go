package redisstore

// luaPrelude holds what the scripts share: the clock, exact integer
// division in Lua doubles, and reading, evicting and writing a log and a
// counter in the layouts described at logScript and counterScript. Each
// script is the prelude followed by its own body, so that the single-key
// scripts, the group script and the inspect script decode and encode one
// layout with one piece of code.
//
// A log's state is a table k with the fields S (slot width), fmt
// ('<I' .. S), bkey and field (the client's bucket and its field there,
// or false), ttl0 (the policy's TTL, ms), s (the stored string, decoded
// to a ring), exists, inbucket, compact, base, water, head, count, cap and
// oldest, and for a ring read in part key, part, lo and raised (see
// logLoad and logPlace); a counter's has idx, prev, cur, water and e, and
// its functions come from ctrLoad.
const luaPrelude = `
-- Arguments of redis.call are passed as strings: Redis formats a Lua
-- number with snprintf's %.17g, which costs several times what the
-- command itself does (string.format's %d does not), and strings are read
-- as numbers by arithmetic rather than by tonumber, which parses them
-- twice. The library functions a decision calls most are bound to
-- locals once: a global lookup and a field lookup per call cost more than
-- an upvalue. A Redis Functions library cannot read them while it loads:
-- it binds them at the start of each call (preludeRC in function.go).
local RC, SP, SU, SS, SF, MF = redis.call, struct.pack, struct.unpack, string.sub, string.format, math.floor
local HDR = '<i8i8I4I4'
-- KL: the state of logScript's key, reused by each of its calls: a table
-- of twenty fields costs more to make than to reset. FMT[S]: the slot
-- format of width S (4 to 8, slotWidth). cfmt(S) and ring2(S): the
-- formats of a ring of capacity 1 and 2, made on first use and kept by a
-- function library (under EVALSHA, every call starts without them).
local KL = {}
local FMT = {[4] = '<I4', [5] = '<I5', [6] = '<I6', [7] = '<I7', [8] = '<I8'}
-- LIM[S]: 2 ^ (8 * S), the offsets a slot of width S holds (a power
-- costs a call to the C library; a lookup does not).
local LIM = {[4] = 2 ^ 32, [5] = 2 ^ 40, [6] = 2 ^ 48, [7] = 2 ^ 56, [8] = 2 ^ 64}
local CFMT, RING2 = {}, {}
local function cfmt(S)
  local f = CFMT[S]
  if not f then f = HDR .. 'I' .. S; CFMT[S] = f end
  return f
end
local function ring2(S)
  local f = RING2[S]
  if not f then f = HDR .. 'I' .. S .. 'I' .. S; RING2[S] = f end
  return f
end
local CTR = '<i8i8i8i8'
-- GF: the group script's fast path's state, GFN slots per key, reused by
-- each of its calls (a table of a few fields per key costs more to make).
local GF, GFN = {}, 21
-- GOUT: the values the group script returns (GRP), and BOUT a batch
-- script's, reused by each of their calls with a nil after the last: a
-- table grown per decision costs more.
local GOUT, BOUT = {}, {}
-- pol(p): the group script's policy argument p ("algorithm L W S TTL",
-- Limiter.gpol) decoded, as {algorithm, L, W, S, TTL, TTL as given}.
-- POL keeps what it decoded by argument (under FCALL from call to call,
-- NPOL entries at most): reading four numbers costs more than a lookup.
local POL, NPOL = {}, 0
local function pol(p)
  local v = POL[p]
  if v then return v end
  local alg, L, W, S, ttl = string.match(p, '^(%d) (%d+) (%d+) (%d+) (%d+)$')
  v = {alg, L + 0, W + 0, S + 0, ttl + 0, ttl}
  if NPOL >= 256 then POL, NPOL = {}, 0 end
  POL[p], NPOL = v, NPOL + 1
  return v
end
-- NUM holds, by string, the numbers the scripts read from arguments that
-- repeat from call to call (a policy's limit, window and slot width, a
-- cost): under FCALL from call to call, NNUM entries at most (num adds
-- them). A string read as a number costs several times a lookup.
local NUM, NNUM = {['1'] = 1}, 0
local function num(s)
  local v = s + 0
  if NNUM >= 1024 then NUM, NNUM = {['1'] = 1}, 0 end
  NUM[s], NNUM = v, NNUM + 1
  return v
end
-- (end of NUM)
-- NOWV, NOWS: the last instant a script wrote as a decimal string, and
-- that string: the decisions of one call share their instant, and a
-- string.format costs many times a comparison. BPX holds, by TTL string,
-- the PEXPIRE argument of a bucket that grows (bucketAdd), NBPX entries
-- at most, for a TTL that is the policy's own.
local NOWV, NOWS = -1, '-1'
local BPX, NBPX = {}, 0
-- BUCKET_MAX: the most fields a bucket holds, its state (bucketAdd)
-- included (hash-max-listpack-entries default: a full bucket is still a
-- listpack); clients beyond keep the compact form in their own key.
local BUCKET_MAX = 512
-- TREAL: Redis TIME (µs) when decisions use it, else -1 (a caller clock).
local TREAL = -1
-- clock(now): the instant to decide at (µs) and Redis TIME, which is read
-- when now is negative (else TIME is -1: a caller clock). TIME is read
-- once per call: the decisions of one batch (batchScript) share it.
local function clock(now)
  if now >= 0 then return now, -1 end
  if TREAL >= 0 then return TREAL, TREAL end
  local tm = RC('TIME')
  TREAL = tm[1] * 1000000 + tm[2]
  return TREAL, TREAL
end
-- RPRE: the bytes of a client's own key that a decision reads at first
-- (the header and the first slots); RCH: the slots read at a time beyond
-- them. Bringing a string into a script costs about a microsecond per
-- kilobyte, so a decision on a long ring reads only the slots it looks
-- at, which are near its oldest and newest entries.
local RPRE, RCH = 280, 64
local RLAST = '279' -- RPRE - 1
-- tailRead(key, p, S) reads the block of TB + 1 slots of width S from
-- slot p - p % TB, so that it holds slots p and p + 1 (if they exist),
-- and returns it with where slot p starts in it. The block's offsets are
-- decimal strings, which OFA and OFZ keep by block (under FCALL from call
-- to call, NOF blocks at most): a ring's newest entry moves one slot per
-- append, and a string.format costs more than a longer read.
-- (tailRead)
local OFA, OFZ, NOF, TB = false, false, 0, 8
local function tailRead(key, p, S)
  local c = p - p % TB
  local x = c * 8 + S
  if not OFA then OFA, OFZ = {}, {} end
  local a = OFA[x]
  if not a then
    if NOF >= 1024 then OFA, OFZ, NOF = {}, {}, 0 end
    a = SF('%d', 24 + c * S)
    OFA[x], OFZ[x], NOF = a, SF('%d', 23 + (c + TB + 1) * S), NOF + 1
  end
  return RC('GETRANGE', key, a, OFZ[x]), 1 + (p - c) * S
end
-- (end of tailRead)
-- LM: what groupBatchScript's call knows of the long rings (GRP's kind
-- 4) its group decisions read, by key: a hot key, a route's limit, comes
-- back several times in one call, and its next decision then reads
-- neither the ring's first bytes nor its newest slots again and, under
-- Redis TIME, sets no TTL again (the call's decisions share its instant,
-- which the first grant covers). A record m holds m[1] the call it is
-- from (GEN), m[2] to m[5] the header's base, watermark, head and count
-- as stored, m[6] the ring's first RPRE bytes as read (their header may
-- be older; their slots are as stored), m[7] and m[8] the first slot and
-- the number of slots of a block of slots tailRead read (or false), m[9]
-- the newest entry's offset and m[10] the TTL the call gave the key (or
-- false). LON: the call keeps LM. GRP's fast path keeps LM true to what
-- it writes, in place: a version that rebuilt the ring's first bytes
-- and made a table per decision cost more than the reads it saved. Code
-- that writes otherwise (a single decision, GRP's general path) moves GEN
-- on, which voids every record. Under FCALL the records last from call to
-- call, 64 of them at most (LMN counts them).
local LM, LMN, GEN, LON = {}, 0, 0, false
-- memoNote records in LM what a decision leaves of the long ring key:
-- m and mv are its record and whether it was valid, s the first bytes
-- the decision read (when mv is false), c and n the block it read (c
-- false: none), and the rest as in LM.
local function memoNote(key, m, mv, s, c, n, base, water, head, count, nw, px)
  if not m then
    if LMN >= 64 then LM, LMN = {}, 0 end
    m = {}
    LM[key], LMN = m, LMN + 1
  end
  if not mv then
    m[6], m[7], m[8] = s, c, n
  elseif c then
    m[7], m[8] = c, n
  end
  m[1], m[2], m[3], m[4], m[5], m[9], m[10] = GEN, base, water, head, count, nw, px
end
-- logLoad reads key into k: its own key, else (when the client has a
-- bucket, k.bkey) the client's field in its bucket. The compact form (one
-- entry, which is also the watermark, as its decimal instant) is decoded
-- as a ring of capacity 1. With part, a ring longer than RPRE bytes is
-- read as its first RPRE bytes (k.part: the rest is read by logAt as
-- needed, and by logFull), its capacity left unknown (k.cap false) and
-- k.lo the slots known to exist, until logPlace. pre and hm, when given,
-- are what a caller already read: the GETRANGE of part, and the HMGET of
-- the bucket.
local function logLoad(k, key, part, pre, hm)
  local s = pre
  if s then
    if s == '' then s = false end
  elseif part then
    s = RC('GETRANGE', key, '0', RLAST)
    if s == '' then s = false end
  else
    s = RC('GET', key)
  end
  if not s and k.bkey then
    if TREAL >= 0 then
      -- The bucket's state comes in the same command (bucketAdd).
      local r = hm or RC('HMGET', k.bkey, k.field, '')
      s, k.meta = r[1], r[2]
    else
      s = RC('HGET', k.bkey, k.field)
    end
    k.inbucket = s and true or false
  end
  if not s then return end
  k.exists = true
  if #s < 24 then
    -- The ring of capacity 1 it stands for, made in one pack; its
    -- fields are known without unpacking it.
    local e = s + 0
    k.s = SP(cfmt(k.S), e, e, 0, 1, 0)
    k.compact = true
    k.base, k.water, k.head, k.count, k.cap = e, e, 0, 1, 1
    return
  end
  k.base, k.water, k.head, k.count = SU(HDR, s)
  k.s = s
  if part and #s == RPRE and not k.inbucket then
    k.part = {}
    k.key = key
    k.cap = false
    k.lo = MF((RPRE - 24) / k.S)
    return
  end
  k.cap = (#s - 24) / k.S
end
-- logChunk(k, c, last): chunk c of a ring read in part (RCH slots from
-- slot c * RCH), read through slot last at least; a read that ends short
-- has met the end of the string, which gives the capacity.
local function logChunk(k, c, last)
  local S = k.S
  local from = 24 + c * RCH * S
  local to = math.max(23 + (c + 1) * RCH * S, 23 + (last + 1) * S)
  local ch = RC('GETRANGE', k.key, SF('%d', from), SF('%d', to))
  k.part[c] = ch
  if #ch > 0 and #ch < to - from + 1 then
    k.cap = (from + #ch - 24) / S
  elseif not k.cap then
    k.lo = math.max(k.lo, (to - 23) / S)
  end
  return ch
end
-- logCap learns the capacity of a ring read in part from its length,
-- which the SETRANGE that moves its watermark to now returns: every
-- decision ends with the watermark at now, allowed or not, so that write
-- is never undone, and it costs what a STRLEN would. k.raised: the
-- watermark is written.
local function logCap(k, now)
  local len = RC('SETRANGE', k.key, '8', SP('<i8', now))
  k.raised = true
  k.cap = (len - 24) / k.S
  if len <= RPRE then k.part = false end
end
-- logFull reads the rest of a ring that logLoad read in part.
local function logFull(k, key)
  if k.part then
    k.s = RC('GET', key)
    k.part = false
    k.cap = (#k.s - 24) / k.S
  end
end
-- slotAt(k, p): the stored offset in ring position p (a slot that exists).
local function slotAt(k, p)
  local S = k.S
  local o = 25 + p * S
  if k.part and o + S > RPRE + 1 then
    local c = MF(p / RCH)
    local ch = k.part[c] or logChunk(k, c, p)
    return SU(k.fmt, ch, 1 + (p - c * RCH) * S)
  end
  return SU(k.fmt, k.s, o)
end
-- logAt(k, i): the i-th oldest entry (0-based).
local function logAt(k, i)
  -- A compact log's one entry is its base (slot 0 holds 0).
  if k.compact then return k.base end
  local p = k.head + i
  if k.cap then p = p % k.cap end
  return k.base + slotAt(k, p)
end
-- logPlace(k, now, n), once now is the decision's instant (at least the
-- watermark), for a ring read in part whose capacity is unknown: either
-- the ring does not wrap, its entries and the n slots after them lie in
-- order from its head, and the slots from the newest through those n are
-- read (whose end, if the string is shorter, gives the capacity), or it
-- learns the capacity (logCap). The ring wraps only if slot 0, which then
-- holds an entry appended after the one at the head, is not older than the
-- head's (entries are sorted, and with the head past 0 and no wrap, slot
-- 0 holds an evicted one).
local function logPlace(k, now, n)
  local h = k.head
  if h > 0 and SU(k.fmt, k.s, 25) >= slotAt(k, h) then
    if not k.cap then logCap(k, now) end
    return
  end
  if k.cap then return end
  local last = h + k.count + n - 1
  if last >= k.lo then
    local newest = h + math.max(k.count - 1, 0)
    local c = MF(newest / RCH)
    logChunk(k, c, last)
  end
end
-- logEvict drops the entries <= now - W (the first live one by galloping
-- from the oldest, then binary search: entries are sorted, and the dead
-- ones are few and near the oldest) and sets k.oldest, the oldest live
-- entry or now. now is the decision's instant and n its cost: a ring read
-- in part is placed here (logPlace).
local function logEvict(k, now, W, n)
  if not k.cap then logPlace(k, now, n or 1) end
  local dead = now - W
  k.oldest = now
  if k.count == 0 then return end
  local o = logAt(k, 0)
  if o <= dead then
    -- logAt(k, lo - 1) <= dead; the first live entry is at most hi.
    local lo, hi = 1, 1
    while hi < k.count and logAt(k, hi) <= dead do
      lo = hi + 1
      hi = hi * 2
    end
    if hi > k.count then hi = k.count end
    while lo < hi do
      local mid = MF((lo + hi) / 2)
      if logAt(k, mid) <= dead then lo = mid + 1 else hi = mid end
    end
    k.head = k.head + lo
    if k.cap then k.head = k.head % k.cap end
    k.count = k.count - lo
    if k.count == 0 then return end
    o = logAt(k, 0)
  end
  k.oldest = o
end
-- A client in its bucket is a field, the decimal instant of its one
-- entry. Under a caller clock, bucketPut keeps it there and makes the
-- bucket last at least ttl ms; h is the bucket's length before (0: the
-- bucket is new, so it has no TTL yet), or -1 when the client already was
-- a field. That clock may step back any distance, so nothing is forgotten
-- by it: fields go with their bucket, when its TTL (real time) runs out.
-- GT: PEXPIRE takes GT (Redis 7.0), which lengthens a TTL and never
-- shortens it in one command; on Redis 6.2 the first refusal of it turns
-- to PTTL and PEXPIRE for the rest of the call.
local GT = true
local function lengthen(b, ttl)
  if GT then
    if type(redis.pcall('PEXPIRE', b, ttl, 'GT')) == 'number' then return end
    GT = false
  end
  if RC('PTTL', b) < ttl + 0 then RC('PEXPIRE', b, ttl) end
end
local function bucketPut(k, now, ttl, h)
  local b = k.bkey
  RC('HSET', b, k.field, SF('%d', now))
  if h == 0 then
    RC('PEXPIRE', b, ttl)
  else
    lengthen(b, ttl)
  end
end
-- Under Redis TIME a bucket also holds its own state, the field '' (no
-- client key is empty): E * 1024 + U in decimal. E is the instant (ms,
-- Redis's clock) the bucket lasts at least until: the scripts set its
-- expiry there, and no writer shortens it. U bounds its client fields
-- from above: a new field adds one, and an HDEL only lowers the true
-- count. The first field of a bucket writes its state with it, so a
-- bucket without one is new. (A store under a caller clock keeps no
-- state: sharing its buckets with a store under Redis TIME, which is
-- sharing keys across two timelines, would leave U short of the count,
-- which costs memory, a bucket past the listpack's size, and never
-- exactness.) So a new field costs one HSET (field and state), and the
-- commands a bucket needs now and then are decided from that state:
-- its expiry is set a quarter of the TTL (1/BSLACK) past the need, so
-- one PEXPIRE covers the new fields of that long (a bucket whose
-- clients all went quiet lasts that much longer); its length is read
-- only when U says it may be full. A new field that makes U a multiple
-- of SWEEP_EVERY samples SWEEP_MANY fields and forgets those past their
-- TTL (k.ttl0 ms after their instant by TIME, when their own key would
-- have expired), so that the fields of clients gone quiet do not pile up
-- in a bucket that other clients keep alive: two per new field. A sample
-- shorter than asked is the whole bucket, which makes U exact. BMK and
-- BMV hold the bucket this call last wrote and its state, for a group of
-- several clients of one bucket; a table per call would cost more. k.fresh:
-- k.meta was read after every write of this call to k's bucket (the group
-- script's fast path reads every key before it writes any), so it holds
-- even when the call wrote another bucket since. tn, when given, is ttl
-- as a number (a string read as a number costs a strtod).
local BSLACK, SWEEP_EVERY, SWEEP_N, SWEEP_MANY = 4, 8, 16, '16'
local BMK, BMV = false, false
local function bucketAdd(k, now, ttl, tn)
  local b = k.bkey
  local m = k.meta
  if BMK == b then
    m = BMV
  elseif (BMK and not k.fresh) or m == nil then
    -- What this call read may be stale (it wrote another bucket since),
    -- or a client read from its own key has not read the state.
    m = RC('HGET', b, '')
  end
  local E, U, had = 0, 0, m and true or false
  if m then
    local v = m + 0
    E = MF(v / 1024)
    U = v - E * 1024
  end
  local put = not k.inbucket
  if put then
    U = U + 1
    -- With its state, the bucket holds U + 1 fields at most.
    if U + 1 > BUCKET_MAX or U % SWEEP_EVERY == 0 then
      local r = RC('HRANDFIELD', b, SWEEP_MANY, 'WITHVALUES')
      local gone = 0
      for i = 1, #r, 2 do
        if r[i] ~= '' and r[i] ~= k.field and TREAL - r[i + 1] >= k.ttl0 * 1000 then
          RC('HDEL', b, r[i])
          gone = gone + 1
        end
      end
      if #r < 2 * SWEEP_N then
        U = #r / 2 - gone + 1
        if had then U = U - 1 end
      else
        U = U - gone
      end
      if U + 1 > BUCKET_MAX then
        U = RC('HLEN', b) + 1
        if had then U = U - 1 end
        if U + 1 > BUCKET_MAX then return false end
      end
    end
  end
  tn = tn or ttl + 0
  local need = MF(TREAL / 1000) + tn
  local grow = need > E
  if grow then E = need + MF(k.ttl0 / BSLACK) end
  if now ~= NOWV then NOWV, NOWS = now, SF('%d', now) end
  if put or grow or not had then
    local st = SF('%d', E * 1024 + U)
    RC('HSET', b, k.field, NOWS, '', st)
    BMK, BMV = b, st
  else
    RC('HSET', b, k.field, NOWS)
  end
  -- Set relative to the command's own clock: TIME, read once per call,
  -- may be older than the TTL by now (a long batch, a stalled server), and
  -- PEXPIREAT at an instant already past deletes the bucket at once. A
  -- bucket that grows lasts E - TIME = ttl + ttl0 / BSLACK from now.
  -- (Kept only for a TTL that is the policy's own: an extended one may
  -- equal another policy's.)
  if grow then
    local px = false
    if tn == k.ttl0 then px = BPX[ttl] end
    if not px then
      px = SF('%d', tn + MF(k.ttl0 / BSLACK))
      if tn == k.ttl0 then
        if NBPX >= 256 then BPX, NBPX = {}, 0 end
        BPX[ttl], NBPX = px, NBPX + 1
      end
    end
    RC('PEXPIRE', b, px)
  end
  return true
end
-- logRaise moves the watermark up to now and writes nothing else; a key
-- that held nothing is created holding its watermark alone (a ring of
-- capacity 0). A client in its bucket moves to its own key: the compact
-- form holds no watermark apart from its entry.
local function logRaise(k, key, now, ttl)
  if k.raised then return end
  if not k.exists then
    RC('SET', key, SP(HDR, now, now, 0, 0), 'PX', ttl)
  elseif k.inbucket then
    RC('HDEL', k.bkey, k.field)
    RC('SET', key, SS(k.s, 1, 8) .. SP('<i8', now) .. SS(k.s, 17), 'PX', ttl)
  elseif k.compact then
    RC('SET', key, SS(k.s, 1, 8) .. SP('<i8', now) .. SS(k.s, 17), 'KEEPTTL')
  else
    RC('SETRANGE', key, '8', SP('<i8', now))
  end
end
-- logAppend appends n entries at now (after logEvict, with room checked)
-- and returns the entries held.
local function logAppend(k, key, now, n, L, ttl)
  local base0 = k.base
  if k.count == 0 then k.base = now; k.head = 0 end
  local need = k.count + n
  local S, fmt = k.S, k.fmt
  local lim = LIM[S]
  if need == 1 then
    -- One entry, at now, which is then the watermark too: the compact
    -- form, a field of the client's bucket, or (clients without one, or
    -- whose bucket is full) an integer in its own key, which Redis keeps
    -- in the object header.
    if k.bkey and TREAL >= 0 and bucketAdd(k, now, ttl) then
      if k.exists and not k.inbucket then RC('DEL', key) end
    else
      local h = -1
      if k.bkey and TREAL < 0 and not k.inbucket then h = RC('HLEN', k.bkey) end
      if k.bkey and TREAL < 0 and h < BUCKET_MAX then
        bucketPut(k, now, ttl, h)
        if k.exists and not k.inbucket then RC('DEL', key) end
      else
        if now ~= NOWV then NOWV, NOWS = now, SF('%d', now) end
        RC('SET', key, NOWS, 'PX', ttl)
      end
    end
  elseif (k.cap and need > k.cap) or now - k.base >= lim then
    -- Rebuild: linearize the ring, grow it, rebase it if needed. A client
    -- leaves its bucket for its own key here (its capacity there is 1).
    if k.inbucket then RC('HDEL', k.bkey, k.field) end
    if k.compact and k.count == 1 and n == 1 then
      -- A client's second entry, the common rebuild: a ring of two on
      -- the first entry's base (within W of now, so no rebase), in one
      -- pack.
      RC('SET', key, SP(ring2(S), k.base, now, 0, 2, 0, now - k.base), 'PX', ttl)
      return need
    end
    logFull(k, key)
    local newcap = k.cap
    if need > newcap then
      newcap = math.min(L, k.cap * 2)
      if newcap < need then newcap = need end
    end
    local newbase = k.base
    if now - k.base >= lim then newbase = k.oldest end
    local body
    local h, c = k.head, k.count
    if c == 0 then
      body = ''
    elseif newbase == k.base then
      -- The same base: the live slots are copied as they are stored.
      if h + c <= k.cap then
        body = SS(k.s, 25 + h * S, 24 + (h + c) * S)
      else
        body = SS(k.s, 25 + h * S, 24 + k.cap * S) .. SS(k.s, 25, 24 + (h + c - k.cap) * S)
      end
    else
      local parts = {}
      for i = 0, c - 1 do parts[i + 1] = SP(fmt, logAt(k, i) - newbase) end
      body = table.concat(parts)
    end
    RC('SET', key, SP(HDR, newbase, now, 0, need) .. body .. string.rep(SP(fmt, now - newbase), n) ..
      string.rep('\0', (newcap - need) * S), 'PX', ttl)
  else
    local e = SP(fmt, now - k.base)
    -- Without a capacity, logPlace found the slots after the newest.
    local pos, first = k.head + k.count, n
    if k.cap then
      pos = pos % k.cap
      first = math.min(n, k.cap - pos)
    end
    if not k.part then
      -- A ring read whole is rewritten whole: one command instead of
      -- three. Each value is one concatenation (one string made).
      local s, hdr = k.s, SP(HDR, k.base, now, k.head, need)
      if n > first then
        s = hdr .. string.rep(e, n - first) .. SS(s, 25 + (n - first) * S, 24 + pos * S) .. string.rep(e, first)
      elseif n == 1 then
        s = hdr .. SS(s, 25, 24 + pos * S) .. e .. SS(s, 25 + (pos + 1) * S)
      else
        s = hdr .. SS(s, 25, 24 + pos * S) .. string.rep(e, n) .. SS(s, 25 + (pos + n) * S)
      end
      RC('SET', key, s, 'PX', ttl)
    else
      RC('SETRANGE', key, SF('%d', 24 + pos * S), string.rep(e, first))
      if n > first then RC('SETRANGE', key, '24', string.rep(e, n - first)) end
      if k.raised and k.base == base0 then
        -- logCap wrote the watermark: the head and the count are left.
        RC('SETRANGE', key, '16', SP('<I4I4', k.head, need))
      else
        RC('SETRANGE', key, '0', SP(HDR, k.base, now, k.head, need))
      end
      RC('PEXPIRE', key, ttl)
    end
  end
  return need
end
-- The counter's functions are made by ctrLoad, which a script calls
-- before it decides a counter: every call of a script runs this prelude
-- again, and making closures is not free, while most decisions are on
-- logs alone.
local fdiv, mul, cmpmul, mdiv, ctrRoll, ctrRoom, ctrRemaining, ctrReset, ctrRetry
local function ctrLoad()
  if fdiv then return end
  -- floor(a / b) for integers a >= 0, b > 0 with a < 2^53.
  function fdiv(a, b)
    local q = MF(a / b)
    while q * b > a do q = q - 1 end
    while (q + 1) * b <= a do q = q + 1 end
    return q
  end
  -- The counter's products (a count, up to 2^32, times a span of the
  -- window, up to 2^45 µs) exceed the 2^53 that doubles hold exactly, so
  -- they are compared as three limbs of 24 bits. mul(x, y): x*y for integers
  -- 0 <= x, y < 2^48, as hi, mid, lo with x*y = (hi*2^24 + mid)*2^24 + lo.
  local LIMB = 16777216
  function mul(x, y)
    local x1 = MF(x / LIMB)
    local x0 = x - x1 * LIMB
    local y1 = MF(y / LIMB)
    local y0 = y - y1 * LIMB
    local p0 = x0 * y0
    local lo = p0 % LIMB
    local m = x1 * y0 + x0 * y1 + (p0 - lo) / LIMB
    local mid = m % LIMB
    return x1 * y1 + (m - mid) / LIMB, mid, lo
  end
  -- cmpmul(a, b, c, d): -1, 0 or 1 as a*b is below, equal to or above c*d.
  function cmpmul(a, b, c, d)
    local h1, m1, l1 = mul(a, b)
    local h2, m2, l2 = mul(c, d)
    if h1 ~= h2 then return h1 < h2 and -1 or 1 end
    if m1 ~= m2 then return m1 < m2 and -1 or 1 end
    if l1 ~= l2 then return l1 < l2 and -1 or 1 end
    return 0
  end
  -- mdiv(x, y, d): floor(x*y / d) for integers 0 <= x, y < 2^48 and
  -- 0 < d < 2^48 whose quotient is below 2^47; the double's estimate is
  -- corrected by exact products.
  function mdiv(x, y, d)
    local q = MF(x * y / d)
    while q > 0 and cmpmul(q, d, x, y) > 0 do q = q - 1 end
    while cmpmul(q + 1, d, x, y) <= 0 do q = q + 1 end
    return q
  end
  -- ctrRoll moves a counter to the window of now: k.idx, the counts, and
  -- the elapsed part e of the window (the previous window weighs
  -- prev*(W - e)/W).
  function ctrRoll(k, now, W)
    local ni = fdiv(now, W)
    if ni == k.idx + 1 then k.prev = k.cur; k.cur = 0 elseif ni ~= k.idx then k.prev = 0; k.cur = 0 end
    k.idx = ni
    k.e = now - ni * W
  end
  -- ctrRoom: the estimate prev*(W - e)/W + cur leaves room for n.
  function ctrRoom(k, n, L, W)
    return k.cur + n <= L and cmpmul(k.prev, W - k.e, L - k.cur - n, W) <= 0
  end
  -- ctrRemaining: L - cur - ceil(prev*(W - e)/W), at least 0.
  function ctrRemaining(k, L, W)
    local q = 0
    if k.prev > 0 then
      q = mdiv(k.prev, W - k.e, W)
      if cmpmul(q, W, k.prev, W - k.e) < 0 then q = q + 1 end
    end
    if k.cur + q < L then return L - k.cur - q end
    return 0
  end
  function ctrReset(k, W)
    if k.cur > 0 then return 2 * W - k.e elseif k.prev > 0 then return W - k.e end
    return 0
  end
  -- ctrRetry: the wait until n more fit (k had no room): within this window
  -- while prev*(W - e - d) <= (L - cur - n)*W can hold, else in the next,
  -- where cur decays.
  function ctrRetry(k, n, L, W)
    local e = k.e
    if k.cur + n <= L then
      local f = mdiv(L - k.cur - n, W, k.prev)
      return W - e - math.min(f, W - e)
    end
    local f = mdiv(L - n, W, k.cur)
    return (W - e) + (W - math.min(f, W))
  end
end
`
