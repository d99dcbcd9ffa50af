#!/usr/bin/env bash
# `dedup exec`: defects found by review of the command line (docs/EXEC.md), with
# real processes and a rocksdb: store (no server, no port).
#
#   tests/exec_review_test.sh build/src/cli/dedup
#
# 1. A reader of dedup exec's stdout that stalls does not stall supervision:
#    a. the command writes 300 KB, runs past two lease intervals and exits 0
#       while the reader does not read: it is not killed, and its outcome is
#       recorded (ok) while the reader still stalls; once the reader reads, it
#       gets every byte and dedup exec exits 0.
#    b. the command writes more than dedup holds for the reader (3 MB, so it
#       waits on its stdout): SIGTERM to dedup exec reaches it at once, and
#       dedup exec exits 143 while the reader still stalls.
# 2. dedup's flags stop at the command's first word: flags written after it
#    (`echo deploying --retention 1ms`) reach the command unchanged and change
#    none of dedup's settings (the next run replays, 79); `--` still works, and a
#    second `--` is the command's; --key after the command is not dedup's (2).
# 3. A rocksdb: directory another dedup process has open: a second dedup exec
#    (same key, another key), dedup forget and dedup worker at start-up exit 75
#    (try again later), not 2 (bad usage), saying the store is open in another
#    process; nothing of theirs runs. (The worker's broker, 127.0.0.1:6489, is
#    never reached: the store is opened first; nothing listens there.) A store
#    on a full disk (a 3 MiB tmpfs in a mount namespace of its own; skipped
#    where one cannot be made) is 75 too, for dedup exec and dedup worker.
set -uo pipefail
# shellcheck source=lib/exec_test.sh
source "$(dirname "$0")/lib/exec_test.sh"
exec_test_begin exec_review "$1"

wait_file() {  # wait_file FILE SECONDS: until FILE is there and not empty
  local deadline=$((SECONDS + $2))
  while ((SECONDS <= deadline)); do
    [[ -s "$1" ]] && return 0
    sleep 0.05
  done
  return 1
}
wait_grep() {  # wait_grep PATTERN FILE SECONDS
  local deadline=$((SECONDS + $3))
  while ((SECONDS <= deadline)); do
    grep -q "$1" "$2" 2>/dev/null && return 0
    sleep 0.05
  done
  return 1
}
# field STORE KEY NAME: a field of `dedup inspect` (read-only: works beside a
# running dedup exec on rocksdb:).
field() {
  "$dedup" inspect --store "$1" "$2" 2>/dev/null | awk -v n="$3" '$1 == n { print $2 }'
}
# A reader that reads nothing until GO exists, then counts the bytes into COUNT.
stalled_reader() {  # stalled_reader GO COUNT
  while [[ ! -e "$1" ]]; do sleep 0.05; done
  wc -c >"$2"
}

# ---- 1a. stalled reader: the command runs past its lease, exits 0, is recorded ----
store="rocksdb:$tmp/s1"
(
  "$dedup" exec --store "$store" --key stalled --lease 2s -- \
    sh -c "head -c 300000 /dev/zero; sleep 5" 2>"$tmp/1a.err"
  echo $? >"$tmp/1a.rc"
) | stalled_reader "$tmp/1a.go" "$tmp/1a.count" &
pipeline=$!
bg_pids+=("$pipeline")
deadline=$((SECONDS + 30))
state=
while ((SECONDS <= deadline)); do
  state=$(field "$store" stalled state)
  [[ "$state" == completed ]] && break
  sleep 0.1
done
if [[ "$state" == completed ]]; then
  [[ -e "$tmp/1a.count" ]] && fail "stalled reader: the reader read before it was let go"
  status=$(field "$store" stalled status)
  [[ "$status" == ok ]] && pass "stalled reader: outcome recorded ok while the reader stalls" ||
    fail "stalled reader: recorded '$status', want ok: $(cat "$tmp/1a.err")"
else
  fail "stalled reader: the outcome was not recorded in 30 s (state '$state'): $(cat "$tmp/1a.err")"
fi
touch "$tmp/1a.go"
wait "$pipeline"
expect_rc 0 "$(cat "$tmp/1a.rc" 2>/dev/null)" "stalled reader: dedup exec"
count=$(cat "$tmp/1a.count" 2>/dev/null | tr -d ' ')
[[ "$count" == 300000 ]] && pass "stalled reader: every byte reached it once it read" ||
  fail "stalled reader: it got ${count:-nothing} bytes, want 300000"
grep -q 'killed by signal' "$tmp/1a.err" && fail "stalled reader: $(cat "$tmp/1a.err")"

# ---- 1b. SIGTERM with a stalled reader reaches the command at once -----------------
store="rocksdb:$tmp/s2"
(
  "$dedup" exec --store "$store" --key termed --lease 30s -- sh -c \
    "trap 'echo TERM >> $tmp/1b.log; exit 1' TERM; echo \$\$ > $tmp/1b.pid; head -c 3000000 /dev/zero; while :; do sleep 0.1; done" \
    2>"$tmp/1b.err" &
  echo $! >"$tmp/1b.exec"
  wait $!
  echo $? >"$tmp/1b.rc"
) | stalled_reader "$tmp/1b.go" "$tmp/1b.count" &
pipeline=$!
bg_pids+=("$pipeline")
if wait_file "$tmp/1b.pid" 10 && wait_file "$tmp/1b.exec" 10; then
  # The command writes 3 MB that nobody reads: once dedup holds what it may, the
  # command's head waits in write() on its pipe (at most 10 s for that; the
  # checks below hold either way).
  sh_pid=$(cat "$tmp/1b.pid")
  for _ in $(seq 200); do
    head_pid=$(cat /proc/"$sh_pid"/task/*/children 2>/dev/null | tr ' ' '\n' | grep -m1 .)
    [[ -n "$head_pid" ]] && grep -q pipe_write "/proc/$head_pid/wchan" 2>/dev/null && break
    sleep 0.05
  done
  kill -TERM "$(cat "$tmp/1b.exec")"
  if wait_grep TERM "$tmp/1b.log" 5; then
    pass "stalled reader: SIGTERM reached the command"
  else
    fail "stalled reader: SIGTERM did not reach the command in 5 s"
  fi
  if wait_file "$tmp/1b.rc" 10; then
    [[ -e "$tmp/1b.count" ]] && fail "stalled reader: the reader read before it was let go"
    expect_rc 143 "$(cat "$tmp/1b.rc")" "stalled reader: SIGTERM of dedup exec"
  else
    fail "stalled reader: dedup exec did not exit in 10 s after SIGTERM"
  fi
else
  fail "the command of case 1b did not start: $(cat "$tmp/1b.err")"
fi
touch "$tmp/1b.go"
wait "$pipeline"

# ---- 2. flags after the command's first word are the command's -------------------
store="rocksdb:$tmp/s3"
out=$("$dedup" exec --store "$store" --key k1 echo deploying --retention 1ms --lease 5s 2>"$tmp/2.err")
expect_rc 0 $? "flags after the command"
[[ "$out" == "deploying --retention 1ms --lease 5s" ]] &&
  pass "flags after the command reach it unchanged" ||
  fail "the command printed '$out', want 'deploying --retention 1ms --lease 5s'"
# A retention of 1 ms would have let the key run again; the default (24 h) replays.
out=$("$dedup" exec --store "$store" --key k1 echo deploying --retention 1ms --lease 5s 2>/dev/null)
expect_rc 79 $? "the same run again (dedup's retention unchanged)"
[[ "$out" == "deploying --retention 1ms --lease 5s" ]] || fail "the replay printed '$out'"
until=$("$dedup" inspect --store "$store" k1 2>/dev/null | awk '$1 == "retention" { print $3 }')
if [[ -n "$until" ]] && (($(date -u -d "$until" +%s) - $(date +%s) > 23 * 3600)); then
  pass "dedup's retention is its default (until $until)"
else
  fail "the record's retention is until '$until', want about 24 h from now"
fi
out=$("$dedup" exec --store "$store" --key k2 -- echo a -- --key b 2>/dev/null)
expect_rc 0 $? "-- before the command"
[[ "$out" == "a -- --key b" ]] && pass "-- still works, and a second -- is the command's" ||
  fail "with --, the command printed '$out', want 'a -- --key b'"
out=$("$dedup" exec --store "$store" echo hi --key k3 2>"$tmp/2.err")
expect_rc 2 $? "--key written after the command"
[[ -z "$out" ]] && grep -q -- '--key is required' "$tmp/2.err" &&
  pass "--key after the command is the command's: dedup has no key and runs nothing" ||
  fail "--key after the command: output '$out', stderr $(cat "$tmp/2.err")"

# ---- 3. a rocksdb: store held by another process: 75, not 2 --------------------
store="rocksdb:$tmp/s4"
"$dedup" exec --store "$store" --key nightly -- sh -c "echo \$\$ > $tmp/3.pid; sleep 300" \
  >/dev/null 2>&1 &
holder=$!
bg_pids+=("$holder")
if wait_file "$tmp/3.pid" 10; then
  held() {  # held WHAT EXIT ERRFILE
    expect_rc 75 "$2" "$1 on a store open in another process"
    grep -q 'already open in another process' "$3" &&
      pass "$1: says the store is open in another process" ||
      fail "$1: stderr does not say why: $(cat "$3")"
  }
  "$dedup" exec --store "$store" --key nightly -- touch "$tmp/3.ran" 2>"$tmp/3a.err"
  held "dedup exec, same key" $? "$tmp/3a.err"
  "$dedup" exec --store "$store" --key other -- touch "$tmp/3.ran" 2>"$tmp/3b.err"
  held "dedup exec, another key" $? "$tmp/3b.err"
  [[ -e "$tmp/3.ran" ]] && fail "a dedup exec on a store open elsewhere ran its command"
  "$dedup" forget --store "$store" nightly 2>"$tmp/3c.err"
  held "dedup forget" $? "$tmp/3c.err"
  timeout 20 "$dedup" worker --broker 'redis://127.0.0.1:6489?stream=s&group=g' \
    --store "$store" --exec "touch $tmp/3.ran" 2>"$tmp/3d.err"
  held "dedup worker at start-up" $? "$tmp/3d.err"
  kill -TERM "$holder"
  wait "$holder"
  expect_rc 143 $? "the holder, stopped"
  "$dedup" exec --store "$store" --key nightly -- true 2>/dev/null
  expect_rc 0 $? "once the holder is gone, the key runs"
else
  fail "the holder of case 3 did not start"
fi

# A full disk: nothing happened, try again once there is space (75, not 2). The
# tmpfs lives in a mount namespace that ends with the shell below.
mkdir -p "$tmp/fs"
if unshare -m sh -c "mount -t tmpfs -o size=3m tmpfs '$tmp/fs'" 2>/dev/null; then
  unshare -m bash -c '
    mount -t tmpfs -o size=3m tmpfs "$2/fs" || exit 9
    "$1" exec --store "rocksdb:$2/fs/db" --key first -- true 2>/dev/null || exit 8
    dd if=/dev/zero of="$2/fs/fill" bs=4k 2>/dev/null
    "$1" exec --store "rocksdb:$2/fs/db" --key second -- touch "$2/full.ran" 2>"$2/full.err"
    echo $? >"$2/full.exec"
    timeout 20 "$1" worker --broker "redis://127.0.0.1:6489?stream=s&group=g" \
      --store "rocksdb:$2/fs/db" --exec true 2>>"$2/full.err"
    echo $? >"$2/full.worker"' _ "$dedup" "$tmp"
  expect_rc 75 "$(cat "$tmp/full.exec" 2>/dev/null)" "dedup exec on a full disk"
  expect_rc 75 "$(cat "$tmp/full.worker" 2>/dev/null)" "dedup worker on a full disk"
  [[ -e "$tmp/full.ran" ]] && fail "dedup exec on a full disk ran its command"
  grep -q RESOURCE_EXHAUSTED "$tmp/full.err" || fail "full disk: $(cat "$tmp/full.err")"
else
  echo "skip: no tmpfs in a mount namespace of our own (full disk case)"
fi

if ((failures > 0)); then
  echo "exec_review_test: $failures failure(s)" >&2
  exit 1
fi
echo "exec_review_test: all passed"
