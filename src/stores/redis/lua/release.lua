-- dedup release, record format 2 (see docs/REDIS_PROTOCOL.md).
-- KEYS[1]  the record key
-- ARGV[1]  token: 16 hex digits
-- ARGV[2]  retention, ms > 0: how long fence and attempts are kept
-- Reply    1 OK (RELEASED: claimable at once), 0 LOST (nothing changed)
--@dedup-include record.lua
local key = KEYS[1]
local tok, retention = ARGV[1], tonumber(ARGV[2])
local hi, lo = tonumber(string.sub(tok, 1, 8), 16), tonumber(string.sub(tok, 9, 16), 16)
if #tok ~= 16 or not hi or not lo or not retention then
  return redis.error_reply('DEDUPARGS release: bad arguments')
end
local r, err = load(key, 'release')
if err then return err end
if not r or r.state ~= 1 or r.tok ~= struct.pack('>I4I4', hi, lo) then return 0 end
redis.call('SET', key, encode(3, 0, r.tok, r.fence, r.attempt, 0, r.fp, ''), 'PX', retention)
return 1
