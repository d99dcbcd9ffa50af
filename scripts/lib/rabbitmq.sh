#!/usr/bin/env bash
# Start and stop a throwaway RabbitMQ node for tests and benchmarks. Source it:
#
#   source scripts/lib/rabbitmq.sh
#   rabbitmq_start 5680 "$tmp/rmq"            # AMQP on 127.0.0.1:5680
#   export DEDUP_TEST_AMQP_URI=amqp://guest:guest@127.0.0.1:5680/
#   rabbitmq_restart                          # stop + start, same data (durable queues survive)
#   ...                                       # the node stops at exit (trap)
#
# Everything belongs to this node alone, so that it never meets a system RabbitMQ
# or another test's node: AMQP port P (5680-5689), Erlang distribution port
# P+20000, its own epmd on 4370+(P-5680) (started here, in the foreground, and
# stopped by PID), node name dedup-P@localhost, its own Erlang cookie (HOME is the
# node's directory), and its configuration, database and logs in DIR. The system's
# /etc/rabbitmq is never read. The node is stopped with `rabbitmqctl stop` and then
# by PID (the wrapper shell, and the Erlang VM from its pid file), never by name.
#
# Start-up takes a few seconds (Erlang boot plus RabbitMQ's boot steps): start one
# node per test script, not one per test case.

RABBITMQ_HOME_BIN=${RABBITMQ_HOME_BIN:-/usr/lib/rabbitmq/bin}
EPMD_BIN=${EPMD_BIN:-$(command -v epmd || echo /usr/lib/erlang/erts-*/bin/epmd)}
RABBITMQ_PID=""       # the rabbitmq-server wrapper shell
RABBITMQ_EPMD_PID=""
RABBITMQ_PORT=""
RABBITMQ_DIR=""
RABBITMQ_START_SECONDS=""  # wall time of the last start, for the test's log

_rabbitmq_log() { echo "rabbitmq.sh: $*" >&2; }

_rabbitmq_port_free() { ! (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

# The environment of every rabbitmq-server / rabbitmqctl call for this node.
_rabbitmq_env() {
  local port=$RABBITMQ_PORT dir=$RABBITMQ_DIR
  env HOME="$dir" \
    RABBITMQ_CONF_ENV_FILE=/dev/null \
    RABBITMQ_NODENAME="dedup-$port@localhost" \
    RABBITMQ_USE_LONGNAME=false \
    RABBITMQ_NODE_IP_ADDRESS=127.0.0.1 \
    RABBITMQ_NODE_PORT="$port" \
    RABBITMQ_DIST_PORT=$((port + 20000)) \
    ERL_EPMD_PORT=$((4370 + port - 5680)) \
    ERL_EPMD_ADDRESS=127.0.0.1 \
    RABBITMQ_CONFIG_FILE="$dir/rabbitmq.conf" \
    RABBITMQ_ADVANCED_CONFIG_FILE="$dir/advanced.config" \
    RABBITMQ_ENABLED_PLUGINS_FILE="$dir/enabled_plugins" \
    RABBITMQ_MNESIA_BASE="$dir/mnesia" \
    RABBITMQ_LOG_BASE="$dir/log" \
    RABBITMQ_PID_FILE="$dir/beam.pid" \
    RABBITMQ_FEATURE_FLAGS_FILE="$dir/feature_flags" \
    RABBITMQ_QUORUM_DIR="$dir/quorum" \
    RABBITMQ_STREAM_DIR="$dir/stream" \
    "$@"
}

# rabbitmqctl_node ARGS...: rabbitmqctl against this node.
rabbitmqctl_node() {
  _rabbitmq_env "$RABBITMQ_HOME_BIN/rabbitmqctl" -n "dedup-$RABBITMQ_PORT@localhost" "$@"
}

# rabbitmq_eval EXPR: evaluates the Erlang expression EXPR on this node and prints
# {ok, Result}. It goes through erl_call (a small C client of Erlang's distribution,
# shipped with erlang-base like rabbitmqctl's VM) and answers in milliseconds,
# where rabbitmqctl boots a whole Erlang VM first (0.4-1.5 s): tests that must read
# the node's own counters inside a short window use this.
ERL_CALL_BIN=${ERL_CALL_BIN:-$(command -v erl_call || echo /usr/lib/erlang/bin/erl_call)}
rabbitmq_eval() {
  printf '%s\n' "$1" |
    _rabbitmq_env "$ERL_CALL_BIN" -sname "dedup-$RABBITMQ_PORT@localhost" -e
}

# rabbitmq_start PORT DIR: starts a node and waits until it accepts AMQP.
rabbitmq_start() {
  local port=$1 dir=$2
  if ((port < 5680 || port > 5689)); then
    _rabbitmq_log "port $port is outside 5680-5689 (docs/PORTS.md)"
    return 1
  fi
  local p
  for p in "$port" $((port + 20000)) $((4370 + port - 5680)); do
    if ! _rabbitmq_port_free "$p"; then
      _rabbitmq_log "port $p is already in use; not starting RabbitMQ there"
      return 1
    fi
  done
  mkdir -p "$dir/log" "$dir/mnesia"
  RABBITMQ_PORT=$port
  RABBITMQ_DIR=$(cd "$dir" && pwd)
  if [[ ! -f "$RABBITMQ_DIR/.erlang.cookie" ]]; then
    head -c 24 /dev/urandom | od -An -tx1 | tr -d ' \n' >"$RABBITMQ_DIR/.erlang.cookie"
    chmod 400 "$RABBITMQ_DIR/.erlang.cookie"
  fi
  cat >"$RABBITMQ_DIR/rabbitmq.conf" <<EOF
listeners.tcp.default = 127.0.0.1:$port
loopback_users = none
disk_free_limit.absolute = 10MB
vm_memory_high_watermark.relative = 0.8
log.console = false
log.file.level = warning
EOF
  echo '[].' >"$RABBITMQ_DIR/enabled_plugins"
  echo '[].' >"$RABBITMQ_DIR/advanced.config"
  _rabbitmq_install_trap
  _rabbitmq_boot
}

_rabbitmq_boot() {
  local t0=$SECONDS epmd_port=$((4370 + RABBITMQ_PORT - 5680)) i
  "$EPMD_BIN" -port "$epmd_port" -address 127.0.0.1 \
    >>"$RABBITMQ_DIR/log/epmd.log" 2>&1 &
  RABBITMQ_EPMD_PID=$!
  # An Erlang VM that finds no epmd listening starts an `epmd -daemon` of its
  # own, which nobody stops (it outlived a test, and the next start on this port
  # found it in use): the node starts once this one listens.
  for i in $(seq 1 200); do
    _rabbitmq_port_free "$epmd_port" || break
    if ! kill -0 "$RABBITMQ_EPMD_PID" 2>/dev/null; then
      _rabbitmq_log "epmd on port $epmd_port exited at start-up; see $RABBITMQ_DIR/log/epmd.log"
      return 1
    fi
    sleep 0.05
  done
  if _rabbitmq_port_free "$epmd_port"; then
    # A node started now would find no epmd and start the daemon nobody stops.
    _rabbitmq_log "epmd on port $epmd_port did not listen within 10 s; see $RABBITMQ_DIR/log/epmd.log"
    rabbitmq_stop  # its epmd (no node yet): a retried start would find the port taken
    return 1
  fi
  _rabbitmq_env "$RABBITMQ_HOME_BIN/rabbitmq-server" </dev/null \
    >>"$RABBITMQ_DIR/log/server.out" 2>&1 &
  RABBITMQ_PID=$!
  local deadline=$((SECONDS + ${RABBITMQ_START_TIMEOUT:-90}))
  while ((SECONDS < deadline)); do
    if ! kill -0 "$RABBITMQ_PID" 2>/dev/null; then
      _rabbitmq_log "rabbitmq-server exited during start-up; see $RABBITMQ_DIR/log"
      return 1
    fi
    # await_startup answers once the node is booted (fails at once while the
    # node is not yet reachable).
    if rabbitmqctl_node -q await_startup --timeout 5 >/dev/null 2>&1 &&
      ! _rabbitmq_port_free "$RABBITMQ_PORT"; then
      RABBITMQ_START_SECONDS=$((SECONDS - t0))
      return 0
    fi
    sleep 0.5
  done
  _rabbitmq_log "node on port $RABBITMQ_PORT did not start; see $RABBITMQ_DIR/log"
  return 1
}

# rabbitmq_stop: stops the node (rabbitmqctl stop, then by PID) and its epmd.
rabbitmq_stop() {
  local beam="" i
  if [[ -n "$RABBITMQ_PID" ]]; then
    [[ -f "$RABBITMQ_DIR/beam.pid" ]] && beam=$(cat "$RABBITMQ_DIR/beam.pid" 2>/dev/null)
    if kill -0 "$RABBITMQ_PID" 2>/dev/null; then
      rabbitmqctl_node -q stop >/dev/null 2>&1 || kill -TERM "$RABBITMQ_PID" 2>/dev/null
      for i in $(seq 1 200); do
        kill -0 "$RABBITMQ_PID" 2>/dev/null || break
        sleep 0.05
      done
      kill -0 "$RABBITMQ_PID" 2>/dev/null && kill -KILL "$RABBITMQ_PID" 2>/dev/null
      wait "$RABBITMQ_PID" 2>/dev/null || true
    fi
    if [[ -n "$beam" ]] && kill -0 "$beam" 2>/dev/null; then
      kill -KILL "$beam" 2>/dev/null || true
    fi
    RABBITMQ_PID=""
  fi
  # Also when the node never started (its epmd did not come up in time).
  if [[ -n "$RABBITMQ_EPMD_PID" ]]; then
    kill -TERM "$RABBITMQ_EPMD_PID" 2>/dev/null
    wait "$RABBITMQ_EPMD_PID" 2>/dev/null || true
    RABBITMQ_EPMD_PID=""
  fi
  return 0
}

# rabbitmq_restart: stops the node and starts it again on its data.
rabbitmq_restart() {
  rabbitmq_stop
  _rabbitmq_boot
}

_rabbitmq_install_trap() {
  if [[ -z "${_RABBITMQ_TRAP_SET:-}" ]]; then
    _RABBITMQ_TRAP_SET=1
    local prev
    prev=$(trap -p EXIT | sed -E "s/^trap -- '(.*)' EXIT$/\1/")
    trap "${prev:+$prev; }rabbitmq_stop" EXIT
  fi
}
