#!/usr/bin/env bash
# The exactly-once-effects chaos test. Three worker processes (postgres_chaos_worker)
# process CHAOS_MESSAGES messages whose effect is one row in a PostgreSQL table; they
# are SIGKILLed at random moments and restarted, and the PostgreSQL server is
# restarted once half-way (CHAOS_PG_STOP: immediate, a crash the server recovers
# from, by default; or fast). The same schedule (same seed) runs twice:
#
#   tx     claim -> business INSERT -> complete in one PostgreSQL transaction
#   redis  the buffer in Redis beside it: INSERT commits alone, complete in Redis
#
# Checks: with tx, every message's row exists exactly once (0 duplicates, 0
# missing). With redis, 0 missing, and the duplicate rows (re-runs of the effect
# after a kill between INSERT and complete: what the transaction removes) are
# counted, and each must be explained: the earlier row is the last of a killed
# worker (the INSERT it had in flight), or was written at the PostgreSQL restart.
# A row missing is *lost* when a worker finished (it acked every message); when no
# worker finished in time it is *unfinished*: both fail.
#
#   tests/postgres_chaos_test.sh WORKER_BIN [tx|redis|both]
#
# Environment: CHAOS_MESSAGES (default 3000), CHAOS_KILLS (default 16), CHAOS_SEED
# (default 10), CHAOS_PG_PORT (default 5442), CHAOS_REDIS_PORT (default 6403),
# CHAOS_PG_STOP (immediate or fast, default immediate),
# CHAOS_TIMEOUT seconds per run (default 150).
set -euo pipefail

worker=$(realpath "$1")
which=${2:-both}
here=$(cd "$(dirname "$0")" && pwd)
messages=${CHAOS_MESSAGES:-3000}
kills_wanted=${CHAOS_KILLS:-16}
seed=${CHAOS_SEED:-10}
pg_port=${CHAOS_PG_PORT:-5442}
redis_port=${CHAOS_REDIS_PORT:-6403}
timeout_s=${CHAOS_TIMEOUT:-150}
pg_stop_mode=${CHAOS_PG_STOP:-immediate}
nworkers=3

# shellcheck source=../scripts/lib/postgres.sh
source "$here/../scripts/lib/postgres.sh"
# shellcheck source=../scripts/lib/redis.sh
source "$here/../scripts/lib/redis.sh"
declare -a worker_pids=()
kill_workers() {
  local p
  for p in "${worker_pids[@]}"; do
    [ -n "$p" ] && kill -KILL "$p" 2>/dev/null && wait "$p" 2>/dev/null
  done
  worker_pids=()
  return 0
}
trap 'kill_workers; redis_stop_all; pg_stop_all' EXIT

pg_start "$pg_port"
business=$PG_LAST_URI
now_us() { date +%s%6N; }
psql_q() { PGPASSWORD=$PG_TEST_PASSWORD "$PG_BIN_DIR/psql" -h 127.0.0.1 -p "$pg_port" -U dedup -d dedup -qtAX -c "$1"; }
logs=$(mktemp -d "${TMPDIR:-/tmp}/dedup-pgchaos.XXXXXX")
trap 'kill_workers; redis_stop_all; pg_stop_all; rm -rf "$logs"' EXIT

run() {  # run MODE: sets dups, missing, kills, failed (in this shell: it owns the servers)
  local mode=$1 store i pid restarted=0 deadline
  kills=0
  : >"$logs/$mode.kills"
  : >"$logs/$mode.restart"
  psql_q "DROP TABLE IF EXISTS chaos_effects; CREATE TABLE chaos_effects (msg text NOT NULL, fence bigint, pid int, at timestamptz DEFAULT clock_timestamp())"
  if [ "$mode" = tx ]; then
    store="$business?table=chaos_$RANDOM&pool=2"
  else
    redis_start "$redis_port" "$logs/redis" >/dev/null
    store="redis://127.0.0.1:$redis_port?prefix=chaos$RANDOM:"
  fi
  restart_pg() {  # the restart's window goes to $mode.restart
    now_us >"$logs/$mode.restart"
    pg_restart "$pg_port" 0.5 "$pg_stop_mode" >/dev/null
    now_us >>"$logs/$mode.restart"
  }
  RANDOM=$seed  # the same kill schedule for both modes
  start_worker() {
    WORK_MS=3 "$worker" "$mode" "$store" "$business" "$messages" >>"$logs/$mode.$1.log" 2>&1 &
    worker_pids[$1]=$!
  }
  for i in $(seq 0 $((nworkers - 1))); do start_worker "$i"; done
  deadline=$((SECONDS + timeout_s))
  while [ "$kills" -lt "$kills_wanted" ] && [ $SECONDS -lt "$deadline" ]; do
    sleep "0.$((RANDOM % 5 + 1))"
    i=$((RANDOM % nworkers))
    pid=${worker_pids[$i]}
    if ! kill -0 "$pid" 2>/dev/null; then break; fi  # all work done already: nothing to cut
    kill -KILL "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
    echo "$(now_us) $pid" >>"$logs/$mode.kills"  # logged once the worker is gone
    kills=$((kills + 1))
    start_worker "$i"
    if [ "$restarted" = 0 ] && [ "$kills" -ge $((kills_wanted / 2)) ]; then
      restart_pg
      restarted=1
    fi
  done
  if [ "$restarted" = 0 ]; then restart_pg; fi
  failed=0
  finished=0  # workers that exited 0: each acked every message (done, or DUPLICATE)
  for i in $(seq 0 $((nworkers - 1))); do
    pid=${worker_pids[$i]}
    while kill -0 "$pid" 2>/dev/null && [ $SECONDS -lt "$deadline" ]; do sleep 0.2; done
    if kill -0 "$pid" 2>/dev/null; then
      echo "$mode: worker $i did not finish in ${timeout_s}s" >&2
      kill -KILL "$pid" 2>/dev/null || true
      failed=1
    fi
    if wait "$pid" 2>/dev/null; then
      finished=$((finished + 1))
    else
      echo "$mode: worker $i failed, see its log:" >&2; tail -3 "$logs/$mode.$i.log" >&2; failed=1
    fi
    worker_pids[$i]=""
  done
  [ "$mode" = redis ] && redis_stop_all
  local rows distinct
  rows=$(psql_q "SELECT count(*) FROM chaos_effects")
  distinct=$(psql_q "SELECT count(DISTINCT msg) FROM chaos_effects")
  dups=$((rows - distinct))
  missing=$((messages - distinct))
  # Each duplicate row must be explained. A worker runs one message at a time and
  # a killed worker never runs again, so a kill can have cut off only its worker's
  # last row (its INSERT in flight, which the server may even stamp after the
  # death); the restart only an INSERT that committed as the server went down (its
  # reply lost). Anything else (a completion skipped or lost, an effect run twice)
  # is unexplained.
  psql_q "SELECT msg, pid, (extract(epoch FROM at) * 1000000)::bigint FROM chaos_effects" \
    >"$logs/$mode.rows"
  unexplained=$(python3 - "$logs/$mode.rows" "$logs/$mode.kills" "$logs/$mode.restart" <<'PY'
import collections, sys
rows = collections.defaultdict(list)
last = {}  # pid -> its last row's time
for line in open(sys.argv[1]):
    if line.strip():
        msg, pid, at = line.strip().split("|")
        rows[msg].append((int(at), pid))
        last[pid] = max(last.get(pid, 0), int(at))
killed = {line.split()[1] for line in open(sys.argv[2]) if line.strip()}
restart = [int(x) for x in open(sys.argv[3]).read().split()]
SLACK = 5_000_000
bad = []
for msg, rs in rows.items():
    for at, pid in sorted(rs)[:-1]:
        if pid in killed and at == last[pid]:
            continue
        if len(restart) == 2 and restart[0] - SLACK <= at <= restart[1]:
            continue
        bad.append((msg, pid, at))
for msg, pid, at in bad[:5]:
    print("  unexplained duplicate row: %s by pid %s (%s, %d ms before its last row); the "
          "restart at %s ms" % (msg, pid, "killed" if pid in killed else "never killed",
                                (last[pid] - at) // 1000, [(t - at) // 1000 for t in restart]),
          file=sys.stderr)
print(len(bad))
PY
)
}

status=0
for mode in tx redis; do
  [ "$which" = both ] || [ "$which" = "$mode" ] || continue
  run "$mode"
  # A worker exits 0 only once it has acked every message, and DUPLICATE is acked
  # only after a completion: with one finished worker, a message without a row is
  # lost. With none, the rows missing are unfinished (the run ran out of time),
  # which fails the run too but is not a lost message.
  if [ "$finished" -gt 0 ]; then
    verdict="$missing missing (lost: acked without an effect)"
  else
    verdict="$missing without an effect yet: unfinished, no worker finished in ${timeout_s}s (not counted as lost)"
  fi
  echo "$mode: $messages messages, $kills SIGKILLs, 1 PostgreSQL restart ($pg_stop_mode): $dups duplicate effects (re-runs), $unexplained of them unexplained by a kill or the restart, $verdict"
  if [ "$failed" != 0 ] || [ "$missing" != 0 ]; then status=1; fi
  if [ "$mode" = tx ] && [ "$dups" != 0 ]; then status=1; fi
  if [ "$unexplained" != 0 ]; then status=1; fi
done
echo "elapsed ${SECONDS}s"
[ $status = 0 ] && echo "PASS" || echo "FAIL"
exit $status
