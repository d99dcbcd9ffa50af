#!/usr/bin/env bash
# The drain of `dedup worker` with a claim in flight while its PostgreSQL store is
# frozen (docs/WORKER.md, "Stopping"; docs/POSTGRES.md): at the drain deadline the
# store is told its Consumer is stopping (Store::StopWaiting), so what still waits
# on the frozen server is given up kDrainStoreGrace (250 ms) later instead of
# waiting for an answer that never comes (statement_timeout is the server's own: a
# frozen server never sends it).
#
#   tests/postgres_drain_frozen_test.sh build/src/cli/dedup [store|sql-output]
#
# MODE store (the default): `dedup worker --store postgres://...`, one connection
#   (pool=1): the late claim goes on the connection already open, where its bytes
#   reach the frozen backend, which runs them once thawed. Ports (docs/PORTS.md):
#   the stream in Redis on 6553, the store in PostgreSQL on 5445.
# MODE sql-output: `dedup worker --sql-output`, pool=3 (each of the concurrency 2
#   transactional handlers may hold one, claims and heartbeats take the third: a
#   smaller pool is refused at start-up). Ports: 6558 and 5446.
# PG_DRAIN_STREAM_PORT and PG_DRAIN_STORE_PORT override the ports.
#
# Real servers on 127.0.0.1, store timeout 3 s. One handler runs (`sleep 30`,
# concurrency 2; with --sql-output its transaction open). Then the whole
# PostgreSQL server is frozen (SIGSTOP of the postmaster and its children, by PID)
# and 4 entries arrive: their claim is sent and waits on the frozen server. The
# worker gets SIGTERM.
#   1. It exits within the drain timeout (1 s) plus 1 s, with exit code 75, and
#      its log says what it gave up. Before: without --sql-output it never exited
#      (the claim waited for ever, the stopped handler's release behind it for the
#      one connection); with it, the Consumer (Consumer::MakeWith, no Buffer) never
#      told the store, and the drain lasted as long as the store's own timeouts
#      (3 s + 1 s, and more).
#   2. Nothing is acked, nothing recorded.
#   3. The server thaws (SIGCONT): a second worker runs each message exactly once.
#      Without --sql-output a claim the server had received is applied late, held
#      by a token nobody has: the second worker finds such a key BUSY until the
#      lease ends and takes it over (at least the stopped handler's, whose release
#      was given up).
set -uo pipefail
dedup=$(realpath "$1")
mode=${2:-store}
here=$(cd "$(dirname "$0")" && pwd)
case "$mode" in
  store) ports=(6553 5445) pool=1 worker_args="" ;;
  sql-output) ports=(6558 5446) pool=3 worker_args=--sql-output ;;
  *) echo "usage: $0 DEDUP [store|sql-output] (not '$mode')" >&2; exit 2 ;;
esac
stream_port=${PG_DRAIN_STREAM_PORT:-${ports[0]}}
pg_port=${PG_DRAIN_STORE_PORT:-${ports[1]}}
# shellcheck source=../scripts/lib/redis.sh
source "$here/../scripts/lib/redis.sh"
# shellcheck source=../scripts/lib/drain.sh
source "$here/../scripts/lib/drain.sh"
# shellcheck source=../scripts/lib/postgres.sh
source "$here/../scripts/lib/postgres.sh"
worker_pid="" second_pid=""
DRAIN_KILL_VARS="worker_pid second_pid" DRAIN_LOGS="w.log w2.log"
drain_begin "pg_drain_${mode//-/_}"
drain_need redis-server
[ -x "$PG_BIN_DIR/postgres" ] || { echo "SKIP: no PostgreSQL server binaries"; exit 0; }
# The frozen server is thawed (drain_begin's trap) before pg_stop_all stops it.
trap '_drain_cleanup; pg_stop_all' EXIT

redis_start "$stream_port" "$tmp/stream" >/dev/null || fail "redis-server did not start on $stream_port"
rcli() { redis-cli -p "$stream_port" "$@"; }
pg_start "$pg_port" || fail "PostgreSQL did not start on $pg_port"
pg_pid=$PG_LAST_PID
# The postmaster and every process it started (the worker's backends among them),
# by PID.
pg_pids() { echo "$pg_pid" $(ps -o pid= --ppid "$pg_pid"); }

drain_s=1
timeout_s=3
late=4
lease=3s
drain_sleeping_handler
store="$PG_LAST_URI?timeout=${timeout_s}s&pool=$pool&expire_interval=0"
DRAIN_WORKER_ARGS=$worker_args
drain_frozen_store_stop "$dedup" "$store" "$lease" "$late" m-late- pg_pids
DRAIN_WORKER_ARGS=""
[ "$took_ms" -lt $(((drain_s + 1) * 1000)) ] || fail "the drain took ${took_ms} ms, want < $(((drain_s + 1) * 1000))"
[ "$rc" = 75 ] || fail "worker exit $rc after SIGTERM, want 75 (store calls given up)"
grep -q "given up at the drain deadline" "$tmp/w.log" || fail "no log line about what was given up"
pending=$(rcli XPENDING jobs g | head -1)
[ "$pending" = $((late + 1)) ] || fail "$pending entries pending after the drain, want $((late + 1))"
drain_nothing_recorded "$dedup" "$store"

drain_second_worker_once "$dedup" "$store" "$lease" $((late + 1))
if [ "$mode" = store ]; then
  [ "$takeovers" -ge 1 ] || fail "want a takeover: $(grep "stopped:" "$tmp/w2.log")"
fi
echo "ok ($mode): drain ${took_ms} ms from SIGTERM (exit $rc), nothing acked; then each of" \
  "$((late + 1)) messages ran once ($takeovers takeovers)"
