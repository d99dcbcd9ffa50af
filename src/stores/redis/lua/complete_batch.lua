-- dedup complete_batch: several completions in one script call, each answered as
-- complete.lua answers it, in order (see docs/REDIS_PROTOCOL.md). Every argument
-- and every record is checked before anything is written: an error reply means
-- nothing changed. A key repeated in the batch answers 0 LOST after it completed.
-- Plain Redis only (the keys of a batch lie in many cluster slots; the cluster
-- store pipelines complete.lua per node instead).
-- KEYS[i]        the record key of completion i, i = 1..n, n >= 1
-- ARGV[4i-3..4i] completion i as complete.lua's ARGV[1..4] (token, retention,
--                completion status, result)
-- Reply          an array of n integers: 1 OK, 0 LOST
--@dedup-include record.lua
local n = #KEYS
if n == 0 or #ARGV ~= 4 * n then
  return bad_args('complete_batch', 'needs 1 or more keys and 4 arguments per key, got ' ..
                  n .. ' keys and ' .. #ARGV .. ' arguments')
end
local m, err = complete_many_read('complete_batch', n, LAYOUT4, true)
if err then return err end
local out = {}
for i = 1, n do out[i] = complete_many_write(m, i) end
return out
