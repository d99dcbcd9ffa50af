#!/usr/bin/env bash
# Claim throughput of the Redis store next to the textbook guard
# (SET task_id:<id> processing NX EX 60, measured with redis-benchmark) at the same
# connection count and pipeline depth, on the same fresh server, in one run; then
# Redis memory per retained completed record, next to the same figure for
# SET task_id:<id> processing EX 86400 (fresh servers, same run).
#
#   bench/redis_bench.sh BUILD_DIR [CONNECTIONS="1 2 8 32"] [SECONDS=3] [RECORDS=1000000] [REPS=3]
#
# For each connection count N, REPS interleaved rounds of:
#   redis-benchmark -c N -P 1            vs  N threads calling Claim() (pool=N)
#   redis-benchmark -c N -P 16           vs  16N threads calling Claim() (pool=N):
#                                            16 claims in flight per connection
#                                        and N threads calling ClaimBatch() of 16
# each of our rows with the auto-pipelined connections (pipeline=auto, the default)
# and with one connection per call (pipeline=off) side by side. Medians of the
# rounds; ratios are median / median.
#
# Servers: 127.0.0.1:6466 (throughput), :6467 (dedup memory), :6468 (baseline
# memory), temporary directories, stopped by PID at exit.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
build=$(cd "${1:?usage: $0 BUILD_DIR [CONNECTIONS] [SECONDS] [RECORDS] [REPS]}" && pwd)
conn_list=${2:-1 2 8 32}
secs=${3:-3}
records=${4:-1000000}
reps=${5:-3}
source "$here/../scripts/lib/redis.sh"
tmp=$(mktemp -d)
trap 'redis_stop_all; rm -rf "$tmp"' EXIT

median() { sort -g | awk '{v[NR]=$1} END {if (NR==0) print 0; else if (NR%2) print v[(NR+1)/2]; else print (v[NR/2]+v[NR/2+1])/2}'; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN{ if (b > 0) printf "%.2f", a/b; else print "n/a" }'; }
verdict() { awk -v r="$1" -v g="$2" 'BEGIN{ print (r + 0 >= g) ? "met" : "not met" }'; }

echo "redis $(redis-server --version | grep -o 'v=[0-9.]*'), $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg)," \
     "$reps rounds of ${secs}s per contender, medians"
redis_start 6466 "$tmp/tp"
base_uri="redis://127.0.0.1:6466?prefix="
ours() {  # URI_SUFFIX CONNS DEPTH SHAPE -> claims/s
  redis-cli -p 6466 FLUSHALL >/dev/null  # the baseline's keys would be foreign records to us
  "$build/bench/redis_bench" claim "$base_uri$1" "$2" "$3" "$secs" "$4" | awk '{print $2}'
}
theirs() {  # CONNS DEPTH -> requests/s
  redis-cli -p 6466 FLUSHALL >/dev/null
  local n=$(( $2 == 1 ? 60000 : 300000 ))
  n=$(( $1 >= 8 ? n * 2 : n ))
  timeout 120 redis-benchmark -h 127.0.0.1 -p 6466 -c "$1" -n "$n" -P "$2" -r 1000000000 --csv \
    SET task_id:__rand_int__ processing NX EX 60 | tail -1 | cut -d, -f2 | tr -d '"'
}
printf '%-5s %-6s %12s %12s %6s %12s %6s %-8s\n' conns depth SET-NX-EX claim/auto ratio claim/off ratio goal
for conns in $conn_list; do
  : >"$tmp/r"
  for rep in $(seq 1 "$reps"); do
    echo "b1 $(theirs "$conns" 1)" >>"$tmp/r"
    echo "a1 $(ours "" "$conns" 1 single)" >>"$tmp/r"
    echo "o1 $(ours "&pipeline=off" "$conns" 1 single)" >>"$tmp/r"
    echo "b16 $(theirs "$conns" 16)" >>"$tmp/r"
    echo "a16 $(ours "" "$conns" 16 single)" >>"$tmp/r"
    echo "o16 $(ours "&pipeline=off" "$conns" 16 single)" >>"$tmp/r"
    echo "x16 $(ours "" "$conns" 16 batch)" >>"$tmp/r"
    echo "y16 $(ours "&pipeline=off" "$conns" 16 batch)" >>"$tmp/r"
  done
  m() { awk -v k="$1" '$1 == k {print $2}' "$tmp/r" | median; }
  b1=$(m b1) a1=$(m a1) o1=$(m o1) b16=$(m b16) a16=$(m a16) o16=$(m o16) x16=$(m x16) y16=$(m y16)
  printf '%-5s %-6s %12.0f %12.0f %6s %12.0f %6s %-8s\n' "$conns" 1 "$b1" "$a1" "$(ratio "$a1" "$b1")" \
    "$o1" "$(ratio "$o1" "$b1")" "$(verdict "$(ratio "$a1" "$b1")" 0.9) (>=0.9, Claim)"
  printf '%-5s %-6s %12.0f %12.0f %6s %12.0f %6s %-8s\n' "$conns" 16 "$b16" "$a16" "$(ratio "$a16" "$b16")" \
    "$o16" "$(ratio "$o16" "$b16")" "$(verdict "$(ratio "$a16" "$b16")" 0.9) (>=0.9, Claim)"
  printf '%-5s %-6s %12.0f %12.0f %6s %12.0f %6s %-8s\n' "$conns" "b16" "$b16" "$x16" "$(ratio "$x16" "$b16")" \
    "$y16" "$(ratio "$y16" "$b16")" "$(verdict "$(ratio "$x16" "$b16")" 1.0) (>=1, ClaimBatch 16)"
done
redis-cli -p 6466 FLUSHALL >/dev/null
[ "$records" -gt 0 ] || exit 0  # RECORDS=0: throughput only

redis_start 6467 "$tmp/mem"
"$build/bench/redis_bench" memory "redis://127.0.0.1:6467?prefix=" "$records" 4 || true
echo "keys: $(redis-cli -p 6467 DBSIZE), sample value bytes: $(redis-cli -p 6467 STRLEN task_id:000000000001)," \
     "MEMORY USAGE of one key: $(redis-cli -p 6467 MEMORY USAGE task_id:000000000001)"

used() { redis-cli -p "$1" INFO memory | tr -d '\r' | awk -F: '$1 == "used_memory" {print $2}'; }
redis_start 6468 "$tmp/base"
before=$(used 6468)
redis-benchmark -h 127.0.0.1 -p 6468 -c 4 -P 16 -n "$records" -r 1000000000 -q \
  SET task_id:__rand_int__ processing EX 86400 >/dev/null
after=$(used 6468)
keys=$(redis-cli -p 6468 DBSIZE)
echo "baseline SET task_id:<id> processing EX 86400: bytes/record" \
     "$(awk -v a="$after" -v b="$before" -v n="$keys" 'BEGIN{printf "%.1f", (a-b)/n}')" \
     "($keys keys, used_memory $before -> $after)"
