#!/usr/bin/env bash
# The worker's --metrics-port, now on serve's HTTP stack and metrics registry:
# Prometheus names, claim and handler latency histograms, dedup_build_info.
#   serve_worker_metrics_test.sh DEDUP_BINARY     (ports 8082-8083, docs/PORTS.md)
set -euo pipefail
dedup=$(realpath "$1")
root=$(cd "$(dirname "$0")/.." && pwd)
# shellcheck source=../scripts/lib/redis.sh
source "$root/scripts/lib/redis.sh"
# shellcheck source=../scripts/lib/serve.sh
source "$root/scripts/lib/serve.sh"
tmp=$(mktemp -d "${TMPDIR:-/tmp}/serve-wm.XXXXXX")
worker=""
stop_worker() {
  if [ -n "$worker" ]; then
    kill "$worker" 2>/dev/null || true
    wait "$worker" 2>/dev/null || true
  fi
}
trap 'stop_worker; redis_stop_all; rm -rf "$tmp"' EXIT
redis_start 8082 "$tmp/redis"
broker='redis://127.0.0.1:8082?stream=jobs&group=g'
"$dedup" publish --broker "$broker" --count 5 --id-prefix m- >/dev/null 2>&1
setpriv --pdeathsig KILL -- "$dedup" worker --broker "$broker" --store "rocksdb:$tmp/db" \
  --exec true --metrics-port 8083 --summary-interval 0 >"$tmp/worker.log" 2>&1 &
worker=$!
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
if [ $FAILS -gt 0 ]; then
  cat "$tmp/m" "$tmp/worker.log" | tail -40
  exit 1
fi
echo "serve_worker_metrics_test: all checks passed"
