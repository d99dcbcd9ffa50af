#!/usr/bin/env bash
# NATS JetStream: a worker that drains keeps telling the server its running
# handler is in progress (+WPI every heartbeat), so a handler that outlives the
# consumer's AckWait during the drain is not redelivered to another worker
# (docs/WORKER.md, "Stopping").
#
#   tests/worker_drain_nats_test.sh build/src/cli/dedup
#
# Real nats-server -js on 127.0.0.1:4234 and redis-server (the shared Redis
# store) on 6477 (docs/PORTS.md). AckWait 1.5 s, lease 1.5 s (heartbeat and
# +WPI every 0.5 s), --drain-timeout 20 s.
#   Worker A starts the one message's handler (it runs 5 s); worker B (same
#   durable consumer, same store) runs beside it; A gets SIGTERM at once and
#   drains. The server must not redeliver the message while A drains: B handles
#   no message (a redelivery would show as messages=1 busy=1 in its summary),
#   A records and acks it, the handler ran once.
set -uo pipefail
dedup=$(realpath "$1")
here=$(cd "$(dirname "$0")" && pwd)
nats_port=${DRAIN_NATS_PORT:-4234}
redis_port=${DRAIN_NATS_REDIS_PORT:-6477}
# shellcheck source=../scripts/lib/redis.sh
source "$here/../scripts/lib/redis.sh"
# shellcheck source=../scripts/lib/nats.sh
source "$here/../scripts/lib/nats.sh"
# shellcheck source=../scripts/lib/drain.sh
source "$here/../scripts/lib/drain.sh"
a_pid=""
b_pid=""
DRAIN_KILL_VARS="a_pid b_pid" DRAIN_LOGS="a.log b.log" DRAIN_TAIL=4
drain_begin drain_nats
drain_need nats-server redis-server
nats_start "$nats_port" "$tmp/nats" || fail "nats-server did not start on $nats_port"
redis_start "$redis_port" "$tmp/redis" >/dev/null || fail "redis-server did not start on $redis_port"

drain_handler "$tmp/handler.sh" <<EOF
echo "\$DEDUP_WORKER_PID \$DEDUP_KEY" >>"$tmp/started"
sleep 5
echo "\$DEDUP_WORKER_PID \$DEDUP_KEY" >>"$tmp/done"
EOF

"$dedup" publish --broker "nats://127.0.0.1:$nats_port?stream=JOBS&subject=jobs.in" \
  --id-prefix m- --count 1 --quiet || fail "publish"
broker="nats://127.0.0.1:$nats_port?stream=JOBS&consumer=workers&subject=jobs.in&ack_wait=1500ms"
run_worker() {  # run_worker LOG; sets worker_pid
  "$dedup" worker --broker "$broker" --store "redis://127.0.0.1:$redis_port" \
    --exec "$tmp/handler.sh" --no-shell --concurrency 1 --lease 1500ms \
    --drain-timeout 20s --summary-interval 0 >>"$1" 2>&1 &
  worker_pid=$!
}

run_worker "$tmp/a.log"; a_pid=$worker_pid
for i in $(seq 1 200); do [ -f "$tmp/started" ] && break; sleep 0.05; done
[ -f "$tmp/started" ] || fail "A's handler did not start"
run_worker "$tmp/b.log"; b_pid=$worker_pid
kill -TERM "$a_pid"
t0=$(date +%s%N)
wait "$a_pid" || fail "worker A exit $?"
a_pid=""
took_ms=$((($(date +%s%N) - t0) / 1000000))
echo "A drained in ${took_ms} ms (handler 5 s, AckWait 1.5 s)"
sleep 1  # a redelivery made during A's drain reaches B by now
kill -TERM "$b_pid"; wait "$b_pid"; b_pid=""

grep -q "stopped: messages=1 acquired=1 .* acked=1 " "$tmp/a.log" ||
  fail "A did not record and ack its message: $(grep stopped: "$tmp/a.log")"
grep -q "stopped: messages=0 " "$tmp/b.log" ||
  fail "the message was redelivered to B while A drained: $(grep stopped: "$tmp/b.log")"
[ "$(wc -l <"$tmp/started")" = 1 ] || fail "the handler started $(wc -l <"$tmp/started") times"
[ "$(wc -l <"$tmp/done" 2>/dev/null)" = 1 ] || fail "the handler did not finish once"
echo "ok: no redelivery while A drained ${took_ms} ms past AckWait; handler ran once"
echo PASS
