#!/usr/bin/env bash
# Runs every Redis test against real servers: the conformance suite on a single
# Redis and on a 3-primary Redis Cluster, the fault tests, and the redis-cli
# protocol test. CI-friendly: loopback only, temporary directories, servers stopped
# by PID on exit.
#
#   tests/redis_ci.sh BUILD_DIR        e.g. tests/redis_ci.sh build-redis
#
# Ports: 6390 (single Redis for the conformance suite), 7100-7102 (cluster), and
# those redis_store_test / redis_protocol_test.sh start themselves (6391-6395,
# 7105-7107).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
build=$(cd "${1:?usage: $0 BUILD_DIR}" && pwd)
source "$here/../scripts/lib/redis.sh"
tmp=$(mktemp -d)
trap 'redis_stop_all; rm -rf "$tmp"' EXIT

redis_start 6390 "$tmp/single"
redis_cluster_start 7100 "$tmp/cluster" 3
export DEDUP_TEST_REDIS_URI=redis://127.0.0.1:6390
export DEDUP_TEST_REDIS_CLUSTER_URI=redis+cluster://127.0.0.1:7100,127.0.0.1:7101,127.0.0.1:7102

"$build/tests/store_conformance_test" --gtest_brief=1 --gtest_filter='*/redis:*/redis_cluster'
"$build/tests/redis_store_test" --gtest_brief=1
bash "$here/redis_protocol_test.sh" "$build/src/stores/redis/lua" | tail -1
echo "redis_ci.sh: all Redis tests passed"
