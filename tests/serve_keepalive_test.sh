#!/usr/bin/env bash
# `dedup serve` answering several requests on one connection and one thread, and
# slow clients (docs/SERVE.md, "Slow clients").
#   serve_keepalive_test.sh DEDUP_BINARY     (ports 8071-8073, 8099, docs/PORTS.md)
#
# What serve learns of a request before its body is read (when routing began, a
# form Content-Type it hid from cpp-httplib) must reach that request's handler and
# logger and no other: each server here has one thread, and the requests share
# one keep-alive connection, so a context left behind by one request would be
# seen by the next.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
# shellcheck source=lib/serve_test.sh
source "$root/tests/lib/serve_test.sh"
serve_test_begin serve-keepalive "$1"

api_port=8071 app_port=8072 proxy_port=8073 slow_port=8099
serve_start $api_port "$tmp/api.log" "$dedup" serve --store memory: \
  --listen 127.0.0.1:$api_port --threads 1
serve_start $app_port "$tmp/app.log" python3 "$root/tests/serve_app.py" $app_port "$tmp/calls"
serve_start $proxy_port "$tmp/proxy.log" "$dedup" serve --store memory: \
  --listen 127.0.0.1:$proxy_port --proxy "http://127.0.0.1:$app_port" --threads 1


# ---- the hidden Content-Type: a multipart upload, then a GET without a body and
# a JSON POST, on one connection to the proxy's one thread. The application must
# see the upload's Content-Type on the upload only.
proxy="http://127.0.0.1:$proxy_port"
curl -s -o "$tmp/first" -w '%{num_connects}\n' -X POST "$proxy/echo" -F 'field=hello' \
  --next -s -o "$tmp/second" -w '%{num_connects}\n' "$proxy/echo" \
  --next -s -o "$tmp/third" -w '%{num_connects}\n' -X POST "$proxy/echo" \
  -H 'Content-Type: application/json' --data-binary '{"a":1}' >"$tmp/connects"
check "the three requests went on one connection" [ "$(tr -d '\n' <"$tmp/connects")" = 100 ]
ctype() {
  python3 -c 'import json,sys; h=json.load(open(sys.argv[1]))["headers"]; print(h.get("Content-Type", "(none)"))' "$1"
}
check "the upload reached the application as multipart/form-data" \
  eval '[[ "$(ctype "$tmp/first")" == multipart/form-data* ]]'
check "the GET after it on that connection carries no Content-Type (got: $(ctype "$tmp/second"))" \
  [ "$(ctype "$tmp/second")" = "(none)" ]
check "the JSON POST after it carries its own only (got: $(ctype "$tmp/third"))" \
  [ "$(ctype "$tmp/third")" = application/json ]

# ---- when routing began: a routed request, then one whose head cpp-httplib
# refuses itself (a target over 8 KiB: 414, never routed), on one connection to
# the API's one thread. The second counts as route "other", as every request
# refused before its path was read (docs/SERVE.md, "Metrics"), not as the page;
# only the routed one has a duration.
api="http://127.0.0.1:$api_port"
long=$(head -c 9000 /dev/zero | tr '\0' a)
curl -s -o /dev/null -w '%{http_code} %{num_connects}\n' "$api/" \
  --next -s -o /dev/null -w '%{http_code} %{num_connects}\n' "$api/?$long" >"$tmp/codes"
check "a page, then a 414 on the same connection (got: $(tr '\n' ' ' <"$tmp/codes"))" \
  [ "$(tr '\n' ' ' <"$tmp/codes")" = "200 1 414 0 " ]
check "both are counted, the 414 as route other" eval \
  '[ "$(metric $api_port "dedup_serve_requests_total{route=\"page\",code=\"200\"}")" = 1 ] &&
   [ "$(metric $api_port "dedup_serve_requests_total{route=\"other\",code=\"414\"}")" = 1 ] &&
   [ "$(metric $api_port "dedup_serve_requests_total{route=\"page\",code=\"414\"}")" = 0 ]'
check "only the routed one has a duration (the 414 did not inherit its start)" \
  eval '[ "$(metric $api_port "dedup_serve_request_duration_seconds_count{route=\"page\"}")" = 1 ]'

# slow_clients SLOW IDLE SECONDS OUT: tests/serve_slow_clients.py against
# $slow_port in the background (its PID in slow_pid), once its connections are open.
slow_clients() {
  serve_client "$4" python3 "$root/tests/serve_slow_clients.py" $slow_port "$1" "$2" "$3"
  slow_pid=$client_pid
  sleep 0.5
}

# ---- slow clients: a connection holds a thread from accept to close, and a
# client that sends its head a byte at a time (each read within the read timeout)
# holds it for as long as it keeps sending. Against --threads 2: two such clients
# and three idle connections, then an ordinary request must still be answered.
serve_start $slow_port "$tmp/slow-serve.log" "$dedup" serve --store memory: \
  --listen 127.0.0.1:$slow_port --threads 2
slow_serve_pid=$SERVE_LAST_PID
slow_clients 2 3 12 "$tmp/slow.out"
t0=$(date +%s%N)
code=$(curl -s -m 8 -o /dev/null -w '%{http_code}' "http://127.0.0.1:$slow_port/healthz" || true)
ms=$((($(date +%s%N) - t0) / 1000000))
check "with 2 trickling and 3 idle connections on --threads 2, /healthz answers 200 (got $code after $ms ms)" \
  [ "$code" = 200 ]
check "... within 2 s" [ "$ms" -lt 2000 ]
wait "$slow_pid" || true
# The idle ones are closed after the keep-alive timeout (5 s), not held for ever.
check "the idle connections were closed after 4-8 s ($(grep idle "$tmp/slow.out" | tr '\n' ' '))" \
  eval '[ "$(grep -c idle_closed_after "$tmp/slow.out")" = 3 ] &&
        awk "/idle_closed_after/ { if (\$2 < 4 || \$2 > 8) bad = 1 } END { exit bad }" "$tmp/slow.out"'

# ---- ... and the threads stay bounded: --threads 1 --max-connections 2 against
# three trickling connections. The third waits (so does a request behind it) and
# no third thread is started; once they are gone, requests are answered again.
# (Both threads may wait for a head here, --max-waiting-connections 2: by default
# only one may, and the others would be shed: tests/serve_reconnect_test.sh.)
serve_stop "$slow_serve_pid"
serve_start $slow_port "$tmp/cap-serve.log" "$dedup" serve --store memory: \
  --listen 127.0.0.1:$slow_port --threads 1 --max-connections 2 --max-waiting-connections 2
cap_pid=$SERVE_LAST_PID
threads() { awk '/^Threads:/ { print $2 }' "/proc/$cap_pid/status"; }
before=$(threads)
slow_clients 3 0 4 "$tmp/cap.out"
during=$(threads)
check "three slow connections on --max-connections 2: one thread more than idle ($before, then $during)" \
  [ "$during" -eq $((before + 1)) ]
code=$(curl -s -m 1 -o /dev/null -w '%{http_code}' "http://127.0.0.1:$slow_port/healthz" || true)
check "... and a request behind them waits (got '$code' within 1 s)" [ "$code" = 000 ]
wait "$slow_pid" || true
code=$(curl -s -m 5 -o /dev/null -w '%{http_code}' "http://127.0.0.1:$slow_port/healthz" || true)
check "once they have gone, /healthz answers 200 (got $code)" [ "$code" = 200 ]

serve_report "$tmp"
