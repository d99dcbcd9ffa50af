-- dedup release, record format 2 (see docs/REDIS_PROTOCOL.md).
-- KEYS[1]  the record key
-- ARGV[1]  token: 16 hex digits
-- ARGV[2]  retention, ms > 0: how long fence and attempts are kept
-- Reply    1 OK (RELEASED: claimable at once), 0 LOST (nothing changed)
--@dedup-include record.lua
local key, key_err = record_key('release', 2)
if key_err then return key_err end
local tok, retention = arg_token(ARGV[1]), arg_ms(ARGV[2])
if not tok then return bad_args('release', 'token must be 16 lower-case hex digits, not all 0') end
if not retention then
  return bad_args('release', 'retention must be an integer of ms, 1 to ' .. MAX_MS)
end
local r, err = load(key, 'release')
if err then return err end
if not r or r.state ~= 1 or r.tok ~= tok then return 0 end
redis.call('SET', key, encode(3, 0, r.tok, r.fence, r.attempt, 0, r.fp, ''), 'PX', retention)
return 1
