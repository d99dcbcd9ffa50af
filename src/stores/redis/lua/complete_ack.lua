-- dedup complete_ack: complete.lua and, only when the completion is OK, XACK of
-- the stream entry, atomically and in one round trip (docs/REDIS_PROTOCOL.md).
-- Plain Redis only: the record key and the stream key must be on one server.
-- KEYS[1]  the record key
-- KEYS[2]  the stream key
-- ARGV[1..4]  as complete.lua (token, retention, completion status, result)
-- ARGV[5]  the consumer group
-- ARGV[6]  the stream entry ID
-- Reply    2 OK and acked; 1 OK, not acked (XACK acked nothing or failed, e.g. the
--          entry is no longer pending or the group is missing); 0 LOST (nothing
--          changed, not acked: the entry stays pending); an error reply as
--          complete.lua (nothing changed, not acked).
-- The completion is complete.lua's: the same read and write of record.lua.
--@dedup-include record.lua
local arity_err = arity_error('complete_ack', 2, 6)
if arity_err then return arity_err end
local m, err = complete_many_read('complete_ack', 1, LAYOUT4, false)
if err then return err end
local done = complete_many_write(m, 1)
if done ~= 1 then return done end
local ok, n = pcall(redis.call, 'XACK', KEYS[2], ARGV[5], ARGV[6])
if ok and n == 1 then return 2 end
return 1
