#!/usr/bin/env bash
# `dedup worker --exec /bin/true` against a plain loop that spawns the same command
# once per message (bench/spawn_loop.cc: posix_spawn + waitpid, no broker, no
# store, no supervision), side by side, alternating, ROUNDS times; also the same
# loop through HandlerSupervisor (spawn_loop --supervised: supervision, stdin, no
# broker or store). Prints medians and the ratios worker / loop and supervised /
# loop (docs/PERFORMANCE.md, "Handler spawn").
#
#   unshare -n bash -c 'ip link set lo up; scripts/bench_exec_spawn.sh [BUILD_DIR=build]'
#
# Environment: MESSAGES (default 2000), ROUNDS (3), CONCURRENCY ("1 2"),
# SHELL_MODES ("1 0": via sh -c, then --no-shell), STORE (memory:),
# BENCH_REDIS_PORT (6471), BASELINE_BUILD (another build dir, e.g. main's: its
# worker runs in the same rounds, a column base/loop). Starts its own Redis
# (stopped by PID).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=$(realpath "${1:-$root/build}")
dedup=$build/src/cli/dedup
loop=$build/bench/spawn_loop
messages=${MESSAGES:-2000}
rounds=${ROUNDS:-3}
concurrency=${CONCURRENCY:-"1 2"}
shell_modes=${SHELL_MODES:-"1 0"}
base_dedup=""
if [[ -n "${BASELINE_BUILD:-}" ]]; then
  base_dedup=$(realpath "$BASELINE_BUILD")/src/cli/dedup
  [[ -x "$base_dedup" ]] || { echo "no dedup in BASELINE_BUILD=$BASELINE_BUILD" >&2; exit 2; }
fi
store=${STORE:-memory:}
port=${BENCH_REDIS_PORT:-6471}
[[ -x "$dedup" && -x "$loop" ]] || { echo "build dedup_cli and spawn_loop in $build first" >&2; exit 2; }
tmp=$(mktemp -d /tmp/dedup_spawn_bench.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
source "$root/scripts/lib/redis.sh"
redis_start "$port" "$tmp/redis" >/dev/null

now() { date +%s.%N; }
# worker_run STREAM CONCURRENCY SHELL(0|1) [DEDUP]: seconds until every message is acked.
worker_run() {
  local stream=$1 c=$2 shell=$3 dedup=${4:-$dedup} t0 t1 wpid info flags=()
  "$dedup" publish --broker "redis://127.0.0.1:$port?stream=$stream" --count "$messages" \
    --id-prefix m --field payload=x --quiet
  ((shell)) || flags=(--no-shell)
  t0=$(now)
  "$dedup" worker --broker "redis://127.0.0.1:$port?stream=$stream&group=g" --store "$store" \
    --exec /bin/true "${flags[@]}" --concurrency "$c" --summary-interval 0 2>"$tmp/worker.err" &
  wpid=$!
  while :; do
    # XINFO GROUPS, raw: name value pairs, one per line.
    info=$(redis-cli -p "$port" xinfo groups "$stream" 2>/dev/null |
      awk 'NR % 2 { k = $0; next } { v[k] = $0 } END { print v["pending"] "/" v["entries-read"] }')
    [[ "$info" == "0/$messages" ]] && break
    kill -0 "$wpid" 2>/dev/null || { cat "$tmp/worker.err" >&2; exit 1; }
    sleep 0.02
  done
  t1=$(now)
  kill -TERM "$wpid"
  wait "$wpid" || true
  grep -q "acked=$messages " "$tmp/worker.err" || { echo "worker did not ack all:" >&2; tail -2 "$tmp/worker.err" >&2; }
  echo "$t1 - $t0" | bc -l
}
loop_run() {  # loop_run CONCURRENCY SHELL [--supervised]
  local t0 t1
  t0=$(now)
  if (($2)); then "$loop" ${3:-} "$messages" "$1" /bin/sh -c /bin/true >/dev/null
  else "$loop" ${3:-} "$messages" "$1" /bin/true >/dev/null; fi
  t1=$(now)
  echo "$t1 - $t0" | bc -l
}
median() { sort -g | awk '{ a[NR] = $1 } END { print a[int((NR + 1) / 2)] }'; }

echo "messages=$messages rounds=$rounds store=$store ($(nproc) cores; $(uptime | sed 's/.*load/load/'))"
[[ -n "$base_dedup" ]] && echo "baseline worker: $base_dedup (base/loop)"
printf '%-28s %5s %10s %10s %10s %8s %8s %9s\n' command conc "worker/s" "superv./s" "loop/s" "w/loop" "s/loop" \
  "$([[ -n "$base_dedup" ]] && echo base/loop)"
n=0
for shell in $shell_modes; do
  for c in $concurrency; do
    wr=() sr=() lr=() wratio=() sratio=() bratio=()
    for ((r = 0; r < rounds; r++)); do
      n=$((n + 1))
      if [[ -n "$base_dedup" ]]; then
        b=$(worker_run "b$n" "$c" "$shell" "$base_dedup")
      fi
      w=$(worker_run "s$n" "$c" "$shell")
      l=$(loop_run "$c" "$shell")
      v=$(loop_run "$c" "$shell" --supervised)
      wr+=("$(echo "$messages / $w" | bc -l)")
      sr+=("$(echo "$messages / $v" | bc -l)")
      lr+=("$(echo "$messages / $l" | bc -l)")
      wratio+=("$(echo "$l / $w" | bc -l)")
      sratio+=("$(echo "$l / $v" | bc -l)")
      [[ -n "$base_dedup" ]] && bratio+=("$(echo "$l / $b" | bc -l)")
    done
    label=$( ((shell)) && echo "--exec /bin/true (sh -c)" || echo "--exec /bin/true --no-shell")
    base_median=""
    [[ -n "$base_dedup" ]] && base_median=$(printf '%.2f' "$(printf '%s\n' "${bratio[@]}" | median)")
    printf '%-28s %5s %10.0f %10.0f %10.0f %8.2f %8.2f %9s   (w/loop: %s%s)\n' "$label" "$c" \
      "$(printf '%s\n' "${wr[@]}" | median)" "$(printf '%s\n' "${sr[@]}" | median)" \
      "$(printf '%s\n' "${lr[@]}" | median)" "$(printf '%s\n' "${wratio[@]}" | median)" \
      "$(printf '%s\n' "${sratio[@]}" | median)" "$base_median" "$(printf '%.2f ' "${wratio[@]}")" \
      "$([[ -n "$base_dedup" ]] && printf '; base/loop: %s' "$(printf '%.2f ' "${bratio[@]}")")"
  done
done
