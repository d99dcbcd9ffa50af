-- dedup claim, record format 2 (see docs/REDIS_PROTOCOL.md).
-- The fresh-key case is also reachable without this script: SET key <record> NX PX
-- lease+retention GET (the store's fast path); this script handles every case.
-- KEYS[1]  the record key (prefix .. key)
-- ARGV[1]  fresh token: 16 hex digits, not all zero
-- ARGV[2]  lease, ms > 0
-- ARGV[3]  retention, ms > 0
-- ARGV[4]  payload fingerprint, may be empty
-- ARGV[5]  max attempts, 0 = unlimited
-- Reply    {outcome, fence, attempt, lease_left_ms, status, result}
--          outcome 0 ACQUIRED, 1 BUSY, 2 DUPLICATE, 3 MISMATCH, 4 EXHAUSTED
--@dedup-include record.lua
local key, key_err = record_key('claim', 5)
if key_err then return key_err end
local tok, lease, retention = arg_token(ARGV[1]), arg_ms(ARGV[2]), arg_ms(ARGV[3])
local fp, max_attempts = ARGV[4], arg_uint(ARGV[5], 4294967295)
if not tok then return bad_args('claim', 'token must be 16 lower-case hex digits, not all 0') end
if not lease then return bad_args('claim', 'lease must be an integer of ms, 1 to ' .. MAX_MS) end
if not retention then
  return bad_args('claim', 'retention must be an integer of ms, 1 to ' .. MAX_MS)
end
if not fp or #fp > 64 then return bad_args('claim', 'fingerprint must be at most 64 bytes') end
if not max_attempts then
  return bad_args('claim', 'max_attempts must be an integer, 0 to 4294967295')
end
local r, err = load(key, 'claim')
if err then return err end
if not r then
  redis.call('SET', key, encode(1, 0, tok, 1, 1, retention, fp, ''),
             'PX', lease + retention)
  return {0, 1, 1}
end
-- A try again of the claim that exhausted the key (its reply lost) reads it as
-- its own EXHAUSTED, as the C++ fast path does: the record holds its token.
if r.state == 2 and r.status == 2 and r.tok == tok then
  return {4, r.fence, r.attempt}
end
if fp ~= '' and r.fp ~= '' and fp ~= r.fp then
  return {3, r.fence, r.attempt}
end
if r.state == 2 then
  return {2, r.fence, r.attempt, 0, r.status, r.result}
end
if r.state == 1 then
  local t = redis.call('TIME')
  local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  local ld = lease_deadline(key, r)
  if now < ld then
    -- A try again of a claim that was written (its reply lost) reads the record
    -- as its own, ACQUIRED, as the C++ fast path does: the record holds its
    -- token, and a fresh random token meets no other record. Its lease runs from
    -- that try, which the caller's lease (counted from its first send) does not
    -- outlast. Once that lease is over, the try again is a takeover like any.
    if r.tok == tok then return {0, r.fence, r.attempt} end
    return {1, r.fence, r.attempt, ld - now}
  end
end
-- RELEASED, or IN_PROGRESS with its lease over: a new attempt, if one is left.
if max_attempts > 0 and r.attempt >= max_attempts then
  -- Under this claim's token: its try again (the reply lost) knows it as its own.
  redis.call('SET', key, encode(2, 2, tok, r.fence, r.attempt, 0, r.fp, ''), 'PX', retention)
  return {4, r.fence, r.attempt}
end
if r.fence >= MAX_VARINT then
  -- fence + 1 could not be read back exactly: the takeover would repeat a fence.
  return redis.error_reply('DEDUPCORRUPT claim: fence ' .. string.format('%.0f', r.fence) ..
                           ' cannot be raised (the largest fence is 2^53 - 1); nothing changed')
end
if r.attempt >= MAX_ATTEMPT then
  -- attempt + 1 would be read back cut to 32 bits.
  return redis.error_reply('DEDUPCORRUPT claim: attempt ' .. string.format('%.0f', r.attempt) ..
                           ' cannot be raised (the largest attempt is 2^32 - 1); nothing changed')
end
if r.fp == '' then r.fp = fp end
redis.call('SET', key, encode(1, 0, tok, r.fence + 1, r.attempt + 1,
                              retention, r.fp, ''), 'PX', lease + retention)
return {0, r.fence + 1, r.attempt + 1}
