#!/usr/bin/env bash
# --handler-cgroup (src/consumer/handler_cgroup.h): a handler's grandchild that
# left the handler's process group (setsid) dies with the handler, and with a
# SIGKILLed owner, for `dedup exec` and `dedup worker --exec`.
#
#   tests/handler_cgroup_test.sh build/src/cli/dedup
#
# The grandchild writes its pid, sleeps 2 s and then writes a marker file.
#   a. the handler exits at once: the grandchild is dead within 1 s, no marker;
#   b. the owner is SIGKILLed while the handler runs: the same;
# plus: no child cgroup is left behind, a bad or empty DIR is refused (exit 2,
# the flag named), and empty stale children of gone owners are removed at start. The test makes its own cgroup (a unique directory under the
# cgroup2 mount found in /proc/self/mountinfo, or under this process's own
# cgroup) and removes it; without a writable cgroup2 it is skipped (exit 77).
# HANDLER_CGROUP_TEST_FLAG=0 runs the same checks without the flag: they fail
# (the documented limit of process groups), which shows that the test can fail.
# The worker part needs redis-server (127.0.0.1:6473, docs/PORTS.md).
set -uo pipefail
dedup=$(realpath "$1")
here=$(cd "$(dirname "$0")" && pwd)
port=${HANDLER_CGROUP_REDIS_PORT:-6473}
use_flag=${HANDLER_CGROUP_TEST_FLAG:-1}
# shellcheck source=../scripts/lib/redis.sh
source "$here/../scripts/lib/redis.sh"

skip() { echo "SKIP: $*"; exit 77; }
# The cgroup2 mount point (field 5 of the line whose type after " - " is cgroup2).
mnt=$(awk '{ for (i = 7; i <= NF; i++) if ($i == "-") { if ($(i + 1) == "cgroup2") print $5; break } }' \
  /proc/self/mountinfo | head -1)
[ -n "$mnt" ] || skip "no cgroup2 file system is mounted"
own=$(sed -n 's/^0:://p' /proc/self/cgroup)
cg=""
for parent in "$mnt${own%/}" "$mnt"; do
  d="$parent/dedup-handler-cgroup-test-$$-$RANDOM"
  if mkdir "$d" 2>/dev/null; then cg=$d; break; fi
done
[ -n "$cg" ] || skip "cannot make a cgroup under $mnt (not root, and no delegated cgroup)"
echo "test cgroup: $cg"

tmp=$(mktemp -d /tmp/dedup_cgroup_test.XXXXXX)
owner_pid=""
cleanup() {
  [ -n "$owner_pid" ] && kill -KILL "$owner_pid" 2>/dev/null
  redis_stop_all
  # Anything a failed run left: killed, then the cgroups removed (deepest first).
  for d in $(find "$cg" -mindepth 1 -type d 2>/dev/null | sort -r) "$cg"; do
    [ -f "$d/cgroup.kill" ] && echo 1 >"$d/cgroup.kill" 2>/dev/null
  done
  for p in $(cat "$tmp"/*.gc 2>/dev/null); do kill -KILL "$p" 2>/dev/null; done
  sleep 0.1
  for d in $(find "$cg" -mindepth 1 -type d 2>/dev/null | sort -r) "$cg"; do
    rmdir "$d" 2>/dev/null
  done
  [ -d "$cg" ] && echo "warning: could not remove $cg" >&2
  rm -rf "$tmp"
}
trap cleanup EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }
flag=()
if [ "$use_flag" = 1 ]; then flag=(--handler-cgroup "$cg"); else echo "(without --handler-cgroup)"; fi

# The handler: starts the grandchild in a session of its own, then exits at
# once (key quick-*) or sleeps (key hold-*).
cat >"$tmp/handler.sh" <<EOF
#!/bin/sh
[ -t 0 ] || cat >/dev/null
setsid sh -c 'echo \$\$ >"$tmp/\$DEDUP_KEY.gc"; sleep 2; touch "$tmp/\$DEDUP_KEY.marker"' \
  </dev/null >/dev/null 2>&1 &
case "\$DEDUP_KEY" in hold-*) sleep 30 ;; *) while [ ! -s "$tmp/\$DEDUP_KEY.gc" ]; do sleep 0.01; done ;; esac
EOF
chmod +x "$tmp/handler.sh"

# alive PID: running, not a zombie.
alive() { [ -e "/proc/$1" ] && ! grep -q '^[^)]*) Z' "/proc/$1/stat" 2>/dev/null; }
wait_file() {  # wait_file FILE SECONDS
  for _ in $(seq 1 $(($2 * 20))); do [ -s "$1" ] && return 0; sleep 0.05; done
  return 1
}
# The grandchild of key $1 is dead within 1 s, and stays without effect.
expect_dead() {  # expect_dead KEY WHAT
  local gc
  gc=$(cat "$tmp/$1.gc")
  for _ in $(seq 1 20); do alive "$gc" || break; sleep 0.05; done
  alive "$gc" && fail "$2: the grandchild (pid $gc, setsid) still runs 1 s later"
  echo "ok: $2: the grandchild (pid $gc) is dead"
}
check_markers() {  # after every grandchild's 2 s: no marker
  sleep 2.2
  local m
  m=$(ls "$tmp"/*.marker 2>/dev/null)
  [ -z "$m" ] || fail "a grandchild ran to its effect: $m"
  echo "ok: no grandchild wrote its marker"
}

# a. dedup exec, the handler exits.
DEDUP_KEY=quick-exec "$dedup" exec --store "rocksdb:$tmp/db" --key quick-exec "${flag[@]}" \
  -- "$tmp/handler.sh" </dev/null || fail "dedup exec exited $?"
expect_dead quick-exec "exec, handler exited"

# b. dedup exec SIGKILLed while its handler runs.
DEDUP_KEY=hold-exec "$dedup" exec --store "rocksdb:$tmp/db" --key hold-exec "${flag[@]}" \
  -- "$tmp/handler.sh" </dev/null &
owner_pid=$!
wait_file "$tmp/hold-exec.gc" 10 || fail "the exec handler did not start its grandchild"
kill -KILL "$owner_pid"; wait "$owner_pid" 2>/dev/null; owner_pid=""
expect_dead hold-exec "exec SIGKILLed"

# The same with `dedup worker --exec` on a Redis stream.
if [ "${HANDLER_CGROUP_WORKER:-1}" != 1 ]; then
  echo "this build has no Redis Streams broker: the worker part is not run"
elif command -v redis-server >/dev/null; then
  redis_start "$port" "$tmp/redis" >/dev/null || fail "redis-server did not start on $port"
  for kind in quick hold; do
    "$dedup" publish --broker "redis://127.0.0.1:$port?stream=$kind" --count 1 \
      --id-prefix "$kind-worker-" --quiet || fail "publish"
    "$dedup" worker --broker "redis://127.0.0.1:$port?stream=$kind&group=g&consumer=w" \
      --store "rocksdb:$tmp/db-$kind" --exec "$tmp/handler.sh" --no-shell "${flag[@]}" \
      --summary-interval 0 >"$tmp/worker-$kind.log" 2>&1 &
    owner_pid=$!
    key=$kind-worker-0
    wait_file "$tmp/$key.gc" 10 || fail "the worker's handler did not start ($(cat "$tmp/worker-$kind.log"))"
    if [ "$kind" = quick ]; then
      # a. the handler exits; its message is acked once the handler is over.
      for _ in $(seq 1 100); do
        [ "$(redis-cli -p "$port" XPENDING quick g 2>/dev/null | head -1)" = 0 ] && break
        sleep 0.05
      done
      expect_dead "$key" "worker, handler exited"
      kill -TERM "$owner_pid"; wait "$owner_pid"; owner_pid=""
    else
      # b. the worker SIGKILLed while its handler runs.
      kill -KILL "$owner_pid"; wait "$owner_pid" 2>/dev/null; owner_pid=""
      expect_dead "$key" "worker SIGKILLed"
    fi
  done
else
  echo "no redis-server: the worker part is not run"
fi
check_markers

if [ "$use_flag" = 1 ]; then
  # Every handler's cgroup is removed (the SIGKILL cases by the watchdog).
  for _ in $(seq 1 40); do
    left=$(find "$cg" -mindepth 1 -maxdepth 1 -type d -name 'dedup-*')
    [ -z "$left" ] && break
    sleep 0.05
  done
  [ -z "$left" ] || fail "handler cgroups left behind: $left"
  echo "ok: no handler cgroup left in $cg"

  # Refused at start-up, naming the flag: not cgroup2, missing, and a cgroup the
  # process itself is in (cgroup v2: no internal processes).
  mkdir "$cg/inside"
  for dir in "$tmp" "$cg/missing" "$cg/inside"; do
    out=$(sh -c 'echo $$ >"$1/inside/cgroup.procs" && shift && exec "$@"' sh "$cg" \
      "$dedup" exec --store "rocksdb:$tmp/db" --key refused --handler-cgroup "$dir" -- true 2>&1)
    rc=$?
    [ "$rc" = 2 ] || fail "--handler-cgroup $dir: exit $rc, want 2 ($out)"
    case "$out" in *--handler-cgroup*) ;; *) fail "--handler-cgroup $dir: the error does not name the flag: $out" ;; esac
    echo "ok: refused: $out"
  done
  out=$("$dedup" worker --broker "redis://127.0.0.1:1?stream=s" --store memory: --exec true \
    --handler-cgroup "$tmp" 2>&1)
  rc=$?
  [ "$rc" = 2 ] && [[ "$out" == *--handler-cgroup* ]] || fail "worker --handler-cgroup $tmp: exit $rc: $out"
  echo "ok: refused: $out"

  # An empty DIR (an unset $VAR) is refused, not read as "no containment".
  for cmd in exec worker; do
    if [ "$cmd" = exec ]; then
      out=$("$dedup" exec --store "rocksdb:$tmp/db" --key empty --handler-cgroup "" -- true 2>&1)
    else
      out=$("$dedup" worker --broker "redis://127.0.0.1:1?stream=s" --store memory: --exec true \
        --handler-cgroup "" 2>&1)
    fi
    rc=$?
    [ "$rc" = 2 ] && [[ "$out" == *--handler-cgroup* ]] ||
      fail "$cmd --handler-cgroup '': exit $rc, want 2 naming the flag: $out"
    echo "ok: refused: $out"
  done

  # Stale children of owners that are gone: the empty ones are removed at
  # start; a populated one is neither killed nor removed (not ours to kill).
  dead=$(sh -c 'echo $$')  # a pid that has exited
  mkdir "$cg/dedup-$dead-7" "$cg/dedup-$dead-1-00000000000000ab-3" "$cg/dedup-$dead-9"
  sleep 30 &
  sleeper=$!
  echo "$sleeper" >"$cg/dedup-$dead-9/cgroup.procs" || fail "cannot move a process into $cg/dedup-$dead-9"
  "$dedup" exec --store "rocksdb:$tmp/db" --key stale --handler-cgroup "$cg/" -- true ||
    fail "dedup exec with stale cgroups exited $?"
  for d in "dedup-$dead-7" "dedup-$dead-1-00000000000000ab-3"; do
    [ -d "$cg/$d" ] && fail "stale empty cgroup $cg/$d was not removed"
  done
  alive "$sleeper" || fail "the process in another owner's cgroup was killed"
  [ -d "$cg/dedup-$dead-9" ] || fail "a populated cgroup of another owner was removed"
  kill -KILL "$sleeper"; wait "$sleeper" 2>/dev/null
  for _ in $(seq 1 20); do rmdir "$cg/dedup-$dead-9" 2>/dev/null && break; sleep 0.05; done
  echo "ok: stale empty cgroups removed, a populated one left alone"
fi
echo PASS
