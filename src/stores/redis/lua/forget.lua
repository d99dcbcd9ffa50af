-- dedup forget, record format 2 (see docs/REDIS_PROTOCOL.md).
-- KEYS[1]  the record key
-- ARGV[1]  force: 0 or 1 (1: also forget a record whose lease is still running)
-- Reply    {outcome, lease_left_ms}
--          outcome 0 no record (none, or a fence floor: nothing changed)
--                  1 removed
--                  2 refused: the lease is still running for lease_left_ms and force
--                    is 0 (nothing changed)
--                  3 forced on a running lease: the record became a fence floor, a
--                    RELEASED record with attempt 0 and the same fence, kept until
--                    that lease would have ended, so the next claim gets fence + 1
-- A value that is not a record is removed (how an operator gets rid of a corrupt one).
-- A key of another Redis type (a hash, a list, a stream) is removed only with force 1,
-- else the error 'DEDUPTYPE forget: the key holds a <type>, not a dedup record; force
-- removes it' and nothing changes: under a shared or empty prefix it may be someone
-- else's data (a broker's stream), which a listing of undecodable keys now shows.
--@dedup-include record.lua
local key, key_err = record_key('forget', 1)
if key_err then return key_err end
local force = arg_uint(ARGV[1], 1)
if not force then return bad_args('forget', 'force must be 0 or 1') end
local kind = redis.call('TYPE', key).ok
if kind == 'none' then return {0, 0} end
if kind ~= 'string' then
  if force == 0 then
    return redis.error_reply('DEDUPTYPE forget: the key holds a ' .. kind ..
                             ', not a dedup record; force removes it')
  end
  redis.call('DEL', key)
  return {1, 0}
end
local v = redis.call('GET', key)
if not v then return {0, 0} end
local r = decode(v)
if not r then
  redis.call('DEL', key)
  return {1, 0}
end
if r.state == 3 and r.attempt == 0 then return {0, 0} end
if r.state == 1 then
  local t = redis.call('TIME')
  local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  local ld = lease_deadline(key, r)
  if now < ld then
    if force == 0 then return {2, ld - now} end
    redis.call('SET', key, encode(3, 0, r.tok, r.fence, 0, 0, '', ''), 'PXAT', ld)
    return {3, ld - now}
  end
end
redis.call('DEL', key)
return {1, 0}
