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
