#!/usr/bin/env bash
# Start and stop throwaway Redis servers for tests and benchmarks. Source it:
#
#   source scripts/lib/redis.sh
#   redis_start 6390 "$tmp/r"                 # plain Redis on 127.0.0.1:6390
#   redis_cluster_start 7100 "$tmp/c"         # 3 primaries on 7100..7102
#   export DEDUP_TEST_REDIS_URI=redis://127.0.0.1:6390
#   export DEDUP_TEST_REDIS_CLUSTER_URI=redis+cluster://127.0.0.1:7100,127.0.0.1:7101
#   ...                                       # every server stops at exit (trap)
#
# Servers listen on 127.0.0.1 only, keep their files in the given directory, save
# nothing (--save '' --appendonly no) unless extra arguments say otherwise, and are
# stopped by their PID, never by name. Ports are checked free before starting.

REDIS_SERVER_BIN=${REDIS_SERVER_BIN:-redis-server}
REDIS_CLI_BIN=${REDIS_CLI_BIN:-redis-cli}
# PIDs of the servers this shell started, and their ports (same order).
REDIS_PIDS=()
REDIS_PORTS=()

_redis_log() { echo "redis.sh: $*" >&2; }

# redis_port_free PORT: true when nothing listens on 127.0.0.1:PORT.
redis_port_free() {
  ! (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null
}

# redis_wait_ready PORT [SECONDS]: waits until the server answers PING.
redis_wait_ready() {
  local port=$1 deadline=$((SECONDS + ${2:-10}))
  while ((SECONDS < deadline)); do
    if [[ "$("$REDIS_CLI_BIN" -h 127.0.0.1 -p "$port" ${REDIS_CLI_AUTH:-} ping 2>/dev/null)" == PONG ]]; then
      return 0
    fi
    sleep 0.05
  done
  _redis_log "server on port $port did not answer PING"
  return 1
}

# redis_start PORT DIR [extra redis-server arguments...]
# Starts a server in the background; its PID is appended to REDIS_PIDS and
# printed in REDIS_LAST_PID.
redis_start() {
  local port=$1 dir=$2
  shift 2
  if ! redis_port_free "$port"; then
    _redis_log "port $port is already in use; not starting a server there"
    return 1
  fi
  mkdir -p "$dir"
  "$REDIS_SERVER_BIN" --port "$port" --bind 127.0.0.1 --dir "$dir" \
    --save '' --appendonly no --daemonize no --logfile "$dir/redis-$port.log" \
    --protected-mode no "$@" &
  REDIS_LAST_PID=$!
  REDIS_PIDS+=("$REDIS_LAST_PID")
  REDIS_PORTS+=("$port")
  _redis_install_trap
  redis_wait_ready "$port" || { _redis_log "see $dir/redis-$port.log"; return 1; }
}

# redis_stop PID: stops one server this shell started (SIGTERM, then SIGKILL).
redis_stop() {
  local pid=$1 i
  if kill -0 "$pid" 2>/dev/null; then
    kill -TERM "$pid" 2>/dev/null
    for i in $(seq 1 100); do
      kill -0 "$pid" 2>/dev/null || break
      sleep 0.05
    done
    kill -0 "$pid" 2>/dev/null && kill -KILL "$pid" 2>/dev/null
    wait "$pid" 2>/dev/null
  fi
  return 0
}

# redis_kill PID: kills one server at once (SIGKILL), as a crash would.
redis_kill() {
  kill -KILL "$1" 2>/dev/null
  wait "$1" 2>/dev/null
  return 0
}

# redis_stop_all: stops every server this shell started.
redis_stop_all() {
  local pid
  for pid in "${REDIS_PIDS[@]}"; do redis_stop "$pid"; done
  REDIS_PIDS=()
  REDIS_PORTS=()
}

_redis_install_trap() {
  if [[ -z "${_REDIS_TRAP_SET:-}" ]]; then
    _REDIS_TRAP_SET=1
    # Keep a trap the caller set before sourcing, and run ours after it.
    local prev
    prev=$(trap -p EXIT | sed -E "s/^trap -- '(.*)' EXIT$/\1/")
    trap "${prev:+$prev; }redis_stop_all" EXIT
  fi
}

# redis_cluster_start BASEPORT DIR [N=3]: N primaries on BASEPORT..BASEPORT+N-1,
# no replicas, all 16384 slots assigned; waits until the cluster is ok.
redis_cluster_start() {
  local base=$1 dir=$2 n=${3:-3} i port addrs=()
  for ((i = 0; i < n; i++)); do
    port=$((base + i))
    redis_start "$port" "$dir/$port" --cluster-enabled yes \
      --cluster-config-file "$dir/$port/nodes.conf" --cluster-node-timeout 5000 || return 1
    addrs+=("127.0.0.1:$port")
  done
  "$REDIS_CLI_BIN" --cluster create "${addrs[@]}" --cluster-replicas 0 --cluster-yes \
    >"$dir/create.log" 2>&1 || { _redis_log "cluster create failed, see $dir/create.log"; return 1; }
  redis_cluster_wait_ok "$base" "$n"
}

# redis_cluster_wait_ok BASEPORT N [SECONDS]: waits until every node says cluster_state:ok.
redis_cluster_wait_ok() {
  local base=$1 n=$2 deadline=$((SECONDS + ${3:-20})) i ok
  while ((SECONDS < deadline)); do
    ok=1
    for ((i = 0; i < n; i++)); do
      "$REDIS_CLI_BIN" -p $((base + i)) cluster info 2>/dev/null | grep -q 'cluster_state:ok' || ok=0
    done
    ((ok)) && return 0
    sleep 0.1
  done
  _redis_log "cluster on $base.. did not reach cluster_state:ok"
  return 1
}

# redis_node_id PORT: the cluster node id of the server on PORT.
redis_node_id() {
  "$REDIS_CLI_BIN" -p "$1" cluster myid
}
