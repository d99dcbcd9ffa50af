#!/usr/bin/env bash
# Chaos test of `dedup worker` on RabbitMQ or NATS JetStream: a real broker (own
# ports and directory, stopped by PID; persistent queue / file-backed stream),
# a real redis-server holding the buffer (or the textbook guard's keys),
# CHAOS_MESSAGES messages of which 10 % are published twice, CHAOS_WORKERS worker
# processes SIGKILLed at random moments and restarted, and the broker restarted
# once halfway through the kills. The handler (worker_ledger_handler) appends one
# line per completed effect to a ledger that no dedup code writes.
#
#   tests/rabbitmq_nats_chaos_test.sh DEDUP_BIN HANDLER_BIN PROBE_BIN rabbitmq|nats [dedup|textbook]
#
# PROBE_BIN is nats_chaos_probe (read-only JetStream consumer info; unused for
# RabbitMQ, whose queues are read with rabbitmqctl). Checks are those of
# tests/worker_chaos_check.py (0 lost, reruns only where a SIGKILL explains them,
# no overlapping runs, fences increasing, nothing pending or dead at the end, at
# least one kill landing between an effect and its complete); the
# textbook pattern only reports its numbers.
#
# Environment: CHAOS_MESSAGES (default 20000), CHAOS_KILLS (20), CHAOS_WORKERS (3),
# CHAOS_TIMEOUT seconds (300), CHAOS_BROKER_PORT (RabbitMQ 5685, NATS 4235),
# CHAOS_REDIS_PORT (6511), CHAOS_KEEP=1 keeps the temporary directory.
set -euo pipefail

dedup=$(realpath "$1")
handler=$(realpath "$2")
probe=$(realpath "$3")
broker_kind=$4
pattern=${5:-dedup}
here=$(cd "$(dirname "$0")" && pwd)
messages=${CHAOS_MESSAGES:-20000}
kills_wanted=${CHAOS_KILLS:-20}
nworkers=${CHAOS_WORKERS:-3}
redis_port=${CHAOS_REDIS_PORT:-6511}
deadline=$((SECONDS + ${CHAOS_TIMEOUT:-300}))
lease=2s
textbook_ttl=2s

source "$here/../scripts/lib/redis.sh"
source "$here/../scripts/lib/rabbitmq.sh"
source "$here/../scripts/lib/nats.sh"

work=$(mktemp -d "${TMPDIR:-/tmp}/dedup-bchaos.XXXXXX")
declare -a worker_pids=()
cleanup() {
  local rc=$? p
  for p in "${worker_pids[@]}"; do
    [ -n "$p" ] && kill -KILL "$p" 2>/dev/null || true
  done
  rabbitmq_stop
  nats_stop
  redis_stop_all
  if [ -z "${CHAOS_KEEP:-}" ]; then rm -rf "$work"; else echo "kept $work"; fi
  exit $rc
}
trap cleanup EXIT INT TERM
now_us() { date +%s%6N; }

redis_start "$redis_port" "$work/redis" --appendonly yes --appendfsync everysec
store="redis://127.0.0.1:$redis_port?prefix=dedup:"

case $broker_kind in
  rabbitmq)
    bport=${CHAOS_BROKER_PORT:-5685}
    rabbitmq_start "$bport" "$work/rabbitmq"
    echo "rabbitmq started in ${RABBITMQ_START_SECONDS}s"
    broker="amqp://guest:guest@127.0.0.1:$bport/?queue=jobs&prefetch=16"
    restart_broker() { rabbitmq_restart; }
    # "<ready+unacked over jobs and its retry queues> <dead>"
    broker_state() {
      rabbitmqctl_node -q list_queues name messages 2>/dev/null | awk '
        $1 == "jobs" || $1 ~ /^jobs\.retry\./ {p += $2}
        $1 == "jobs.dead" {d += $2}
        END {print p + 0, d + 0}'
    }
    ;;
  nats)
    bport=${CHAOS_BROKER_PORT:-4235}
    nats_start "$bport" "$work/nats"
    echo "nats started in ${NATS_START_MS}ms"
    # The key travels in a header, not Nats-Msg-Id: the stream's duplicate window
    # would otherwise drop the repeats before any worker saw them (docs/WORKER.md).
    broker="nats://127.0.0.1:$bport?stream=JOBS&consumer=workers&subject=jobs.in&key=header:Dedup-Key"
    restart_broker() { nats_restart; }
    broker_state() {
      local s
      s=$("$probe" "nats://127.0.0.1:$bport" JOBS workers 2>/dev/null) || { echo "? ?"; return; }
      set -- $s
      echo "$(($1 + $2)) $4"
    }
    ;;
  *) echo "broker must be rabbitmq or nats" >&2; exit 2 ;;
esac

publish_out=$("$dedup" publish --broker "$broker" --count "$messages" --id-prefix m- \
  --duplicates 0.1 --seed 7)
echo "$publish_out"
published=$(echo "$publish_out" | awk '{print $2}')

export LEDGER=$work/ledger WORK_MS=2 SLOW_EVERY=500 SLOW_MS=3500
touch "$LEDGER" "$work/kills" "$work/outage"

# The textbook flags are refused without --pattern textbook, the Buffer's with it.
pattern_flags=(--store "$store" --lease "$lease")
if [ "$pattern" = textbook ]; then
  pattern_flags=(--textbook-redis "redis://127.0.0.1:$redis_port" --textbook-ttl "$textbook_ttl")
fi

start_worker() {  # start_worker I
  local i=$1
  "$dedup" worker --broker "$broker" --pattern "$pattern" "${pattern_flags[@]}" \
    --exec "$handler" --no-shell --concurrency 4 --retry-delay 200ms \
    --summary-interval 5s >>"$work/worker$i.log" 2>&1 &
  worker_pids[$i]=$!
}
for i in $(seq 0 $((nworkers - 1))); do start_worker "$i"; done
# A worker that cannot reach the broker at start-up (during the restart) exits
# with 75; start it again, as a service manager would.
respawn_exited() {
  local i
  for i in $(seq 0 $((nworkers - 1))); do
    if ! kill -0 "${worker_pids[$i]}" 2>/dev/null; then
      wait "${worker_pids[$i]}" 2>/dev/null || true
      echo "worker $i (pid ${worker_pids[$i]}) exited; starting it again"
      start_worker "$i"
    fi
  done
}

t_start=$SECONDS
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
broker_restarted=0
while [ "$kills" -lt "$kills_wanted" ] && [ $SECONDS -lt "$deadline" ]; do
  sleep "0.$((RANDOM % 6 + 2))"
  respawn_exited
  i=$((RANDOM % nworkers))
  pid=${worker_pids[$i]}
  wait_first_effect "$pid"
  kill -KILL "$pid" 2>/dev/null || true
  wait "$pid" 2>/dev/null || true
  echo "$(now_us) $pid" >>"$work/kills"  # logged once the worker (and its handler) is gone
  kills=$((kills + 1))
  start_worker "$i"
  if [ "$broker_restarted" = 0 ] && [ "$kills" -ge $((kills_wanted / 2)) ]; then
    t0=$SECONDS
    restart_broker
    broker_restarted=1
    echo "$broker_kind restarted after $kills kills ($((SECONDS - t0))s)"
  fi
done
echo "$kills kills done in $((SECONDS - t_start))s; $(wc -l <"$LEDGER") effects in the ledger so far"

# Drain: until nothing is queued, pending or waiting for a retry, or the deadline.
state="? ?"
while [ $SECONDS -lt "$deadline" ]; do
  state=$(broker_state)
  if [ "${state%% *}" = 0 ]; then break; fi
  respawn_exited
  sleep 2
done
for i in $(seq 0 $((nworkers - 1))); do
  kill -TERM "${worker_pids[$i]}" 2>/dev/null || true
  wait "${worker_pids[$i]}" 2>/dev/null || true
  worker_pids[$i]=""
done
state=$(broker_state)
pending=${state%% *}
dead=${state##* }
[ "$pending" = "?" ] && pending=-1
[ "$dead" = "?" ] && dead=-1
tail -qn 1 "$work"/worker*.log
echo "broker: $broker_kind, broker restarts: $broker_restarted, drained after $((SECONDS - t_start))s"

# The buffer's Redis never restarts here (the broker does): no rerun may be
# explained by a store outage, hence --store redis-on-<broker>.
python3 "$here/worker_chaos_check.py" --ledger "$LEDGER" --kills "$work/kills" \
  --outage "$work/outage" \
  --messages "$messages" --published "$published" --pending "$pending" --dead "$dead" \
  --pattern "$pattern" --store "redis-on-$broker_kind" --workers "$nworkers" \
  --redis-restarts 0 --elapsed "$SECONDS" --min-kill-hits 1
