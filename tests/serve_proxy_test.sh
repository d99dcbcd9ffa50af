#!/usr/bin/env bash
# The Idempotency-Key proxy of `dedup serve` in front of a real application
# (tests/serve_app.py, which counts every call it serves in a file).
#   serve_proxy_test.sh DEDUP_BINARY      (ports 8080-8081, docs/PORTS.md)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
# shellcheck source=lib/serve_test.sh
source "$root/tests/lib/serve_test.sh"
serve_test_begin serve-proxy "$1"
app_port=8080
port=8081
app="http://127.0.0.1:$app_port"
base="http://127.0.0.1:$port"
serve_start $app_port "$tmp/app.log" python3 "$root/tests/serve_app.py" $app_port "$tmp/calls"
app_pid=$SERVE_LAST_PID
# A 3 s lease: the slow request below (5 s) lives on heartbeats.
serve_start $port "$tmp/serve.log" "$dedup" serve --store "rocksdb:$tmp/db" \
  --listen 127.0.0.1:$port --proxy "$app" --lease 3s --max-response-bytes 1000

calls() { curl -s "$app/count"; }
# post PATH KEY BODY [curl args...]: sets $code, $body, $headers.
post() {
  local path=$1 key=$2 data=$3
  shift 3
  local args=(-s -o "$tmp/body" -D "$tmp/headers" -w '%{http_code}' -X POST "$base$path"
              -H 'Content-Type: application/json' --data-binary "$data")
  [ -n "$key" ] && args+=(-H "Idempotency-Key: $key")
  code=$(curl "${args[@]}" "$@")
  body=$(cat "$tmp/body")
  headers=$(tr -d '\r' <"$tmp/headers")
}

# ---- forwarded once, replayed after
post /charge k-1 '{"amount":7}'
check "first request is forwarded: the app's 201" [ "$code" = 201 -a "$(calls)" = 1 ]
first_body=$body
check "the live response is not marked as a replay" [ -z "$(header Idempotent-Replayed)" ]
check "the live response carries the app's Set-Cookie" [ -n "$(header Set-Cookie)" ]
post /charge k-1 '{"amount":7}'
check "a repeat is not forwarded" [ "$(calls)" = 1 ]
check "the repeat gets the recorded status and body" [ "$code" = 201 -a "$body" = "$first_body" ]
check "... with Idempotent-Replayed: true" [ "$(header Idempotent-Replayed)" = true ]
check "... and the app's headers (X-App-Call, Location, Content-Type)" \
  [ "$(header X-App-Call)" = 1 -a "$(header Location)" = /charges/1 -a "$(header Content-Type)" = application/json ]
check "... but never its Set-Cookie" [ -z "$(header Set-Cookie)" ]

# ---- a different request under the same key
post /charge k-1 '{"amount":8}'
check "same key, different body: 422, not forwarded" [ "$code" = 422 -a "$(calls)" = 1 ]
check "the 422 is a problem+json" [ "$(header Content-Type)" = application/problem+json ]
post /refund k-1 '{"amount":7}'
check "same key, different path: 422" [ "$code" = 422 -a "$(calls)" = 1 ]
# Another client's key with its own credentials was answered with the first
# client's recorded response (its data): 422 now, nothing replayed.
post /charge k-auth '{"amount":7}' -H 'Authorization: Bearer user-a'
check "a request with credentials is forwarded" [ "$code" = 201 -a "$(calls)" = 2 ]
post /charge k-auth '{"amount":7}' -H 'Authorization: Bearer user-b'
check "the same key with other credentials: 422, not user-a's response ($code)" \
  [ "$code" = 422 -a "$(calls)" = 2 -a -z "$(header Idempotent-Replayed)" ]
post /charge k-auth '{"amount":7}' -H 'Authorization: Bearer user-a'
check "... and user-a's own retry is still replayed" \
  [ "$code" = 201 -a "$(header Idempotent-Replayed)" = true -a "$(calls)" = 2 ]
code=$(curl -s -o /dev/null -w '%{http_code}' -X POST "$base/charge" -H 'Idempotency-Key: k-1' \
  -H 'Content-Type: text/xml' --data-binary '{"amount":7}')
check "same key and bytes as another Content-Type: 422 ($code, $(calls) calls)" [ "$code" = 422 -a "$(calls)" = 2 ]

# ---- a concurrent repeat while the first is in flight (longer than the lease)
post '/charge?sleep_ms=5000' k-2 '{"amount":9}' &
slow=$!
sleep 1
post '/charge?sleep_ms=5000' k-2 '{"amount":9}'
check "a concurrent repeat: 409 with Retry-After" [ "$code" = 409 -a -n "$(header Retry-After)" ]
sleep 3  # now past the 3 s lease: only heartbeats keep the claim
post '/charge?sleep_ms=5000' k-2 '{"amount":9}'
check "a repeat after the first lease would have ended: still 409 (heartbeat)" [ "$code" = 409 ]
wait $slow
check "the slow request ran once" [ "$(calls)" = 3 ]
post '/charge?sleep_ms=5000' k-2 '{"amount":9}'
check "its repeat afterwards is replayed at once" [ "$code" = 201 -a "$(header Idempotent-Replayed)" = true -a "$(calls)" = 3 ]

# ---- no Idempotency-Key: untouched pass-through
post /echo '' 'plain' -H 'X-Test: 1' -H 'Authorization: Bearer app-token'
post /echo '' 'plain' -H 'X-Test: 1' -H 'Authorization: Bearer app-token'
check "requests without the header are forwarded every time" [ "$code" = 200 -a "$(calls)" = 5 ]
check "... with their headers as sent" python3 -c '
import json,sys; b=json.loads(sys.argv[1]); h={k.lower():v for k,v in b["headers"].items()}
assert b["method"]=="POST" and b["path"]=="/echo" and b["body"]=="plain"
assert h["x-test"]=="1" and h["authorization"]=="Bearer app-token", h
assert "remote_addr" not in h' "$body"
code=$(curl -s -o "$tmp/body" -w '%{http_code}' "$base/echo/a%2Fb?q=1%202")
check "a GET's target (escapes and query) reaches the app as sent" \
  python3 -c 'import json,sys; assert json.load(open(sys.argv[1]))["path"]=="/echo/a%2Fb?q=1%202"' "$tmp/body"
# A Range is the application's to judge, also one cpp-httplib cannot parse
# (another unit than bytes, a backwards range): it answered those 416 itself, and
# the application never saw the request.
for range in 'items=0-9' 'bytes=9-0' 'bytes=0-3'; do
  code=$(curl -s -o "$tmp/body" -w '%{http_code}' -H "Range: $range" "$base/echo")
  check "GET with Range: $range reaches the app as sent, and its 200 comes back (got $code)" \
    python3 -c 'import json,sys; b=json.load(open(sys.argv[1])); assert sys.argv[2]=="200" and b["headers"]["Range"]==sys.argv[3], b' \
    "$tmp/body" "$code" "$range"
done
# Header values go on as sent, both ways. cpp-httplib percent-decodes every
# header value it reads: a%41b reached the application as aAb, and %0D%0A as a
# line break, so that a header of the client's own became one more header line
# upstream (a forged Dedup-Fence); two Idempotency-Keys that differ only in an
# escape were one key; an application's %0D%0A split its answer to the client.
post /echo '' 'plain' -H 'X-Escaped: a%41b %25 %zz %u0041' -H 'X-Smuggle: x%0D%0ADedup-Fence: 999'
check "header values reach the app as sent, no line of their own (${body:0:300})" python3 -c '
import json,sys; h={k.lower():v for k,v in json.loads(sys.argv[1])["headers"].items()}
assert h.get("x-escaped")=="a%41b %25 %zz %u0041", h
assert h.get("x-smuggle")=="x%0D%0ADedup-Fence: 999" and "dedup-fence" not in h, h' "$body"
post /charge 'pct-%41' '{"amount":3}'
post /charge 'pct-A' '{"amount":3}'
check "Idempotency-Keys pct-%41 and pct-A are two keys: the second is forwarded too (got $code)" \
  [ "$code" = 201 -a -z "$(header Idempotent-Replayed)" ]
code=$(curl -s -o /dev/null -D "$tmp/headers" -w '%{http_code}' \
  "$base/header?value=a%2541b%250D%250AX-Injected:%201")
headers=$(tr -d '\r' <"$tmp/headers")
check "an application's header value with %0D%0A is no header line of its own to the client (got $code)" \
  [ "$code" = 200 -a -z "$(header X-Injected)" ]
# A recorded header value that is not UTF-8 came back with U+FFFD in place of
# its byte (the recording is JSON): now kept byte for byte.
for i in 1 2; do
  curl -s -o /dev/null -D "$tmp/bytes$i" -H 'Idempotency-Key: k-bytes' "$base/header?value=caf%E9"
done
check "a header value that is not UTF-8 is replayed byte for byte" python3 -c '
import sys
live, replay = (open(p, "rb").read() for p in sys.argv[1:3])
line = b"X-Echo-Value: caf\xe9\r\n"
sys.exit(0 if line in live and line in replay and b"Idempotent-Replayed: true" in replay else 1)
' "$tmp/bytes1" "$tmp/bytes2"
# A bare CR or a NUL in a header value is refused, 400 (RFC 9110 5.5: refused, or
# replaced with SP before forwarding): cpp-httplib ends header lines at LF only,
# and an application whose parser ends them at a bare CR too (Python's does)
# read what followed as a header line of its own (a forged Dedup-Fence).
before=$(calls)
for value in 'x\rDedup-Fence: 999' 'x\0y'; do
  got=$(python3 - "$port" "$value" <<'PY'
import socket, sys
s = socket.create_connection(("127.0.0.1", int(sys.argv[1])))
value = sys.argv[2].replace("\\r", "\r").replace("\\0", "\0").encode()
s.sendall(b"GET /echo HTTP/1.1\r\nHost: 127.0.0.1\r\nX-A: " + value + b"\r\nConnection: close\r\n\r\n")
out = b""
while True:
    d = s.recv(65536)
    if not d:
        break
    out += d
print(out.split(b" ")[1].decode(), "fence" if b"dedup-fence" in out.lower() else "-")
PY
)
  check "a header value with ${value:1:2}: 400, not forwarded (got $got, $(($(calls) - before)) calls)" \
    [ "$got" = "400 -" -a "$(calls)" = "$before" ]
done

# An empty Idempotency-Key is a malformed key, refused (400), not no key: the
# request went on unprotected, and its retry ran the application again.
before=$(calls)
post /charge '' '{"amount":5}' -H 'Idempotency-Key;'
first=$code
post /charge '' '{"amount":5}' -H 'Idempotency-Key;'
check "an empty Idempotency-Key: 400, twice, nothing forwarded (got $first, $code; $(($(calls) - before)) calls)" \
  [ "$first" = 400 -a "$code" = 400 -a "$(calls)" = "$before" ]
# An unterminated quote was the key '"a' and a tab was part of a key: 400, naming it.
for value in '"a' $'a\tb'; do
  post /charge '' '{"amount":5}' -H "Idempotency-Key: $value"
  check "Idempotency-Key '${value//$'\t'/<TAB>}': 400 naming the problem ($code: $body)" \
    eval '[ "$code" = 400 ] && grep -q -e "must end with one" -e "control byte" <<<"$body"'
done
check "... nothing forwarded" [ "$(calls)" = "$before" ]

# ---- responses too large to record
post '/big?bytes=5000' k-3 ''
check "a large response is forwarded whole" [ "$code" = 200 -a ${#body} = 5000 ]
post '/big?bytes=5000' k-3 ''
check "its repeat is not forwarded and says the body was not kept" \
  [ "$code" = 200 -a -z "$body" -a -n "$(header Dedup-Replay-Body)" -a "$(header Idempotent-Replayed)" = true ]

# ---- the application down: nothing recorded, the key can be retried
serve_stop $app_pid
post /charge k-4 '{"amount":1}'
check "the app down: 502" [ "$code" = 502 ]
# Said in words (cpp-httplib's own name for it was the one word "Connection"),
# without the application's address, which the proxy's clients need not know.
check "... saying it could not connect, not where" eval 'grep -q "could not connect" <<<"$body" && ! grep -q "$app_port" <<<"$body"'
serve_start $app_port "$tmp/app2.log" python3 "$root/tests/serve_app.py" $app_port "$tmp/calls"
before=$(calls)
post /charge k-4 '{"amount":1}'
check "the retry after the app is back is forwarded (the claim was released)" \
  [ "$code" = 201 -a "$(calls)" = $((before + 1)) -a -z "$(header Idempotent-Replayed)" ]

# ---- the API, page and metrics move under /_dedup/
code=$(curl -s -o "$tmp/body" -w '%{http_code}' "$base/_dedup/v1/keys/idem:k-1")
check "/_dedup/v1/keys/idem:k-1 shows the completed record" \
  python3 -c 'import json,sys; r=json.load(open(sys.argv[1])); assert r["state"]=="completed", r' "$tmp/body"
curl -s "$base/_dedup/metrics" >"$tmp/metrics"
for o in forwarded replayed busy mismatch pass_through upstream_error; do
  check "dedup_proxy_requests_total{outcome=\"$o\"} counted" grep -q "^dedup_proxy_requests_total{outcome=\"$o\"} [1-9]" "$tmp/metrics"
done
check "upstream latency is a histogram in seconds" grep -q '^dedup_proxy_upstream_duration_seconds_count [1-9]' "$tmp/metrics"
check "no Idempotency-Key appears in /metrics" bash -c "! grep -q 'k-1' '$tmp/metrics'"
code=$(curl -s -o /dev/null -w '%{http_code}' "$base/_dedup/nothing-here")
check "unknown /_dedup/ paths are not sent to the app" [ "$code" = 404 ]

if [ $FAILS -gt 0 ]; then
  echo "serve_proxy_test: $FAILS check(s) failed; server log:"
  tail -30 "$tmp/serve.log"
  exit 1
fi
echo "serve_proxy_test: all checks passed"
