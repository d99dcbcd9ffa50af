#!/usr/bin/env bash
# `dedup serve` against clients that do not read their answers: one that pipelines
# requests and never reads, one that never reads one large answer (2.5 MB), and
# one that reads a large answer slowly (through a 1 KiB receive buffer, ~50 KB/s).
# Each holds serve's only thread (--threads 1 --max-connections 1) until serve
# gives its answer up: a /healthz behind it measures for how long (docs/SERVE.md,
# "Slow clients").
#   serve_slow_reader_test.sh DEDUP_BINARY     (ports 8113-8114, docs/PORTS.md)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
# shellcheck source=lib/serve_test.sh
source "$root/tests/lib/serve_test.sh"
serve_test_begin serve-slowread "$1"
readers=$root/tests/serve_slow_readers.py

# fill PORT: 1000 records with 1000-byte keys: a page of them is 2.5 MB of JSON.
fill() {
  python3 - "$1" <<'PY'
import http.client, sys
c = http.client.HTTPConnection("127.0.0.1", int(sys.argv[1]))
for i in range(1000):
    c.request("POST", "/v1/keys/%04d%s/claim" % (i, "k" * 996), body=b"{}",
              headers={"Content-Type": "application/json"})
    r = c.getresponse()
    r.read()
    assert r.status == 201, r.status
PY
}
# reader PORT MODE SECONDS OUT: a client of serve_slow_readers.py in the
# background (PID in reader_pid), once its requests are sent.
reader() {
  serve_client "$4" python3 "$readers" "$1" "$2" "$3"
  reader_pid=$client_pid
}
# behind PORT BOUND: GET /healthz given BOUND seconds; prints "CODE MS".
behind() {
  local t0 code
  t0=$(date +%s%N)
  code=$(curl -s -m "$2" -o /dev/null -w '%{http_code}' "http://127.0.0.1:$1/healthz" || true)
  echo "$code $((($(date +%s%N) - t0) / 1000000))"
}
response_timeouts='dedup_serve_request_timeouts_total{part="response"}'

# ---- the defaults: readers that never read are given up after the write
# timeout (10 s without progress). Before, a blocking send() waited out the
# socket's own send timeout (10 s) and then the next write its poll (10 s more):
# /healthz behind them waited 18 s, and nothing counted it.
port=8113
serve_start $port "$tmp/serve.log" "$dedup" serve --store memory: --listen 127.0.0.1:$port \
  --threads 1 --max-connections 1 --quiet
fill $port
for mode in pipelined big; do
  reader $port $mode 25 "$tmp/$mode.out"
  read -r code ms < <(behind $port 25)
  check "behind a $mode reader that never reads, /healthz answers 200 within 12 s (got '$code' after $ms ms)" \
    eval '[ "$code" = 200 ] && [ "$ms" -le 12000 ]'
  wait "$reader_pid" || true
  check "... and the $mode reader was closed ($(tr '\n' ' ' <"$tmp/$mode.out"))" \
    grep -qx "$mode closed" "$tmp/$mode.out"
done
check "both answers given up are counted as part=\"response\" (got $(metric $port "$response_timeouts"))" \
  [ "$(metric $port "$response_timeouts")" = 2 ]

# ---- --response-timeout: validated at start-up; a short one ends a reader that
# reads slowly (before: ~24 s on this answer) and one that never reads.
for bad in 0 0s -1s; do
  set +e
  out=$(timeout 10 "$dedup" serve --store memory: --listen 127.0.0.1:8114 "--response-timeout=$bad" 2>&1)
  rc=$?
  set -e
  check "--response-timeout=$bad is refused at start-up, naming the flag (rc $rc: ${out%%$'\n'*})" \
    eval '[ $rc = 2 ] && [[ "$out" == *--response-timeout* ]]'
done
port=8114
serve_start $port "$tmp/short.log" "$dedup" serve --store memory: --listen 127.0.0.1:$port \
  --threads 1 --max-connections 1 --quiet --response-timeout 2s
fill $port
for mode in trickle big; do
  reader $port $mode 10 "$tmp/short-$mode.out"
  read -r code ms < <(behind $port 10)
  check "--response-timeout 2s: behind a $mode reader, /healthz answers 200 after 1.5-4 s (got '$code' after $ms ms)" \
    eval '[ "$code" = 200 ] && [ "$ms" -ge 1500 ] && [ "$ms" -le 4000 ]'
  wait "$reader_pid" || true
  check "... and the $mode reader was closed ($(tr '\n' ' ' <"$tmp/short-$mode.out"))" \
    grep -qx "$mode closed" "$tmp/short-$mode.out"
done
check "both counted as part=\"response\" (got $(metric $port "$response_timeouts"))" \
  [ "$(metric $port "$response_timeouts")" = 2 ]
# An ordinary large answer read at once is not cut short.
bytes=$(curl -s -m 10 "http://127.0.0.1:$port/v1/keys?limit=1000" | wc -c)
check "a 2.5 MB answer read at once is whole ($bytes bytes)" [ "$bytes" -gt 2500000 ]
serve_report "$tmp"
