#!/usr/bin/env bash
# `dedup serve` against requests whose framing two readers could see apart: serve
# reads each request head itself (src/serve/http_server.cc) before cpp-httplib
# parses it, so both must end a head at the same byte, and after an answer the
# connection may carry another request only if serve knows where it starts.
#   serve_framing_test.sh DEDUP_BINARY     (ports 8105-8106, docs/PORTS.md)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
# shellcheck source=lib/serve_test.sh
source "$root/tests/lib/serve_test.sh"
serve_test_begin serve-framing "$1"
port=8105 stop_port=8106

serve_start $port "$tmp/serve.log" "$dedup" serve --store memory: --listen 127.0.0.1:$port \
  --header-timeout 1s --body-timeout 5s --quiet
setpriv --pdeathsig KILL -- python3 "$root/tests/serve_framing_clients.py" $port >"$tmp/out" 2>&1
cat "$tmp/out"

# expect NAME REGEX WHY: the case's line (tests/serve_framing_clients.py) matches.
expect() {
  local line re="^$1 $2\$"
  line=$(awk -v n="$1" '$1 == n && $2 != "announced"' "$tmp/out")
  check "$3 ($line)" eval '[[ $line =~ $re ]]'
}
expect lf_blank_big '431 CLOSED 0\.[0-9]' \
  "a bare LF is no blank line to cpp-httplib: the head goes on, and over the bound is refused 431 at once"
expect lf_blank_trickle '408 CLOSED [1-3]\.[0-9]' \
  "... and header lines trickled after it get 408 at --header-timeout (1 s), not --body-timeout"
expect lf_only '408 CLOSED [1-2]\.[0-9]' \
  "a head of bare-LF lines gets one answer (408 at the deadline), not one per line"
expect long_header_line '400 CLOSED 0\.[0-9]' \
  "a head cpp-httplib cannot parse (a header line over 8 KiB): one 400, then the connection ends"
expect long_request_line '414 .*' "a request line over 8 KiB: 414"
expect range_unknown_unit '201 200 OPEN 0\.[0-9]' \
  "a Range cpp-httplib cannot parse (Range: items=0-9) is ignored: the claim, then the GET behind it"
# announced NAME: the answer after which serve ended the case's connection said
# Connection: close.
announced() {
  local line
  line=$(awk -v n="$1" '$1 == n && $2 == "announced"' "$tmp/out")
  check "$1: the answer after which serve ends the connection says Connection: close ($line)" \
    [ "$line" = "$1 announced yes" ]
}
for name in long_header_line long_request_line get_with_body refused_post_body; do
  announced $name
done
expect get_with_body '200 CLOSED 0\.[0-9]' \
  "a GET's body is not read as the next request: one answer, then the connection ends"
expect refused_post_body '400 CLOSED 0\.[0-9]' \
  "a POST refused before its body was read: one answer, then the connection ends"
expect cl_and_te '400 CLOSED 0\.[0-9]' \
  "Content-Length with Transfer-Encoding (RFC 9112 6.1): refused unrun (400), then the connection ends"
expect two_lengths '400 CLOSED 0\.[0-9]' \
  "two Content-Lengths that differ: refused unrun (400), then the connection ends"
expect chunked_trailer '400 CLOSED 0\.[0-9]' \
  "a chunked body cpp-httplib cannot read (a trailer): one 400, then the connection ends"
expect pipelined_after_body '201 200 OPEN 0\.[0-9]' "a claim then a GET pipelined: both, kept alive"
expect head_then_get '200 200 OPEN 0\.[0-9]' "HEAD then GET pipelined: both, kept alive"
expect expect_continue '100 201 OPEN 0\.[0-9]' "Expect: 100-continue: 100, then the claim"
expect chunked '201 CLOSED 0\.[0-9]' "a chunked claim (with a chunk extension) is answered"
expect too_large_continue '413 CLOSED 0\.[0-9]' \
  "Content-Length over --max-body-bytes with Expect: 100-continue: 413 at once, no 100"
expect too_large '413 CLOSED 0\.[0-9]' \
  "Content-Length over --max-body-bytes, the body never sent: 413 at once, not after the read timeout"
expect unknown_method '501 CLOSED 0\.[0-9]' "PROPFIND: 501 naming the method, then the connection ends"
expect post_unframed '201 200 OPEN 0\.[0-9]' \
  "a POST without Content-Length or Transfer-Encoding has an empty body: the claim, then the GET behind it"
# The framing fields a server in front could read otherwise (RFC 9112 3.2, 6.1,
# 6.3): refused unrun, the connection ended.
for name in length_word length_plus length_suffix length_list te_gzip no_host two_hosts; do
  line=$(awk -v n="$name" '$1 == n && $2 != "announced" && $2 != "unrun"' "$tmp/out")
  check "$name: refused (400), then the connection ends ($line)" eval '[[ $line =~ ^$name\ 400\ CLOSED ]]'
  check "$name: the claim did not run ($(grep "^$name unrun" "$tmp/out"))" \
    grep -qx "$name unrun 404" "$tmp/out"
done
check "a claim and a GET split once at every byte are both answered ($(grep split_every_byte "$tmp/out"))" \
  grep -q '^split_every_byte [0-9]* bad 0 *$' "$tmp/out"

# ---- stopping: connections that began no request (idle, or a head still
# arriving, here well within the default --header-timeout of 10 s) do not hold
# SIGTERM up.
serve_start $stop_port "$tmp/stop.log" "$dedup" serve --store memory: \
  --listen 127.0.0.1:$stop_port --quiet
stop_pid=$SERVE_LAST_PID
setpriv --pdeathsig KILL -- python3 - $stop_port >"$tmp/stop.out" 2>&1 <<'PY' &
import socket, sys, time
port = int(sys.argv[1])
conns = [socket.create_connection(("127.0.0.1", port)) for _ in range(4)]
for c in conns[:3]:
    c.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n")
print("open", flush=True)
for _ in range(30):  # a header line every 0.5 s for 15 s
    time.sleep(0.5)
    for c in conns[:3]:
        try:
            c.sendall(b"X-More: 1\r\n")
        except OSError:
            pass
PY
clients=$!
SERVE_PIDS+=("$clients")
for _ in $(seq 100); do grep -q open "$tmp/stop.out" && break; sleep 0.05; done
sleep 0.5
t0=$(date +%s%N)
kill -TERM "$stop_pid"
rc=0
wait "$stop_pid" || rc=$?
stop_ms=$((($(date +%s%N) - t0) / 1000000))
kill "$clients" 2>/dev/null || true
check "SIGTERM with 3 heads arriving and 1 idle connection: serve exits 0 within 3 s (rc $rc after $stop_ms ms)" \
  eval '[ $rc = 0 ] && [ $stop_ms -lt 3000 ]'

serve_report "$tmp"
