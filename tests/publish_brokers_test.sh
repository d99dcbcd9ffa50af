#!/usr/bin/env bash
# `dedup publish` and broker URIs against real brokers, one broker per run:
#
#   tests/publish_brokers_test.sh DEDUP_CLI redis|nats|rabbitmq
#
#   redis     a Redis out of memory (maxmemory 1 byte, noeviction) answers XADD with
#             OOM: publish exits 75 (try again later), as on READONLY or LOADING,
#             not 2 (bad usage).
#   nats      a publish to a stream that is not there says it made it (as to Redis).
#
# Ports (docs/PORTS.md): Redis 6520, NATS 4239.
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
nats)
  source "$here/../scripts/lib/nats.sh"
  port=4239 pw='nats-s3cret'
  NATS_SERVER_ARGS=(--user dedup --pass "$pw")
  nats_start "$port" "$tmp/nats"
  # A stream that is not there is made by the publish: said on stderr, once.
  expect_rc "publish to a missing NATS stream" 0 \
    "$dedup" publish --broker "nats://dedup:$pw@127.0.0.1:$port?stream=JBOS" --id-prefix n- --count 2
  [[ "$out" == *"stream 'JBOS' did not exist; this publish created it"* ]] ||
    fail "publish made stream JBOS without saying so: $out"
  expect_rc "publish to the stream, now there" 0 \
    "$dedup" publish --broker "nats://dedup:$pw@127.0.0.1:$port?stream=JBOS" --id-prefix n- --count 2
  [[ "$out" != *"did not exist"* ]] || fail "an existing stream was said to be made: $out"
  expect_rc "--quiet says nothing, not even that" 0 \
    "$dedup" publish --broker "nats://dedup:$pw@127.0.0.1:$port?stream=QUIET" --id-prefix n- --quiet
  [[ -z "$out" ]] || fail "--quiet printed: $out"

  ;;
*)
  echo "usage: publish_brokers_test.sh DEDUP_CLI redis|nats|rabbitmq" >&2
  exit 2
  ;;
esac
check_done "publish_brokers ($broker)"
