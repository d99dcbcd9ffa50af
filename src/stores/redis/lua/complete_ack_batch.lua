-- dedup complete_ack_batch: several completions, each as complete_ack.lua (XACK of
-- its stream entry only when its completion is OK), in order and in one script
-- call (see docs/REDIS_PROTOCOL.md). Every argument and every record is checked
-- before anything is written: an error reply means nothing changed, nothing acked.
-- Plain Redis only: the record keys and the stream keys must be on one server.
-- KEYS[i]        the record key of completion i, i = 1..n, n >= 1
-- KEYS[n+i]      the stream key of completion i
-- ARGV[6i-5..6i] completion i: token, retention, completion status, result (as
--                complete.lua), the consumer group, the stream entry ID
-- Reply          an array of n integers, each as complete_ack.lua: 2 OK and acked,
--                1 OK not acked, 0 LOST (not acked)
--@dedup-include record.lua
local n = #KEYS / 2
if n < 1 or n ~= math.floor(n) or #ARGV ~= 6 * n then
  return bad_args('complete_ack_batch', 'needs 2 keys (record, stream) and 6 arguments per ' ..
                  'completion, got ' .. #KEYS .. ' keys and ' .. #ARGV .. ' arguments')
end
local items, recs = {}, {}
for i = 1, n do
  local a = 6 * i - 6
  local what = 'complete_ack_batch: completion ' .. i
  local c, bad = complete_args(what, ARGV[a + 1], ARGV[a + 2], ARGV[a + 3], ARGV[a + 4])
  if bad then return bad end
  if ARGV[a + 5] == '' or ARGV[a + 6] == '' then
    return bad_args(what, 'group and entry ID must not be empty')
  end
  c.group, c.id = ARGV[a + 5], ARGV[a + 6]
  items[i] = c
end
for i = 1, n do
  if recs[KEYS[i]] == nil then
    local r, err = load(KEYS[i], 'complete_ack_batch')
    if err then return err end
    recs[KEYS[i]] = r or false
  end
end
local out = {}
for i = 1, n do
  local key, c = KEYS[i], items[i]
  local done = complete_record(key, recs[key] or nil, c)
  if done == 1 then
    recs[key] = false
    local ok, acked = pcall(redis.call, 'XACK', KEYS[n + i], c.group, c.id)
    if ok and acked == 1 then done = 2 end
  end
  out[i] = done
end
return out
