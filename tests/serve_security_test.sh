#!/usr/bin/env bash
# Security of `dedup serve`: loopback unless a token is given; the token checked
# by the API, /metrics, the page and the proxy; the store URI's password in no
# answer, error, log line or metric.
#   serve_security_test.sh DEDUP_BINARY     (ports 8074-8079, 8126 and 6540, docs/PORTS.md)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
# shellcheck source=lib/serve_test.sh
source "$root/tests/lib/serve_test.sh"
serve_test_begin serve-sec "$1"

status() { curl -s -o "$tmp/body" -w '%{http_code}' "$@"; }
token="tok-$(head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \n')"
echo "$token" >"$tmp/token"

# ---- loopback by default; any other address needs a token
set +e
"$dedup" serve --store memory: --listen 0.0.0.0:8074 >"$tmp/out" 2>&1
rc=$?
set -e
check "0.0.0.0 without a token: exit 2" [ $rc = 2 ]
check "... saying --auth-token-file is needed" grep -q -- "--auth-token-file" "$tmp/out"
echo short >"$tmp/short"
set +e
"$dedup" serve --store memory: --listen 127.0.0.1:8074 --auth-token-file "$tmp/short" >"$tmp/out" 2>&1
rc=$?
set -e
check "a token under 16 characters: exit 2" [ $rc = 2 ]
# An empty token file (a secret not mounted yet, a truncated one) must not turn the
# token check off: refused at start, on loopback and on any address; a file that
# never ends is not read to its end.
: >"$tmp/empty"
printf '\n' >"$tmp/newline"
for file in "$tmp/empty" "$tmp/newline" /dev/null; do
  for listen in 127.0.0.1:8074 0.0.0.0:8074; do
    set +e
    timeout 10 "$dedup" serve --store memory: --listen "$listen" --auth-token-file "$file" >"$tmp/out" 2>&1
    rc=$?
    set -e
    check "token file $(basename "$file"), --listen $listen: exit 2" [ $rc = 2 ]
    check "... saying it holds no token" grep -q "holds no token" "$tmp/out"
  done
done
set +e
timeout 10 "$dedup" serve --store memory: --listen 127.0.0.1:8074 --auth-token-file /dev/zero >"$tmp/out" 2>&1
rc=$?
set -e
check "token file /dev/zero: exit 2, not read to its end" [ $rc = 2 ]
check "... saying it is not a token file" grep -q "not a token file" "$tmp/out"
# A malformed address is named as malformed, not as "not a loopback address"
# (which suggested that a token would make it work).
for listen in '[::1' '[::1]x:8074' '[nope]:8074' '::1]:8074'; do
  set +e
  "$dedup" serve --store memory: --listen "$listen" >"$tmp/out" 2>&1
  rc=$?
  set -e
  check "--listen '$listen': exit 2" [ $rc = 2 ]
  check "... named malformed" grep -q -- "--listen: malformed address" "$tmp/out"
  check "... not called non-loopback" bash -c "! grep -q loopback '$tmp/out'"
done

serve_start 8074 "$tmp/serve.log" "$dedup" serve --store memory: --listen 0.0.0.0:8074 \
  --auth-token-file "$tmp/token"
base=http://127.0.0.1:8074
check "API without the token: 401" [ "$(status -X POST "$base/v1/keys/k/claim")" = 401 ]
check "API with a wrong token: 401" [ "$(status -H "Authorization: Bearer ${token}x" "$base/v1/info")" = 401 ]
check "API with the token: 201" [ "$(status -H "Authorization: Bearer $token" -X POST -d "{}" "$base/v1/keys/k/claim")" = 201 ]
# The scheme is case-insensitive (RFC 9110 11.1): "bearer" was refused, 401.
check "API with the token, scheme 'bearer': 200" [ "$(status -H "Authorization: bearer $token" "$base/v1/info")" = 200 ]
check "API with the token in Dedup-Token: 200" [ "$(status -H "Dedup-Token: $token" "$base/v1/keys/k")" = 200 ]
check "/metrics without the token: 401" [ "$(status "$base/metrics")" = 401 ]
check "/metrics with the token: 200" [ "$(status -H "Authorization: Bearer $token" "$base/metrics")" = 200 ]
check "the page without the token: 401" [ "$(status "$base/")" = 401 ]
check "the page's script without the token: 401" [ "$(status "$base/assets/app.js")" = 401 ]
check "/healthz needs no token" [ "$(status "$base/healthz")" = 200 ]
code=$(curl -s -o /dev/null -D "$tmp/h" -w '%{http_code}' "$base/?token=$token")
check "/?token=T: 303 to / with an HttpOnly, SameSite=Strict cookie" \
  eval '[ "$code" = 303 ] && grep -qi "^Set-Cookie: dedup_token=.*HttpOnly; SameSite=Strict" "$tmp/h"'
cookie="dedup_token=$token"
check "the cookie opens the page" [ "$(status -H "Cookie: $cookie" "$base/")" = 200 ]
check "a wrong ?token= gets no cookie" [ "$(status "$base/?token=nope-nope-nope-nope")" = 401 ]
# k's lease is running: the page confirms and sends force=true (docs/SERVE.md).
check "DELETE with the cookie alone (a cross-site form could): 401" \
  [ "$(status -X DELETE -H "Cookie: $cookie" "$base/v1/keys/k?force=true")" = 401 ]
check "DELETE with the cookie and the page's header: 200" \
  [ "$(status -X DELETE -H "Cookie: $cookie" -H 'X-Requested-With: dedup-page' "$base/v1/keys/k?force=true")" = 200 ]

# ---- the proxy checks the token too (in Dedup-Token; Authorization is the app's)
serve_start 8076 "$tmp/app.log" python3 "$root/tests/serve_app.py" 8076 "$tmp/calls"
serve_start 8077 "$tmp/proxy.log" "$dedup" serve --store memory: --listen 127.0.0.1:8077 \
  --proxy http://127.0.0.1:8076 --auth-token-file "$tmp/token"
check "proxy without the token: 401" \
  [ "$(status -X POST -d '{}' -H 'Idempotency-Key: a' http://127.0.0.1:8077/charge)" = 401 ]
check "... a pass-through request too" [ "$(status http://127.0.0.1:8077/echo)" = 401 ]
n=$(curl -s http://127.0.0.1:8076/count)
check "... and the app was not called ($n calls)" [ "$n" = 0 ]
check "proxy with Dedup-Token: forwarded" \
  [ "$(status -X POST -d '{}' -H "Dedup-Token: $token" -H 'Idempotency-Key: a' http://127.0.0.1:8077/charge)" = 201 ]
status -H "Dedup-Token: $token" -H 'Authorization: Bearer app' http://127.0.0.1:8077/echo >/dev/null
check "the app gets its Authorization but never dedup's token" python3 -c '
import json,sys; h={k.lower():v for k,v in json.load(open(sys.argv[1]))["headers"].items()}
assert h.get("authorization")=="Bearer app" and "dedup-token" not in h, h' "$tmp/body"

# ---- the store URI's password: never in answers, errors, logs or /metrics
pw="secret-$(head -c 8 /dev/urandom | od -An -tx1 | tr -d ' \n')"
REDIS_CLI_AUTH="-a $pw --no-auth-warning" redis_start 8078 "$tmp/redis" --requirepass "$pw"
redis_pid=$REDIS_LAST_PID
set +e
"$dedup" serve --store "redis://:wrong-$pw@127.0.0.1:8078" --listen 127.0.0.1:8079 >"$tmp/wrong" 2>&1 &
wrong=$!
sleep 2
kill $wrong 2>/dev/null
wait $wrong
set -e
check "a wrong password: an error naming AUTH" grep -q "AUTH" "$tmp/wrong"
check "... that does not show the password" bash -c "! grep -q '$pw' '$tmp/wrong'"
serve_start 8079 "$tmp/pw.log" "$dedup" serve --store "redis://:$pw@127.0.0.1:8078" \
  --listen 127.0.0.1:8079
b=http://127.0.0.1:8079
status -X POST -d "{}" "$b/v1/keys/p/claim" >/dev/null
curl -s "$b/v1/info" >"$tmp/info"
check "/v1/info names the store without the password" \
  eval 'grep -q "redis://" "$tmp/info" && ! grep -q "$pw" "$tmp/info"'
kill -STOP "$redis_pid"  # the store stops answering
code=$(status -m 8 -X POST -d "{}" "$b/v1/keys/q/claim")
kill -CONT "$redis_pid"
check "a store that does not answer: 503 or 504" eval '[ "$code" = 503 -o "$code" = 504 ]'
check "... whose error does not show the password" bash -c "! grep -q '$pw' '$tmp/body'"
serve_stop "$redis_pid"
code=$(status -m 20 -X POST -d "{}" "$b/v1/keys/r/claim")
check "the store down: 503 with Retry-After" [ "$code" = 503 ]
check "... whose error does not show the password" bash -c "! grep -q '$pw' '$tmp/body'"
check "... and names the problem" grep -qi "redis" "$tmp/body"
curl -s "$b/metrics" >"$tmp/metrics"
check "/metrics counts the errors" grep -q 'dedup_serve_claims_total{outcome="error"} [1-9]' "$tmp/metrics"
check "/metrics does not show the password" bash -c "! grep -q '$pw' '$tmp/metrics'"
check "serve's log does not show the password" bash -c "! grep -q '$pw' '$tmp/pw.log'"

# ---- a password that is also an ordinary word changes no answer and no metric
# (the data and the metric names are not messages: no password is in them).
REDIS_CLI_AUTH="-a dedup --no-auth-warning" redis_start 6540 "$tmp/redis-word" --requirepass dedup
serve_start 8126 "$tmp/word.log" "$dedup" serve --store "redis://:dedup@127.0.0.1:6540?prefix=w:" \
  --listen 127.0.0.1:8126
w=http://127.0.0.1:8126
check "a password that is a word: a claim of dedup-job-1 is 201" \
  [ "$(status -X POST -d "{}" "$w/v1/keys/dedup-job-1/claim")" = 201 ]
status "$w/v1/keys/dedup-job-1" >/dev/null
check "... its record names the key as it is" grep -q '"key":"dedup-job-1"' "$tmp/body"
status "$w/v1/keys" >/dev/null
check "... so does the list of records" grep -q '"key":"dedup-job-1"' "$tmp/body"
curl -s "$w/metrics" >"$tmp/word-metrics"
check "... /metrics keeps its names" grep -q '^dedup_serve_claims_total' "$tmp/word-metrics"

if [ $FAILS -gt 0 ]; then
  echo "serve_security_test: $FAILS check(s) failed"
  exit 1
fi
echo "serve_security_test: all checks passed"
