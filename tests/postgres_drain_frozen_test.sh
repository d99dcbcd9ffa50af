#!/usr/bin/env bash
# The drain of `dedup worker` with a claim in flight while its PostgreSQL store is
# frozen (docs/WORKER.md, "Stopping"; docs/POSTGRES.md): at the drain deadline the
# store is told its Consumer is stopping (Store::StopWaiting), so what still waits
# on the frozen server is given up instead of waiting for an answer that never
# comes (statement_timeout is the server's own: a frozen server never sends it).
#
#   tests/postgres_drain_frozen_test.sh build/src/cli/dedup
#
# Real servers on 127.0.0.1 (docs/PORTS.md): the stream in Redis on 6553, the
# store in PostgreSQL on 5445 (timeout 3 s, pool=1). One handler runs (`sleep
# 30`, concurrency 2). Then the whole PostgreSQL server is frozen (SIGSTOP of the
# postmaster and its children, by PID) and 4 entries arrive: their claim is sent
# and waits on the frozen server. The worker gets SIGTERM.
#   1. It exits within the drain timeout (1 s) plus 1 s, with exit code 75, and
#      its log says what it gave up. Before: it never exited (the claim waited
#      for ever, the stopped handler's release behind it for the one connection).
#   2. Nothing is acked, nothing recorded.
#   3. The server thaws (SIGCONT): a claim it had received is applied late, held
#      by a token nobody has. A second worker finds such a key BUSY until the
#      lease ends, takes it over, and runs each message exactly once.
set -uo pipefail
dedup=$(realpath "$1")
here=$(cd "$(dirname "$0")" && pwd)
stream_port=${PG_DRAIN_STREAM_PORT:-6553}
pg_port=${PG_DRAIN_STORE_PORT:-5445}
# shellcheck source=../scripts/lib/redis.sh
source "$here/../scripts/lib/redis.sh"
# shellcheck source=../scripts/lib/drain.sh
source "$here/../scripts/lib/drain.sh"
# shellcheck source=../scripts/lib/postgres.sh
source "$here/../scripts/lib/postgres.sh"
worker_pid="" second_pid=""
DRAIN_KILL_VARS="worker_pid second_pid" DRAIN_LOGS="w.log w2.log"
drain_begin pg_drain_frozen
drain_need redis-server
[ -x "$PG_BIN_DIR/postgres" ] || { echo "SKIP: no PostgreSQL server binaries"; exit 0; }
# The frozen server is thawed (drain_begin's trap) before pg_stop_all stops it.
trap '_drain_cleanup; pg_stop_all' EXIT

redis_start "$stream_port" "$tmp/stream" >/dev/null || fail "redis-server did not start on $stream_port"
rcli() { redis-cli -p "$stream_port" "$@"; }
pg_start "$pg_port" || fail "PostgreSQL did not start on $pg_port"
pg_pid=$PG_LAST_PID
# The postmaster and every process it started (the worker's backend among them),
# by PID.
pg_pids() { echo "$pg_pid" $(ps -o pid= --ppid "$pg_pid"); }

drain_s=1
timeout_s=3
late=4
lease=3s
drain_sleeping_handler
# One connection (pool=1): the late claim goes on the connection already open,
# where its bytes reach the frozen backend, which runs them once thawed.
store="$PG_LAST_URI?timeout=${timeout_s}s&pool=1&expire_interval=0"
drain_frozen_store_stop "$dedup" "$store" "$lease" "$late" m-late- pg_pids
[ "$took_ms" -lt $(((drain_s + 1) * 1000)) ] || fail "the drain took ${took_ms} ms, want < $(((drain_s + 1) * 1000))"
[ "$rc" = 75 ] || fail "worker exit $rc after SIGTERM, want 75 (store calls given up)"
grep -q "given up at the drain deadline" "$tmp/w.log" || fail "no log line about what was given up"
pending=$(rcli XPENDING jobs g | head -1)
[ "$pending" = $((late + 1)) ] || fail "$pending entries pending after the drain, want $((late + 1))"
drain_nothing_recorded "$dedup" "$store"

# The second worker: each message once, a late claim taken over after its lease.
drain_second_worker_once "$dedup" "$store" "$lease" $((late + 1))
# At least the stopped handler's claim (its release was given up).
[ "$takeovers" -ge 1 ] || fail "want a takeover: $(grep "stopped:" "$tmp/w2.log")"
echo "ok: drain ${took_ms} ms from SIGTERM (exit $rc), nothing acked; then each of $((late + 1))" \
  "messages ran once ($takeovers takeovers)"
