#!/usr/bin/env bash
# Redis Streams: what a drained worker hands back is taken at once by the next
# worker under ANY consumer name (docs/WORKER.md, "Stopping"), not only after
# the reclaim min-idle (lease + 5 s).
#
#   tests/worker_drain_handback_test.sh build/src/cli/dedup
#
# Real redis-server on 127.0.0.1:6476 (docs/PORTS.md), RocksDB buffer, lease 60 s
# (so XAUTOCLAIM's min-idle is 65 s).
#   1. Worker A (consumer=a, concurrency 1, prefetch 8) runs one `sleep 30`
#      handler with 8 entries fetched and claimed ahead; SIGTERM: the handler is
#      stopped after the drain timeout, nothing acked, every entry pending.
#   2. Worker B (consumer=b) runs all 9 within a few seconds, each exactly once,
#      and sees them as redelivered (delivery count 2: A's hand-back counted none).
set -uo pipefail
dedup=$(realpath "$1")
here=$(cd "$(dirname "$0")" && pwd)
port=${DRAIN_HANDBACK_REDIS_PORT:-6476}
# shellcheck source=../scripts/lib/redis.sh
source "$here/../scripts/lib/redis.sh"
tmp=$(mktemp -d /tmp/dedup_drain_handback.XXXXXX)
worker_pid=""
cleanup() {
  [ -n "$worker_pid" ] && kill -KILL "$worker_pid" 2>/dev/null
  redis_stop_all
  rm -rf "$tmp"
}
trap cleanup EXIT
fail() {
  echo "FAIL: $*" >&2
  for f in "$tmp/a.log" "$tmp/b.log"; do [ -f "$f" ] && tail -5 "$f" >&2; done
  exit 1
}

if ! command -v redis-server >/dev/null; then echo "SKIP: no redis-server"; exit 0; fi
redis_start "$port" "$tmp/redis" >/dev/null || fail "redis-server did not start on $port"
rcli() { redis-cli -p "$port" "$@"; }

queued=8
messages=$((queued + 1))
cat >"$tmp/handler.sh" <<EOF
#!/bin/sh
cat >/dev/null
echo "\$\$ \$DEDUP_KEY" >>"$tmp/started"
[ -f "$tmp/fast" ] || sleep 30
echo "\$DEDUP_KEY \$DEDUP_ATTEMPT" >>"$tmp/done"
EOF
chmod +x "$tmp/handler.sh"

"$dedup" publish --broker "redis://127.0.0.1:$port?stream=jobs" --count "$messages" \
  --id-prefix m- --quiet || fail "publish"
run_worker() {  # run_worker CONSUMER LOG
  "$dedup" worker --broker "redis://127.0.0.1:$port?stream=jobs&group=g&consumer=$1" \
    --store "rocksdb:$tmp/db" --exec "$tmp/handler.sh" --no-shell --concurrency 1 \
    --prefetch "$queued" --lease 60s --drain-timeout 1s --summary-interval 0 >>"$2" 2>&1 &
  worker_pid=$!
}

# 1. Worker A: one handler sleeps, the rest wait fetched ahead; SIGTERM.
run_worker a "$tmp/a.log"
for i in $(seq 1 200); do
  [ -f "$tmp/started" ] && [ "$(rcli XPENDING jobs g | head -1)" = "$messages" ] && break
  sleep 0.05
done
[ "$(wc -l <"$tmp/started" 2>/dev/null)" = 1 ] || fail "want 1 handler started"
[ "$(rcli XPENDING jobs g | head -1)" = "$messages" ] || fail "A did not fetch all $messages entries"
kill -TERM "$worker_pid"
wait "$worker_pid" || fail "worker A exit $?"
worker_pid=""
[ "$(rcli XPENDING jobs g | head -1)" = "$messages" ] || fail "entries acked by the drain"
[ -f "$tmp/done" ] && fail "a handler of A ran to its end"
echo "ok: A drained, $messages entries pending"

# 2. Worker B, another consumer name: takes them at once (XAUTOCLAIM min-idle 65 s).
touch "$tmp/fast"
t0=$(date +%s%N)
run_worker b "$tmp/b.log"
for i in $(seq 1 200); do
  [ "$(rcli XPENDING jobs g | head -1)" = 0 ] && [ "$(wc -l <"$tmp/done" 2>/dev/null)" -ge "$messages" ] && break
  sleep 0.05
done
took_ms=$((($(date +%s%N) - t0) / 1000000))
kill -TERM "$worker_pid"; wait "$worker_pid"; worker_pid=""
[ "$(rcli XPENDING jobs g | head -1)" = 0 ] || fail "entries still pending ${took_ms} ms after B started (min-idle 65 s)"
[ "$(wc -l <"$tmp/done")" = "$messages" ] || fail "handlers ran $(wc -l <"$tmp/done") times, want $messages"
[ "$(cut -d' ' -f1 "$tmp/done" | sort -u | wc -l)" = "$messages" ] || fail "a key ran twice: $(cat "$tmp/done")"
grep -q "stopped: messages=$messages .* redelivered=$messages " "$tmp/b.log" ||
  fail "B did not see $messages redeliveries: $(grep stopped: "$tmp/b.log")"
echo "ok: B (another consumer name) finished all $messages within ${took_ms} ms, each once;" \
  "attempts: $(cut -d' ' -f2 "$tmp/done" | sort | uniq -c | tr -s ' ' | tr '\n' ';')"
echo PASS
