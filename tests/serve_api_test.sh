#!/usr/bin/env bash
# The JSON API of `dedup serve` driven with curl, then with a Python client
# (tests/serve_api_client.py), against a real server on a RocksDB store.
#   serve_api_test.sh DEDUP_BINARY     (port 8070, docs/PORTS.md)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
# shellcheck source=lib/serve_test.sh
source "$root/tests/lib/serve_test.sh"
serve_test_begin serve-api "$1"
port=8070
base="http://127.0.0.1:$port"
serve_start $port "$tmp/serve.log" "$dedup" serve --store "rocksdb:$tmp/db" \
  --listen 127.0.0.1:$port --max-body-bytes 100000

# call METHOD PATH [JSON]: sets $code, $body and $headers.
call() {
  local args=(-s -o "$tmp/body" -D "$tmp/headers" -w '%{http_code}' -X "$1" "$base$2")
  [ $# -ge 3 ] && args+=(-H 'Content-Type: application/json' --data-binary "$3")
  code=$(curl "${args[@]}")
  body=$(cat "$tmp/body")
  headers=$(tr -d '\r' <"$tmp/headers")
}
field() { python3 -c 'import json,sys; v=json.loads(sys.argv[1]).get(sys.argv[2]); print("" if v is None else v)' "$body" "$1"; }
has_header() { grep -qi "^$1" <<<"$headers"; }

# ---- claim, busy, extend, complete, duplicate
call POST /v1/keys/order-1/claim '{"lease_ms":20000}'
check "claim of a new key: 201 ACQUIRED" [ "$code" = 201 -a "$(field outcome)" = ACQUIRED ]
token=$(field token)
check "the token is 16 hex digits" grep -Eq '^[0-9a-f]{16}$' <<<"$token"
# The first fence of a key is the store's floor: 1 on most stores, above a durable
# epoch on RocksDB (docs/DESIGN.md); every later claim of the key is higher.
fence1=$(field fence)
check "a positive fence, attempt 1" [ "$fence1" -ge 1 -a "$(field attempt)" = 1 ]
call POST /v1/keys/order-1/claim '{}'
check "second claim while the lease is valid: 409 BUSY" [ "$code" = 409 -a "$(field outcome)" = BUSY ]
check "409 carries Retry-After" has_header 'Retry-After: [0-9]'
call POST /v1/keys/order-1/extend "{\"token\":\"$token\",\"lease_ms\":20000}"
check "extend with the owner's token: 200 OK" [ "$code" = 200 -a "$(field result)" = OK ]
call POST /v1/keys/order-1/extend '{"token":"0000000000000001","lease_ms":20000}'
check "extend with another token: 412 LOST" [ "$code" = 412 -a "$(field result)" = LOST ]
call POST /v1/keys/order-1/complete "{\"token\":\"$token\",\"result\":\"receipt-42\"}"
check "complete: 200 OK" [ "$code" = 200 -a "$(field result)" = OK ]
call POST /v1/keys/order-1/claim '{}'
check "claim after complete: 200 DUPLICATE with the result" \
  [ "$code" = 200 -a "$(field outcome)" = DUPLICATE -a "$(field result)" = receipt-42 ]
check "the duplicate says it is a replay" has_header 'Idempotent-Replayed: true'
call POST /v1/keys/order-1/complete "{\"token\":\"$token\",\"result\":\"again\"}"
check "a second complete: 412 LOST" [ "$code" = 412 ]

# ---- fingerprints, release, attempts
call POST /v1/keys/order-2/claim '{"fingerprint":"sha-A"}'
check "claim with a fingerprint: 201" [ "$code" = 201 ]
t2=$(field token)
f2=$(field fence)
call POST /v1/keys/order-2/claim '{"fingerprint":"sha-B"}'
check "same key, other fingerprint: 422 MISMATCH" [ "$code" = 422 -a "$(field outcome)" = MISMATCH ]
call POST /v1/keys/order-2/release "{\"token\":\"$t2\"}"
check "release: 200 OK" [ "$code" = 200 ]
call POST /v1/keys/order-2/claim '{"fingerprint":"sha-A","max_attempts":2}'
check "claim after release: attempt 2, the next fence" \
  [ "$code" = 201 -a "$(field attempt)" = 2 -a "$(field fence)" = $((f2 + 1)) ]
t2=$(field token)
call POST /v1/keys/order-2/release "{\"token\":\"$t2\"}"
call POST /v1/keys/order-2/claim '{"fingerprint":"sha-A","max_attempts":2}'
check "a claim past max_attempts: 410 EXHAUSTED" [ "$code" = 410 -a "$(field outcome)" = EXHAUSTED ]

# ---- inspect, forget
call GET /v1/keys/order-1
check "inspect: 200, completed, with the result" \
  [ "$code" = 200 -a "$(field state)" = completed -a "$(field result)" = receipt-42 ]
check "inspect never shows the owner's token" [ "$(field token)" = "" ]
call GET /v1/keys/no-such-key
check "inspect of an absent key: 404" [ "$code" = 404 ]
call DELETE /v1/keys/order-1
check "forget: 200" [ "$code" = 200 ]
call DELETE /v1/keys/order-1
check "forget again: 404" [ "$code" = 404 ]
call POST /v1/keys/order-1/claim '{}'
# A fresh start (attempt 1); the fence never goes back below the first (the RocksDB
# store keeps its fences rising within a process even across a forget).
check "after forget the key starts again: attempt 1, fence not below the first" \
  [ "$code" = 201 -a "$(field attempt)" = 1 -a "$(field fence)" -ge "$fence1" ]

# ---- forget of a running lease: 409 unless force=true; a forced one keeps fences rising
call POST /v1/keys/busy-1/claim '{"lease_ms":60000}'
tb=$(field token)
fb=$(field fence)
call DELETE /v1/keys/busy-1
check "forget of a running lease: 409" [ "$code" = 409 ]
check "as problem+json" has_header 'Content-Type: application/problem+json'
check "naming the key, the time left and force" grep -q 'busy-1.*left.*force' <<<"$(field detail)"
call GET /v1/keys/busy-1
check "the refused forget changed nothing" [ "$code" = 200 -a "$(field state)" = in_progress ]
call DELETE '/v1/keys/busy-1?force=maybe'
check "force must be true or false: 400" [ "$code" = 400 ]
call DELETE '/v1/keys/busy-1?force=true'
check "forget with force=true: 200" [ "$code" = 200 ]
call GET /v1/keys/busy-1
check "then the key reads absent: 404" [ "$code" = 404 ]
call POST /v1/keys/busy-1/complete "{\"token\":\"$tb\"}"
check "the forgotten owner's complete: 412 LOST" [ "$code" = 412 ]
call POST /v1/keys/busy-1/claim '{}'
check "the next claim: 201 at attempt 1, a fence above the forgotten owner's" \
  [ "$code" = 201 -a "$(field attempt)" = 1 -a "$(field fence)" -gt "$fb" ]

# ---- keys are bytes: percent-encoded in the path, base64 in JSON when not UTF-8
call POST '/v1/keys/bin%00%FF%2Fx/claim' '{}'
check "a key with NUL, 0xFF and '/' can be claimed" [ "$code" = 201 ]
call GET '/v1/keys/bin%00%FF%2Fx'
check "its record carries key_b64 and no text key" [ "$(field key_b64)" = "YmluAP8veA==" -a "$(field key)" = "" ]
call POST '/v1/keys/caf%C3%A9/claim' '{}'
call GET '/v1/keys/caf%C3%A9'
check "a UTF-8 key comes back as text too" [ "$(field key)" = "café" ]

# ---- a prefix, paged
for i in 1 2 3 4 5; do call POST "/v1/keys/page-$i/claim" '{}'; done
seen=""
cursor=""
pages=0
while :; do
  call GET "/v1/keys?prefix=page-&limit=2${cursor:+&after=$cursor}"
  seen+=$(python3 -c 'import json,sys; print(" ".join(r["key"] for r in json.loads(sys.argv[1])["records"]), end=" ")' "$body")
  pages=$((pages + 1))
  cursor=$(field next)
  [ -z "$cursor" ] && break
  [ $pages -gt 5 ] && break
done
check "paging by 2 lists all 5 keys in order, in 3 pages" [ "$seen" = "page-1 page-2 page-3 page-4 page-5 " -a $pages = 3 ]

# ---- bad input: a clear error, nothing written
call POST /v1/keys/bad-1/claim '{"lease_ms":0}'
check "lease_ms 0: 400 naming the lease" eval '[ "$code" = 400 ] && grep -qi lease <<<"$body"' 
call GET /v1/keys/bad-1
check "... and nothing was written" [ "$code" = 404 ]
# A misspelt field was ignored: the claim was taken with the default 30 s lease.
call POST /v1/keys/bad-6/claim '{"lease":5000}'
check "an unknown claim field: 400 naming it" eval '[ "$code" = 400 ] && grep -q "unknown field .lease. in the request body" <<<"$body"'
call GET /v1/keys/bad-6
check "... and nothing was written" [ "$code" = 404 ]
call POST /v1/keys/bad-6/claim '{}'
t6=$(field token)
call POST /v1/keys/bad-6/complete "{\"token\":\"$t6\",\"results\":\"x\"}"
check "an unknown complete field: 400 naming it" eval '[ "$code" = 400 ] && grep -q "unknown field .results. in the request body" <<<"$body"'
call GET /v1/keys/bad-6
check "... and the claim is still running" [ "$code" = 200 -a "$(field state)" = in_progress ]
call POST /v1/keys/bad-2/claim '{not json'
check "a body that is not JSON: 400" [ "$code" = 400 ]
call POST /v1/keys/bad-3/claim '{"lease_ms":"soon"}'
check "a lease that is not a number: 400" [ "$code" = 400 ]
# One message for every lease or retention that is not one (0 was "lease must be
# positive", 1.5 "lease_ms must be a non-negative integer"), naming the value.
for v in 0 1.5 -5 '"30s"'; do
  call POST /v1/keys/bad-3/claim "{\"lease_ms\":$v}"
  check "lease_ms $v: 400, a whole number of milliseconds" eval '[ "$code" = 400 ] && grep -q "lease_ms must be a whole number of milliseconds from 1" <<<"$body"'
done
call POST /v1/keys/bad-3/claim '{"retention_ms":2.5}'
check "retention_ms 2.5: 400, the same words" eval '[ "$code" = 400 ] && grep -q "retention_ms must be a whole number of milliseconds from 1" <<<"$body"'
call GET /v1/keys/bad-3
check "... and nothing was written" [ "$code" = 404 ]
long=$(head -c 1025 /dev/zero | tr '\0' k)
call POST "/v1/keys/$long/claim" '{}'
check "a 1025-byte key: 400 naming the key" eval '[ "$code" = 400 ] && grep -qi key <<<"$body"' 
call POST /v1/keys/bad-4/complete '{"token":"xyz"}'
check "a token that is not hex: 400" [ "$code" = 400 ]
head -c 200000 /dev/zero | tr '\0' a >"$tmp/big"
code=$(curl -s -o /dev/null -w '%{http_code}' -X POST "$base/v1/keys/bad-5/claim" --data-binary "@$tmp/big")
check "a body over --max-body-bytes: 413" [ "$code" = 413 ]
hdrs=()
for i in $(seq 120); do hdrs+=(-H "X-Filler-$i: $i"); done
code=$(curl -s -o /dev/null -w '%{http_code}' "${hdrs[@]}" "$base/v1/info")
check "120 header fields: 431" [ "$code" = 431 ]

# ---- metrics: Prometheus names, outcome labels, never a key
curl -s "$base/metrics" >"$tmp/metrics"
check "dedup_build_info is exposed" grep -q '^dedup_build_info{version="[^"]*"} 1$' "$tmp/metrics"
check "claims are counted by outcome" grep -q '^dedup_serve_claims_total{outcome="acquired"} [1-9]' "$tmp/metrics"
check "claim latency is a histogram in seconds" grep -q '^dedup_serve_claim_duration_seconds_bucket{le="+Inf"}' "$tmp/metrics"
check "requests are counted by route and code" grep -q '^dedup_serve_requests_total{code="409",route="claim"}\|^dedup_serve_requests_total{route="claim",code="409"}' "$tmp/metrics"
check "no key appears in /metrics" bash -c "! grep -Eq 'order-|page-|caf|bin' '$tmp/metrics'"
check "every counter ends in _total" bash -c "! grep '^# TYPE' '$tmp/metrics' | grep ' counter$' | grep -v '_total counter$'"

# ---- the second client language
check "the Python client's run" python3 "$root/tests/serve_api_client.py" "$base"

if [ $FAILS -gt 0 ]; then
  echo "serve_api_test: $FAILS check(s) failed; server log:"
  tail -20 "$tmp/serve.log"
  exit 1
fi
echo "serve_api_test: all checks passed"
