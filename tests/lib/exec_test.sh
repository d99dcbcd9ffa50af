# Shared by the `dedup exec` shell tests (exec_supervision_test.sh,
# exec_review_test.sh): their temporary directory, the background processes
# they start (SIGKILLed at exit), and how they count and report checks.
#
#   source tests/lib/exec_test.sh; exec_test_begin NAME DEDUP_BINARY
#   sets $dedup (absolute), $tmp, $failures; bg_pids+=(PID) to own a process.

exec_test_begin() {
  dedup=$(realpath "$2")
  tmp=$(mktemp -d "/tmp/dedup_$1.XXXXXX")
  failures=0
  bg_pids=()
  trap _exec_test_cleanup EXIT
}

_exec_test_cleanup() {
  local p
  for p in "${bg_pids[@]}"; do kill -KILL "$p" 2>/dev/null; done
  rm -rf "$tmp"
}

fail() { echo "FAIL: $*" >&2; failures=$((failures + 1)); }
pass() { echo "ok: $*"; }
expect_rc() {  # expect_rc WANT GOT WHAT
  if [[ "$2" == "$1" ]]; then pass "$3: exit $2"; else fail "$3: exit $2, want $1"; fi
}
