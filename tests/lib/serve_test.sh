#!/usr/bin/env bash
# What every tests/serve_*_test.sh starts with, and the helpers several of them
# share. Source it once root is set (it sources scripts/lib/serve.sh, for
# serve_start, check and serve_report, and scripts/lib/redis.sh):
#
#   set -euo pipefail
#   root=$(cd "$(dirname "$0")/.." && pwd)
#   # shellcheck source=lib/serve_test.sh
#   source "$root/tests/lib/serve_test.sh"
#   serve_test_begin serve-api "$1"   # $dedup, $tmp; everything stopped at exit

# shellcheck source=../../scripts/lib/serve.sh
source "$root/scripts/lib/serve.sh"
# shellcheck source=../../scripts/lib/redis.sh
source "$root/scripts/lib/redis.sh"

# serve_test_begin NAME DEDUP_BINARY: sets dedup (the binary's absolute path)
# and tmp (a new directory NAME.XXXXXX under $TMPDIR). At exit
# (serve_test_cleanup), every server and client started through serve.sh and
# redis.sh is stopped and tmp removed; serve_report keeps tmp when a check failed.
# A test with more to stop sets its own trap, ending in serve_test_cleanup.
serve_test_begin() {
  dedup=$(realpath "$2")
  tmp=$(mktemp -d "${TMPDIR:-/tmp}/$1.XXXXXX")
  trap serve_test_cleanup EXIT
}

serve_test_cleanup() {
  serve_stop_all
  redis_stop_all
  rm -rf "$tmp"
}

# metric PORT NAME_AND_LABELS [BASE]: the value of one sample of
# http://127.0.0.1:PORT[BASE]/metrics, or 0.
metric() {
  curl -s "http://127.0.0.1:$1${3:-}/metrics" | awk -v m="$2" '$1 == m { v = $2 } END { print v + 0 }'
}

# header NAME: the value of the first header NAME in $headers (an answer's head
# as curl -D wrote it, CRs removed), or nothing.
header() { grep -i "^$1:" <<<"$headers" | head -1 | cut -d' ' -f2-; }

# serve_client OUT COMMAND...: starts COMMAND (a test client) in the background,
# its output in OUT and its PID in client_pid, stopped at exit with the servers;
# returns once it printed "open" (its connections are open, its requests sent),
# or after 5 s.
serve_client() {
  local out=$1
  shift
  setpriv --pdeathsig KILL -- "$@" >"$out" 2>&1 &
  client_pid=$!
  SERVE_PIDS+=("$client_pid")
  for _ in $(seq 100); do grep -q open "$out" 2>/dev/null && break; sleep 0.05; done
}
