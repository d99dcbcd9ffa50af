#!/usr/bin/env bash
# Graceful drain of `dedup worker --exec` (docs/WORKER.md, "Stopping"): SIGTERM
# while handlers run much longer than --drain-timeout.
#
#   tests/worker_drain_test.sh build/src/cli/dedup
#
# Real redis-server on 127.0.0.1:6472 (docs/PORTS.md), RocksDB buffer, lease 60 s.
#   1. The worker exits within the drain timeout plus a margin, its handlers (and
#      their `sleep 30`) are dead, no outcome is recorded (dedup inspect), and the
#      entries are still pending, not acked.
#   2. A second worker under ANOTHER consumer name claims and runs every message
#      at once, exactly once each: long before the 60 s lease would have freed a
#      claim left held, and before XAUTOCLAIM's min-idle (lease + 5 s) would have
#      let it take entries left pending under the first name (the drain's
#      hand-back sets their idle time, XCLAIM ... IDLE ... JUSTID). It sees each as
#      redelivered (delivery count 2: the hand-back counted no delivery).
set -uo pipefail
dedup=$(realpath "$1")
here=$(cd "$(dirname "$0")" && pwd)
port=${WORKER_DRAIN_REDIS_PORT:-6472}
# shellcheck source=../scripts/lib/redis.sh
source "$here/../scripts/lib/redis.sh"
# shellcheck source=../scripts/lib/drain.sh
source "$here/../scripts/lib/drain.sh"
worker_pid=""
DRAIN_KILL_VARS=worker_pid DRAIN_LOGS=w1.log DRAIN_TAIL=5
drain_begin drain_test
drain_need redis-server
redis_start "$port" "$tmp/redis" >/dev/null || fail "redis-server did not start on $port"
rcli() { redis-cli -p "$port" "$@"; }

messages=3
drain_s=1
# Attempt 1 of every key sleeps 30 s (it must be stopped); the second worker's
# handlers (once $tmp/fast exists) finish at once.
drain_handler "$tmp/handler.sh" <<EOF
echo "\$\$ \$DEDUP_KEY" >>"$tmp/started"
[ -f "$tmp/fast" ] || sleep 30
echo "\$DEDUP_KEY \$DEDUP_ATTEMPT" >>"$tmp/done"
EOF

broker="redis://127.0.0.1:$port?stream=jobs&group=g&consumer="
"$dedup" publish --broker "redis://127.0.0.1:$port?stream=jobs" --count "$messages" \
  --id-prefix m- --quiet || fail "publish"
run_worker() {  # run_worker LOG CONSUMER
  "$dedup" worker --broker "$broker$2" --store "rocksdb:$tmp/db" --exec "$tmp/handler.sh" \
    --no-shell --concurrency 4 --lease 60s --drain-timeout "${drain_s}s" \
    --summary-interval 0 >>"$1" 2>&1 &
  worker_pid=$!
}

# 1. SIGTERM while every handler sleeps.
run_worker "$tmp/w1.log" w
for i in $(seq 1 200); do
  [ -f "$tmp/started" ] && [ "$(wc -l <"$tmp/started")" -ge "$messages" ] && break
  sleep 0.05
done
[ "$(wc -l <"$tmp/started" 2>/dev/null)" = "$messages" ] || fail "the handlers did not all start"
handler_pids=$(cut -d' ' -f1 "$tmp/started")
t0=$(date +%s%N)
kill -TERM "$worker_pid"
wait "$worker_pid"
rc=$?
worker_pid=""
took_ms=$((($(date +%s%N) - t0) / 1000000))
echo "worker exited $rc ${took_ms} ms after SIGTERM (drain timeout ${drain_s} s)"
[ "$rc" = 0 ] || fail "worker exit $rc after SIGTERM"
[ "$took_ms" -ge $((drain_s * 1000)) ] || fail "the handlers were not given the drain timeout"
[ "$took_ms" -lt $((drain_s * 1000 + 4000)) ] || fail "the drain took ${took_ms} ms"
for p in $handler_pids; do
  kill -0 "$p" 2>/dev/null && fail "handler $p still runs after the worker stopped"
done
[ -f "$tmp/done" ] && fail "a stopped handler ran to its end: $(cat "$tmp/done")"
grep -q "stopping them" "$tmp/w1.log" || fail "no drain line in the worker's log"
drain_nothing_recorded "$dedup" "rocksdb:$tmp/db"
grep -q "in_progress" "$tmp/inspect" && fail "a claim was left held: $(cat "$tmp/inspect")"
[ "$(grep -c "released" "$tmp/inspect")" = "$messages" ] || fail "claims not released: $(cat "$tmp/inspect")"
pending=$(rcli XPENDING jobs g | head -1)
[ "$pending" = "$messages" ] || fail "$pending entries pending after the drain, want $messages"
echo "ok: handlers stopped, nothing recorded, claims released, $pending entries pending"

# 2. The next worker, another name, runs them at once (a held claim would be BUSY
# for 60 s; entries left pending under "w" would wait 65 s for XAUTOCLAIM).
touch "$tmp/fast"
t1=$SECONDS
run_worker "$tmp/w2.log" w2
for i in $(seq 1 100); do
  [ "$(rcli XPENDING jobs g | head -1)" = 0 ] && [ -f "$tmp/done" ] &&
    [ "$(wc -l <"$tmp/done")" -ge "$messages" ] && break
  sleep 0.05
done
took2=$((SECONDS - t1))
kill -TERM "$worker_pid"; wait "$worker_pid"; worker_pid=""
[ "$(rcli XPENDING jobs g | head -1)" = 0 ] || fail "entries still pending ${took2} s after the second worker started"
[ "$(wc -l <"$tmp/done")" = "$messages" ] || fail "handlers ran $(wc -l <"$tmp/done") times, want $messages"
[ "$(cut -d' ' -f1 "$tmp/done" | sort -u | wc -l)" = "$messages" ] || fail "a key ran twice: $(cat "$tmp/done")"
grep -q "stopped: messages=$messages .* redelivered=$messages " "$tmp/w2.log" ||
  fail "the second worker did not see $messages redeliveries: $(grep stopped: "$tmp/w2.log")"
echo "ok: the second worker finished all $messages messages within ${took2} s (lease 60 s)"
echo PASS
