#!/usr/bin/env bash
# What a Redis Streams consumer group still holds, for the chaos and fault tests
# (tests/worker_chaos_test.sh, tests/redis_fault_proxy_test.sh). Source it:
#
#   source scripts/lib/stream_outstanding.sh
#   stream_outstanding_keys PORT STREAM GROUP   # one dedup key (field id) per line
#   stream_outstanding_count PORT STREAM GROUP
#
# Outstanding = entries the group has not delivered yet + entries pending (an
# entry deleted from the stream counts as "?<entry id>"). Read with one EVAL, so
# that the two parts are taken at one moment. A group that does not exist (no worker
# ever started) has delivered nothing: every entry of the stream is outstanding.

_stream_outstanding_lua='
if redis.call("EXISTS", KEYS[1]) == 0 then return {} end
local g = redis.call("XINFO", "GROUPS", KEYS[1])
local last = nil
for _, grp in ipairs(g) do
  local name, ld
  for i = 1, #grp, 2 do
    if grp[i] == "name" then name = grp[i + 1] end
    if grp[i] == "last-delivered-id" then ld = grp[i + 1] end
  end
  if name == ARGV[1] then last = ld end
end
local out = {}
local function key_of(entry)
  local f = entry[2]
  for i = 1, #f, 2 do if f[i] == "id" then return f[i + 1] end end
  return "?" .. entry[1]
end
local from = last and "(" .. last or "-"
for _, e in ipairs(redis.call("XRANGE", KEYS[1], from, "+")) do out[#out + 1] = key_of(e) end
if not last then return out end
for _, p in ipairs(redis.call("XPENDING", KEYS[1], ARGV[1], "-", "+", 1000000)) do
  local e = redis.call("XRANGE", KEYS[1], p[1], p[1])
  if #e == 1 then out[#out + 1] = key_of(e[1]) end
end
return out'

stream_outstanding_keys() {  # PORT STREAM GROUP
  "${REDIS_CLI_BIN:-redis-cli}" -p "$1" --raw EVAL "$_stream_outstanding_lua" 1 "$2" "$3" \
    2>/dev/null | grep -v '^$' || true
}

stream_outstanding_count() {  # PORT STREAM GROUP
  stream_outstanding_keys "$@" | wc -l
}

# stream_stop_workers PORT STREAM GROUP WORK: SIGTERMs the worker processes in the
# caller's array worker_pids and waits for each (graceful drain), then sets
# `pending` (the group's pending count) and `dead` (entries in STREAM:dead), writes
# the outstanding keys to WORK/outstanding and prints each WORK/worker*.log's last
# line (the workers' final summaries).
stream_stop_workers() {
  local port=$1 stream=$2 group=$3 work=$4 i
  for i in "${!worker_pids[@]}"; do
    [ -n "${worker_pids[$i]}" ] || continue
    kill -TERM "${worker_pids[$i]}" 2>/dev/null || true
    wait "${worker_pids[$i]}" 2>/dev/null || true
    worker_pids[$i]=""
  done
  pending=$("${REDIS_CLI_BIN:-redis-cli}" -p "$port" XPENDING "$stream" "$group" 2>/dev/null | head -1)
  [[ "$pending" =~ ^[0-9]+$ ]] || pending=0  # no group: no worker ever read
  dead=$("${REDIS_CLI_BIN:-redis-cli}" -p "$port" XLEN "$stream:dead")
  stream_outstanding_keys "$port" "$stream" "$group" >"$work/outstanding"
  tail -n 1 "$work"/worker*.log
}
