#!/usr/bin/env bash
# `dedup exec`: supervision and exit codes (docs/EXEC.md), with real processes.
#
#   tests/exec_supervision_test.sh build/src/cli/dedup
#
# 1. kill -9 of `dedup exec`: its command, a grandchild deaf to SIGTERM and the
#    watchdog are dead within 5 s, and the key is not left COMPLETED.
# 2. SIGTERM of `dedup exec`: exit 143, the claim is released, the next run runs.
# 3. A command that is missing / not executable: 127 / 126, nothing recorded.
# 4. Exit codes: ran (N), replayed ok (79), replayed failed (80), command exit 75
#    (released), exhausted (69, and 69 again on every later run), a lease shorter
#    than the first look (75); busy (75) in 5.
# 5. With a Redis store on 127.0.0.1:6470 (docs/PORTS.md; skipped without
#    redis-server): the store stalls (SIGSTOP) and the command is stopped before
#    its lease ends; exit 75; the next run after the lease takes over; a key
#    running in another `dedup exec` gives 75; the command inherits no socket.
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
# shellcheck source=lib/exec_test.sh
source "$(dirname "$0")/lib/exec_test.sh"
exec_test_begin exec_test "$1"

# dead PID: gone, or a zombie waiting for its reaper.
dead() {
  local s
  s=$(awk '{ sub(/.*\) /, ""); print $1 }' "/proc/$1/stat" 2>/dev/null)
  [[ -z "$s" || "$s" == Z ]]
}
# all_dead_within SECONDS PID...
all_dead_within() {
  local limit=$1 p alive deadline
  shift
  deadline=$((SECONDS + limit))
  while ((SECONDS <= deadline)); do
    alive=0
    for p in "$@"; do dead "$p" || alive=1; done
    ((alive == 0)) && return 0
    sleep 0.05
  done
  return 1
}
wait_lines() {  # wait_lines FILE N SECONDS
  local deadline=$((SECONDS + $3))
  while ((SECONDS <= deadline)); do
    [[ -f "$1" ]] && (($(wc -l <"$1") >= $2)) && return 0
    sleep 0.05
  done
  return 1
}
wait_in_progress() {  # wait_in_progress STORE KEY: at most 5 s, until KEY is claimed
  local _
  for _ in $(seq 100); do
    "$dedup" inspect --store "$1" "$2" 2>/dev/null | grep -q in_progress && return 0
    sleep 0.05
  done
}
# The watchdog of a `dedup exec` is its child named dedup-watchdog.
watchdog_of() {
  local c
  for c in $(cat /proc/"$1"/task/*/children 2>/dev/null); do
    [[ "$(cat /proc/$c/comm 2>/dev/null)" == dedup-watchdog ]] && echo "$c"
  done
}

store="rocksdb:$tmp/store"

# ---- 1. SIGKILL of exec --------------------------------------------------------
pids=$tmp/pids1
"$dedup" exec --store "$store" --key killed -- sh -c \
  "echo \$\$ >> $pids; (trap '' TERM; exec sleep 300) & echo \$! >> $pids; sleep 300; true" \
  >/dev/null 2>&1 &
exec_pid=$!
bg_pids+=("$exec_pid")
if wait_lines "$pids" 2 10; then
  wd=$(watchdog_of "$exec_pid")
  [[ -n "$wd" ]] || fail "no dedup-watchdog child of dedup exec"
  kill -KILL "$exec_pid"
  wait "$exec_pid" 2>/dev/null
  if all_dead_within 5 $(cat "$pids") $wd; then
    pass "kill -9 of dedup exec: command, TERM-deaf grandchild and watchdog dead"
  else
    fail "kill -9 of dedup exec: survivors: $(for p in $(cat "$pids") $wd; do dead "$p" || echo -n "$p "; done)"
  fi
else
  fail "the command of case 1 did not start"
fi
state=$("$dedup" inspect --store "$store" killed 2>&1 | awk '$1 == "state" { print $2 }')
[[ "$state" != completed ]] && pass "killed run not recorded (state ${state:-none})" ||
  fail "killed run was recorded as completed"

# ---- 2. SIGTERM of exec releases the claim -------------------------------------
pids=$tmp/pids2
"$dedup" exec --store "$store" --key termed -- sh -c "echo \$\$ >> $pids; sleep 300; true" \
  >/dev/null 2>"$tmp/term.err" &
exec_pid=$!
bg_pids+=("$exec_pid")
if wait_lines "$pids" 1 10; then
  kill -TERM "$exec_pid"
  wait "$exec_pid"
  expect_rc 143 $? "SIGTERM of dedup exec"
  all_dead_within 5 $(cat "$pids") && pass "SIGTERM: command stopped" || fail "SIGTERM: command still running"
  state=$("$dedup" inspect --store "$store" termed 2>&1 | awk '$1 == "state" { print $2 }')
  [[ "$state" == released ]] && pass "SIGTERM: claim released" || fail "SIGTERM: state '$state', want released"
  out=$("$dedup" exec --store "$store" --key termed -- echo rerun 2>/dev/null)
  rc=$?
  [[ $rc == 0 && "$out" == rerun ]] && pass "SIGTERM: the next run runs the command" ||
    fail "SIGTERM: next run exit $rc output '$out' (a replayed 143?)"
else
  fail "the command of case 2 did not start"
fi

# ---- 3. missing / not executable commands ----------------------------------------
"$dedup" exec --store "$store" --key missing -- no-such-command-for-dedup 2>/dev/null
expect_rc 127 $? "missing command"
"$dedup" inspect --store "$store" missing >/dev/null 2>&1 && fail "missing command left a record" ||
  pass "missing command: no record"
"$dedup" exec --store "$store" --key notexec -- /etc/passwd 2>/dev/null
expect_rc 126 $? "not executable"
"$dedup" exec --store "$store" --key shellmissing -- sh -c 'no-such-command-for-dedup' 2>/dev/null
expect_rc 127 $? "sh -c of a missing command"
state=$("$dedup" inspect --store "$store" shellmissing 2>&1 | awk '$1 == "state" { print $2 }')
[[ "$state" != completed ]] && pass "sh: not found: not recorded (state ${state:-none})" ||
  fail "sh: not found was recorded"
# An empty command is a usage error (2, as `worker --exec ''`), not "try again later" (75).
"$dedup" exec --store "$store" --key empty -- '' 2>/dev/null
expect_rc 2 $? "empty command"

# ---- 4. exit codes ---------------------------------------------------------------
out=$("$dedup" exec --store "$store" --key ok -- echo hello 2>/dev/null); rc=$?
expect_rc 0 $rc "first run"
out=$("$dedup" exec --store "$store" --key ok -- echo other 2>/dev/null); rc=$?
expect_rc 79 $rc "replay of a success"
[[ "$out" == hello ]] && pass "replay prints the recorded output" || fail "replay printed '$out'"
"$dedup" exec --store "$store" --key bad -- sh -c 'exit 3' 2>/dev/null
expect_rc 3 $? "failing command"
"$dedup" exec --store "$store" --key bad -- true 2>/dev/null
expect_rc 80 $? "replay of a failure"
"$dedup" exec --store "$store" --key retry -- sh -c 'exit 75' 2>/dev/null
expect_rc 75 $? "command asks for a retry"
"$dedup" exec --store "$store" --key retry -- true 2>/dev/null
expect_rc 0 $? "after exit 75 the key runs again"
"$dedup" exec --store "$store" --max-attempts 1 --key tired -- sh -c 'exit 75' 2>/dev/null
expect_rc 75 $? "attempt 1 of 1 asks for a retry"
"$dedup" exec --store "$store" --max-attempts 1 --key tired -- true 2>/dev/null
expect_rc 69 $? "attempts exhausted"
"$dedup" exec --store "$store" --max-attempts 1 --key tired -- true 2>/dev/null
expect_rc 69 $? "exhausted again, consistently"
# A lease shorter than the supervisor's first look: the watchdog's SIGKILL at the
# lease's end is the lease ending, exit 75 as for any lost lease, not 137 as if
# something else had killed the command.
for lease in 1ms 2ms; do
  "$dedup" exec --store "$store" --lease "$lease" --key "short-$lease" -- sh -c 'sleep 0.3; echo done' \
    >/dev/null 2>"$tmp/short.err"
  expect_rc 75 $? "--lease $lease: the command outlives its lease"
  grep -q 'lease was lost or could not be renewed' "$tmp/short.err" &&
    pass "... and the message says the lease ended" || fail "... message: $(cat "$tmp/short.err")"
done
"$dedup" exec --help | grep -q '79 replayed' && pass "--help has the exit-code table" ||
  fail "--help lacks the exit-code table"

# ---- 5. the store stalls: the command is stopped before its lease ends --------------
if command -v redis-server >/dev/null; then
  source "$root/scripts/lib/redis.sh"
  port=${EXEC_TEST_REDIS_PORT:-6470}
  if redis_start "$port" "$tmp/redis"; then
    rpid=$REDIS_LAST_PID
    pids=$tmp/pids5
    "$dedup" exec --store "redis://127.0.0.1:$port?timeout=500ms" --lease 2s --key stall -- \
      sh -c "echo \$\$ >> $pids; sleep 300; true" >/dev/null 2>"$tmp/stall.err" &
    exec_pid=$!
    bg_pids+=("$exec_pid")
    if wait_lines "$pids" 1 10; then
      sleep 0.3
      kill -STOP "$rpid"
      t0=$(date +%s%N)
      if all_dead_within 5 $(cat "$pids"); then
        ms=$((($(date +%s%N) - t0) / 1000000))
        # The lease ran from the last extend (at most 2/3 s before the stop) for 2 s.
        if ((ms <= 2300)); then pass "store stalled: command stopped after ${ms} ms (lease 2 s)"
        else fail "store stalled: command stopped only after ${ms} ms (lease 2 s)"; fi
      else
        fail "store stalled: command still running after 5 s"
      fi
      kill -CONT "$rpid"
      wait "$exec_pid"
      expect_rc 75 $? "lease could not be renewed"
      grep -q 'lease was lost or could not be renewed' "$tmp/stall.err" ||
        fail "no message about the lease: $(cat "$tmp/stall.err")"
      sleep 2.1
      "$dedup" exec --store "redis://127.0.0.1:$port" --key stall -- true 2>/dev/null
      expect_rc 0 $? "after the lease the next run takes over"
      # Busy needs a store two processes can open at once (RocksDB locks its directory).
      "$dedup" exec --store "redis://127.0.0.1:$port" --key busy -- sleep 300 >/dev/null 2>&1 &
      busy_pid=$!
      bg_pids+=("$busy_pid")
      wait_in_progress "redis://127.0.0.1:$port" busy
      "$dedup" exec --store "redis://127.0.0.1:$port" --key busy -- true 2>/dev/null
      expect_rc 75 $? "running elsewhere"
      kill -TERM "$busy_pid"; wait "$busy_pid" 2>/dev/null
      # The record forgotten under the running command: it ends, its complete
      # answers LOST, and exit 75 says "not recorded" (it was the command's 0).
      "$dedup" exec --store "redis://127.0.0.1:$port" --key lost --lease 30s -- sleep 2 \
        >/dev/null 2>"$tmp/lost.err" &
      lost_pid=$!
      bg_pids+=("$lost_pid")
      wait_in_progress "redis://127.0.0.1:$port" lost
      "$dedup" forget --force --store "redis://127.0.0.1:$port" lost >/dev/null 2>&1
      wait "$lost_pid"
      expect_rc 75 $? "the outcome could not be recorded (lease lost to a forget)"
      grep -q 'the outcome was not recorded; exit 75' "$tmp/lost.err" ||
        fail "no message about the unrecorded outcome: $(cat "$tmp/lost.err")"
      # The command inherits none of dedup's sockets (the store's connection).
      "$dedup" exec --store "redis://127.0.0.1:$port" --key fds -- ls -l /proc/self/fd \
        >"$tmp/fds" 2>&1
      expect_rc 0 $? "listing the command's descriptors"
      if grep -q 'socket:' "$tmp/fds"; then
        fail "the command inherited a socket of dedup: $(grep 'socket:' "$tmp/fds")"
      else
        pass "the command inherits no socket of dedup"
      fi
    else
      kill -CONT "$rpid"
      fail "the command of case 5 did not start: $(cat "$tmp/stall.err")"
    fi
    redis_stop "$rpid"
  else
    fail "could not start redis-server on port $port"
  fi
else
  echo "skip: no redis-server (case 5)"
fi

if ((failures > 0)); then
  echo "exec_supervision_test: $failures failure(s)" >&2
  exit 1
fi
echo "exec_supervision_test: all passed"
