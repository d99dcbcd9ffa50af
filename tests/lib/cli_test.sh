#!/usr/bin/env bash
# What the CLI's shell tests that start a Redis and a worker of their own
# (cli_hardening_test.sh, secrets_hardening_test.sh) start with. Source it once
# here is set (it sources scripts/lib/redis.sh, for redis_start, and
# scripts/lib/check.sh, for check, fail and check_done):
#
#   set -euo pipefail
#   here=$(cd "$(dirname "$0")" && pwd)
#   # shellcheck source=lib/cli_test.sh
#   source "$here/lib/cli_test.sh"
#   cli_test_begin   # $tmp; everything stopped at exit
#   ...
#   "$dedup" worker ... & worker_pid=$!   # killed at exit unless the test stopped it (worker_pid=)

# shellcheck source=../../scripts/lib/redis.sh
source "$here/../scripts/lib/redis.sh"
# shellcheck source=../../scripts/lib/check.sh
source "$here/../scripts/lib/check.sh"

# cli_test_begin: sets tmp (a new directory) and worker_pid (empty). At exit
# (cli_test_cleanup) the worker in worker_pid is killed, every Redis started
# through redis.sh stopped and tmp removed.
cli_test_begin() {
  tmp=$(mktemp -d)
  worker_pid=
  trap cli_test_cleanup EXIT
}

cli_test_cleanup() {
  [[ -n "$worker_pid" ]] && kill -9 "$worker_pid" 2>/dev/null || true
  redis_stop_all
  rm -rf "$tmp"
}
