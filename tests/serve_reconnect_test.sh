#!/usr/bin/env bash
# `dedup serve` against slow connections that come back: N connections that each
# trickle a request head that never ends (or send nothing), and are opened again
# as soon as serve closes them, while a well-behaved client sends GET /healthz on
# a new connection every 0.2 s (tests/serve_reconnect_clients.py). With every
# thread held by them, a connection that waited its turn behind them waited for
# their head deadlines (10 s each); at most --max-waiting-connections connections
# may now wait for a head, and the others must bring theirs at once
# (docs/SERVE.md, "Slow clients"). A keep-alive client beside idle connections
# is told when its connection is not kept (tests/serve_keepalive_shed_clients.py).
#   serve_reconnect_test.sh DEDUP_BINARY     (ports 8115-8116, docs/PORTS.md)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
# shellcheck source=lib/serve_test.sh
source "$root/tests/lib/serve_test.sh"
serve_test_begin serve-reconnect "$1"
clients=$root/tests/serve_reconnect_clients.py
# field NAME LINE: the value of NAME=V in a line of serve_reconnect_clients.py.
field() { tr ' ' '\n' <<<"$2" | awk -F= -v n="$1" '$1 == n { print $2 }'; }

# --threads 4 --max-connections 4: four threads in all (the default for
# --max-waiting-connections then: 3).
port=8115
serve_start $port "$tmp/serve.log" "$dedup" serve --store memory: --listen 127.0.0.1:$port \
  --threads 4 --max-connections 4 --quiet
for run in "4 head" "8 head" "8 idle"; do
  read -r n mode <<<"$run"
  line=$(python3 "$clients" $port "$n" 15 "$mode")
  echo "$line"
  p99=$(field p99_ms "$line") max=$(field max_ms "$line") failed=$(field failed "$line")
  check "$n $mode connections coming back on 4 threads: /healthz p99 under 1 s, none failed ($line)" \
    awk -v p="$p99" -v m="$max" -v f="$failed" 'BEGIN { exit !(p >= 0 && p < 1000 && m < 2000 && f == 0) }'
done
check "the connections shed are counted (new: $(metric $port 'dedup_serve_shed_connections_total{state="new"}'))" \
  [ "$(metric $port 'dedup_serve_shed_connections_total{state="new"}')" -gt 0 ]
check "... and answered 503 (route other: $(metric $port 'dedup_serve_requests_total{route="other",code="503"}'))" \
  [ "$(metric $port 'dedup_serve_requests_total{route="other",code="503"}')" -gt 0 ]
# A kept-alive connection goes on while fewer are waiting: three requests, one connection.
curl -s -o /dev/null -w '%{http_code} %{num_connects}\n' "http://127.0.0.1:$port/healthz" \
  --next -s -o /dev/null -w '%{http_code} %{num_connects}\n' "http://127.0.0.1:$port/healthz" \
  --next -s -o /dev/null -w '%{http_code} %{num_connects}\n' "http://127.0.0.1:$port/healthz" >"$tmp/ka"
check "keep-alive is kept when nothing waits ($(tr '\n' ' ' <"$tmp/ka"))" \
  [ "$(tr '\n' ' ' <"$tmp/ka")" = "200 1 200 0 200 0 " ]
# While the waiting places are taken (3 connections that send nothing, as the idle
# kept-alive connections of other clients would), a keep-alive client's
# connection is not kept: its answers say so (Connection: close), and every
# request succeeds, the client opening a new connection for each. A connection
# closed after an answer that did not say so fails the client's next request
# (a POST is not retried).
line=$(python3 "$root/tests/serve_keepalive_shed_clients.py" $port 3 40)
check "a keep-alive client beside 3 idle connections: every claim answered, no connection closed unannounced ($line)" \
  eval '[[ "$line" == "ok=40 failed=0 "*"closed_unannounced=0 "* ]]'

# ---- the flag: validated at start-up.
for bad in -1 5 x; do
  set +e
  out=$(timeout 10 "$dedup" serve --store memory: --listen 127.0.0.1:8116 --threads 2 \
    --max-connections 4 "--max-waiting-connections=$bad" 2>&1)
  rc=$?
  set -e
  check "--max-waiting-connections=$bad (with --max-connections 4) is refused, naming the flag (rc $rc: ${out%%$'\n'*})" \
    eval '[ $rc = 2 ] && [[ "$out" == *--max-waiting-connections* ]]'
done
serve_report "$tmp"
