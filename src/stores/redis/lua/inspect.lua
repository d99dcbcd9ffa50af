-- dedup inspect, record format 2 (see docs/REDIS_PROTOCOL.md).
-- KEYS[1]  the record key
-- ARGV[1]  optional: noresult, to leave the result out (a listing): '' in its
--          place, and the result's length in bytes as a 10th element
-- Reply    nil when no record is kept (or only a fence floor), else
--          {state, status, token_hex, fence, attempt, lease_deadline_ms,
--           retention_deadline_ms, fingerprint, result}
--          state 1 in_progress, 2 completed, 3 released; status 0 ok, 1 failed, 2 exhausted
--          lease_deadline_ms is 0 for a format-2 record that is not IN_PROGRESS.
--@dedup-include record.lua
local key, key_err = record_key('inspect')
if key_err then return key_err end
if #KEYS ~= 1 or #ARGV > 1 or (#ARGV == 1 and ARGV[1] ~= 'noresult') then
  return bad_args('inspect', 'needs 1 key and no argument, or the argument noresult; got ' ..
                  #KEYS .. ' keys and ' .. #ARGV .. ' arguments')
end
local r, err = load(key, 'inspect')
if err then return err end
if not r then return false end
-- A fence floor left by a forced forget (forget.lua) is no record.
if r.state == 3 and r.attempt == 0 then return false end
local ld = 0
if r.state == 1 then ld = lease_deadline(key, r) elseif r.fmt == 1 then ld = r.ld end
local hi, lo = struct.unpack('>I4I4', r.tok)
local out = {r.state, r.status, string.format('%08x%08x', hi, lo), r.fence, r.attempt, ld,
             redis.call('PEXPIRETIME', key), r.fp, r.result}
if #ARGV == 1 then
  out[9] = ''
  out[10] = #r.result
end
return out
