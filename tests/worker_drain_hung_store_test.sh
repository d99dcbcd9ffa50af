#!/usr/bin/env bash
# Graceful drain of `dedup worker` with a hung store (docs/WORKER.md, "Stopping"):
# the whole drain is bounded by --drain-timeout, not by (queued entries x store
# timeout).
#
#   tests/worker_drain_hung_store_test.sh build/src/cli/dedup
#
# Real redis-servers on 127.0.0.1 (docs/PORTS.md): the stream on 6474, the Redis
# store on 6475 (client timeout 1 s). One handler runs (`sleep 30`), 16 entries
# wait fetched and claimed ahead (--prefetch 16). Then the store's server is
# frozen with SIGSTOP (by PID) and the worker gets SIGTERM.
#   1. The worker exits within the drain timeout plus a margin (the releases
#      of what never started no longer come before the drain timer, nor wait
#      once the store has failed one; at the drain deadline the store is told to
#      stop waiting, so the stopped handler's release is given up 250 ms later),
#      with exit code 75 and a log line saying what was given up.
#   2. Nothing is acked: every entry is still pending, handed back to the stream.
#   3. Once the store answers again, every claim is either released or still
#      held (left to run out with its lease), none completed.
set -uo pipefail
dedup=$(realpath "$1")
here=$(cd "$(dirname "$0")" && pwd)
stream_port=${DRAIN_HUNG_STREAM_PORT:-6474}
store_port=${DRAIN_HUNG_STORE_PORT:-6475}
# shellcheck source=../scripts/lib/redis.sh
source "$here/../scripts/lib/redis.sh"
# shellcheck source=../scripts/lib/drain.sh
source "$here/../scripts/lib/drain.sh"
worker_pid=""
DRAIN_KILL_VARS=worker_pid DRAIN_THAW_VARS=store_pid DRAIN_LOGS=w.log
drain_begin drain_hung
drain_need redis-server
drain_stream_and_store "$stream_port" "$store_port"

queued=16
messages=$((queued + 1))
drain_s=2
drain_sleeping_handler

"$dedup" publish --broker "redis://127.0.0.1:$stream_port?stream=jobs" --count "$messages" \
  --id-prefix m- --quiet || fail "publish"
store="redis://127.0.0.1:$store_port?timeout=1s"
"$dedup" worker --broker "redis://127.0.0.1:$stream_port?stream=jobs&group=g&consumer=w" \
  --store "$store" --exec "$tmp/handler.sh" --no-shell --concurrency 1 --prefetch "$queued" \
  --lease 60s --drain-timeout "${drain_s}s" --summary-interval 0 >>"$tmp/w.log" 2>&1 &
worker_pid=$!

# Wait until the handler runs and every entry is claimed (the queued ones ahead).
drain_wait_claimed "$dedup" "$store" "$messages" "$tmp/started"
[ "$(wc -l <"$tmp/started" 2>/dev/null)" = 1 ] || fail "want 1 handler started"
[ "$DRAIN_CLAIMED" = "$messages" ] ||
  fail "$DRAIN_CLAIMED claims held, want $messages (fetched and claimed ahead)"

drain_stop_timed "$worker_pid" "$store_pid"
worker_pid=""
rc=$DRAIN_RC
took_ms=$DRAIN_TOOK_MS
echo "worker exited $rc ${took_ms} ms after SIGTERM (drain timeout ${drain_s} s, store frozen, timeout 1 s, $queued queued)"
[ "$rc" = 75 ] || fail "worker exit $rc after SIGTERM, want 75 (the stopped handler's release given up)"
# Bounded by the drain timeout plus the 250 ms grace of the stopped handler's
# release try (2.3 s measured). Before: one store timeout for it (3.3 s); and
# before that the queued claims' releases (2.3 s) came before the drain timer,
# and the stopped handler's release was retried (2.2 s): 6.5 s.
[ "$took_ms" -lt $((drain_s * 1000 + 1500)) ] || fail "the drain took ${took_ms} ms"
grep -q "given up at the drain deadline.*0 claim(s), 1 outcome write(s) or release(s)" "$tmp/w.log" ||
  fail "no line about the release given up"
grep -q "left to run out with their lease" "$tmp/w.log" || fail "no line about the claims not released"
pending=$(rcli XPENDING jobs g | head -1)
[ "$pending" = "$messages" ] || fail "$pending entries pending after the drain, want $messages (nothing acked)"
drain_nothing_recorded "$dedup" "redis://127.0.0.1:$store_port"
echo "ok: drain ${took_ms} ms, nothing acked ($pending pending), nothing recorded," \
  "$(grep -c in_progress "$tmp/inspect") claims left to their lease"
echo PASS
