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
local what = 'complete_ack_stream'
-- The checks of complete_many_read(), in its order and with its errors, written out
-- for this layout: with #ARGV = 2 + 3n every argument is a string, the retention
-- and the status (0) are the script's own, so only the token, the result and the
-- entry ID are checked per completion.
for i = 1, n do
  local a = 3 * i
  local tok = ARGV[a]
  if #tok ~= 8 or tok == ZERO_TOKEN then
    return bad_args(nth(what, i), 'token must be 8 bytes, not all 0')
  end
  if #ARGV[a + 1] > 1048576 then
    return bad_args(nth(what, i), 'result must be at most 1048576 bytes')
  end
  if ARGV[a + 2] == '' then
    return bad_args(nth(what, i), 'group and entry ID must not be empty')
  end
end
-- Read every record before writing any (an error reply writes nothing). For the
-- first completion j of each key (first[key] = j): the record of a first claim
-- (first_claim()) in fast[j]; or, from quick_in_progress(), rtok[j] its record's
-- token and body[j], flag[j] what its COMPLETED/ok record is made of; or rtok[j]
-- false and the decoded record in full[j] (load()), or false alone (no record).
-- State is kept by position, so that each key costs one table entry by name.
local first, fast, rtok, body, flag, full = {}, {}, {}, {}, {}, {}
for i = 1, n do
  local key = KEYS[1 + i]
  if not first[key] then
    first[key] = i
    local v = call('GET', key)
    if v and first_claim(v) then
      fast[i] = v
    else
      local t, b, f
      if v then
        t, b, f = quick_in_progress(v)
        if t then f = COMPLETED_OK[f] end
      end
      if t then
        rtok[i], body[i], flag[i] = t, b, f
      else
        rtok[i] = false
        if v then
          local r, lerr = load(key, what)
          if lerr then return lerr end
          full[i] = r
        end
      end
    end
  end
end
-- Complete in order (a key completed here answers LOST to a later completion of
-- it); then one XACK for the entries of those that answered OK: when it acks as
-- many as it was given they are 2 (acked), else they stay 1.
local px = ARGV[2]
local out, ids = {}, {}
for i = 1, n do
  local key = KEYS[1 + i]
  local j = first[key]
  local tok = ARGV[3 * i]
  local ok = 0
  local v = fast[j]
  if v then
    if str_find(v, tok, 2, true) == 2 then
      call('SET', key, 'B' .. tok .. '\1\1' .. ARGV[3 * i + 1], 'PX', px)
      fast[j] = nil
      ok = 1
    end
  else
    local t = rtok[j]
    if t then
      if t == tok then
        call('SET', key, flag[j] .. body[j] .. ARGV[3 * i + 1], 'PX', px)
        rtok[j] = nil
        ok = 1
      end
    else
      local r = full[j]
      if r and r.state == 1 and r.tok == tok then
        full[j] = nil
        call('SET', key, encode(2, 0, r.tok, r.fence, r.attempt, 0, r.fp, ARGV[3 * i + 1]),
             'PX', px)
        ok = 1
      end
    end
  end
  out[i] = ok
  if ok == 1 then ids[#ids + 1] = ARGV[3 * i + 2] end
end
if #ids > 0 and xack_many(KEYS[1], ARGV[1], ids) == #ids then
  for i = 1, n do
    if out[i] == 1 then out[i] = 2 end
  end
end
return out
