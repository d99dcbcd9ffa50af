#!/usr/bin/env bash
# The drain of `dedup worker` with a claim in flight while the Redis store is
# frozen (docs/WORKER.md, "Stopping"): at the drain deadline the store is told
# its Consumer is stopping (Store::StopWaiting), so what still waits on the
# frozen server is given up instead of waiting out the store's timeout.
#
#   tests/worker_drain_frozen_claim_test.sh build/src/cli/dedup
#
# Real redis-servers on 127.0.0.1 (docs/PORTS.md): the stream on 6550, the Redis
# store on 6551 (client timeout 3 s). One handler runs (`sleep 30`, concurrency
# 2). Then the store's server is frozen (SIGSTOP, by PID) and 4 entries arrive:
# their claim is sent and waits on the frozen server. The worker gets SIGTERM.
#   1. It exits within the drain timeout (1 s) plus 1 s, with exit code 75, and
#      its log says what it gave up (a claim, the stopped handler's release).
#      Before: the drain timeout plus two store timeouts, exit 0 (6.2-6.9 s).
#   2. Nothing is acked, nothing recorded.
#   3. The store thaws (SIGCONT): the claims the first worker sent are applied
#      late, held by tokens nobody has. A second worker (another consumer name,
#      the same lease) finds those keys BUSY until the lease ends, then takes
#      them over and runs each message exactly once.
set -uo pipefail
dedup=$(realpath "$1")
here=$(cd "$(dirname "$0")" && pwd)
stream_port=${DRAIN_FROZEN_STREAM_PORT:-6550}
store_port=${DRAIN_FROZEN_STORE_PORT:-6551}
# shellcheck source=../scripts/lib/redis.sh
source "$here/../scripts/lib/redis.sh"
# shellcheck source=../scripts/lib/drain.sh
source "$here/../scripts/lib/drain.sh"
worker_pid="" second_pid=""
DRAIN_KILL_VARS="worker_pid second_pid" DRAIN_THAW_VARS=store_pid DRAIN_LOGS="w.log w2.log"
drain_begin drain_frozen
drain_need redis-server
drain_stream_and_store "$stream_port" "$store_port"

drain_s=1
timeout_s=3
late=4
lease=3s
drain_sleeping_handler

# One connection to the store (pool=1): the late claim goes on the connection
# already open (its bytes reach the frozen server, which runs them once thawed),
# not on a new one waiting in its handshake. The store is frozen, then the late
# entries arrive at once: their claim is sent to the frozen server and waits for
# its answer; the worker gets SIGTERM.
store="redis://127.0.0.1:$store_port?timeout=${timeout_s}s&pool=1"
drain_frozen_store_stop "$dedup" "$store" "$lease" "$late" m-late-
[ "$took_ms" -lt $(((drain_s + 1) * 1000)) ] || fail "the drain took ${took_ms} ms, want < $(((drain_s + 1) * 1000))"
[ "$rc" = 75 ] || fail "worker exit $rc after SIGTERM, want 75 (store calls given up)"
grep -q "given up at the drain deadline" "$tmp/w.log" || fail "no log line about what was given up"
# The late claims, and the release of the handler stopped at the deadline.
grep -q "for $((late + 1)) deliveries: $late claim(s), 1 outcome write(s) or release(s)" "$tmp/w.log" ||
  fail "the log does not say what was given up"
pending=$(rcli XPENDING jobs g | head -1)
[ "$pending" = $((late + 1)) ] || fail "$pending entries pending after the drain, want $((late + 1))"
drain_nothing_recorded "$dedup" "redis://127.0.0.1:$store_port"

# The second worker: each message once, the late claims taken over after their lease.
drain_second_worker_once "$dedup" "$store" "$lease" $((late + 1))
# Each late claim and the stopped handler's claim (its release was given up).
[ "$takeovers" = $((late + 1)) ] || fail "want $((late + 1)) takeovers: $(grep "stopped:" "$tmp/w2.log")"
[ "$busy" -ge 1 ] || fail "no claim was BUSY before its takeover: $(grep "stopped:" "$tmp/w2.log")"
echo "ok: drain ${took_ms} ms from SIGTERM (exit $rc), nothing acked; then each of $((late + 1))" \
  "messages ran once ($takeovers takeovers, $busy BUSY first)"
