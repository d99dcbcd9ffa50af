#!/usr/bin/env bash
# The drain of `dedup worker --sql-output` with a claim in flight while its
# PostgreSQL store is frozen: as without --sql-output (postgres_drain_frozen_test.sh),
# at the drain deadline the store is told its Consumer is stopping
# (Store::StopWaiting), so what still waits on the frozen server (a claim, the
# stopped handler's ROLLBACK) is given up kDrainStoreGrace (250 ms) later,
# instead of after the store's timeout + 1 s.
#
#   tests/postgres_drain_sql_output_test.sh build/src/cli/dedup
#
# Real servers on 127.0.0.1 (docs/PORTS.md): the stream in Redis on 6558, the
# store in PostgreSQL on 5446 (timeout 3 s, pool=2: a transactional handler holds
# one, claims and heartbeats take the other). One handler runs (`sleep 30`,
# concurrency 2, its transaction open). Then the whole PostgreSQL server is
# frozen (SIGSTOP of the postmaster and its children, by PID) and 4 entries
# arrive: their claim waits on the frozen server. The worker gets SIGTERM.
#   1. It exits within the drain timeout (1 s) plus 1 s, with exit code 75, and
#      its log says what it gave up. Before: the Consumer of --sql-output
#      (Consumer::MakeWith, no Buffer) never told the store, and the drain
#      lasted as long as the store's own timeouts (3 s + 1 s, and more).
#   2. Nothing is acked, nothing recorded.
#   3. The server thaws (SIGCONT): a second worker runs each message once.
set -uo pipefail
dedup=$(realpath "$1")
here=$(cd "$(dirname "$0")" && pwd)
stream_port=${PG_DRAIN_SQL_STREAM_PORT:-6558}
pg_port=${PG_DRAIN_SQL_STORE_PORT:-5446}
# shellcheck source=../scripts/lib/redis.sh
source "$here/../scripts/lib/redis.sh"
# shellcheck source=../scripts/lib/drain.sh
source "$here/../scripts/lib/drain.sh"
# shellcheck source=../scripts/lib/postgres.sh
source "$here/../scripts/lib/postgres.sh"
worker_pid="" second_pid=""
DRAIN_KILL_VARS="worker_pid second_pid" DRAIN_LOGS="w.log w2.log"
drain_begin pg_drain_sql
drain_need redis-server
[ -x "$PG_BIN_DIR/postgres" ] || { echo "SKIP: no PostgreSQL server binaries"; exit 0; }
# The frozen server is thawed (drain_begin's trap) before pg_stop_all stops it.
trap '_drain_cleanup; pg_stop_all' EXIT

redis_start "$stream_port" "$tmp/stream" >/dev/null || fail "redis-server did not start on $stream_port"
rcli() { redis-cli -p "$stream_port" "$@"; }
pg_start "$pg_port" || fail "PostgreSQL did not start on $pg_port"
pg_pid=$PG_LAST_PID
pg_pids() { echo "$pg_pid" $(ps -o pid= --ppid "$pg_pid"); }

drain_s=1
timeout_s=3
late=4
lease=3s
drain_sleeping_handler
store="$PG_LAST_URI?timeout=${timeout_s}s&pool=2&expire_interval=0"
DRAIN_WORKER_ARGS=--sql-output
drain_frozen_store_stop "$dedup" "$store" "$lease" "$late" m-late- pg_pids
DRAIN_WORKER_ARGS=""
[ "$took_ms" -lt $(((drain_s + 1) * 1000)) ] || fail "the drain took ${took_ms} ms, want < $(((drain_s + 1) * 1000))"
[ "$rc" = 75 ] || fail "worker exit $rc after SIGTERM, want 75 (store calls given up)"
grep -q "given up at the drain deadline" "$tmp/w.log" || fail "no log line about what was given up"
pending=$(rcli XPENDING jobs g | head -1)
[ "$pending" = $((late + 1)) ] || fail "$pending entries pending after the drain, want $((late + 1))"
drain_nothing_recorded "$dedup" "$store"

drain_second_worker_once "$dedup" "$store" "$lease" $((late + 1))
echo "ok: --sql-output drain ${took_ms} ms from SIGTERM (exit $rc), nothing acked; then each of" \
  "$((late + 1)) messages ran once ($takeovers takeovers)"
