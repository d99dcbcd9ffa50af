#!/usr/bin/env bash
# Graceful drain of `dedup worker` on NATS JetStream with the broker frozen
# (docs/WORKER.md, "Stopping"): handing back what was read ahead must not wait
# on the broker once per entry (each NAK waits for its flush, `timeout=`).
#
#   tests/worker_drain_hung_nats_test.sh build/src/cli/dedup
#
# Real nats-server -js on 127.0.0.1:4237 and redis-server (the Redis store) on
# 6478 (docs/PORTS.md). One handler runs (`sleep 30`), 16 messages wait fetched
# and claimed ahead (--prefetch 16), NATS timeout 1 s. Then nats-server is
# frozen with SIGSTOP (by PID) and the worker gets SIGTERM.
#   1. The worker exits within the drain timeout plus two broker timeouts (the
#      first failed hand-back, the stopped handler's NAK) and a margin, not
#      after one broker timeout per entry read ahead (16 s).
#   2. Nothing is recorded: every claim is released (the store answers).
#   3. The deliveries not handed back (the first hand-back failed, the rest were
#      not tried) have their own count, hand_back_errors, in the summary, and
#      one log line saying how many: they come back only on the broker's own
#      timer (AckWait, 60 s here), which an operator must be able to see.
set -uo pipefail
dedup=$(realpath "$1")
here=$(cd "$(dirname "$0")" && pwd)
nats_port=${DRAIN_HUNG_NATS_PORT:-4237}
redis_port=${DRAIN_HUNG_NATS_REDIS_PORT:-6478}
# shellcheck source=../scripts/lib/redis.sh
source "$here/../scripts/lib/redis.sh"
# shellcheck source=../scripts/lib/nats.sh
source "$here/../scripts/lib/nats.sh"
# shellcheck source=../scripts/lib/drain.sh
source "$here/../scripts/lib/drain.sh"
worker_pid=""
DRAIN_KILL_VARS=worker_pid DRAIN_THAW_VARS=NATS_PID DRAIN_LOGS=w.log
drain_begin drain_hung_nats
drain_need nats-server redis-server
nats_start "$nats_port" "$tmp/nats" || fail "nats-server did not start on $nats_port"
redis_start "$redis_port" "$tmp/redis" >/dev/null || fail "redis-server did not start on $redis_port"

queued=16
messages=$((queued + 1))
drain_s=2
drain_sleeping_handler

"$dedup" publish --broker "nats://127.0.0.1:$nats_port?stream=JOBS&subject=jobs.in" \
  --id-prefix m- --count "$messages" --quiet || fail "publish"
broker="nats://127.0.0.1:$nats_port?stream=JOBS&consumer=workers&subject=jobs.in&ack_wait=60s&timeout=1s"
store="redis://127.0.0.1:$redis_port"
"$dedup" worker --broker "$broker" --store "$store" --exec "$tmp/handler.sh" --no-shell \
  --concurrency 1 --prefetch "$queued" --lease 60s --drain-timeout "${drain_s}s" \
  --summary-interval 0 >>"$tmp/w.log" 2>&1 &
worker_pid=$!

drain_wait_claimed "$dedup" "$store" "$messages" "$tmp/started"
[ "$(wc -l <"$tmp/started" 2>/dev/null)" = 1 ] || fail "want 1 handler started"
[ "$DRAIN_CLAIMED" = "$messages" ] ||
  fail "$DRAIN_CLAIMED claims held, want $messages (fetched and claimed ahead)"

drain_stop_timed "$worker_pid" "$NATS_PID"
worker_pid=""
rc=$DRAIN_RC
took_ms=$DRAIN_TOOK_MS
echo "worker exited $rc ${took_ms} ms after SIGTERM (drain timeout ${drain_s} s, broker frozen, timeout 1 s, $queued queued)"
[ "$rc" = 0 ] || fail "worker exit $rc after SIGTERM"
[ "$took_ms" -lt $((drain_s * 1000 + 2 * 1000 + 2500)) ] || fail "the drain took ${took_ms} ms"
drain_nothing_recorded "$dedup" "$store"
held=$(grep -c in_progress "$tmp/inspect")
[ "$held" = 0 ] || fail "$held claims still held after the drain (the store answered: want all released)"
grep -q "stopped: .*hand_back_errors=$queued" "$tmp/w.log" ||
  fail "the summary at exit does not count $queued failed hand-backs (hand_back_errors)"
grep -q "drain: $queued deliveries not started were not handed back" "$tmp/w.log" ||
  fail "no log line saying $queued deliveries were not handed back"
echo "ok: drain ${took_ms} ms with the broker frozen, nothing recorded, every claim released, $queued hand-backs counted as failed"
echo PASS
