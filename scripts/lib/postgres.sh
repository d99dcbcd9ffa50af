#!/usr/bin/env bash
# Start and stop throwaway PostgreSQL servers for tests and benchmarks. Source it:
#
#   source scripts/lib/postgres.sh
#   pg_start 5440                     # PostgreSQL on 127.0.0.1:5440, database "dedup"
#   export DEDUP_TEST_POSTGRES_URI=$PG_LAST_URI
#   pg_restart 5440                   # fast shutdown, then start on the same data
#   pg_restart 5440 0 immediate       # a crash (no checkpoint), then crash recovery
#   ...                               # every server stops at exit (trap)
#
# Each server gets a fresh data directory (initdb) under ${TMPDIR:-/tmp}, listens on
# 127.0.0.1 only (no Unix socket outside its directory), and authenticates with a
# password (scram-sha-256) as user "dedup" / "$PG_TEST_PASSWORD". PostgreSQL refuses
# to run as root: when this shell is root the server runs as the unprivileged user
# $PG_RUN_AS (default "nobody", through setpriv), which owns the directory. The
# server runs in the foreground as a child of this shell with a parent-death signal,
# so it dies with the shell even when the shell is SIGKILLed; it is stopped by
# `pg_ctl stop -m fast` and its PID, never by name. Ports are checked free first.
#
# Run directly, for tests that manage a server of their own:
#   scripts/lib/postgres.sh init            makes a data directory, prints its path
#   scripts/lib/postgres.sh run PORT DIR    becomes that server (exec; SIGINT = fast
#                                           shutdown), e.g. as a test's child process

PG_BIN_DIR=${PG_BIN_DIR:-$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -1)}
PG_RUN_AS=${PG_RUN_AS:-nobody}
PG_TEST_PASSWORD=${PG_TEST_PASSWORD:-dedup-test-pw}
# PIDs of the servers this shell started, their ports and data directories (same order).
PG_PIDS=()
PG_PORTS=()
PG_DIRS=()
# The shell (BASHPID) that started each server: only it can wait for the PID.
PG_OWNERS=()

_pg_log() { echo "postgres.sh: $*" >&2; }

# _pg_as CMD...: runs CMD as the unprivileged user when this shell is root.
_pg_as() {
  if [ "$(id -u)" -eq 0 ]; then
    local group
    group=$(id -gn "$PG_RUN_AS")
    setpriv --reuid="$PG_RUN_AS" --regid="$group" --clear-groups --reset-env \
      env PATH="$PG_BIN_DIR:/usr/bin:/bin" "$@"
  else
    "$@"
  fi
}

pg_port_free() {
  ! (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null
}

# pg_init: makes a fresh data directory, prints its path.
pg_init() {
  local dir
  dir=$(mktemp -d "${TMPDIR:-/tmp}/dedup-pg.XXXXXX") || return 1
  chmod 755 "$dir"
  [ "$(id -u)" -eq 0 ] && chown "$PG_RUN_AS" "$dir"
  printf '%s\n' "$PG_TEST_PASSWORD" >"$dir/pwfile"
  [ "$(id -u)" -eq 0 ] && chown "$PG_RUN_AS" "$dir/pwfile"
  if ! _pg_as "$PG_BIN_DIR/initdb" -D "$dir/data" -U dedup --pwfile="$dir/pwfile" \
      --auth-host=scram-sha-256 --auth-local=scram-sha-256 -E UTF8 --locale=C.UTF-8 \
      >"$dir/initdb.log" 2>&1; then
    _pg_log "initdb failed, see $dir/initdb.log"
    return 1
  fi
  rm -f "$dir/pwfile"
  printf '%s\n' "$dir"
}

# _pg_server_args PORT DIR: the command line of the server of DIR on PORT, in
# PG_SERVER_ARGS. fsync off: test data need not survive a power loss, and it spares
# the shared disk. The parent-death signal kills the server with its parent.
_pg_server_args() {
  local port=$1 dir=$2
  PG_SERVER_ARGS=(setpriv --pdeathsig KILL)
  if [ "$(id -u)" -eq 0 ]; then
    PG_SERVER_ARGS+=(--reuid="$PG_RUN_AS" --regid="$(id -gn "$PG_RUN_AS")" --clear-groups --reset-env)
  fi
  PG_SERVER_ARGS+=("$PG_BIN_DIR/postgres" -D "$dir/data" -p "$port" -c listen_addresses=127.0.0.1
    -c unix_socket_directories="$dir" -c fsync=off -c max_connections=200)
}

# _pg_run PORT DIR: starts the server of DIR on PORT in the background.
_pg_run() {
  _pg_server_args "$1" "$2"
  "${PG_SERVER_ARGS[@]}" >>"$2/server.log" 2>&1 &
  PG_LAST_PID=$!
}

# pg_wait_ready PORT [SECONDS]
pg_wait_ready() {
  local port=$1 deadline=$((SECONDS + ${2:-30}))
  while ((SECONDS < deadline)); do
    "$PG_BIN_DIR/pg_isready" -q -h 127.0.0.1 -p "$port" && return 0
    sleep 0.1
  done
  _pg_log "server on port $port did not become ready"
  return 1
}

# pg_start PORT [DIR]: starts a server (a fresh one unless DIR holds one) and
# creates the database "dedup". Sets PG_LAST_PID, PG_LAST_DIR and PG_LAST_URI.
pg_start() {
  local port=$1 dir=${2:-}
  if ! pg_port_free "$port"; then
    _pg_log "port $port is already in use; not starting a server there"
    return 1
  fi
  local fresh=0
  if [ -z "$dir" ]; then
    dir=$(pg_init) || return 1
    fresh=1
  fi
  _pg_run "$port" "$dir"
  PG_PIDS+=("$PG_LAST_PID")
  PG_PORTS+=("$port")
  PG_DIRS+=("$dir")
  PG_OWNERS+=("$BASHPID")
  PG_LAST_DIR=$dir
  _pg_install_trap
  pg_wait_ready "$port" || { _pg_log "see $dir/server.log"; return 1; }
  if [ "$fresh" = 1 ]; then
    PGPASSWORD=$PG_TEST_PASSWORD "$PG_BIN_DIR/createdb" -h 127.0.0.1 -p "$port" -U dedup dedup \
      || { _pg_log "createdb failed on port $port"; return 1; }
  fi
  PG_LAST_URI="postgres://dedup:$PG_TEST_PASSWORD@127.0.0.1:$port/dedup"
}

# _pg_index PORT: index of the server on PORT in PG_PORTS.
_pg_index() {
  local i
  for i in "${!PG_PORTS[@]}"; do
    [ "${PG_PORTS[$i]}" = "$1" ] && { echo "$i"; return 0; }
  done
  return 1
}

# pg_stop PORT [MODE]: shutdown (pg_ctl -m MODE: fast, or immediate = a crash
# that the next start recovers from) of the server this shell started on PORT,
# waited for by PID (SIGKILL if it has not gone after 20 s). Its directory is kept.
pg_stop() {
  local i pid dir n mode=${2:-fast}
  i=$(_pg_index "$1") || return 0
  pid=${PG_PIDS[$i]} dir=${PG_DIRS[$i]}
  [ -n "$pid" ] || return 0
  if kill -0 "$pid" 2>/dev/null; then
    _pg_as "$PG_BIN_DIR/pg_ctl" stop -D "$dir/data" -m "$mode" -w -t 20 >/dev/null 2>&1 \
      || kill -TERM "$pid" 2>/dev/null
    for n in $(seq 1 200); do
      kill -0 "$pid" 2>/dev/null || break
      sleep 0.1
    done
    kill -0 "$pid" 2>/dev/null && kill -KILL "$pid" 2>/dev/null
  fi
  # A subshell must not `wait` for its parent's child: bash would wait forever.
  [ "${PG_OWNERS[$i]}" = "$BASHPID" ] && wait "$pid" 2>/dev/null
  PG_PIDS[$i]=""
  return 0
}

# pg_restart PORT [PAUSE_SECONDS] [MODE]: shutdown (fast unless MODE), pause, start
# again on the same data.
pg_restart() {
  local port=$1 i dir
  i=$(_pg_index "$port") || { _pg_log "no server of ours on $port"; return 1; }
  dir=${PG_DIRS[$i]}
  pg_stop "$port" "${3:-fast}"
  sleep "${2:-0}"
  _pg_run "$port" "$dir"
  PG_PIDS[$i]=$PG_LAST_PID
  PG_OWNERS[$i]=$BASHPID
  pg_wait_ready "$port"
}

# pg_stop_all: stops every server this shell started and removes their directories.
pg_stop_all() {
  local i
  for i in "${!PG_PORTS[@]}"; do
    pg_stop "${PG_PORTS[$i]}"
    [ -n "${PG_DIRS[$i]}" ] && [ -z "${PG_KEEP:-}" ] && rm -rf "${PG_DIRS[$i]}"
  done
  PG_PIDS=()
  PG_PORTS=()
  PG_DIRS=()
  PG_OWNERS=()
}

_pg_install_trap() {
  if [[ -z "${_PG_TRAP_SET:-}" ]]; then
    _PG_TRAP_SET=1
    local prev
    prev=$(trap -p EXIT | sed -E "s/^trap -- '(.*)' EXIT$/\1/")
    trap "${prev:+$prev; }pg_stop_all" EXIT
  fi
}

if [[ "${BASH_SOURCE[0]}" == "$0" ]]; then
  case "${1:-}" in
    init) pg_init ;;
    run)
      _pg_server_args "$2" "$3"
      exec "${PG_SERVER_ARGS[@]}" >>"$3/server.log" 2>&1
      ;;
    *) echo "usage: $0 init | run PORT DIR" >&2; exit 2 ;;
  esac
fi
