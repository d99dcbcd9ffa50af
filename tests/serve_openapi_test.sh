#!/usr/bin/env bash
# Every status `dedup serve` answers on an API route is one docs/openapi.yaml lists
# for that operation: provoked on three servers (with a token and short deadlines;
# without a token, for the browser guards; on a stopped Redis, for 503), then read
# back from dedup_serve_requests_total{route,code} and compared with the spec
# (tests/serve_openapi_statuses.py).
#   serve_openapi_test.sh DEDUP_BINARY     (ports 8110-8112, Redis 6530; docs/PORTS.md)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
# shellcheck source=lib/serve_test.sh
source "$root/tests/lib/serve_test.sh"
serve_test_begin serve-openapi "$1"
statuses=$root/tests/serve_openapi_statuses.py

token="tok-$(head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \n')"
echo "$token" >"$tmp/token"
serve_start 8110 "$tmp/token.log" "$dedup" serve --store memory: --listen 127.0.0.1:8110 \
  --auth-token-file "$tmp/token" --header-timeout 1s --body-timeout 1s
serve_start 8111 "$tmp/open.log" "$dedup" serve --store memory: --listen 127.0.0.1:8111
redis_start 6530 "$tmp/redis"
redis_pid=$REDIS_LAST_PID
serve_start 8112 "$tmp/down.log" "$dedup" serve --store redis://127.0.0.1:6530 \
  --listen 127.0.0.1:8112
kill "$redis_pid"
wait "$redis_pid" 2>/dev/null || true

python3 "$statuses" provoke 8110 token "$token" >"$tmp/token.out"
python3 "$statuses" provoke 8111 open >"$tmp/open.out"
python3 "$statuses" provoke 8112 down >"$tmp/down.out"
curl -s -H "Authorization: Bearer $token" http://127.0.0.1:8110/metrics >"$tmp/token.metrics"
curl -s http://127.0.0.1:8111/metrics >"$tmp/open.metrics"
curl -s http://127.0.0.1:8112/metrics >"$tmp/down.metrics"
# The provocations reached what they aimed at (else the comparison proves little).
check "with a token: 201 200 409 410 412 422 400 401 404 413 408 414 431 answered ($(awk '{print $NF}' "$tmp/token.out" | sort -u | tr '\n' ' '))" \
  eval 'for c in 201 200 409 410 412 422 400 401 404 413 408 414 431; do grep -q " $c\$" "$tmp/token.out" || exit 1; done'
check "without a token: 403 and 421 answered ($(awk '{print $NF}' "$tmp/open.out" | sort -u | tr '\n' ' '))" \
  eval 'grep -q " 403$" "$tmp/open.out" && grep -q " 421$" "$tmp/open.out"'
check "the store stopped: 503 answered ($(awk '{print $NF}' "$tmp/down.out" | sort -u | tr '\n' ' '))" \
  grep -q " 503$" "$tmp/down.out"
# A Range header is ignored on serve's own answers (RFC 9110 14.2 allows it):
# cpp-httplib cut a claim's answer to the range, under its 201, and the claimer
# lost its token with the rest.
auth=(-H "Authorization: Bearer $token")
claim=$(curl -s "${auth[@]}" -X POST -H 'Range: bytes=0-20' -d '{}' http://127.0.0.1:8110/v1/keys/ranged/claim)
check "a claim sent with Range: bytes=0-20 gets its whole answer ($claim)" \
  eval 'python3 -c "import json, sys; assert json.loads(sys.argv[1])[\"outcome\"] == \"ACQUIRED\"" "$claim" 2>/dev/null'
info=$(curl -s -w ' %{http_code}' "${auth[@]}" -H 'Range: bytes=0-3,5-9' http://127.0.0.1:8110/v1/info)
check "GET /v1/info with Range: bytes=0-3,5-9 gets the whole JSON, 200 (${info:0:80}...)" \
  eval '[[ "$info" == "{"*"} 200" ]]'
# So is one cpp-httplib cannot parse (another unit than bytes, a backwards range,
# no range): it answered 416 itself, before serve saw the request.
for range in 'items=0-9' 'bytes=9-0' 'bytes=x'; do
  info=$(curl -s -w ' %{http_code}' "${auth[@]}" -H "Range: $range" http://127.0.0.1:8110/v1/info)
  check "GET /v1/info with Range: $range gets the whole JSON, 200 (${info:0:80}...)" \
    eval '[[ "$info" == "{"*"} 200" ]]'
done
if python3 "$statuses" compare "$root/docs/openapi.yaml" "$tmp"/*.metrics >"$tmp/compare.out"; then
  ok=1
else
  ok=0
fi
cat "$tmp/compare.out"
check "every status answered on an API route is in docs/openapi.yaml" [ $ok = 1 ]
serve_report "$tmp"
