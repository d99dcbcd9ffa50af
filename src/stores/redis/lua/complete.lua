-- dedup complete, record format 2 (see docs/REDIS_PROTOCOL.md).
-- KEYS[1]  the record key
-- ARGV[1]  token: 16 hex digits
-- ARGV[2]  retention, ms > 0
-- ARGV[3]  completion status: 0 ok, 1 failed, 2 exhausted
-- ARGV[4]  result bytes, may be empty
-- Reply    1 OK (COMPLETED, kept until now + retention), 0 LOST (nothing changed)
--@dedup-include record.lua
local key = KEYS[1]
local tok, retention, status = arg_token(ARGV[1]), arg_ms(ARGV[2]), arg_uint(ARGV[3], 2)
if not tok then return bad_args('complete', 'token must be 16 lower-case hex digits, not all 0') end
if not retention then
  return bad_args('complete', 'retention must be an integer of ms, 1 to ' .. MAX_MS)
end
if not status then return bad_args('complete', 'status must be 0, 1 or 2') end
if not ARGV[4] or #ARGV[4] > 1048576 then
  return bad_args('complete', 'result must be at most 1048576 bytes')
end
local r, err = load(key, 'complete')
if err then return err end
if not r or r.state ~= 1 or r.tok ~= tok then return 0 end
redis.call('SET', key, encode(2, status, r.tok, r.fence, r.attempt, 0, r.fp, ARGV[4]),
           'PX', retention)
return 1
