#!/usr/bin/env bash
# Start and stop `dedup serve` and small HTTP applications for tests. Source it:
#
#   source scripts/lib/serve.sh
#   serve_start 8070 "$log" ./build/src/cli/dedup serve --store memory: --listen 127.0.0.1:8070
#   serve_start 8080 "$log" python3 tests/serve_app.py 8080 "$tmp/calls"
#   check "the answer is 200" [ "$code" = 200 ]   # counted in $FAILS
#   ...                                      # every process stops at exit (trap)
#
# Each process gets SIGKILL if this shell dies (setpriv --pdeathsig), is stopped
# by its PID (never by name), and must answer GET /healthz on 127.0.0.1:PORT
# within 20 s. Ports are checked free before starting.

SERVE_PIDS=()
# Checks that failed so far (see check).
FAILS=0

# check WHAT COMMAND...: runs COMMAND; prints "ok   WHAT" or "FAIL WHAT" and
# counts failures in FAILS, so that a test reports every check, not the first.
check() {
  local what=$1
  shift
  if "$@"; then echo "ok   $what"; else echo "FAIL $what"; FAILS=$((FAILS + 1)); fi
}

_serve_log() { echo "serve.sh: $*" >&2; }

serve_port_free() {
  ! (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null
}

# Keeps a trap the caller set, and runs ours after it.
_serve_install_trap() {
  if [[ -z "${_SERVE_TRAP_SET:-}" ]]; then
    _SERVE_TRAP_SET=1
    local prev
    prev=$(trap -p EXIT | sed -E "s/^trap -- '(.*)' EXIT$/\1/")
    trap "${prev:+$prev; }serve_stop_all" EXIT
  fi
}

# serve_start PORT LOGFILE COMMAND...: starts COMMAND in the background; its PID
# is in SERVE_LAST_PID. The health check sends $SERVE_HEALTH_HEADER if set.
serve_start() {
  local port=$1 log=$2
  shift 2
  if ! serve_port_free "$port"; then
    _serve_log "port $port is already in use"
    return 1
  fi
  setpriv --pdeathsig KILL -- "$@" >"$log" 2>&1 &
  SERVE_LAST_PID=$!
  SERVE_PIDS+=("$SERVE_LAST_PID")
  _serve_install_trap
  local deadline=$((SECONDS + 20))
  while ((SECONDS < deadline)); do
    # /healthz first; /_dedup/healthz (proxy mode with a token) only once
    # something answered, so that an application never sees it.
    local code
    code=$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$port/healthz" 2>/dev/null || true)
    if [ "$code" = 200 ]; then
      return 0
    elif [ "$code" != 000 ] && [ -n "$code" ] &&
         curl -fsS -o /dev/null "http://127.0.0.1:$port/_dedup/healthz" 2>/dev/null; then
      return 0
    fi
    if ! kill -0 "$SERVE_LAST_PID" 2>/dev/null; then
      _serve_log "'$*' exited; its log:"
      cat "$log" >&2
      return 1
    fi
    sleep 0.05
  done
  _serve_log "nothing answered on port $port; log in $log"
  return 1
}

# serve_stop PID: SIGTERM, then SIGKILL after 5 s.
serve_stop() {
  local pid=$1 i
  kill -TERM "$pid" 2>/dev/null || return 0
  for i in $(seq 50); do
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.1
  done
  kill -KILL "$pid" 2>/dev/null || true
  wait "$pid" 2>/dev/null || true
}

# serve_report TMP: the end of a test made of checks. When one failed: says so,
# sets SERVE_KEEP_TMP (the test's EXIT trap, serve_test_cleanup, then stops every
# process it started, Redis and workers included, and keeps TMP with its logs)
# and exits 1.
serve_report() {
  if ((FAILS > 0)); then
    echo "$FAILS check(s) failed; logs in $1" >&2
    SERVE_KEEP_TMP=1
    exit 1
  fi
  echo "all checks passed"
}

serve_stop_all() {
  local pid
  for pid in "${SERVE_PIDS[@]}"; do serve_stop "$pid"; done
  SERVE_PIDS=()
}
