-- dedup extend, record format 1 (see docs/REDIS_PROTOCOL.md).
-- KEYS[1]  the record key
-- ARGV[1]  token: 16 hex digits
-- ARGV[2]  lease, ms > 0
-- Reply    1 OK (lease now ends at now + lease), 0 LOST (nothing changed)
local key = KEYS[1]
local tok, lease = ARGV[1], tonumber(ARGV[2])
local hi, lo = tonumber(string.sub(tok, 1, 8), 16), tonumber(string.sub(tok, 9, 16), 16)
if #tok ~= 16 or not hi or not lo or not lease then
  return redis.error_reply('DEDUPARGS extend: bad arguments')
end
local v = redis.call('GET', key)
if not v then return 0 end
if #v < 27 or string.byte(v, 1) ~= 1 then
  return redis.error_reply('DEDUPCORRUPT record is not dedup format 1')
end
local _, ss, ctok, _, _, lease_deadline = struct.unpack('>BBc8I6I4I6', v)
if ss % 16 ~= 1 or ctok ~= struct.pack('>I4I4', hi, lo) then return 0 end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
-- The record is kept as long after its lease as the claim asked for.
local keep = redis.call('PEXPIRETIME', key) - lease_deadline
if keep < 0 then keep = 0 end
local new_deadline = now + lease
redis.call('SET', key, string.sub(v, 1, 20) .. struct.pack('>I6', new_deadline) ..
           string.sub(v, 27), 'PXAT', new_deadline + keep)
return 1
