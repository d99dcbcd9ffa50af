#!/usr/bin/env bash
# The worker's --metrics-port, now on serve's HTTP stack and metrics registry:
# Prometheus names, claim and handler latency histograms, dedup_build_info.
#   serve_worker_metrics_test.sh DEDUP_BINARY     (ports 8082-8083, docs/PORTS.md)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
# shellcheck source=lib/serve_test.sh
source "$root/tests/lib/serve_test.sh"
serve_test_begin serve-wm "$1"
redis_start 8082 "$tmp/redis"
broker='redis://127.0.0.1:8082?stream=jobs&group=g'
"$dedup" publish --broker "$broker" --count 5 --id-prefix m- >/dev/null 2>&1
setpriv --pdeathsig KILL -- "$dedup" worker --broker "$broker" --store "rocksdb:$tmp/db" \
  --exec true --metrics-port 8083 --summary-interval 0 >"$tmp/worker.log" 2>&1 &
SERVE_PIDS+=("$!")  # stopped at exit, before Redis
for _ in $(seq 200); do
  if curl -s 127.0.0.1:8083/metrics 2>/dev/null | grep -q '^dedup_worker_acked_total 5$'; then break; fi
  sleep 0.1
done
curl -s 127.0.0.1:8083/metrics >"$tmp/m"
check "the worker's counters: 5 acked" grep -q '^dedup_worker_acked_total 5$' "$tmp/m"
check "claims by outcome label" grep -q '^dedup_worker_claims_total{outcome="acquired"} 5$' "$tmp/m"
check "claim latency histogram in seconds" grep -q '^dedup_worker_claim_duration_seconds_count [1-9]' "$tmp/m"
check "handler latency histogram by outcome" grep -q '^dedup_worker_handler_duration_seconds_count{outcome="done"} 5$' "$tmp/m"
check "dedup_build_info" grep -q '^dedup_build_info{version="[^"]*"} 1$' "$tmp/m"
check "HELP and TYPE lines" grep -q '^# TYPE dedup_worker_acked_total counter$' "$tmp/m"
check "no message key in /metrics" bash -c "! grep -q 'm-' '$tmp/m'"
check "anything else is 404" [ "$(curl -s -o /dev/null -w '%{http_code}' 127.0.0.1:8083/)" = 404 ]
# The listener is serve's HTTP server, with serve's deadlines and answers
# (docs/SERVE.md, "Slow clients"): a head trickled is answered 408 after 10 s, a
# body trickled 408 after 30 s (not cpp-httplib's 400), both closed; a head too
# large 431 at once. The two trickles at once: ~30 s.
trickle() {
  setpriv --pdeathsig KILL -- python3 "$root/tests/serve_trickle_clients.py" 8083 "$1" 1 "$2" \
    >"$tmp/$1.out" 2>&1 &
}
big=$(python3 - <<'PY'
import socket, time
s = socket.create_connection(("127.0.0.1", 8083))
t0 = time.monotonic()
s.sendall(b"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\n"
          + b"".join(b"X-Big-%d: %s\r\n" % (i, b"b" * 4000) for i in range(25)))
out = b""
while True:
    d = s.recv(65536)
    if not d:
        break
    out += d
print(out.split(b" ")[1].decode(), "%.1f" % (time.monotonic() - t0))
PY
)
trickle head 20
head_pid=$!
trickle metrics-body 40
body_pid=$!
wait "$head_pid" "$body_pid" || true
check "a head trickled to the worker's /metrics: 408 after 10-13 s, closed ($(grep -vx open "$tmp/head.out"))" \
  awk '$1 == "0" { ok = $2 == "408" && $3 >= 10 && $3 <= 13 && $4 == "closed" } END { exit !ok }' "$tmp/head.out"
check "a body trickled to the worker's /metrics: 408 after 30-33 s, closed ($(grep -vx open "$tmp/metrics-body.out"))" \
  awk '$1 == "0" { ok = $2 == "408" && $3 >= 30 && $3 <= 33 && $4 == "closed" } END { exit !ok }' "$tmp/metrics-body.out"
check "a head over the bound: 431 at once ($big)" eval '[[ "$big" =~ ^431\ 0\. ]]'
# A second worker on the port the first holds: refused (75, try again later)
# before it opens its store or the broker. It made the RocksDB directory and the
# consumer group first, and then failed.
set +e
"$dedup" worker --broker 'redis://127.0.0.1:8082?stream=other&group=g2' --store "rocksdb:$tmp/db2" \
  --exec true --metrics-port 8083 >"$tmp/second.log" 2>&1
rc=$?
set -e
check "a worker on a metrics port in use: exit 75 (rc $rc), naming the flag and why" \
  eval '[ $rc = 75 ] && grep -q -- "--metrics-port: .*cannot listen on 127.0.0.1:8083: address in use" "$tmp/second.log"'
check "... its store was not created" [ ! -e "$tmp/db2" ]
check "... nor its stream and group" [ "$(redis-cli -p 8082 EXISTS other)" = 0 ]
if [ $FAILS -gt 0 ]; then
  cat "$tmp/m" "$tmp/worker.log" | tail -40
  exit 1
fi
echo "serve_worker_metrics_test: all checks passed"
