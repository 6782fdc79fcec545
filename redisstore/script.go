package redisstore

import (
	"crypto/sha1"
	"encoding/hex"
	"regexp"
	"strings"
)

// script is a Lua script with its SHA1, for EVALSHA, and its function in
// the library (function.go), for FCALL.
type script struct {
	body  string
	sha   string
	fbody string // body without the prelude: the function's
	fn    string // the function's name, set by library
	flags string // script flags (Redis 7): its shebang's and its function's
}

// newScript makes a script of body, which starts with luaPrelude or uses
// none of it, and adds it to the library; it is called at package
// initialization only. The function keeps body as written; the script
// for EVALSHA is evalText(body).
func newScript(body string) *script {
	text := evalText(body)
	sum := sha1.Sum([]byte(text))
	s := &script{body: text, sha: hex.EncodeToString(sum[:]), fbody: strings.TrimPrefix(body, luaPrelude)}
	allScripts = append(allScripts, s)
	return s
}

// evalText returns body as EVALSHA runs it, which runs the prelude in
// every call: without the prelude's locals that save lookups from call to
// call under FCALL (preludeRC's library functions and NUM), which would
// cost a script more to bind than they save in one call. Each RC( is
// redis.call( again, and so on, and NUM[ARGV[i]] or num(ARGV[i]) is
// ARGV[i] + 0.
func evalText(body string) string {
	body = strings.Replace(body, preludeRC, "", 1)
	body = cut(body, "local NUM, NNUM", "-- (end of NUM)\n", "")
	body = cut(body, "-- (tailRead)\n", "-- (end of tailRead)\n", evalTailRead)
	body = evalCalls.ReplaceAllStringFunc(body, func(m string) string { return evalNames[m[:2]] + "(" })
	return evalNum.ReplaceAllString(body, "$1 + 0")
}

// cut replaces the text of body from the first from through the first
// to after it with repl.
func cut(body, from, to, repl string) string {
	i := strings.Index(body, from)
	j := strings.Index(body, to)
	if i < 0 || j < i {
		return body
	}
	return body[:i] + repl + body[j+len(to):]
}

// evalTailRead is tailRead for EVALSHA: no offsets to keep from call to
// call, so the two slots alone.
const evalTailRead = `local function tailRead(key, p, S)
  return RC('GETRANGE', key, SF('%d', 24 + p * S), SF('%d', 23 + (p + 2) * S)), 1
end
`

var (
	evalCalls = regexp.MustCompile(`\b(RC|SP|SU|SS|SF|MF)\(`)
	evalNames = map[string]string{"RC": "redis.call", "SP": "struct.pack", "SU": "struct.unpack",
		"SS": "string.sub", "SF": "string.format", "MF": "math.floor"}
	evalNum = regexp.MustCompile(`NUM\[(ARGV\[\d+\])\] or num\(ARGV\[\d+\]\)`)
)

// Log layout: one Redis string per (policy, client key), except for a
// client holding exactly one entry whose instant is also its watermark (a
// client that sent one request, the common case at a million clients).
// That state is the compact form, the instant in decimal, kept as the
// client's field in a hash shared by many clients, its bucket:
//
//	bucket key: prefix + policy + ":1{" + slot tag + "}"   field: client key
//
// one bucket per policy and cluster slot, so in the slot of the client's
// own key; a Redis key costs about 130 bytes whatever it holds, a field of
// a small hash about 30 (docs/distributed.md). Client keys of more than
// maxBucketField bytes, which would turn a bucket into a hash table, and
// clients whose bucket is full (BUCKET_MAX fields, 512: still a listpack
// at Redis's default hash-max-listpack-entries; under Redis TIME one of
// them is the bucket's own state, the field "", see bucketAdd) keep the
// compact form in their own key instead, where Redis encodes the decimal
// as an integer inside the object header. The state of a client
// is in one place at a time: the script reads its own key, else its field,
// and moves it from one to the other as it changes. Any other state is a
// ring of fixed-width offsets behind a 24-byte header:
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
// key holding k entries costs 24 + S·cap bytes with cap < 2k (see
// docs/distributed.md for the per-key totals). Entries are kept sorted (appends are at the
// newest instant, which never decreases), so the first live entry is found
// by binary search: eviction is O(log L) whatever the number of expired
// entries. When the newest instant no longer fits S bytes above base, the
// ring is rebased on its oldest live entry, which is within W of now: that
// leaves at least 2^(8S) − W ≥ 2^(8S)/8 µs of headroom (8.9 min for 4-byte
// slots), so a key is rebased, an O(L) rewrite, at most once per that long.
//
// See docs/distributed.md for the measurements behind this choice.
//
// KEYS[1]: the client's own key; KEYS[2], if given, its bucket. ARGV:
// limit L, window W (µs), cost n, now (µs, or −1 to read the server's
// TIME), slot width S, TTL (ms), and with a bucket the client key (the
// field). Returns {allowed 0|1, remaining, retry-after µs, reset µs, at
// µs}.
var logScript = newScript(luaPrelude + logBody)

// luaArgs reads the arguments the log and counter scripts share: the key,
// L, W, n, the TTL and the instant to decide at (ARGV as logScript's).
const luaArgs = `
local key = KEYS[1]
local L = NUM[ARGV[1]] or num(ARGV[1])
local W = NUM[ARGV[2]] or num(ARGV[2])
local n = NUM[ARGV[3]] or num(ARGV[3])
local ttl = ARGV[6]
local now, treal = clock(ARGV[4] == '-1' and -1 or ARGV[4] + 0)
`

// logBody is logScript without the prelude: batchScript runs it too.
const logBody = luaArgs + `
local S = NUM[ARGV[5]] or num(ARGV[5])
local s = RC('GETRANGE', key, '0', RLAST)
local hm = nil
if treal >= 0 and n == 1 then
  -- The common decisions, in straight-line code on locals: each Lua
  -- instruction, call and table field costs Redis CPU. Under Redis TIME,
  -- cost 1, and no watermark ahead of TIME, no entry to evict, no
  -- reservation ahead and no rebuild beyond a client's second entry;
  -- anything else goes on to the general code below, with what was read.
  local len = #s
  if len > 24 and len < RPRE then
    -- A ring read whole.
    local fmt = FMT[S]
    local base, water, head, count = SU(HDR, s)
    local cap = (len - 24) / S
    if water <= now and count > 0 then
      local oldest = base + SU(fmt, s, 25 + head * S)
      local newest = oldest
      if count > 1 then newest = base + SU(fmt, s, 25 + ((head + count - 1) % cap) * S) end
      if oldest > now - W and newest <= now then
        if count == L then
          -- Refused (see below): the oldest entry's expiry makes room, and
          -- the watermark moves to now.
          if now > water then RC('SETRANGE', key, '8', SP('<i8', now)) end
          return {0, 0, oldest + W - now, oldest + W - now, now}
        end
        if count < L and now - base < LIM[S] then
          if count < cap then
            local pos = (head + count) % cap
            RC('SET', key, SP(HDR, base, now, head, count + 1) .. SS(s, 25, 24 + pos * S) ..
              SP(fmt, now - base) .. SS(s, 25 + (pos + 1) * S), 'PX', ttl)
          else
            -- A full ring grows to twice its capacity (at most L), its
            -- entries from slot 0, on the same base.
            RC('SET', key, SP(HDR, base, now, 0, count + 1) .. SS(s, 25 + head * S) ..
              SS(s, 25, 24 + head * S) .. SP(fmt, now - base) ..
              string.rep('\0', (math.min(L, 2 * cap) - count - 1) * S), 'PX', ttl)
          end
          return {1, L - count - 1, 0, oldest + W - now, now}
        end
      end
    end
  elseif len == 0 and KEYS[2] then
    -- Not in its own key: a field of its bucket, or a new client.
    local b, f = KEYS[2], ARGV[7]
    hm = RC('HMGET', b, f, '')
    local v = hm[1]
    if not v then
      local k = KL
      k.bkey, k.field, k.meta, k.inbucket, k.ttl0 = b, f, hm[2], false, NUM[ARGV[6]] or num(ARGV[6])
      if not bucketAdd(k, now, ttl, k.ttl0) then RC('SET', key, SF('%d', now), 'PX', ttl) end
      return {1, L - 1, 0, W, now}
    end
    local e = v + 0
    if e <= now and e > now - W and L > 1 then
      -- Its second entry: a ring of two in its own key.
      RC('HDEL', b, f)
      RC('SET', key, SP(ring2(S), e, now, 0, 2, 0, now - e), 'PX', ttl)
      return {1, L - 2, 0, e + W - now, now}
    end
  end
end
local k = KL
k.s, k.S, k.fmt, k.bkey, k.field, k.ttl0 = false, S, FMT[S], KEYS[2] or false, ARGV[7] or false, NUM[ARGV[6]] or num(ARGV[6])
k.exists, k.inbucket, k.compact, k.part, k.key, k.raised, k.meta, k.lo = false, false, false, false, false, false, nil, nil
k.base, k.water, k.head, k.count, k.cap, k.oldest = 0, 0, 0, 0, 0, 0
logLoad(k, key, true, s, hm)
local water0 = k.water
if now < k.water then now = k.water end
-- Redis expires keys on its own clock: when the watermark is ahead of
-- TIME (the clock stepped back), the key must last that much longer.
if now > treal and treal >= 0 then ttl = SF('%d', ttl + math.ceil((now - treal) / 1000)) end
logEvict(k, now, W, n)
local count = k.count
-- The newest entry, and the one whose expiry makes room for n (j: its
-- index); logEvict read the oldest.
local newest, j, ej = now, count + n - L - 1, 0
if count == 1 then newest = k.oldest elseif count > 1 then newest = logAt(k, count - 1) end
if j == 0 then ej = k.oldest elseif j > 0 then ej = logAt(k, j) end
if count > 0 and newest > now then
  -- A reservation lies ahead (reserve.go): no request goes before it.
  local f = newest
  if j >= 0 and ej + W > f then f = ej + W end
  if now > water0 then logRaise(k, key, now, ttl) end
  return {0, math.max(L - count, 0), f - now, k.oldest + W - now, now}
end
if j >= 0 then
  -- Refused: nothing is written but the watermark, so that no later
  -- decision on the key is made at an earlier instant, whatever the
  -- clock does next.
  if now > water0 then logRaise(k, key, now, ttl) end
  return {0, L - count, ej + W - now, k.oldest + W - now, now}
end
local need = logAppend(k, key, now, n, L, ttl)
return {1, L - need, 0, k.oldest + W - now, now}
`

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
// The arithmetic is the engine's (shard.counterDecide) in Lua doubles:
// the products of a count and a span of the window, beyond the 2^53 that
// doubles hold, are compared in 24-bit limbs (mul in luaPrelude), and each
// division is corrected by those exact products, so that floor and ceil
// are exact for every limit and window a policy can have.
//
// KEYS[1]: the key. ARGV: limit L, window W (µs), cost n, now (µs, or −1
// for TIME), unused, TTL (ms). Returns as the log script.
var counterScript = newScript(luaPrelude + counterBody)

// counterBody is counterScript without the prelude: batchScript runs it
// too.
const counterBody = luaArgs + `
ctrLoad()
local k = {idx = 0, prev = 0, cur = 0, water = 0, e = 0}
local s = RC('GET', key)
if s then k.idx, k.prev, k.cur, k.water = SU(CTR, s) end
local water0 = k.water
if now < k.water then now = k.water end
if now > treal and treal >= 0 then ttl = SF('%d', ttl + math.ceil((now - treal) / 1000)) end
ctrRoll(k, now, W)
if ctrRoom(k, n, L, W) then
  k.cur = k.cur + n
  RC('SET', key, SP(CTR, k.idx, k.prev, k.cur, now), 'PX', ttl)
  return {1, ctrRemaining(k, L, W), 0, ctrReset(k, W), now}
end
if now > water0 and s then
  RC('SETRANGE', key, '24', SP('<i8', now))
end
return {0, ctrRemaining(k, L, W), ctrRetry(k, n, L, W), ctrReset(k, W), now}
`
