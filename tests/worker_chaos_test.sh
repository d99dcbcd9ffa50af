#!/usr/bin/env bash
# Chaos test of `dedup worker` on Redis Streams: a real redis-server (own port,
# temporary directory, AOF on, stopped by PID), CHAOS_MESSAGES messages (10% of
# them published twice), worker processes killed with SIGKILL at random moments
# (each once it has written an effect: a kill must land while it is at work)
# and restarted, and the Redis server restarted once. The handler
# (worker_ledger_handler) appends one line per completed effect to a ledger.
#
#   tests/worker_chaos_test.sh DEDUP_BIN HANDLER_BIN [rocksdb|redis] [dedup|textbook]
#
#   rocksdb   buffer in RocksDB: one worker process (the embedded store is
#             single-process), restarted after each kill
#   redis     buffer in the same Redis: three worker processes
#   textbook  the SET NX EX / DEL / exists=ack guard instead of the buffer: the
#             numbers are reported, and the run does not fail on them
#
# Checks (pattern dedup): every message completed and acked (0 lost, nothing
# pending, nothing dead-lettered); a message whose effect is missing is *lost*
# only when the stream no longer holds it (acked or gone), and *unfinished* when
# it is still undelivered or pending when the drain ended (its own failure); every key whose handler completed more than once
# is explained by a SIGKILL of the earlier runner after its effect, or by the Redis
# restart (complete could not be recorded: fail closed, run again); no two runs of
# one key overlapped in time; and at least one kill landed between an effect and
# its complete (a rerun it explains), or the run tested nothing of that window.
# tests/worker_chaos_check_test.py (ctest worker_chaos_check_test) holds the
# checker to its verdicts on synthetic ledgers.
#
# After the kills the workers drain the stream: the test waits until the group
# has delivered everything and nothing is pending, and stops early only when the
# outstanding count has not moved for CHAOS_STALL seconds (default 60) or at
# CHAOS_TIMEOUT seconds from the start (default 400): a slow, busy machine only
# makes the run longer, never a failure by itself.
#
# Environment: CHAOS_MESSAGES (default 20000), CHAOS_KILLS (default 20),
# CHAOS_PORT (default 6401; use 6400-6409), CHAOS_TIMEOUT, CHAOS_STALL,
# CHAOS_KEEP=1 keeps the temporary directory. CI runs this full scale too
# (tests/CMakeLists.txt, CHAOS_MESSAGES=20000); its figures are in docs/WORKER.md.
set -euo pipefail

dedup=$(realpath "$1")
handler=$(realpath "$2")
store_kind=${3:-rocksdb}
pattern=${4:-dedup}
here=$(cd "$(dirname "$0")" && pwd)
messages=${CHAOS_MESSAGES:-20000}
kills_wanted=${CHAOS_KILLS:-20}
port=${CHAOS_PORT:-6401}
deadline=$((SECONDS + ${CHAOS_TIMEOUT:-400}))
stall_limit=${CHAOS_STALL:-60}
lease=2s
textbook_ttl=2s

work=$(mktemp -d "${TMPDIR:-/tmp}/dedup-chaos.XXXXXX")
redis_pid=""
declare -a worker_pids=()
cleanup() {
  local rc=$?
  for p in "${worker_pids[@]}"; do
    [ -n "$p" ] && kill -KILL "$p" 2>/dev/null || true
  done
  if [ -n "$redis_pid" ]; then
    kill -TERM "$redis_pid" 2>/dev/null || true
    wait "$redis_pid" 2>/dev/null || true
  fi
  if [ -z "${CHAOS_KEEP:-}" ]; then rm -rf "$work"; else echo "kept $work"; fi
  exit $rc
}
trap cleanup EXIT INT TERM

now_us() { date +%s%6N; }

start_redis() {
  redis-server --port "$port" --bind 127.0.0.1 --dir "$work" --appendonly yes \
    --appendfsync everysec --save '' --maxmemory-policy noeviction \
    >>"$work/redis.log" 2>&1 &
  redis_pid=$!
  local i
  for i in $(seq 1 100); do
    redis-cli -p "$port" ping >/dev/null 2>&1 && return 0
    sleep 0.1
  done
  echo "redis-server did not start on port $port" >&2
  return 1
}

stop_redis() {  # by PID, never by name
  kill -TERM "$redis_pid"
  wait "$redis_pid" || true
  redis_pid=""
}

start_redis
rcli() { redis-cli -p "$port" "$@"; }

broker="redis://127.0.0.1:$port?stream=jobs&group=workers&reclaim=3s"
case $store_kind in
  rocksdb) store="rocksdb:$work/buffer"; nworkers=1 ;;
  redis) store="redis://127.0.0.1:$port?prefix=dedup:"; nworkers=3 ;;
  *) echo "store must be rocksdb or redis" >&2; exit 2 ;;
esac
if [ "$pattern" = textbook ]; then nworkers=3; fi
# Twelve handler slots in all, whatever the number of worker processes: the
# RocksDB buffer's single process gets the slots the Redis buffer's three share.
# On a busy machine each message waits a scheduling slice at each of its
# hand-offs (spawn, the handler's sleep, its exit, the ack) with the worker
# nearly idle (7 % of a core), so the rate follows the slots: with 4, a RocksDB
# run at load 10-12 took 314 s of its 380 s budget.
concurrency=$((12 / nworkers))

"$dedup" publish --broker "$broker" --count "$messages" --id-prefix m- --duplicates 0.1 --seed 7
published=$(rcli XLEN jobs)

export LEDGER=$work/ledger WORK_MS=2 SLOW_EVERY=500 SLOW_MS=3500
touch "$LEDGER" "$work/kills" "$work/outage"

# The textbook flags are refused without --pattern textbook, the Buffer's with it.
pattern_flags=(--store "$store" --lease "$lease")
if [ "$pattern" = textbook ]; then pattern_flags=(--textbook-ttl "$textbook_ttl"); fi

start_worker() {  # start_worker I
  local i=$1
  "$dedup" worker --broker "$broker&consumer=w$i" --pattern "$pattern" \
    "${pattern_flags[@]}" --exec "$handler" --no-shell --concurrency "$concurrency" \
    --retry-delay 200ms --summary-interval 5s \
    >>"$work/worker$i.log" 2>&1 &
  worker_pids[$i]=$!
}

for i in $(seq 0 $((nworkers - 1))); do start_worker "$i"; done

# A kill must land while the worker is at work, not while it is still starting
# (on a busy machine a RocksDB worker can spend a whole kill interval opening its
# store: a run whose 20 kills all hit start-ups tests nothing of the window between
# effect and complete). Waits until the worker has an effect in the ledger (its
# pid is the last field), at most 15 s.
wait_first_effect() {  # wait_first_effect PID
  local t=$((SECONDS + 15))
  while [ $SECONDS -lt "$t" ] && ! grep -q " $1\$" "$LEDGER"; do sleep 0.05; done
}

kills=0
redis_restarted=0
while [ "$kills" -lt "$kills_wanted" ] && [ $SECONDS -lt "$deadline" ]; do
  sleep "0.$((RANDOM % 6 + 2))"
  i=$((RANDOM % nworkers))
  pid=${worker_pids[$i]}
  wait_first_effect "$pid"
  kill -KILL "$pid" 2>/dev/null || true
  wait "$pid" 2>/dev/null || true
  echo "$(now_us) $pid" >>"$work/kills"  # logged once the worker is gone
  kills=$((kills + 1))
  start_worker "$i"
  if [ "$redis_restarted" = 0 ] && [ "$kills" -ge $((kills_wanted / 2)) ]; then
    echo "$(now_us)" >"$work/outage"
    stop_redis
    sleep 0.5
    start_redis
    echo "$(now_us)" >>"$work/outage"
    redis_restarted=1
    echo "redis restarted after $kills kills"
  fi
done
done_effects=$(wc -l <"$LEDGER")
echo "$kills kills done; $done_effects effects in the ledger so far"

# Outstanding = entries the group has not delivered yet + entries pending.
# outstanding_keys prints the dedup key (field id) of each, one per line.
source "$here/../scripts/lib/stream_outstanding.sh"
outstanding_keys() { stream_outstanding_keys "$port" jobs workers; }
outstanding_count() { outstanding_keys | wc -l; }

# Drain: until nothing is outstanding, the count stalls for stall_limit, or the
# deadline.
last_count=-1
last_move=$SECONDS
while [ $SECONDS -lt "$deadline" ]; do
  count=$(outstanding_count)
  [ "$count" = 0 ] && break
  if [ "$count" != "$last_count" ]; then last_count=$count; last_move=$SECONDS; fi
  if [ $((SECONDS - last_move)) -ge "$stall_limit" ]; then
    echo "drain stalled at $count outstanding for ${stall_limit}s"
    break
  fi
  sleep 1
done
echo "drain ended after ${SECONDS}s with $(outstanding_count) outstanding"
stream_stop_workers "$port" jobs workers "$work"

python3 "$here/worker_chaos_check.py" --ledger "$LEDGER" --kills "$work/kills" \
  --outage "$work/outage" --outstanding "$work/outstanding" \
  --messages "$messages" --published "$published" --pending "$pending" --dead "$dead" \
  --pattern "$pattern" --store "$store_kind" --workers "$nworkers" \
  --redis-restarts "$redis_restarted" --elapsed "$SECONDS" --min-kill-hits 1
