#!/usr/bin/env bash
# A second SIGTERM while `dedup worker` returns from its Consumer's Run() and
# destroys it (src/cli/worker_command.cc): the signal handler must not be inside
# the Consumer's Stop() when it goes, and the worker exits as after one SIGTERM.
#
#   tests/worker_stop_signal_test.sh build/src/cli/dedup build/tests/libstop_signal_preload.so
#
# Real redis-server on 127.0.0.1:6516 (docs/PORTS.md), memory: store. The worker
# runs with tests/stop_signal_preload.cc preloaded: a thread of its own to which
# the test sends the second signal, whose handler's sem_post it holds for 2 s,
# and which ends the process with exit code 86 if the semaphore of that held post
# is destroyed meanwhile (the Consumer destroyed under the handler).
#   1. One SIGTERM while a handler runs (1.5 s): exit 0 once it is done.
#   2. SIGTERM, then a second one (to the preload's thread) while the drain
#      waits for the handler: exit 0 too, the handler's entry acked.
set -uo pipefail
dedup=$(realpath "$1")
preload=$(realpath "$2")
here=$(cd "$(dirname "$0")" && pwd)
port=${WORKER_STOP_SIGNAL_PORT:-6516}
# shellcheck source=../scripts/lib/redis.sh
source "$here/../scripts/lib/redis.sh"
# shellcheck source=../scripts/lib/drain.sh
source "$here/../scripts/lib/drain.sh"
worker_pid=""
DRAIN_KILL_VARS=worker_pid DRAIN_LOGS=w.log
drain_begin stop_signal
drain_need redis-server
redis_start "$port" "$tmp/redis" >/dev/null || fail "redis-server did not start on $port"
rcli() { redis-cli -p "$port" "$@"; }

drain_handler "$tmp/handler.sh" <<EOF
echo "\$DEDUP_KEY" >>"$tmp/started"
sleep 1.5
EOF

# run_once KEY SIGNALS: publishes KEY, starts a worker, waits for its handler,
# sends SIGTERM (to the process), and with SIGNALS=2 a second SIGTERM 0.2 s later
# to the preload's thread; sets rc (the worker's exit code).
run_once() {
  local key=$1 signals=$2 i tid
  rm -f "$tmp/started" "$tmp/tid"
  rcli XADD jobs '*' id "$key" >/dev/null || fail "XADD"
  echo "--- $key: $signals SIGTERM" >>"$tmp/w.log"
  LD_PRELOAD="$preload" STOP_SIGNAL_TID_FILE="$tmp/tid" \
    "$dedup" worker --broker "redis://127.0.0.1:$port?stream=jobs&group=g&consumer=w" \
    --store memory: --exec "$tmp/handler.sh" --no-shell --concurrency 1 \
    --drain-timeout 10s --summary-interval 0 >>"$tmp/w.log" 2>&1 &
  worker_pid=$!
  for i in $(seq 1 200); do
    [ -s "$tmp/started" ] && [ -s "$tmp/tid" ] && break
    sleep 0.05
  done
  [ "$(cat "$tmp/started" 2>/dev/null)" = "$key" ] || fail "$key: the handler did not start"
  tid=$(cat "$tmp/tid")
  [ -d "/proc/$worker_pid/task/$tid" ] || fail "$key: thread $tid is not the worker's"
  kill -TERM "$worker_pid"
  if [ "$signals" = 2 ]; then
    sleep 0.2
    kill -TERM "$tid"
  fi
  wait "$worker_pid"
  rc=$?
  worker_pid=""
}

run_once k1 1
rc_once=$rc
[ "$rc_once" = 0 ] || fail "one SIGTERM: exit $rc_once, want 0"
run_once k2 2
[ "$rc" = "$rc_once" ] || fail "two SIGTERMs: exit $rc, want $rc_once as after one"
grep -q "holding a signal handler's sem_post" "$tmp/w.log" ||
  fail "the second SIGTERM's handler did not run on the preload's thread"
grep -q "sem_destroy of a semaphore" "$tmp/w.log" && fail "$(grep sem_destroy "$tmp/w.log")"
pending=$(rcli XPENDING jobs g | head -1)
[ "$pending" = 0 ] || fail "$pending entries pending, want 0 (both handlers ended in time)"
echo "ok: exit $rc_once after one SIGTERM and after two, nothing pending"
echo PASS
