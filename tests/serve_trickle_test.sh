#!/usr/bin/env bash
# `dedup serve` against clients that trickle their request, one byte a second
# (a slowloris): each byte comes within the read timeout, so only a deadline for
# the whole head or body ends them (docs/SERVE.md, "Slow clients").
#   serve_trickle_test.sh DEDUP_BINARY     (ports 8100-8101, docs/PORTS.md)
#
# Two servers with --threads 1 --max-connections 2, i.e. two threads at most, and
# the default deadlines; against each, two clients that hold both threads: one
# pair trickles its request heads, the other the bodies of their claims. An
# ordinary request behind them must be answered once their deadline passes, and
# the trickling clients answered 408 and closed.
set -euo pipefail
dedup=$(realpath "$1")
root=$(cd "$(dirname "$0")/.." && pwd)
# shellcheck source=../scripts/lib/serve.sh
source "$root/scripts/lib/serve.sh"
tmp=$(mktemp -d "${TMPDIR:-/tmp}/serve-trickle.XXXXXX")
trap 'serve_stop_all; rm -rf "$tmp"' EXIT

head_port=8100 body_port=8101
# The defaults the bounds below rest on (docs/SERVE.md): the head within 10 s of
# its first byte, the body within 30 s of the end of the head.
header_timeout=10 body_timeout=30

# trickle PORT MODE SECONDS OUT: two trickling clients in the background (PID in
# trickle_pid), once their connections are open.
trickle() {
  setpriv --pdeathsig KILL -- python3 "$root/tests/serve_trickle_clients.py" "$1" "$2" 2 "$3" \
    >"$4" 2>&1 &
  trickle_pid=$!
  SERVE_PIDS+=("$trickle_pid")
  for _ in $(seq 100); do grep -q open "$4" && break; sleep 0.05; done
  sleep 0.5
}

# answered PORT BOUND OUT: GET /healthz, given BOUND seconds; writes "CODE MS" to OUT.
answered() {
  local t0 code
  t0=$(date +%s%N)
  code=$(curl -s -m "$2" -o /dev/null -w '%{http_code}' "http://127.0.0.1:$1/healthz" || true)
  echo "$code $((($(date +%s%N) - t0) / 1000000))" >"$3"
}

serve_start $head_port "$tmp/head-serve.log" "$dedup" serve --store memory: \
  --listen 127.0.0.1:$head_port --threads 1 --max-connections 2
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

if ((FAILS > 0)); then
  echo "$FAILS check(s) failed; logs in $tmp" >&2
  trap - EXIT
  serve_stop_all
  exit 1
fi
echo "all checks passed"
