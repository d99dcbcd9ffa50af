-- dedup unclaim, record format 2 (see docs/REDIS_PROTOCOL.md).
-- Undoes a claim whose token nobody was given: a claim batch that failed as a
-- whole gives back the claims it made on the way. release.lua would keep the
-- attempt the claim counted, and every key of such a batch lost one attempt it
-- never ran (with max_attempts 1, EXHAUSTED without a run). Here the record
-- goes back to the attempt it had before the claim, RELEASED; the fence stays
-- where the claim raised it (fences never repeat). A claim of a key that had
-- no record becomes a fence floor (RELEASED with attempt 0: no record to
-- inspect, and the next claim gets the fence after it).
-- KEYS[1]  the record key
-- ARGV[1]  token: 16 hex digits (the claim's)
-- ARGV[2]  retention, ms > 0: how long fence and attempts are kept
-- Reply    1 OK, 0 LOST (the token does not hold the key: nothing changed)
--@dedup-include record.lua
local key, key_err = record_key('unclaim', 2)
if key_err then return key_err end
local tok, retention = arg_token(ARGV[1]), arg_ms(ARGV[2])
if not tok then return bad_args('unclaim', 'token must be 16 lower-case hex digits, not all 0') end
if not retention then
  return bad_args('unclaim', 'retention must be an integer of ms, 1 to ' .. MAX_MS)
end
local r, err = load(key, 'unclaim')
if err then return err end
if not r or r.state ~= 1 or r.tok ~= tok then return 0 end
local before = r.attempt > 0 and r.attempt - 1 or 0
redis.call('SET', key, encode(3, 0, r.tok, r.fence, before, 0, before > 0 and r.fp or '', ''),
           'PX', retention)
return 1
