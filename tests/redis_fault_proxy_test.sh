#!/usr/bin/env bash
# Network faults between `dedup worker` and Redis (issue 13, item 10): two worker
# processes read a Redis Streams stream and keep their claims in the same Redis,
# both through tests/fault_proxy.py, which at random cuts connections mid-reply
# (RST or FIN) and holds traffic for 2.5 s (longer than the client's 2 s timeout,
# shorter than the 4 s lease) or 5.5 s (longer than the lease), on one
# connection or on all of them. The handler (worker_ledger_handler) appends one
# line per effect to a ledger; every 50th message works 5 s, longer than the
# lease, so heartbeats must get through the faults.
#
#   tests/redis_fault_proxy_test.sh DEDUP_BIN HANDLER_BIN
#
# The checker of tests/worker_chaos_test.sh judges the ledger: 0 lost (missing
# and no longer in the stream), 0 unfinished, 0 overlapping runs of one key,
# fences increasing, and every rerun explained by a fault the proxy logged on a
# connection of the earlier run's worker (or on all) while that run ran or just
# after (its heartbeats or its complete could not get through: fail closed). The test also fails when the proxy did not cut at
# least one connection and hold traffic longer than the lease at least once.
#
# Time: faults for FAULT_SECONDS (default 30), then a drain without faults until
# the group holds nothing, at most until FAULT_TIMEOUT (default 80) seconds from
# the start. Ports (docs/PORTS.md): Redis FAULT_REDIS_PORT (6501), proxy
# FAULT_PROXY_PORT (6502). FAULT_SEED (1); FAULT_KEEP=1 keeps the temporary
# directory. FAULT_PATTERN=textbook runs the SET NX EX / DEL guard instead (TTL =
# the lease) under the same faults: the checker then only reports.
set -euo pipefail

dedup=$(realpath "$1")
handler=$(realpath "$2")
here=$(cd "$(dirname "$0")" && pwd)
redis_port=${FAULT_REDIS_PORT:-6501}
proxy_port=${FAULT_PROXY_PORT:-6502}
fault_seconds=${FAULT_SECONDS:-30}
seed=${FAULT_SEED:-1}
pattern=${FAULT_PATTERN:-dedup}
deadline=$((SECONDS + ${FAULT_TIMEOUT:-80}))
lease_s=4

work=$(mktemp -d "${TMPDIR:-/tmp}/dedup-fault-proxy.XXXXXX")
proxy_pid=""
declare -a worker_pids=()
cleanup() {
  for p in "${worker_pids[@]}" $proxy_pid; do
    [ -n "$p" ] && kill -KILL "$p" 2>/dev/null || true
  done
  if [ -z "${FAULT_KEEP:-}" ]; then rm -rf "$work"; else echo "kept $work"; fi
}
trap cleanup EXIT
source "$here/../scripts/lib/redis.sh"
source "$here/../scripts/lib/stream_outstanding.sh"

redis_start "$redis_port" "$work/redis" --appendonly yes --maxmemory-policy noeviction
rcli() { redis-cli -p "$redis_port" "$@"; }

# Published straight to Redis; only the workers go through the proxy. Messages
# m-<n>, 10% of them twice, in chunks of 20 while fewer than 40 are outstanding:
# the workers have work during every fault, and the backlog at the end of the
# faults stays small however slow a busy machine makes them.
rcli XGROUP CREATE jobs workers '$' MKSTREAM >/dev/null
messages=0
publish_chunk() {
  "$dedup" publish --broker "redis://127.0.0.1:$redis_port?stream=jobs&group=workers" \
    --count 20 --start "$messages" --id-prefix m- --duplicates 0.1 \
    --seed $((seed + messages)) >/dev/null
  messages=$((messages + 20))
}

python3 "$here/fault_proxy.py" --listen "$proxy_port" --target "$redis_port" \
  --log "$work/faults" --seed "$seed" --every 1.5 --delays 2.5,5.5 \
  --duration "$fault_seconds" --ready "$work/proxy.ready" --pids "$work/pids" \
  2>"$work/proxy.log" &
proxy_pid=$!
for _ in $(seq 1 100); do [ -s "$work/proxy.ready" ] && break; sleep 0.1; done
[ -s "$work/proxy.ready" ] || { echo "the fault proxy did not start"; cat "$work/proxy.log"; exit 1; }

broker="redis://127.0.0.1:$proxy_port?stream=jobs&group=workers&reclaim=6s"
store="redis://127.0.0.1:$proxy_port?prefix=dedup:"
export LEDGER=$work/ledger WORK_MS=2 SLOW_EVERY=50 SLOW_MS=5000
touch "$LEDGER" "$work/kills" "$work/outage"
nworkers=2
# The textbook flags are refused without --pattern textbook, the Buffer's with it.
pattern_flags=(--store "$store" --lease "${lease_s}s")
if [ "$pattern" = textbook ]; then pattern_flags=(--textbook-ttl "${lease_s}s"); fi
for i in $(seq 0 $((nworkers - 1))); do
  "$dedup" worker --broker "$broker&consumer=w$i" --pattern "$pattern" \
    "${pattern_flags[@]}" --exec "$handler" \
    --no-shell --concurrency 4 --retry-delay 200ms \
    --summary-interval 10s >>"$work/worker$i.log" 2>&1 &
  worker_pids[$i]=$!
  echo "${worker_pids[$i]}" >>"$work/pids"
done

# Faults run for fault_seconds; then the workers drain the stream.
faults_end=$((SECONDS + fault_seconds))
while [ $SECONDS -lt $faults_end ]; do
  if [ "$(stream_outstanding_count "$redis_port" jobs workers)" -lt 40 ]; then publish_chunk; fi
  sleep 0.3
done
published=$(rcli XLEN jobs)
echo "faults over after ${SECONDS}s: $messages messages published, $(wc -l <"$LEDGER") effects so far"
while [ $SECONDS -lt "$deadline" ]; do
  [ "$(stream_outstanding_count "$redis_port" jobs workers)" = 0 ] && break
  sleep 1
done
echo "drain ended after ${SECONDS}s with $(stream_outstanding_count "$redis_port" jobs workers) outstanding"
stream_stop_workers "$redis_port" jobs workers "$work"

# The faults must have happened, or the verdict says nothing.
cuts=$(awk '$3 == "rst" || $3 == "close"' "$work/faults" | wc -l)
long_holds=$(awk -v l="$lease_s" '($3 == "delay" || $3 == "stall") && ($2 - $1) > l * 1000000' \
  "$work/faults" | wc -l)
unowned=$(awk '$3 != "stall" && $5 == "?"' "$work/faults" | wc -l)
echo "proxy: $cuts connections cut, $long_holds holds longer than the ${lease_s}s lease," \
  "$unowned faults on a connection of no known worker (explain any rerun)"
ok=1
if [ "$cuts" -lt 1 ] || [ "$long_holds" -lt 1 ]; then
  echo "FAIL: the proxy injected too few faults to judge (cuts $cuts, long holds $long_holds)"
  ok=0
fi

python3 "$here/worker_chaos_check.py" --ledger "$LEDGER" --kills "$work/kills" \
  --outage "$work/outage" --faults "$work/faults" --fault-slack-ms 3000 \
  --outstanding "$work/outstanding" \
  --messages "$messages" --published "$published" --pending "$pending" --dead "$dead" \
  --pattern "$pattern" --store redis --workers "$nworkers" --redis-restarts 0 \
  --elapsed "$SECONDS" || ok=0
[ "$ok" = 1 ]
