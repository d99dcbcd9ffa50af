-- dedup claim, record format 1 (see docs/REDIS_PROTOCOL.md).
-- KEYS[1]  the record key (prefix .. key)
-- ARGV[1]  fresh token: 16 hex digits, not all zero
-- ARGV[2]  lease, ms > 0
-- ARGV[3]  retention, ms > 0
-- ARGV[4]  payload fingerprint, may be empty
-- ARGV[5]  max attempts, 0 = unlimited
-- Reply    {outcome, fence, attempt, lease_left_ms, status, result}
--          outcome 0 ACQUIRED, 1 BUSY, 2 DUPLICATE, 3 MISMATCH, 4 EXHAUSTED
local key = KEYS[1]
local tok, lease, retention = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])
local fp, max_attempts = ARGV[4], tonumber(ARGV[5])
local hi, lo = tonumber(string.sub(tok, 1, 8), 16), tonumber(string.sub(tok, 9, 16), 16)
if #tok ~= 16 or not hi or not lo or not lease or not retention or not max_attempts then
  return redis.error_reply('DEDUPARGS claim: bad arguments')
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)

local function put(state, status, token, fence, attempt, lease_deadline, fprint, expire_at)
  redis.call('SET', key, struct.pack('>BBc8I6I4I6B', 1, state + 16 * status, token, fence,
                                     attempt, lease_deadline, #fprint) .. fprint,
             'PXAT', expire_at)
end

local v = redis.call('GET', key)
if not v then
  put(1, 0, struct.pack('>I4I4', hi, lo), 1, 1, now + lease, fp, now + lease + retention)
  return {0, 1, 1}
end
if #v < 27 or string.byte(v, 1) ~= 1 then
  return redis.error_reply('DEDUPCORRUPT record is not dedup format 1')
end
local _, ss, ctok, fence, attempt, lease_deadline, fplen = struct.unpack('>BBc8I6I4I6B', v)
local state, status = ss % 16, math.floor(ss / 16)
local cfp = string.sub(v, 28, 27 + fplen)
if fp ~= '' and cfp ~= '' and fp ~= cfp then
  return {3, fence, attempt}
end
if state == 2 then
  return {2, fence, attempt, 0, status, string.sub(v, 28 + fplen)}
end
if state == 1 and now < lease_deadline then
  return {1, fence, attempt, lease_deadline - now}
end
-- RELEASED, or IN_PROGRESS with its lease over: a new attempt, if one is left.
if max_attempts > 0 and attempt >= max_attempts then
  put(2, 2, ctok, fence, attempt, now, cfp, now + retention)
  return {4, fence, attempt}
end
if cfp == '' then cfp = fp end
put(1, 0, struct.pack('>I4I4', hi, lo), fence + 1, attempt + 1, now + lease, cfp,
    now + lease + retention)
return {0, fence + 1, attempt + 1}
