-- dedup extend, record format 2 (see docs/REDIS_PROTOCOL.md).
-- KEYS[1]  the record key
-- ARGV[1]  token: 16 hex digits
-- ARGV[2]  lease, ms > 0
-- Reply    1 OK (lease now ends at now + lease), 0 LOST (nothing changed)
--@dedup-include record.lua
local key, key_err = record_key('extend', 2)
if key_err then return key_err end
local tok, lease = arg_token(ARGV[1]), arg_ms(ARGV[2])
if not tok then return bad_args('extend', 'token must be 16 lower-case hex digits, not all 0') end
if not lease then return bad_args('extend', 'lease must be an integer of ms, 1 to ' .. MAX_MS) end
local r, err = load(key, 'extend')
if err then return err end
if not r or r.state ~= 1 or r.tok ~= tok then return 0 end
-- The lease ends at now + lease; the record is kept `keep` ms after it, as the
-- claim asked. Format 2 stores keep, so only the key's expiry moves.
if r.fmt == 2 then
  redis.call('PEXPIRE', key, lease + r.keep)
else
  local keep = redis.call('PEXPIRETIME', key) - r.ld
  if keep < 0 then keep = 0 end
  redis.call('SET', key, encode(1, 0, r.tok, r.fence, r.attempt, keep, r.fp, ''),
             'PX', lease + keep)
end
return 1
