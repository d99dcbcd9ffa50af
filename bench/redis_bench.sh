#!/usr/bin/env bash
# Claim throughput of the Redis store next to the textbook guard
# (SET task_id:<id> processing NX EX 60, measured with redis-benchmark) at the same
# connection count and pipeline depth, on the same fresh server, in one run; then
# Redis memory per retained completed record, next to the same figure for
# SET task_id:<id> processing EX 86400 (fresh servers, same run).
#
#   bench/redis_bench.sh BUILD_DIR [CONNECTIONS=8] [SECONDS=5] [RECORDS=1000000] [REPS=1]
#
# Servers: 127.0.0.1:6396 (throughput), :6397 (dedup memory), :6398 (baseline
# memory), temporary directories, stopped by PID at exit.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
build=$(cd "${1:?usage: $0 BUILD_DIR [CONNECTIONS] [SECONDS] [RECORDS]}" && pwd)
conns=${2:-8}
secs=${3:-5}
records=${4:-1000000}
reps=${5:-1}
source "$here/../scripts/lib/redis.sh"
tmp=$(mktemp -d)
trap 'redis_stop_all; rm -rf "$tmp"' EXIT

echo "redis $(redis-server --version | grep -o 'v=[0-9.]*'), $(nproc) cores, $conns connections"
redis_start 6396 "$tmp/tp"
for rep in $(seq 1 "$reps"); do for depth in 1 16; do
  n=$((depth == 1 ? 100000 : 400000))
  base=$(timeout 60 redis-benchmark -h 127.0.0.1 -p 6396 -c "$conns" -n "$n" -P "$depth" -r 1000000000 --csv \
           SET task_id:__rand_int__ processing NX EX 60 | tail -1 | cut -d, -f2 | tr -d '"')
  redis-cli -p 6396 FLUSHALL >/dev/null  # the baseline's keys would be foreign records to us
  ours=$("$build/bench/redis_bench" claim "redis://127.0.0.1:6396?prefix=" "$conns" "$depth" "$secs" || true)
  ours_rate=$(awk '{print $2}' <<<"$ours")
  printf 'depth %-2s  SET NX EX: %10.0f/s   dedup claim: %10.0f/s   ratio %.2f   (%s)\n' \
    "$depth" "$base" "$ours_rate" "$(awk -v a="$ours_rate" -v b="$base" 'BEGIN{print a/b}')" "$ours"
  redis-cli -p 6396 FLUSHALL >/dev/null
done; done

redis_start 6397 "$tmp/mem"
"$build/bench/redis_bench" memory "redis://127.0.0.1:6397?prefix=" "$records" 4 || true
echo "keys: $(redis-cli -p 6397 DBSIZE), sample value bytes: $(redis-cli -p 6397 STRLEN task_id:000000000001)," \
     "MEMORY USAGE of one key: $(redis-cli -p 6397 MEMORY USAGE task_id:000000000001)"

used() { redis-cli -p "$1" INFO memory | tr -d '\r' | awk -F: '$1 == "used_memory" {print $2}'; }
redis_start 6398 "$tmp/base"
before=$(used 6398)
redis-benchmark -h 127.0.0.1 -p 6398 -c "$conns" -P 16 -n "$records" -r 1000000000 -q \
  SET task_id:__rand_int__ processing EX 86400 >/dev/null
after=$(used 6398)
keys=$(redis-cli -p 6398 DBSIZE)
echo "baseline SET task_id:<id> processing EX 86400: bytes/record" \
     "$(awk -v a="$after" -v b="$before" -v n="$keys" 'BEGIN{printf "%.1f", (a-b)/n}')" \
     "($keys keys, used_memory $before -> $after)"
