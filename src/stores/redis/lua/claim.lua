-- dedup claim, record format 2 (see docs/REDIS_PROTOCOL.md).
-- The fresh-key case is also reachable without this script: SET key <record> NX PX
-- lease+retention GET (the store's fast path); this script handles every case.
-- KEYS[1]  the record key (prefix .. key)
-- ARGV[1]  fresh token: 16 hex digits, not all zero
-- ARGV[2]  lease, ms > 0
-- ARGV[3]  retention, ms > 0
-- ARGV[4]  payload fingerprint, may be empty
-- ARGV[5]  max attempts, 0 = unlimited
-- Reply    {outcome, fence, attempt, lease_left_ms, status, result}
--          outcome 0 ACQUIRED, 1 BUSY, 2 DUPLICATE, 3 MISMATCH, 4 EXHAUSTED
-- Record format 2 (docs/REDIS_PROTOCOL.md); format 1 is still read, never written.
local function uv(n)
  local s = ''
  while n >= 128 do
    s = s .. string.char(n % 128 + 128)
    n = math.floor(n / 128)
  end
  return s .. string.char(n)
end
local function rv(v, i)
  local n, m = 0, 1
  for _ = 1, 8 do
    local b = string.byte(v, i)
    if not b then return nil end
    i = i + 1
    if b < 128 then return n + b * m, i end
    n, m = n + (b - 128) * m, m * 128
  end
  return nil
end
local function encode(state, status, tok, fence, attempt, keep, fp, result)
  local flags, v = 64 + state + 4 * status, ''
  if fp ~= '' then flags, v = flags + 16, string.char(#fp) .. fp end
  if state == 1 then v = uv(keep) .. v end
  return string.char(flags) .. tok .. uv(fence) .. uv(attempt) .. v .. result
end
local function decode(v)
  local b = string.byte(v, 1)
  if b == 1 and #v >= 27 then
    local _, ss, tok, fence, attempt, ld, n = struct.unpack('>BBc8I6I4I6B', v)
    local state, status = ss % 16, math.floor(ss / 16)
    if state < 1 or state > 3 or status > 2 or #v < 27 + n then return nil end
    return {fmt = 1, state = state, status = status, tok = tok, fence = fence,
            attempt = attempt, ld = ld, fp = string.sub(v, 28, 27 + n),
            result = string.sub(v, 28 + n)}
  end
  if not b or b < 64 or b >= 96 or #v < 11 then return nil end
  local state, status = b % 4, math.floor(b / 4) % 4
  if state == 0 or status == 3 then return nil end
  local r = {fmt = 2, state = state, status = status, tok = string.sub(v, 2, 9), fp = ''}
  local i
  r.fence, i = rv(v, 10)
  if not r.fence then return nil end
  r.attempt, i = rv(v, i)
  if not r.attempt then return nil end
  if state == 1 then
    r.keep, i = rv(v, i)
    if not r.keep then return nil end
  end
  if b % 32 >= 16 then
    local n = string.byte(v, i)
    if not n or n == 0 or #v < i + n then return nil end
    r.fp, i = string.sub(v, i + 1, i + n), i + 1 + n
  end
  r.result = string.sub(v, i)
  if state ~= 2 and r.result ~= '' then return nil end
  return r
end
-- IN_PROGRESS only: format 2 keeps the distance from lease end to expiry.
local function lease_deadline(key, r)
  if r.fmt == 1 then return r.ld end
  return redis.call('PEXPIRETIME', key) - r.keep
end
local function load(key, what)
  local v = redis.call('GET', key)
  if not v then return nil end
  local r = decode(v)
  if not r then
    return nil, redis.error_reply('DEDUPCORRUPT ' .. what .. ': record is not dedup format 1 or 2 (first byte ' .. tostring(string.byte(v, 1)) .. ', ' .. #v .. ' bytes)')
  end
  return r
end
local key = KEYS[1]
local tok, lease, retention = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])
local fp, max_attempts = ARGV[4], tonumber(ARGV[5])
local hi, lo = tonumber(string.sub(tok, 1, 8), 16), tonumber(string.sub(tok, 9, 16), 16)
if #tok ~= 16 or not hi or not lo or not lease or not retention or not max_attempts
    or #fp > 64 then
  return redis.error_reply('DEDUPARGS claim: bad arguments')
end
local r, err = load(key, 'claim')
if err then return err end
if not r then
  redis.call('SET', key, encode(1, 0, struct.pack('>I4I4', hi, lo), 1, 1, retention, fp, ''),
             'PX', lease + retention)
  return {0, 1, 1}
end
if fp ~= '' and r.fp ~= '' and fp ~= r.fp then
  return {3, r.fence, r.attempt}
end
if r.state == 2 then
  return {2, r.fence, r.attempt, 0, r.status, r.result}
end
if r.state == 1 then
  local t = redis.call('TIME')
  local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  local ld = lease_deadline(key, r)
  if now < ld then return {1, r.fence, r.attempt, ld - now} end
end
-- RELEASED, or IN_PROGRESS with its lease over: a new attempt, if one is left.
if max_attempts > 0 and r.attempt >= max_attempts then
  redis.call('SET', key, encode(2, 2, r.tok, r.fence, r.attempt, 0, r.fp, ''), 'PX', retention)
  return {4, r.fence, r.attempt}
end
if r.fp == '' then r.fp = fp end
redis.call('SET', key, encode(1, 0, struct.pack('>I4I4', hi, lo), r.fence + 1, r.attempt + 1,
                              retention, r.fp, ''), 'PX', lease + retention)
return {0, r.fence + 1, r.attempt + 1}
