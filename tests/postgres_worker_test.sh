#!/usr/bin/env bash
# `dedup worker --store postgres://... --sql-output`: a handler in any language prints
# SQL, and the worker runs it in the transaction that records the completion.
# Real redis-server (the stream, port 6404) and PostgreSQL (port 5443). Checks:
#   1. every message's row exists exactly once although the worker is SIGKILLed
#      again and again while handlers run (the kill lands before COMMIT: nothing);
#   2. a handler whose SQL fails leaves nothing and its message is not acked;
#   3. plain `dedup worker --store postgres://` (no --sql-output) works too;
#   4. `dedup simulate --store postgres://...` runs;
#   5. with --sql-output, a handler whose lease is lost is stopped, its SQL never run;
#   6. with --sql-output, a key that is not UTF-8 is dead-lettered, never retried for ever;
#   7. with --sql-output, pool=1 is refused at start-up, naming pool;
#   8. a server notice (a handler's RAISE WARNING) reaches stderr escaped.
#
#   tests/postgres_worker_test.sh DEDUP_BIN
set -euo pipefail
dedup=$(realpath "$1")
here=$(cd "$(dirname "$0")" && pwd)
messages=${PG_WORKER_MESSAGES:-400}
redis_port=6404
pg_port=5443
# shellcheck source=../scripts/lib/postgres.sh
source "$here/../scripts/lib/postgres.sh"
# shellcheck source=../scripts/lib/redis.sh
source "$here/../scripts/lib/redis.sh"
work=$(mktemp -d "${TMPDIR:-/tmp}/dedup-pgworker.XXXXXX")
chmod 755 "$work"
worker_pid=""
trap '[ -n "$worker_pid" ] && kill -KILL "$worker_pid" 2>/dev/null; redis_stop_all; pg_stop_all; rm -rf "$work"' EXIT

redis_start "$redis_port" "$work/redis" >/dev/null
pg_start "$pg_port" >/dev/null
pg=$PG_LAST_URI
psql_q() { PGPASSWORD=$PG_TEST_PASSWORD "$PG_BIN_DIR/psql" -h 127.0.0.1 -p "$pg_port" -U dedup -d dedup -qtAX -c "$1"; }
psql_q "CREATE TABLE effects (msg text NOT NULL, fence bigint NOT NULL)"
fail() { echo "FAIL: $*" >&2; exit 1; }

# The handler: reads the payload, works a little, prints its effect as SQL. The key
# and fence come from the transaction's settings, so nothing needs quoting.
cat >"$work/handler.sh" <<'EOF'
#!/bin/sh
cat >/dev/null
sleep 0.02
echo "INSERT INTO effects (msg, fence) VALUES (current_setting('dedup.key'), current_setting('dedup.fence')::bigint);"
EOF
chmod +x "$work/handler.sh"

broker="redis://127.0.0.1:$redis_port?stream=jobs&group=g"
"$dedup" publish --broker "$broker" --count "$messages" --id-prefix m- --duplicates 0.2 --seed 3 --quiet
start_worker() {
  "$dedup" worker --broker "$broker&consumer=w&reclaim=2s" --store "$pg?table=worker_buf" \
    --sql-output --exec "$work/handler.sh" --no-shell --concurrency 4 --lease 1s \
    --retry-delay 100ms --summary-interval 0 >>"$work/worker.log" 2>&1 &
  worker_pid=$!
}
start_worker
for i in $(seq 1 8); do
  sleep "0.$((RANDOM % 4 + 2))"
  kill -KILL "$worker_pid"
  wait "$worker_pid" 2>/dev/null || true
  start_worker
done
rcli() { redis-cli -p "$redis_port" "$@"; }
for i in $(seq 1 120); do
  pending=$(rcli XPENDING jobs g | head -1)
  delivered=$(rcli XINFO GROUPS jobs | awk 'f{print; exit} /^last-delivered-id$/{f=1}')
  last=$(rcli XINFO STREAM jobs | awk 'f{print; exit} /^last-generated-id$/{f=1}')
  [ "$pending" = 0 ] && [ "$delivered" = "$last" ] && break
  sleep 0.5
done
kill -TERM "$worker_pid"; wait "$worker_pid" || true; worker_pid=""
rows=$(psql_q "SELECT count(*) FROM effects")
distinct=$(psql_q "SELECT count(DISTINCT msg) FROM effects")
echo "sql-output: $messages messages, 8 SIGKILLs: $rows rows, $distinct distinct, pending $pending"
[ "$pending" = 0 ] || fail "entries left pending"
[ "$distinct" = "$messages" ] || fail "$((messages - distinct)) messages have no row"
[ "$rows" = "$distinct" ] || fail "$((rows - distinct)) effects ran twice"

# one_sql_job NAME TABLE LEASE: publishes one message on stream NAMEjobs and starts
# a --sql-output worker (buffer table TABLE) running $work/NAME.sh, logging to
# $work/NAME.log.
one_sql_job() {
  "$dedup" publish --broker "redis://127.0.0.1:$redis_port?stream=$1jobs" --count 1 \
    --id-prefix "$1-" --quiet
  "$dedup" worker --broker "redis://127.0.0.1:$redis_port?stream=$1jobs&group=g&consumer=$1" \
    --store "$pg?table=$2" --sql-output --exec "$work/$1.sh" --no-shell --lease "$3" \
    --retry-delay 200ms --summary-interval 0 >>"$work/$1.log" 2>&1 &
  worker_pid=$!
}

# 2. SQL that fails: nothing is written, the entry stays pending (retried later).
cat >"$work/bad.sh" <<'EOF'
#!/bin/sh
cat >/dev/null
echo "INSERT INTO effects (msg, fence) VALUES ('bad', 1); INSERT INTO no_such_table VALUES (1);"
EOF
chmod +x "$work/bad.sh"
one_sql_job bad worker_buf 1s
sleep 2
kill -TERM "$worker_pid"; wait "$worker_pid" || true; worker_pid=""
[ "$(psql_q "SELECT count(*) FROM effects WHERE msg = 'bad'")" = 0 ] || fail "a failed handler's SQL was committed"
[ "$(rcli XPENDING badjobs g | head -1)" = 1 ] || fail "the failed message was acked"
[ "$(rcli XLEN badjobs:dead)" = 0 ] || fail "a retryable SQL failure was dead-lettered"
echo "sql-output: failing SQL left nothing and its message pending"

# 3. The plain worker on the PostgreSQL store.
cat >"$work/touch.sh" <<'EOF'
#!/bin/sh
cat >/dev/null
exit 0
EOF
chmod +x "$work/touch.sh"
"$dedup" publish --broker "redis://127.0.0.1:$redis_port?stream=plain" --count 50 --id-prefix p- --quiet
"$dedup" worker --broker "redis://127.0.0.1:$redis_port?stream=plain&group=g&consumer=p" \
  --store "$pg?table=plain_buf" --exec "$work/touch.sh" --no-shell --summary-interval 0 \
  >>"$work/plain.log" 2>&1 &
worker_pid=$!
for i in $(seq 1 60); do
  [ "$(psql_q "SELECT count(*) FROM plain_buf WHERE state = 2" 2>/dev/null)" = 50 ] && break
  sleep 0.25
done
kill -TERM "$worker_pid"; wait "$worker_pid" || true; worker_pid=""
[ "$(psql_q "SELECT count(*) FROM plain_buf WHERE state = 2")" = 50 ] || fail "plain worker did not complete 50 keys"
echo "worker --store postgres://: 50 keys completed"

# 5. --sql-output with a lost lease: the handler is stopped (SIGTERM to its group),
# its SQL never runs, and a later attempt does the work once. The lease is taken
# from under the worker by changing the owner's token in the table, so that the
# next extend answers LOST.
cat >"$work/slow.sh" <<EOF
#!/bin/sh
cat >/dev/null
echo "\$\$ \$DEDUP_ATTEMPT" >>"$work/slow.pids"
[ "\$DEDUP_ATTEMPT" = 1 ] && sleep 30
echo "INSERT INTO effects (msg, fence) VALUES ('slow', current_setting('dedup.fence')::bigint);"
EOF
chmod +x "$work/slow.sh"
one_sql_job slow slow_buf 2s
for i in $(seq 1 100); do
  [ -s "$work/slow.pids" ] &&
    [ "$(psql_q "SELECT count(*) FROM slow_buf WHERE state = 1" 2>/dev/null)" = 1 ] && break
  sleep 0.1
done
[ -s "$work/slow.pids" ] || fail "the slow handler did not start"
slow_pid=$(head -1 "$work/slow.pids" | cut -d' ' -f1)
psql_q "UPDATE slow_buf SET token = token + 1 WHERE state = 1" >/dev/null
t0=$SECONDS
while kill -0 "$slow_pid" 2>/dev/null && [ $((SECONDS - t0)) -lt 10 ]; do sleep 0.1; done
kill -0 "$slow_pid" 2>/dev/null && fail "the handler of a lost lease still runs after 10 s"
stopped_after=$((SECONDS - t0))
for i in $(seq 1 100); do
  [ "$(psql_q "SELECT count(*) FROM effects WHERE msg = 'slow'")" = 1 ] && break
  sleep 0.1
done
kill -TERM "$worker_pid"; wait "$worker_pid" || true; worker_pid=""
[ "$(psql_q "SELECT count(*) FROM effects WHERE msg = 'slow'")" = 1 ] ||
  fail "the message was not done exactly once after the lost lease"
[ "$(psql_q "SELECT fence > 1 FROM effects WHERE msg = 'slow'")" = t ] ||
  fail "the stopped attempt's SQL ran"
grep -q "lost_leases=1 " "$work/slow.log" || { cat "$work/slow.log"; fail "no lost lease counted"; }
echo "sql-output: a lost lease stopped the handler within ${stopped_after}s; the next attempt did the work once"

# 6. A key that is not UTF-8 (keys are bytes): dedup.key is a text setting and
# cannot carry it. The message is dead-lettered with the reason, and the handler
# is not run again and again (a retry would meet the same key).
cat >"$work/utf.sh" <<EOF
#!/bin/sh
cat >/dev/null
echo run >>"$work/utf.runs"
echo "SELECT 1;"
EOF
chmod +x "$work/utf.sh"
printf 'XADD utfjobs * id "k\\xff"\n' | rcli >/dev/null
"$dedup" worker --broker "redis://127.0.0.1:$redis_port?stream=utfjobs&group=g&consumer=u" \
  --store "$pg?table=utf_buf" --sql-output --exec "$work/utf.sh" --no-shell --lease 1s \
  --retry-delay 100ms --summary-interval 0 >>"$work/utf.log" 2>&1 &
worker_pid=$!
for i in $(seq 1 30); do
  [ "$(rcli XLEN utfjobs:dead)" = 1 ] && break
  sleep 0.1
done
sleep 1
kill -TERM "$worker_pid"; wait "$worker_pid" || true; worker_pid=""
utf_runs=0
[ -f "$work/utf.runs" ] && utf_runs=$(wc -l <"$work/utf.runs")
[ "$(rcli XLEN utfjobs:dead)" = 1 ] ||
  fail "a key that is not UTF-8 was not dead-lettered (handler runs: $utf_runs; log: $(tail -2 "$work/utf.log"))"
[ "$utf_runs" -le 1 ] || fail "the handler of a key that is not UTF-8 ran $utf_runs times"
grep -q "UTF-8" "$work/utf.log" || fail "the log does not say why: $(tail -2 "$work/utf.log")"
echo "sql-output: a key that is not UTF-8 was dead-lettered, the handler ran $utf_runs time(s)"

# 7. --sql-output with pool=1: a transaction holds its connection while the handler
# runs and the heartbeat needs another, so every message would fail at run time.
# Refused at start-up instead, with an error naming pool.
set +e
timeout 10 "$dedup" worker --broker "redis://127.0.0.1:$redis_port?stream=pooljobs&group=g&consumer=p1" \
  --store "$pg?table=pool_buf&pool=1" --sql-output --exec "$work/touch.sh" --no-shell \
  --summary-interval 0 >"$work/pool1.log" 2>&1
pool_rc=$?
set -e
[ "$pool_rc" != 124 ] || fail "a --sql-output worker with pool=1 started (every message would fail)"
[ "$pool_rc" != 0 ] || fail "a --sql-output worker with pool=1 exited 0"
grep -q "pool=1" "$work/pool1.log" || fail "the error does not name pool: $(cat "$work/pool1.log")"
echo "sql-output: pool=1 refused at start-up (exit $pool_rc): $(head -1 "$work/pool1.log")"

# 8. A server notice (a handler's RAISE WARNING) is printed escaped: libpq's
# default printed it byte for byte, and a handler's escape sequences reached the
# terminal (ESC [2J cleared it).
cat >"$work/notice.sh" <<'EOF'
#!/bin/sh
cat >/dev/null
echo "DO \$\$ BEGIN RAISE WARNING E'clear\\x1b[2J here'; END \$\$;"
EOF
chmod +x "$work/notice.sh"
rcli XADD noticejobs '*' id n1 >/dev/null
"$dedup" worker --broker "redis://127.0.0.1:$redis_port?stream=noticejobs&group=g&consumer=n" \
  --store "$pg?table=notice_buf" --sql-output --exec "$work/notice.sh" --no-shell \
  --summary-interval 0 >"$work/notice.log" 2>&1 &
worker_pid=$!
for i in $(seq 1 50); do
  grep -q 'clear' "$work/notice.log" && break
  sleep 0.1
done
kill -TERM "$worker_pid"; wait "$worker_pid" || true; worker_pid=""
grep -q 'server says: WARNING:  clear\\x1b\[2J here' "$work/notice.log" ||
  fail "the notice is not printed escaped: $(od -c "$work/notice.log" | head -20)"
if grep -q $'\x1b' "$work/notice.log"; then fail "a raw ESC reached the log"; fi
echo "sql-output: a handler's RAISE WARNING printed escaped: $(grep -m1 'server says' "$work/notice.log")"

# 4. The simulation on PostgreSQL.
"$dedup" simulate --store "$pg?table=sim_buf" --messages 200 >"$work/sim.log" 2>&1 \
  || { cat "$work/sim.log"; fail "dedup simulate --store postgres:// failed"; }
echo "simulate --store postgres://: $(tail -1 "$work/sim.log")"
echo PASS
