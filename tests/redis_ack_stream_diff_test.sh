#!/usr/bin/env bash
# Differential test of the two fused completion + XACK scripts: for random
# batches, complete_ack_batch.lua (documented for other-language clients) and
# complete_ack_stream.lua (what the C++ store sends) run on identical copies of
# the same records, stream and group, and must give the same replies, stored
# bytes, TTLs and pending entries. The records are random and mutated (every
# state, format 1 and 2, corrupt bytes, empty values, hashes); the tokens are
# often made of bytes Lua patterns treat specially (% \0 ] - ^ ...), sent as 8
# raw bytes to the new script and as 16 hex digits to the old one.
#
#   tests/redis_ack_stream_diff_test.sh LUA_DIR [TRIALS]
#
# LUA_DIR: the templates (src/stores/redis/lua), expanded here as the build does:
# the check of record.lua's quick read needs record.lua itself.
#
# Starts its own redis-server on 127.0.0.1:${DEDUP_ACK_STREAM_DIFF_PORT:-6503}
# (docs/PORTS.md) and stops it by PID on exit. SEED (default 1) picks the batches.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
lua_dir=${1:?usage: redis_ack_stream_diff_test.sh LUA_DIR [TRIALS]}
trials=${2:-1500}
port=${DEDUP_ACK_STREAM_DIFF_PORT:-6503}
source "$here/../scripts/lib/redis.sh"
tmp=$(mktemp -d)
trap 'redis_stop_all; rm -rf "$tmp"' EXIT
redis_start "$port" "$tmp/redis"
SEED=${SEED:-1} python3 "$here/redis_ack_stream_diff.py" "$port" "$lua_dir" "$trials"
