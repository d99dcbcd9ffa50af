-- dedup inspect, record format 1 (see docs/REDIS_PROTOCOL.md).
-- KEYS[1]  the record key
-- Reply    nil when no record is kept, else
--          {state, status, token_hex, fence, attempt, lease_deadline_ms,
--           retention_deadline_ms, fingerprint, result}
--          state 1 in_progress, 2 completed, 3 released; status 0 ok, 1 failed, 2 exhausted
local key = KEYS[1]
local v = redis.call('GET', key)
if not v then return false end
if #v < 27 or string.byte(v, 1) ~= 1 then
  return redis.error_reply('DEDUPCORRUPT record is not dedup format 1')
end
local _, ss, hi, lo, fence, attempt, lease_deadline, fplen =
    struct.unpack('>BBI4I4I6I4I6B', v)
return {ss % 16, math.floor(ss / 16), string.format('%08x%08x', hi, lo), fence, attempt,
        lease_deadline, redis.call('PEXPIRETIME', key), string.sub(v, 28, 27 + fplen),
        string.sub(v, 28 + fplen)}
