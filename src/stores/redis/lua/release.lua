-- dedup release, record format 1 (see docs/REDIS_PROTOCOL.md).
-- KEYS[1]  the record key
-- ARGV[1]  token: 16 hex digits
-- ARGV[2]  retention, ms > 0: how long fence and attempts are kept
-- Reply    1 OK (RELEASED: claimable at once), 0 LOST (nothing changed)
local key = KEYS[1]
local tok, retention = ARGV[1], tonumber(ARGV[2])
local hi, lo = tonumber(string.sub(tok, 1, 8), 16), tonumber(string.sub(tok, 9, 16), 16)
if #tok ~= 16 or not hi or not lo or not retention then
  return redis.error_reply('DEDUPARGS release: bad arguments')
end
local v = redis.call('GET', key)
if not v then return 0 end
if #v < 27 or string.byte(v, 1) ~= 1 then
  return redis.error_reply('DEDUPCORRUPT record is not dedup format 1')
end
local _, ss, ctok = struct.unpack('>BBc8', v)
if ss % 16 ~= 1 or ctok ~= struct.pack('>I4I4', hi, lo) then return 0 end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('SET', key, string.char(1, 3 + 16 * math.floor(ss / 16)) .. string.sub(v, 3, 20) ..
           struct.pack('>I6', now) .. string.sub(v, 27), 'PXAT', now + retention)
return 1
