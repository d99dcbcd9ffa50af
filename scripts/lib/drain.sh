#!/usr/bin/env bash
# Helpers of the drain tests (tests/worker_drain_*.sh). Source it:
#
#   drain_begin NAME
#       makes the test's temporary directory, tmp (/tmp/dedup_NAME.XXXXXX), and
#       an EXIT trap that SIGKILLs the PIDs held (at exit) by the variables named
#       in DRAIN_KILL_VARS, SIGCONTs those named in DRAIN_THAW_VARS, stops the
#       servers this shell started (nats_stop when scripts/lib/nats.sh is
#       sourced, redis_stop_all) and removes tmp. Everything by PID.
#   fail MESSAGE...
#       prints FAIL: MESSAGE and the last DRAIN_TAIL (20) lines of each log named
#       in DRAIN_LOGS (files in tmp), then exits 1.
#   drain_need COMMAND...
#       prints SKIP and exits 0 unless every COMMAND is installed.
#   drain_handler FILE
#       writes FILE, an executable /bin/sh handler that reads its message from
#       stdin, then runs the lines given on this function's stdin.
#   drain_sleeping_handler
#       drain_handler $tmp/handler.sh: appends "PID KEY" to $tmp/started, then
#       sleeps 30 s.
#   drain_stream_and_store STREAM_PORT STORE_PORT
#       starts two redis-servers (scripts/lib/redis.sh), the stream's and the
#       store's, in $tmp; sets store_pid and rcli (redis-cli of the stream).
#   drain_nothing_recorded DEDUP STORE_URI
#       fails unless `dedup inspect` of the keys m-* works and shows no completed
#       record; the listing stays in $tmp/inspect.
#   drain_wait_claimed DEDUP STORE_URI WANT STARTED_FILE
#       waits (10 s at most) until a handler has written STARTED_FILE and WANT
#       claims of keys m-* are held in the store; sets DRAIN_CLAIMED (the count
#       last seen). Returns 1 when that never happened.
#   drain_stop_timed WORKER_PID [FROZEN_PID...]
#       freezes each FROZEN_PID (SIGSTOP, by PID), sends the worker SIGTERM and
#       waits for it, then thaws them (SIGCONT); sets DRAIN_RC (the worker's exit
#       code) and DRAIN_TOOK_MS (SIGTERM to exit).
#   drain_frozen_store_stop DEDUP STORE_URI LEASE LATE ID_PREFIX
#       the run of the drain tests whose store freezes with claims in flight:
#       publishes one entry (key m-1) to the stream of drain_stream_and_store,
#       starts `dedup worker` on it (consumer w, --exec $tmp/handler.sh of
#       drain_sleeping_handler, --concurrency 2 --prefetch 8, --lease LEASE,
#       --drain-timeout ${drain_s}s, log $tmp/w.log; its PID in worker_pid) and
#       waits until its handler runs; then freezes the store (store_pid, SIGSTOP)
#       and lets LATE entries arrive at once (MULTI/EXEC, keys ID_PREFIX1 to
#       ID_PREFIX<LATE>), so that their claims are sent and wait; 0.5 s later it
#       stops the worker (drain_stop_timed). Sets rc and took_ms, clears
#       worker_pid and prints them (with drain_s and timeout_s).

DRAIN_KILL_VARS=${DRAIN_KILL_VARS:-}
DRAIN_THAW_VARS=${DRAIN_THAW_VARS:-}
DRAIN_LOGS=${DRAIN_LOGS:-}
DRAIN_TAIL=${DRAIN_TAIL:-20}

drain_begin() {
  tmp=$(mktemp -d "/tmp/dedup_$1.XXXXXX")
  trap _drain_cleanup EXIT
}

_drain_cleanup() {
  local v
  for v in $DRAIN_KILL_VARS; do [ -n "${!v:-}" ] && kill -KILL "${!v}" 2>/dev/null; done
  for v in $DRAIN_THAW_VARS; do [ -n "${!v:-}" ] && kill -CONT "${!v}" 2>/dev/null; done
  if declare -F nats_stop >/dev/null; then nats_stop; fi
  redis_stop_all
  rm -rf "$tmp"
}

fail() {
  local f
  echo "FAIL: $*" >&2
  for f in $DRAIN_LOGS; do [ -f "$tmp/$f" ] && tail -"$DRAIN_TAIL" "$tmp/$f" >&2; done
  exit 1
}

drain_need() {
  local c
  for c in "$@"; do
    command -v "$c" >/dev/null || { echo "SKIP: needs $*"; exit 0; }
  done
}

drain_handler() {
  { echo '#!/bin/sh'; echo 'cat >/dev/null'; cat; } >"$1"
  chmod +x "$1"
}

drain_sleeping_handler() {
  drain_handler "$tmp/handler.sh" <<EOF
echo "\$\$ \$DEDUP_KEY" >>"$tmp/started"
sleep 30
EOF
}

drain_stream_and_store() {
  stream_port=$1
  redis_start "$1" "$tmp/stream" >/dev/null || fail "redis-server did not start on $1"
  redis_start "$2" "$tmp/store" >/dev/null || fail "redis-server did not start on $2"
  store_pid=$REDIS_LAST_PID
  rcli() { redis-cli -p "$stream_port" "$@"; }
}

drain_nothing_recorded() {
  "$1" inspect --store "$2" --prefix m- >"$tmp/inspect" 2>&1 || fail "inspect: $(cat "$tmp/inspect")"
  grep -q "completed" "$tmp/inspect" && fail "an outcome was recorded: $(cat "$tmp/inspect")"
  return 0
}

drain_wait_claimed() {
  local dedup=$1 store=$2 want=$3 started=$4 i
  DRAIN_CLAIMED=0
  for i in $(seq 1 200); do
    DRAIN_CLAIMED=$("$dedup" inspect --store "$store" --prefix m- 2>/dev/null | grep -c in_progress)
    [ -f "$started" ] && [ "$DRAIN_CLAIMED" -ge "$want" ] && return 0
    sleep 0.05
  done
  return 1
}

drain_stop_timed() {
  local worker=$1 t0 p
  shift
  for p in "$@"; do kill -STOP "$p"; done
  t0=$(date +%s%N)
  kill -TERM "$worker"
  wait "$worker"
  DRAIN_RC=$?
  DRAIN_TOOK_MS=$((($(date +%s%N) - t0) / 1000000))
  for p in "$@"; do kill -CONT "$p"; done
}

drain_frozen_store_stop() {
  local dedup=$1 store=$2 lease=$3 late=$4 prefix=$5 i
  "$dedup" publish --broker "redis://127.0.0.1:$stream_port?stream=jobs" --count 1 \
    --id-prefix m- --quiet || fail "publish"
  "$dedup" worker --broker "redis://127.0.0.1:$stream_port?stream=jobs&group=g&consumer=w" \
    --store "$store" --exec "$tmp/handler.sh" --no-shell --concurrency 2 --prefetch 8 \
    --lease "$lease" --drain-timeout "${drain_s}s" --summary-interval 0 >>"$tmp/w.log" 2>&1 &
  worker_pid=$!
  drain_wait_claimed "$dedup" "$store" 1 "$tmp/started" || fail "the first handler did not start"
  kill -STOP "$store_pid"
  {
    echo MULTI
    for i in $(seq 1 "$late"); do echo "XADD jobs * id $prefix$i"; done
    echo EXEC
  } | rcli >/dev/null || fail "MULTI XADD"
  sleep 0.5
  drain_stop_timed "$worker_pid" "$store_pid"
  worker_pid=""
  rc=$DRAIN_RC
  took_ms=$DRAIN_TOOK_MS
  echo "worker exited $rc ${took_ms} ms after SIGTERM (drain timeout ${drain_s} s, store frozen," \
    "timeout ${timeout_s} s)"
}
