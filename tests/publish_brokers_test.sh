#!/usr/bin/env bash
# `dedup publish` and broker URIs against real brokers, one broker per run:
#
#   tests/publish_brokers_test.sh DEDUP_CLI redis|nats|rabbitmq
#
#   redis     a Redis out of memory (maxmemory 1 byte, noeviction) answers XADD with
#             OOM: publish exits 75 (try again later), as on READONLY or LOADING,
#             not 2 (bad usage).
#
# Ports (docs/PORTS.md): Redis 6520.
# Servers run in a temporary directory and are stopped by PID at exit.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
dedup=${1:?usage: publish_brokers_test.sh DEDUP_CLI redis|nats|rabbitmq}
broker=${2:?usage: publish_brokers_test.sh DEDUP_CLI redis|nats|rabbitmq}
source "$here/../scripts/lib/check.sh"
tmp=$(mktemp -d)
# The servers stop (by PID) before their directories go: this trap alone.
_REDIS_TRAP_SET=1 _NATS_TRAP_SET=1 _RABBITMQ_TRAP_SET=1
cleanup() {
  [[ -n "$(type -t redis_stop_all)" ]] && redis_stop_all
  [[ -n "$(type -t nats_stop)" ]] && nats_stop
  [[ -n "$(type -t rabbitmq_stop)" ]] && rabbitmq_stop
  rm -rf "$tmp"
}
trap cleanup EXIT
ok() { echo "ok   $*"; }
# expect_rc NAME RC CMD...: runs CMD, checks its exit code; output in $out.
expect_rc() {
  local name=$1 want=$2; shift 2
  set +e; out=$(timeout 60 "$@" 2>&1); local rc=$?; set -e
  [[ $rc -eq $want ]] && ok "$name (rc $rc)" || fail "$name: rc $rc, want $want: $out"
}

case $broker in
redis)
  source "$here/../scripts/lib/redis.sh"
  port=6520
  redis_start "$port" "$tmp/redis" --maxmemory 1 --maxmemory-policy noeviction
  expect_rc "publish to a Redis out of memory is 'try again later'" 75 \
    "$dedup" publish --broker "redis://127.0.0.1:$port?stream=oom" --field id=1
  [[ "$out" == *OOM* ]] || fail "the OOM reply is not shown: $out"
  ;;
*)
  echo "usage: publish_brokers_test.sh DEDUP_CLI redis|nats|rabbitmq" >&2
  exit 2
  ;;
esac
check_done "publish_brokers ($broker)"
