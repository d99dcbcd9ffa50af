#!/usr/bin/env bash
# Start and stop a throwaway NATS server with JetStream for tests and benchmarks.
# Source it:
#
#   source scripts/lib/nats.sh
#   nats_start 4230 "$tmp/nats"               # nats://127.0.0.1:4230, JetStream on
#   export DEDUP_TEST_NATS_URI=nats://127.0.0.1:4230
#   nats_restart                              # stop + start on the same store dir
#   ...                                       # the server stops at exit (trap)
#
# The server listens on 127.0.0.1 only (port 4230-4249, docs/PORTS.md), keeps its
# JetStream files in DIR/js (file-backed streams survive a restart) and is stopped
# by its PID (SIGTERM: a clean shutdown that flushes the streams), never by name.

NATS_SERVER_BIN=${NATS_SERVER_BIN:-nats-server}
NATS_PID=""
NATS_PORT=""
NATS_DIR=""
NATS_START_MS=""  # wall time of the last start, for the test's log
# More nats-server arguments, e.g. NATS_SERVER_ARGS=(--user u --pass p) before nats_start.
[[ -n "${NATS_SERVER_ARGS+set}" ]] || NATS_SERVER_ARGS=()

_nats_log() { echo "nats.sh: $*" >&2; }
_nats_port_free() { ! (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }
_nats_now_ms() { date +%s%3N; }

# nats_start PORT DIR: starts a server and waits until it accepts connections.
nats_start() {
  local port=$1 dir=$2
  if ((port < 4230 || port > 4249)); then
    _nats_log "port $port is outside 4230-4249 (docs/PORTS.md)"
    return 1
  fi
  if ! _nats_port_free "$port"; then
    _nats_log "port $port is already in use; not starting NATS there"
    return 1
  fi
  mkdir -p "$dir/js"
  NATS_PORT=$port
  NATS_DIR=$(cd "$dir" && pwd)
  _nats_install_trap
  _nats_boot
}

_nats_boot() {
  local t0 deadline
  t0=$(_nats_now_ms)
  "$NATS_SERVER_BIN" -js -a 127.0.0.1 -p "$NATS_PORT" -sd "$NATS_DIR/js" \
    -l "$NATS_DIR/nats.log" "${NATS_SERVER_ARGS[@]}" </dev/null >>"$NATS_DIR/nats.out" 2>&1 &
  NATS_PID=$!
  deadline=$((SECONDS + ${NATS_START_TIMEOUT:-20}))
  while ((SECONDS < deadline)); do
    if ! kill -0 "$NATS_PID" 2>/dev/null; then
      _nats_log "nats-server exited during start-up; see $NATS_DIR/nats.log"
      return 1
    fi
    # JetStream is ready once the log says so; the port alone opens earlier.
    if ! _nats_port_free "$NATS_PORT" && grep -q 'Server is ready' "$NATS_DIR/nats.log" 2>/dev/null; then
      NATS_START_MS=$(($(_nats_now_ms) - t0))
      return 0
    fi
    sleep 0.02
  done
  _nats_log "server on port $NATS_PORT did not start; see $NATS_DIR/nats.log"
  return 1
}

# nats_stop: stops the server by PID (SIGTERM, then SIGKILL after 10 s).
nats_stop() {
  [[ -n "$NATS_PID" ]] || return 0
  local i
  if kill -0 "$NATS_PID" 2>/dev/null; then
    kill -TERM "$NATS_PID" 2>/dev/null
    for i in $(seq 1 200); do
      kill -0 "$NATS_PID" 2>/dev/null || break
      sleep 0.05
    done
    kill -0 "$NATS_PID" 2>/dev/null && kill -KILL "$NATS_PID" 2>/dev/null
    wait "$NATS_PID" 2>/dev/null || true
  fi
  NATS_PID=""
  return 0
}

# nats_restart: stops the server and starts it again on the same store directory.
nats_restart() {
  nats_stop
  # The log of the last run says "Server is ready" already: start a fresh one.
  [[ -f "$NATS_DIR/nats.log" ]] && mv "$NATS_DIR/nats.log" "$NATS_DIR/nats.log.$(date +%s%N)"
  _nats_boot
}

_nats_install_trap() {
  if [[ -z "${_NATS_TRAP_SET:-}" ]]; then
    _NATS_TRAP_SET=1
    local prev
    prev=$(trap -p EXIT | sed -E "s/^trap -- '(.*)' EXIT$/\1/")
    trap "${prev:+$prev; }nats_stop" EXIT
  fi
}
