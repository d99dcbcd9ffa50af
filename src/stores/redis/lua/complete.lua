-- dedup complete, record format 2 (see docs/REDIS_PROTOCOL.md).
-- KEYS[1]  the record key
-- ARGV[1]  token: 16 hex digits
-- ARGV[2]  retention, ms > 0
-- ARGV[3]  completion status: 0 ok, 1 failed, 2 exhausted
-- ARGV[4]  result bytes, may be empty
-- Reply    1 OK (COMPLETED, kept until now + retention), 0 LOST (nothing changed)
--@dedup-include record.lua
local key = KEYS[1]
local tok, retention, status = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])
local hi, lo = tonumber(string.sub(tok, 1, 8), 16), tonumber(string.sub(tok, 9, 16), 16)
if #tok ~= 16 or not hi or not lo or not retention or not status or status < 0 or status > 2
    or status % 1 ~= 0 then
  return redis.error_reply('DEDUPARGS complete: bad arguments')
end
local r, err = load(key, 'complete')
if err then return err end
if not r or r.state ~= 1 or r.tok ~= struct.pack('>I4I4', hi, lo) then return 0 end
redis.call('SET', key, encode(2, status, r.tok, r.fence, r.attempt, 0, r.fp, ARGV[4]),
           'PX', retention)
return 1
