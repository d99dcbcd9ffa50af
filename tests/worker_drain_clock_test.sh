#!/usr/bin/env bash
# The drain clock of `dedup worker` starts at SIGTERM (docs/WORKER.md,
# "Stopping"), not when the fetch thread comes back from a call into a store
# that hangs.
#
#   tests/worker_drain_clock_test.sh build/src/cli/dedup
#
# Real redis-servers on 127.0.0.1 (docs/PORTS.md): the stream on 6476, the Redis
# store on 6479 (client timeout 3 s). One handler runs (`sleep 30`, concurrency
# 2, --prefetch 8). Then the store's server is frozen (SIGSTOP, by PID) and 20
# entries arrive at once (MULTI/EXEC): the idle handler thread takes the first
# fetched batch to claim it, and the fetch thread claims the next batch itself
# (the claim stage is busy). Both claims wait for the store's timeout. The
# worker gets SIGTERM while they wait.
#   1. The worker exits within the drain timeout plus a margin, with exit code
#      75: at the drain deadline the store is told to stop waiting
#      (Store::StopWaiting), so the claims in flight and the stopped handler's
#      release are given up 250 ms later (1.27 s measured). Before: the claim in
#      flight timed out, the Redis store tried it once more on a new connection,
#      whose PING waited a whole timeout again: the drain timeout plus two store
#      timeouts, exit 0 (6.2-6.3 s). A shorter wait for that reconnect alone was
#      tried and taken back: a server that stalls for between one and two
#      timeouts then failed a claim that succeeds today
#      (RedisStoreTest.AClaimOutlastingAStallOfUnderTwoTimeoutsIsAcquired). Before
#      that, the drain clock started only when the fetch thread's claim gave up:
#      10.5 s.
#   2. Both batches were read (19 entries pending), nothing is acked, nothing
#      recorded.
set -uo pipefail
dedup=$(realpath "$1")
here=$(cd "$(dirname "$0")" && pwd)
stream_port=${DRAIN_CLOCK_STREAM_PORT:-6476}
store_port=${DRAIN_CLOCK_STORE_PORT:-6479}
# shellcheck source=../scripts/lib/redis.sh
source "$here/../scripts/lib/redis.sh"
# shellcheck source=../scripts/lib/drain.sh
source "$here/../scripts/lib/drain.sh"
worker_pid=""
DRAIN_KILL_VARS=worker_pid DRAIN_THAW_VARS=store_pid DRAIN_LOGS=w.log
drain_begin drain_clock
drain_need redis-server
drain_stream_and_store "$stream_port" "$store_port"

drain_s=1
timeout_s=3
late=20
drain_sleeping_handler

# The store is frozen, then 20 entries arrive at once (the fetch thread waits in
# XREADGROUP BLOCK): two batches of 9 are fetched and their claims sent; the
# worker gets SIGTERM.
store="redis://127.0.0.1:$store_port?timeout=${timeout_s}s"
drain_frozen_store_stop "$dedup" "$store" 60s "$late" b-
[ "$rc" = 75 ] || fail "worker exit $rc after SIGTERM, want 75 (store calls given up)"
# The drain timeout, the 250 ms grace of the store calls still waiting, and a
# margin for the busy 2-core machine. Before: 6.2-6.9 s (two store timeouts),
# and 10.5 s before that (the drain clock started after the fetch thread's claim).
[ "$took_ms" -lt $((drain_s * 1000 + 1500)) ] || fail "the drain took ${took_ms} ms"
grep -q "given up at the drain deadline" "$tmp/w.log" || fail "no log line about what was given up"
# Read and not acked: the first entry and two batches of 9 (the second one was
# fetched while the first waited in the claim stage: the fetch thread claimed it).
pending=$(rcli XPENDING jobs g | head -1)
[ "$pending" = 19 ] || fail "$pending entries pending after the drain, want 19"
drain_nothing_recorded "$dedup" "redis://127.0.0.1:$store_port"
echo "ok: drain ${took_ms} ms from SIGTERM, two claim batches were in flight, nothing acked ($pending pending)"
echo PASS
