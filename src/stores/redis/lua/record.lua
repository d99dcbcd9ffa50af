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
    if b < 128 then
      -- Canonical only: a last byte of 0 after others is a padded encoding.
      if b == 0 and m > 1 then return nil end
      return n + b * m, i
    end
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
    if state < 1 or state > 3 or status > 2 or n > 64 or #v < 27 + n then return nil end
    return {fmt = 1, state = state, status = status, tok = tok, fence = fence,
            attempt = attempt, ld = ld, fp = string.sub(v, 28, 27 + n),
            result = string.sub(v, 28 + n)}
  end
  if not b or b < 64 or b >= 96 or #v < 11 then return nil end
  local state, status = b % 4, math.floor(b / 4) % 4
  -- A status only on COMPLETED (0x45 is not a record).
  if state == 0 or status == 3 or (state ~= 2 and status ~= 0) then return nil end
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
    if not n or n == 0 or n > 64 or #v < i + n then return nil end
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
-- Arguments, checked as the C++ API checks them (src/core/store.cc); a bad one is
-- an error reply 'DEDUPARGS <script>: <what>' and nothing is read or written.
local MAX_MS = 315360000000  -- 10 years (kMaxDuration)
local function bad_args(what, why)
  return redis.error_reply('DEDUPARGS ' .. what .. ': ' .. why)
end
-- A duration in ms: decimal digits, no sign or leading zero, 1 to MAX_MS.
local function arg_ms(s)
  if type(s) ~= 'string' or #s > 12 or not string.find(s, '^[1-9][0-9]*$') then return nil end
  local n = tonumber(s)
  if n > MAX_MS then return nil end
  return n
end
-- A token: exactly 16 lower-case hex digits, not all zero; returned as 8 bytes.
local function arg_token(s)
  if type(s) ~= 'string' or #s ~= 16 or not string.find(s, '^[0-9a-f]+$')
      or s == '0000000000000000' then
    return nil
  end
  return struct.pack('>I4I4', tonumber(string.sub(s, 1, 8), 16),
                     tonumber(string.sub(s, 9, 16), 16))
end
-- A non-negative decimal integer up to `max` (no sign, no leading zero).
local function arg_uint(s, max)
  if type(s) ~= 'string' or #s > 10 or not string.find(s, '^[0-9]+$')
      or (#s > 1 and string.sub(s, 1, 1) == '0') then
    return nil
  end
  local n = tonumber(s)
  if n > max then return nil end
  return n
end
-- The name a batch script gives completion i in its errors. Built only for an
-- error: formatting a number is most of what checking a completion costs.
local function nth(what, i)
  if i then return what .. ': completion ' .. i end
  return what
end
-- The arguments of one completion (complete.lua and the batch scripts): token,
-- retention, completion status, result; i: its place in a batch (nil alone). A
-- table, or nil and the error reply.
local function complete_args(what, i, tok, retention, status, result)
  local ms = retention
  tok, retention, status = arg_token(tok), arg_ms(retention), arg_uint(status, 2)
  if not tok then
    return nil, bad_args(nth(what, i), 'token must be 16 lower-case hex digits, not all 0')
  end
  if not retention then
    return nil, bad_args(nth(what, i), 'retention must be an integer of ms, 1 to ' .. MAX_MS)
  end
  if not status then return nil, bad_args(nth(what, i), 'status must be 0, 1 or 2') end
  if type(result) ~= 'string' or #result > 1048576 then
    return nil, bad_args(nth(what, i), 'result must be at most 1048576 bytes')
  end
  -- px: the retention as given (checked canonical above), so that SET gets it
  -- without a number-to-string conversion.
  return {tok = tok, retention = retention, px = ms, status = status, result = result}
end
-- Completes record r of `key` (as load() gave it, or nil) for completion c: 1 OK
-- (COMPLETED, kept until now + retention), 0 LOST (not IN_PROGRESS under c.tok;
-- nothing changed).
local function complete_record(key, r, c)
  if not r or r.state ~= 1 or r.tok ~= c.tok then return 0 end
  redis.call('SET', key, encode(2, c.status, r.tok, r.fence, r.attempt, 0, r.fp, c.result),
             'PX', c.px)
  return 1
end
