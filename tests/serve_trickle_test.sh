#!/usr/bin/env bash
# `dedup serve` against clients that trickle their request, one byte a second
# (a slowloris): each byte comes within the read timeout, so only a deadline for
# the whole head or body ends them (docs/SERVE.md, "Slow clients").
#   serve_trickle_test.sh DEDUP_BINARY     (ports 8100-8102, docs/PORTS.md)
#
# Two servers with --threads 1 --max-connections 2, i.e. two threads at most, and
# the default deadlines; against each, two clients that hold both threads: one
# pair trickles its request heads, the other the bodies of their claims. An
# ordinary request behind them must be answered once their deadline passes, and
# the trickling clients answered 408 and closed. Then the flags (--header-timeout,
# --body-timeout): validated at start-up, and short ones on a third server, with
# a head too large, the counters, and keep-alive.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
# shellcheck source=lib/serve_test.sh
source "$root/tests/lib/serve_test.sh"
serve_test_begin serve-trickle "$1"

head_port=8100 body_port=8101 short_port=8102
# The defaults the bounds below rest on (docs/SERVE.md): the head within 10 s of
# its first byte, the body within 30 s of the end of the head.
header_timeout=10 body_timeout=30

# trickle PORT MODE SECONDS OUT: two trickling clients in the background (PID in
# trickle_pid), once their connections are open.
trickle() {
  serve_client "$4" python3 "$root/tests/serve_trickle_clients.py" "$1" "$2" 2 "$3"
  trickle_pid=$client_pid
  sleep 0.5
}

# answered PORT BOUND OUT: GET /healthz, given BOUND seconds; writes "CODE MS" to OUT.
answered() {
  local t0 code
  t0=$(date +%s%N)
  code=$(curl -s -m "$2" -o /dev/null -w '%{http_code}' "http://127.0.0.1:$1/healthz" || true)
  echo "$code $((($(date +%s%N) - t0) / 1000000))" >"$3"
}

# Both threads may wait for a head (--max-waiting-connections 2; by default only
# one may, and the second trickler would be shed at once, 503): the head's
# deadline is what this tests.
serve_start $head_port "$tmp/head-serve.log" "$dedup" serve --store memory: \
  --listen 127.0.0.1:$head_port --threads 1 --max-connections 2 --max-waiting-connections 2
serve_start $body_port "$tmp/body-serve.log" "$dedup" serve --store memory: \
  --listen 127.0.0.1:$body_port --threads 1 --max-connections 2

# Both scenarios at once (the body's deadline is the longer one). The clients
# trickle for longer than each bound, so that a server without the deadline
# fails the check rather than being rescued by the clients giving up.
head_bound=$((header_timeout + 5)) body_bound=$((body_timeout + 5))
trickle $head_port head $((head_bound + 5)) "$tmp/head.out"
head_pid=$trickle_pid
trickle $body_port body $((body_bound + 5)) "$tmp/body.out"
body_pid=$trickle_pid
answered $head_port $head_bound "$tmp/head.answer" &
a1=$!
answered $body_port $body_bound "$tmp/body.answer" &
a2=$!
wait $a1 $a2 || true
read -r head_code head_ms <"$tmp/head.answer"
read -r body_code body_ms <"$tmp/body.answer"
check "behind 2 clients trickling their heads (--threads 1 --max-connections 2), /healthz answers 200 within ${head_bound} s (got '$head_code' after $head_ms ms)" \
  [ "$head_code" = 200 ]
check "behind 2 clients trickling their bodies, /healthz answers 200 within ${body_bound} s (got '$body_code' after $body_ms ms)" \
  [ "$body_code" = 200 ]
wait "$head_pid" "$body_pid" || true

# "N STATUS AFTER CLOSED" per client (tests/serve_trickle_clients.py).
for mode in head body; do
  timeout=$([ $mode = head ] && echo $header_timeout || echo $body_timeout)
  what=$([ $mode = head ] && echo heads || echo bodies)
  check "the clients trickling their $what got 408 after ${timeout}-$((timeout + 3)) s and were closed ($(grep -vx open "$tmp/$mode.out" | tr '\n' ' '))" \
    awk -v lo="$timeout" -v hi=$((timeout + 3)) '
      $1 == "open" { next }
      { n++; if ($2 != "408" || $3 < lo || $3 > hi || $4 != "closed") bad = 1 }
      END { exit bad || n != 2 }' "$tmp/$mode.out"
done

# ---- the flags: validated at start-up, naming the flag.
for flag in --header-timeout --body-timeout; do
  for bad in 0 0s -1s; do
    set +e
    out=$(timeout 10 "$dedup" serve --store memory: --listen 127.0.0.1:$short_port "$flag=$bad" 2>&1)
    rc=$?
    set -e
    check "$flag=$bad is refused at start-up, naming the flag (rc $rc: ${out%%$'\n'*})" \
      eval '[ $rc = 2 ] && [[ "$out" == *"$flag"* ]]'
  done
done

# ---- short deadlines: one client trickling its head, one its body, one sending
# its head in two parts within the deadline, and one sending a head larger than
# the bound at once.
serve_start $short_port "$tmp/short-serve.log" "$dedup" serve --store memory: \
  --listen 127.0.0.1:$short_port --header-timeout 1s --body-timeout 2s
setpriv --pdeathsig KILL -- python3 "$root/tests/serve_trickle_clients.py" $short_port head 1 8 \
  >"$tmp/short-head.out" 2>&1 &
p1=$!
setpriv --pdeathsig KILL -- python3 "$root/tests/serve_trickle_clients.py" $short_port body 1 8 \
  >"$tmp/short-body.out" 2>&1 &
p2=$!
SERVE_PIDS+=("$p1" "$p2")
# A head in two parts 0.5 s apart; a head of 100 KiB without its end; a claim
# and a GET pipelined in one write (serve reads a head ahead of cpp-httplib with
# what follows it: the claim's body and the next request must both reach it;
# before, the bytes read past a request were dropped).
python3 - $short_port >"$tmp/short-other.out" 2>&1 <<'PY' &
import re, socket, sys, time
port = int(sys.argv[1])


def to_close(sock):
    out = b""
    while True:
        d = sock.recv(65536)
        if not d:
            return out
        out += d


s = socket.create_connection(("127.0.0.1", port))
s.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n")
time.sleep(0.5)
s.sendall(b"X-Late: 1\r\n\r\n")
print("two_parts", s.recv(4096).split(b"\r\n")[0].decode(), flush=True)
b = socket.create_connection(("127.0.0.1", port))
t0 = time.monotonic()
b.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n" + b"X-Big: " + b"a" * 8000 + b"\r\n"
          + b"".join(b"X-Big-%d: %s\r\n" % (i, b"b" * 4000) for i in range(25)))
answer = to_close(b)
print("big", answer.split(b"\r\n")[0].decode(), "%.1f" % (time.monotonic() - t0), flush=True)
p = socket.create_connection(("127.0.0.1", port))
p.sendall(b"POST /v1/keys/pipelined/claim HTTP/1.1\r\nHost: 127.0.0.1\r\n"
          b"Content-Type: application/json\r\nContent-Length: 2\r\n\r\n{}"
          b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
print("pipelined", " ".join(x.decode() for x in re.findall(rb"HTTP/1.1 (\d+)", to_close(p))))
PY
p3=$!
wait "$p1" "$p2" "$p3" || true
check "a head trickled against --header-timeout 1s: 408 after 1-3 s, closed ($(tr '\n' ' ' <"$tmp/short-head.out"))" \
  awk '$1 == "0" { ok = $2 == "408" && $3 >= 1 && $3 <= 3 && $4 == "closed" } END { exit !ok }' "$tmp/short-head.out"
check "a body trickled against --body-timeout 2s: 408 after 2-4 s, closed ($(tr '\n' ' ' <"$tmp/short-body.out"))" \
  awk '$1 == "0" { ok = $2 == "408" && $3 >= 2 && $3 <= 4 && $4 == "closed" } END { exit !ok }' "$tmp/short-body.out"
check "a head sent in two parts within the deadline is answered ($(tr '\n' ' ' <"$tmp/short-other.out"))" \
  grep -q "^two_parts HTTP/1.1 200" "$tmp/short-other.out"
check "a head over the bound is refused 431 at once, not at the deadline" \
  awk '$1 == "big" { ok = $3 == "431" && $NF < 1 } END { exit !ok }' "$tmp/short-other.out"
check "a claim and a GET pipelined in one write are both answered" \
  grep -qx "pipelined 201 200" "$tmp/short-other.out"
check "the timeouts are counted by part" eval \
  '[ "$(metric $short_port "dedup_serve_request_timeouts_total{part=\"head\"}")" = 1 ] &&
   [ "$(metric $short_port "dedup_serve_request_timeouts_total{part=\"body\"}")" = 1 ]'
check "... and as answers: the body's under its route, the head's and the 431 as route other" eval \
  '[ "$(metric $short_port "dedup_serve_requests_total{route=\"claim\",code=\"408\"}")" = 1 ] &&
   [ "$(metric $short_port "dedup_serve_requests_total{route=\"other\",code=\"408\"}")" = 1 ] &&
   [ "$(metric $short_port "dedup_serve_requests_total{route=\"other\",code=\"431\"}")" = 1 ]'
# On a keep-alive connection, each head's deadline counts from that head's first
# byte: a second request begun 1.5 s after the first answer (past the 1 s header
# timeout counted from the connection's start) and sent in two parts 0.5 s apart
# is answered; the connection idle after it is closed after the keep-alive
# timeout (5 s).
python3 - $short_port >"$tmp/ka-deadline.out" 2>&1 <<'PY'
import re, socket, sys, time
port = int(sys.argv[1])
s = socket.create_connection(("127.0.0.1", port))
req = b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"


def answer():
    """The status line of one whole answer (head and its Content-Length body)."""
    got = b""
    while b"\r\n\r\n" not in got:
        got += s.recv(4096)
    head, _, body = got.partition(b"\r\n\r\n")
    length = int(re.search(rb"Content-Length: (\d+)", head).group(1))
    while len(body) < length:
        body += s.recv(4096)
    return head.split(b"\r\n")[0].decode()


s.sendall(req)
print("first", answer(), flush=True)
time.sleep(1.5)
s.sendall(req[:20])
time.sleep(0.5)
s.sendall(req[20:])
print("second", answer(), flush=True)
t0 = time.monotonic()
s.settimeout(15)
try:
    end = s.recv(4096)
except OSError:
    end = b"error"
print("idle_closed_after %.1f %s" % (time.monotonic() - t0, "eof" if end == b"" else end[:20]))
PY
check "keep-alive: a second head's deadline counts from its first byte ($(tr '\n' ' ' <"$tmp/ka-deadline.out"))" \
  eval 'grep -qx "first HTTP/1.1 200 OK" "$tmp/ka-deadline.out" && grep -qx "second HTTP/1.1 200 OK" "$tmp/ka-deadline.out"'
check "keep-alive: the connection idle after it is closed after 4-7 s" \
  awk '$1 == "idle_closed_after" { ok = $2 >= 4 && $2 <= 7 && $3 == "eof" } END { exit !ok }' "$tmp/ka-deadline.out"
# Keep-alive is kept: three requests on one connection, the second a POST.
curl -s -o /dev/null -w '%{http_code} %{num_connects}\n' "http://127.0.0.1:$short_port/healthz" \
  --next -s -o /dev/null -w '%{http_code} %{num_connects}\n' -X POST \
  "http://127.0.0.1:$short_port/v1/keys/ka/claim" -H 'Content-Type: application/json' --data '{}' \
  --next -s -o /dev/null -w '%{http_code} %{num_connects}\n' "http://127.0.0.1:$short_port/healthz" \
  >"$tmp/ka"
check "three requests on one kept-alive connection ($(tr '\n' ' ' <"$tmp/ka"))" \
  eval '[[ "$(tr "\n" " " <"$tmp/ka")" =~ ^200\ 1\ 20[01]\ 0\ 200\ 0\ $ ]]'

serve_report "$tmp"
