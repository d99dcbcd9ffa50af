-- dedup complete, record format 1 (see docs/REDIS_PROTOCOL.md).
-- KEYS[1]  the record key
-- ARGV[1]  token: 16 hex digits
-- ARGV[2]  retention, ms > 0
-- ARGV[3]  completion status: 0 ok, 1 failed, 2 exhausted
-- ARGV[4]  result bytes, may be empty
-- Reply    1 OK (COMPLETED, kept until now + retention), 0 LOST (nothing changed)
local key = KEYS[1]
local tok, retention, status = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])
local hi, lo = tonumber(string.sub(tok, 1, 8), 16), tonumber(string.sub(tok, 9, 16), 16)
if #tok ~= 16 or not hi or not lo or not retention or not status then
  return redis.error_reply('DEDUPARGS complete: bad arguments')
end
local v = redis.call('GET', key)
if not v then return 0 end
if #v < 27 or string.byte(v, 1) ~= 1 then
  return redis.error_reply('DEDUPCORRUPT record is not dedup format 1')
end
local _, ss, ctok, fence, attempt, _, fplen = struct.unpack('>BBc8I6I4I6B', v)
if ss % 16 ~= 1 or ctok ~= struct.pack('>I4I4', hi, lo) then return 0 end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('SET', key, struct.pack('>BBc8I6I4I6', 1, 2 + 16 * status, ctok, fence, attempt, now) ..
           string.sub(v, 27, 27 + fplen) .. ARGV[4], 'PXAT', now + retention)
return 1
