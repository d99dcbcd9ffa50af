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
-- This file is a template: the build replaces the include line below with the
-- text of complete.lua (src/stores/redis/CMakeLists.txt), so there is one copy of
-- the complete logic. Run the generated script, not this file.
local function complete()
--@dedup-include complete.lua
end
local done = complete()
if done ~= 1 then return done end
local ok, n = pcall(redis.call, 'XACK', KEYS[2], ARGV[5], ARGV[6])
if ok and n == 1 then return 2 end
return 1
