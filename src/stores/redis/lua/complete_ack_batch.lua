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
--                1 OK not known to be acked (ack it yourself), 0 LOST (not acked)
--@dedup-include record.lua
local n = #KEYS / 2
if n < 1 or n ~= math.floor(n) or #ARGV ~= 6 * n then
  return bad_args('complete_ack_batch', 'needs 2 keys (record, stream) and 6 arguments per ' ..
                  'completion, got ' .. #KEYS .. ' keys and ' .. #ARGV .. ' arguments')
end
local m, err = complete_many_read('complete_ack_batch', n,
                                  layout({stride = 6, res = 4, group = 5, id = 6}), true)
if err then return err end
-- Complete in order; then one XACK per (stream, group) for the entries of the
-- completions that answered OK. When it acks as many entries as it was given,
-- each of them is 2 (acked); when fewer (some were no longer pending), each stays
-- 1: the caller acks those itself, which is harmless for the ones acked here.
local out, acks, order = {}, {}, {}
for i = 1, n do
  out[i] = complete_many_write(m, i)
  if out[i] == 1 then
    local group, id = ARGV[6 * i - 1], ARGV[6 * i]
    local by_group = acks[KEYS[n + i]]
    if not by_group then
      by_group = {}
      acks[KEYS[n + i]] = by_group
    end
    local a = by_group[group]
    if not a then
      a = {stream = KEYS[n + i], group = group, ids = {}, at = {}}
      by_group[group] = a
      order[#order + 1] = a
    end
    a.ids[#a.ids + 1] = id
    a.at[#a.at + 1] = i
  end
end
for _, a in ipairs(order) do
  if xack_many(a.stream, a.group, a.ids) == #a.ids then
    for _, i in ipairs(a.at) do out[i] = 2 end
  end
end
return out
