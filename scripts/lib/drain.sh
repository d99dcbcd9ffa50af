#!/usr/bin/env bash
# Helpers of the drain tests (tests/worker_drain_*.sh). Source it:
#
#   drain_begin NAME
#       makes the test's temporary directory, tmp (/tmp/dedup_NAME.XXXXXX), and
#       an EXIT trap that SIGKILLs the PIDs held (at exit) by the variables named
#       in DRAIN_KILL_VARS, SIGCONTs those named in DRAIN_THAW_VARS and those in
#       DRAIN_FROZEN, stops the
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
#       code) and DRAIN_TOOK_MS (SIGTERM to exit, seen within 50 ms). Fails
#       (after thawing them) when the worker has not exited DRAIN_STOP_LIMIT_S
#       (15) seconds after SIGTERM.
#   drain_frozen_store_stop DEDUP STORE_URI LEASE LATE ID_PREFIX [PIDS_FUNCTION]
#       the run of the drain tests whose store freezes with claims in flight
#       (the store's processes: those PIDS_FUNCTION prints at the moment of the
#       freeze, or store_pid; DRAIN_FROZEN holds them while they are frozen, and
#       drain_begin's trap thaws them):
#       publishes one entry (key m-1) to the stream of drain_stream_and_store,
#       starts `dedup worker` on it (consumer w, --exec $tmp/handler.sh of
#       drain_sleeping_handler, --concurrency 2 --prefetch 8, --lease LEASE,
#       --drain-timeout ${drain_s}s, the words of DRAIN_WORKER_ARGS, log
#       $tmp/w.log; its PID in worker_pid) and
#       waits until its handler runs; then freezes the store (SIGSTOP)
#       and lets LATE entries arrive at once (MULTI/EXEC, keys ID_PREFIX1 to
#       ID_PREFIX<LATE>), so that their claims are sent and wait; 0.5 s later it
#       stops the worker (drain_stop_timed). Sets rc and took_ms, clears
#       worker_pid and prints them (with drain_s and timeout_s).
#   drain_second_worker_once DEDUP STORE_URI LEASE WANT
#       after drain_frozen_store_stop: starts a second `dedup worker` on the
#       same stream and group (consumer w2, a handler appending its key to
#       $tmp/ran, --lease LEASE, log $tmp/w2.log; its PID in second_pid) and
#       waits (30 s at most) until WANT keys m-* are completed and nothing is
#       pending; then stops it (SIGTERM) and fails unless it exited 0 and each
#       of the WANT messages ran exactly once. Sets takeovers and busy (from its
#       summary at exit), clears second_pid.

DRAIN_KILL_VARS=${DRAIN_KILL_VARS:-}
DRAIN_THAW_VARS=${DRAIN_THAW_VARS:-}
DRAIN_LOGS=${DRAIN_LOGS:-}
DRAIN_TAIL=${DRAIN_TAIL:-20}
DRAIN_STOP_LIMIT_S=${DRAIN_STOP_LIMIT_S:-15}
DRAIN_WORKER_ARGS=${DRAIN_WORKER_ARGS:-}
DRAIN_FROZEN=""

drain_begin() {
  tmp=$(mktemp -d "/tmp/dedup_$1.XXXXXX")
  trap _drain_cleanup EXIT
}

_drain_cleanup() {
  local v
  for v in $DRAIN_KILL_VARS; do [ -n "${!v:-}" ] && kill -KILL "${!v}" 2>/dev/null; done
  for v in $DRAIN_THAW_VARS; do [ -n "${!v:-}" ] && kill -CONT "${!v}" 2>/dev/null; done
  # shellcheck disable=SC2086
  [ -n "$DRAIN_FROZEN" ] && kill -CONT $DRAIN_FROZEN 2>/dev/null
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
  local worker=$1 t0 p i
  shift
  for p in "$@"; do kill -STOP "$p"; done
  t0=$(date +%s%N)
  kill -TERM "$worker"
  for ((i = 0; i < DRAIN_STOP_LIMIT_S * 20; i++)); do
    kill -0 "$worker" 2>/dev/null || break
    sleep 0.05
  done
  DRAIN_TOOK_MS=$((($(date +%s%N) - t0) / 1000000))
  if kill -0 "$worker" 2>/dev/null; then
    for p in "$@"; do kill -CONT "$p"; done
    fail "the worker had not exited ${DRAIN_TOOK_MS} ms after SIGTERM (drain timeout ${drain_s:-?} s)"
  fi
  wait "$worker"
  DRAIN_RC=$?
  for p in "$@"; do kill -CONT "$p"; done
}

drain_frozen_store_stop() {
  local dedup=$1 store=$2 lease=$3 late=$4 prefix=$5 pids=${6:-} i
  "$dedup" publish --broker "redis://127.0.0.1:$stream_port?stream=jobs" --count 1 \
    --id-prefix m- --quiet || fail "publish"
  # shellcheck disable=SC2086
  "$dedup" worker --broker "redis://127.0.0.1:$stream_port?stream=jobs&group=g&consumer=w" \
    --store "$store" --exec "$tmp/handler.sh" --no-shell --concurrency 2 --prefetch 8 \
    --lease "$lease" --drain-timeout "${drain_s}s" --summary-interval 0 $DRAIN_WORKER_ARGS \
    >>"$tmp/w.log" 2>&1 &
  worker_pid=$!
  drain_wait_claimed "$dedup" "$store" 1 "$tmp/started" || fail "the first handler did not start"
  if [ -n "$pids" ]; then DRAIN_FROZEN=$("$pids"); else DRAIN_FROZEN=$store_pid; fi
  # shellcheck disable=SC2086
  kill -STOP $DRAIN_FROZEN
  {
    echo MULTI
    for i in $(seq 1 "$late"); do echo "XADD jobs * id $prefix$i"; done
    echo EXEC
  } | rcli >/dev/null || fail "MULTI XADD"
  sleep 0.5
  # shellcheck disable=SC2086
  drain_stop_timed "$worker_pid" $DRAIN_FROZEN
  DRAIN_FROZEN=""
  worker_pid=""
  rc=$DRAIN_RC
  took_ms=$DRAIN_TOOK_MS
  echo "worker exited $rc ${took_ms} ms after SIGTERM (drain timeout ${drain_s} s, store frozen," \
    "timeout ${timeout_s} s)"
}

drain_second_worker_once() {
  local dedup=$1 store=$2 lease=$3 want=$4 done_all="" completed=0 rc2 runs summary
  drain_handler "$tmp/fast.sh" <<EOF
echo "\$DEDUP_KEY" >>"$tmp/ran"
EOF
  "$dedup" worker --broker "redis://127.0.0.1:$stream_port?stream=jobs&group=g&consumer=w2" \
    --store "$store" --exec "$tmp/fast.sh" --no-shell --concurrency 2 \
    --lease "$lease" --drain-timeout 5s --summary-interval 0 >>"$tmp/w2.log" 2>&1 &
  second_pid=$!
  for _ in $(seq 1 300); do
    completed=$("$dedup" inspect --store "$store" --prefix m- 2>/dev/null | grep -c completed)
    if [ "$completed" = "$want" ] && [ "$(rcli XPENDING jobs g | head -1)" = 0 ]; then
      done_all=1
      break
    fi
    sleep 0.1
  done
  [ -n "$done_all" ] || fail "the second worker did not finish every message ($completed completed)"
  kill -TERM "$second_pid"
  wait "$second_pid"
  rc2=$?
  second_pid=""
  [ "$rc2" = 0 ] || fail "second worker exit $rc2"
  runs=$(sort "$tmp/ran" | uniq -c | awk '$1 != 1' | wc -l)
  [ "$runs" = 0 ] || fail "a message ran more than once: $(sort "$tmp/ran" | uniq -c)"
  [ "$(wc -l <"$tmp/ran")" = "$want" ] || fail "want $want runs: $(cat "$tmp/ran")"
  summary=$(grep "stopped:" "$tmp/w2.log")
  takeovers=$(sed -n 's/.* takeovers=\([0-9]*\).*/\1/p' <<<"$summary")
  busy=$(sed -n 's/.* busy=\([0-9]*\).*/\1/p' <<<"$summary")
  takeovers=${takeovers:-0} busy=${busy:-0}
}
