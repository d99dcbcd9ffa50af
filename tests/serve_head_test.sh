#!/usr/bin/env bash
# HEAD on every route of `dedup serve` (the API, the page, the proxy) and of the
# worker's --metrics-port: the status and headers GET gives, without the body,
# and no Accept-Ranges that the route does not send itself. cpp-httplib (0.11)
# adds "Accept-Ranges: bytes" to every HEAD answer that has none, though serve
# serves no ranges (a Range is ignored: docs/SERVE.md), and a GET of the same
# route says nothing of ranges.
#   serve_head_test.sh DEDUP_BINARY [worker]
#     ports 8119 (serve), 8120 (app), 8121 (proxy); with "worker": Redis 6525 and
#     the worker's metrics on 8122 (docs/PORTS.md)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
# shellcheck source=lib/serve_test.sh
source "$root/tests/lib/serve_test.sh"
serve_test_begin serve-head "$1"
with_worker=${2:-}

# heads METHOD URL: the answer's status line, then its header lines sorted (CRs
# removed), without Date (an application's, through the proxy: it may tick
# between the two requests). Content-Length is left out too when NO_LENGTH is
# set (/metrics: its body changes from one request to the next).
heads() {
  local out
  if [ "$1" = HEAD ]; then
    out=$(curl -s -I --max-time 10 "$2" || true)
  else
    out=$(curl -s -o /dev/null -D - --max-time 10 "$2" || true)
  fi
  tr -d '\r' <<<"$out" | awk -v nolen="${NO_LENGTH:-}" '
    NR == 1 { print; fflush(); next }
    /^$/ || tolower($0) ~ /^date:/ { next }
    nolen != "" && tolower($0) ~ /^content-length:/ { next }
    { print | "sort" }
    END { close("sort") }'
}

# same_as_get URL WHAT: checks that HEAD answers as GET does, and claims no ranges.
same_as_get() {
  local get head
  get=$(heads GET "$1")
  head=$(heads HEAD "$1")
  check "HEAD $2: GET's status and headers ($(head -1 <<<"$get"))" [ "$get" = "$head" ]
  if [ "$get" != "$head" ]; then diff <(echo "$get") <(echo "$head") | sed 's/^/     /' || true; fi
  check "... and no Accept-Ranges" bash -c '! grep -qi "^accept-ranges:" <<<"$1"' _ "$head"
}

port=8119
base="http://127.0.0.1:$port"
serve_start $port "$tmp/serve.log" "$dedup" serve --store memory: --listen 127.0.0.1:$port
token=$(curl -s -X POST "$base/v1/keys/done/claim" -d '{}' |
  python3 -c 'import json,sys; print(json.load(sys.stdin)["token"])')
curl -s -o /dev/null -X POST "$base/v1/keys/done/complete" -d "{\"token\":\"$token\",\"result\":\"r\"}"
same_as_get "$base/healthz" /healthz
NO_LENGTH=1 same_as_get "$base/metrics" /metrics
same_as_get "$base/v1/info" /v1/info
same_as_get "$base/v1/keys" /v1/keys
same_as_get "$base/v1/keys?prefix=do&limit=5" "/v1/keys?prefix="
same_as_get "$base/v1/keys/done" "/v1/keys/{key} (a completed record)"
same_as_get "$base/v1/keys/absent" "/v1/keys/{key} (no record: 404)"
same_as_get "$base/v1/keys?nosuch=1" "/v1/keys with an unknown parameter (400)"
same_as_get "$base/v1/keys/done/claim" "a POST route (404)"
same_as_get "$base/nosuch" "no such route (404)"
same_as_get "$base/" "the page"
same_as_get "$base/assets/app.js" /assets/app.js
same_as_get "$base/assets/style.css" /assets/style.css
# A Range is ignored on GET (the whole answer, 200): HEAD says the same.
get=$(curl -s -o /dev/null -w '%{http_code}' -H 'Range: bytes=0-1' "$base/assets/app.js")
check "GET with a Range: 200, the whole answer" [ "$get" = 200 ]

# ---- the proxy: its own routes as above, and the application's answer to HEAD
# as the application gave it (its own Accept-Ranges kept, none added).
app_port=8120
proxy_port=8121
proxy="http://127.0.0.1:$proxy_port"
serve_start $app_port "$tmp/app.log" python3 "$root/tests/serve_app.py" $app_port "$tmp/calls"
serve_start $proxy_port "$tmp/proxy.log" "$dedup" serve --store memory: \
  --listen 127.0.0.1:$proxy_port --proxy "http://127.0.0.1:$app_port"
same_as_get "$proxy/_dedup/healthz" "proxy mode: /_dedup/healthz"
same_as_get "$proxy/_dedup/" "proxy mode: the page"
same_as_get "$proxy/_dedup/v1/info" "proxy mode: /_dedup/v1/info"
same_as_get "$proxy/healthz" "proxy mode: the application's /healthz"
headers=$(curl -s -I --max-time 10 "$proxy/ranges" | tr -d '\r')
check "HEAD through the proxy: the application's answer (200)" grep -q '^HTTP/1.1 200' <<<"$headers"
check "... with the application's own Accept-Ranges, once" \
  [ "$(grep -ci '^accept-ranges:' <<<"$headers")" = 1 -a "$(header Accept-Ranges)" = bytes ]
# A HEAD with an Idempotency-Key: recorded, and replayed with the Content-Length
# the application gave (its GET's length), not 0 for the replay's empty body.
live=$(curl -s -I --max-time 10 -H 'Idempotency-Key: head-1' "$proxy/charge" | tr -d '\r')
again=$(curl -s -I --max-time 10 -H 'Idempotency-Key: head-1' "$proxy/charge" | tr -d '\r')
live_len=$(awk -F': ' 'tolower($1) == "content-length" { print $2 }' <<<"$live")
again_len=$(awk -F': ' 'tolower($1) == "content-length" { print $2 }' <<<"$again")
check "HEAD with an Idempotency-Key: the application's 201, Content-Length $live_len" \
  eval '[[ "$live" == "HTTP/1.1 201"* && "$live_len" -gt 0 ]]'
check "... replayed with the same Content-Length ($again_len), Idempotent-Replayed" \
  eval '[[ "$again" == "HTTP/1.1 201"* && "$again_len" == "$live_len" ]] &&
        grep -qi "^idempotent-replayed: true" <<<"$again"'

# ---- the worker's --metrics-port (serve's HTTP server too).
if [ "$with_worker" = worker ]; then
  redis_start 6525 "$tmp/redis"
  broker='redis://127.0.0.1:6525?stream=jobs&group=g'
  "$dedup" publish --broker "$broker" --count 1 --id-prefix m- >/dev/null 2>&1
  setpriv --pdeathsig KILL -- "$dedup" worker --broker "$broker" --store memory: \
    --exec true --metrics-port 8122 --summary-interval 0 >"$tmp/worker.log" 2>&1 &
  SERVE_PIDS+=("$!")  # stopped at exit, before Redis
  for _ in $(seq 200); do
    curl -s -o /dev/null 127.0.0.1:8122/metrics 2>/dev/null && break
    sleep 0.1
  done
  NO_LENGTH=1 same_as_get "http://127.0.0.1:8122/metrics" "the worker's /metrics"
  same_as_get "http://127.0.0.1:8122/" "the worker's metrics listener, another path (404)"
fi

serve_report "$tmp"
