-- dedup complete, record format 2 (see docs/REDIS_PROTOCOL.md).
-- KEYS[1]  the record key
-- ARGV[1]  token: 16 hex digits
-- ARGV[2]  retention, ms > 0
-- ARGV[3]  completion status: 0 ok, 1 failed, 2 exhausted
-- ARGV[4]  result bytes, may be empty
-- Reply    1 OK (COMPLETED, kept until now + retention), 0 LOST (nothing changed)
--@dedup-include record.lua
local _, key_err = record_key('complete', 4)
if key_err then return key_err end
local m, err = complete_many_read('complete', 1, LAYOUT4, false)
if err then return err end
return complete_many_write(m, 1)
