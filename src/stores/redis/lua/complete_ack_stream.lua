-- dedup complete_ack_stream: complete_ack_batch.lua for completions that share
-- one stream, one group and one retention, all with status 0 (ok), in a compact
-- layout: the stream, group and retention are sent once per call, not once per
-- completion, and each token as 8 bytes, not 16 hex digits (see
-- docs/REDIS_PROTOCOL.md). The answers, the checks and the XACK are
-- complete_ack_batch.lua's. Plain Redis only (as complete_ack_batch).
-- KEYS[1]          the stream key
-- KEYS[1+i]        the record key of completion i, i = 1..n, n >= 1
-- ARGV[1]          the consumer group, not empty
-- ARGV[2]          retention, ms (every completion's)
-- ARGV[3i..3i+2]   completion i: token as its 8 bytes (big-endian, not the 16
--                  hex digits of the other scripts), result, stream entry ID (not
--                  empty)
-- Reply            an array of n integers, each as complete_ack.lua: 2 OK and acked,
--                  1 OK not known to be acked (ack it yourself), 0 LOST (not acked)
--@dedup-include record.lua
local n = #KEYS - 1
if n < 1 or #ARGV ~= 2 + 3 * n then
  return bad_args('complete_ack_stream', 'needs 1 stream key, then 1 key and 3 arguments per ' ..
                  'completion after the group and retention, got ' .. #KEYS .. ' keys and ' ..
                  #ARGV .. ' arguments')
end
if ARGV[1] == '' then return bad_args('complete_ack_stream', 'group must not be empty') end
if not arg_ms(ARGV[2]) then
  return bad_args('complete_ack_stream', 'retention must be an integer of ms, 1 to ' .. MAX_MS)
end
local m, err = complete_many_read('complete_ack_stream', n,
                                  layout({stride = 3, base = 2, key0 = 1, px = ARGV[2], st = 0,
                                          res = 2, id = 3, raw_token = true}), true)
if err then return err end
-- Complete in order; then one XACK for the entries of those that answered OK:
-- when it acks as many as it was given they are 2 (acked), else they stay 1.
local out, ids, at = {}, {}, {}
for i = 1, n do
  out[i] = complete_many_write(m, i)
  if out[i] == 1 then
    ids[#ids + 1] = ARGV[3 * i + 2]
    at[#at + 1] = i
  end
end
if #ids > 0 then
  if xack_many(KEYS[1], ARGV[1], ids) == #ids then
    for _, i in ipairs(at) do out[i] = 2 end
  end
end
return out
