#!/usr/bin/env bash
# Helpers of the drain tests (tests/worker_drain_*.sh). Source it:
#
#   drain_wait_claimed DEDUP STORE_URI WANT STARTED_FILE
#       waits (10 s at most) until a handler has written STARTED_FILE and WANT
#       claims of keys m-* are held in the store; sets DRAIN_CLAIMED (the count
#       last seen). Returns 1 when that never happened.
#   drain_stop_timed WORKER_PID [FROZEN_PID...]
#       freezes each FROZEN_PID (SIGSTOP, by PID), sends the worker SIGTERM and
#       waits for it, then thaws them (SIGCONT); sets DRAIN_RC (the worker's exit
#       code) and DRAIN_TOOK_MS (SIGTERM to exit).

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
