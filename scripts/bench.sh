#!/usr/bin/env bash
# Rerun `dedup bench` and regenerate what docs/PERFORMANCE.md shows: the figures
# (docs/PERFORMANCE.figures.md, spliced into PERFORMANCE.md between its
# <!-- figures:begin/end --> markers), the raw JSON
# (docs/PERFORMANCE.json) and the plots (docs/bench_*.png).
#
#   scripts/bench.sh [BUILD_DIR=build-bench] [extra dedup bench flags, e.g. --full]
#
# Builds dedup_cli in BUILD_DIR first (-j2). Starts its own Redis on a free port in
# 127.0.0.1:6420-6429 (stopped by PID at the end) unless --redis URI is given, and
# its own PostgreSQL (5444), RabbitMQ (5688) and NATS JetStream (4238) for the
# phases that need them, unless DEDUP_BENCH_*_URI names them (docs/PORTS.md).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-$root/build-bench}
shift || true
cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build "$build" -j2 --target dedup_cli >/dev/null
tmp=$(mktemp)
trap 'rm -f "$tmp"' EXIT
# The PostgreSQL phase's server (scripts/lib/postgres.sh, 127.0.0.1:5444), unless given.
if [[ -z "${DEDUP_BENCH_POSTGRES_URI:-}" ]] && grep -q '^DEDUP_WITH_POSTGRES:BOOL=ON' "$build/CMakeCache.txt"; then
  # shellcheck source=lib/postgres.sh
  source "$root/scripts/lib/postgres.sh"
  trap 'rm -f "$tmp"; pg_stop_all' EXIT
  pg_start 5444 >/dev/null && export DEDUP_BENCH_POSTGRES_URI=$PG_LAST_URI
fi
# The broker_consumers phase's RabbitMQ node (127.0.0.1:5688, scripts/lib/rabbitmq.sh)
# and NATS JetStream server (127.0.0.1:4238, scripts/lib/nats.sh), unless given and
# when this build has the source and the machine the server: stopped by PID at exit
# (the libraries' own traps are replaced by one that also removes their directory).
broker_dir=""
cleanup_brokers() {
  declare -F rabbitmq_stop >/dev/null && rabbitmq_stop
  declare -F nats_stop >/dev/null && nats_stop
  [[ -n "$broker_dir" ]] && rm -rf "$broker_dir"
  return 0
}
if [[ -z "${DEDUP_BENCH_AMQP_URI:-}" ]] && grep -q '^DEDUP_WITH_RABBITMQ:BOOL=ON' "$build/CMakeCache.txt" &&
  [[ -x /usr/lib/rabbitmq/bin/rabbitmq-server || -n "${RABBITMQ_HOME_BIN:-}" ]]; then
  broker_dir=${broker_dir:-$(mktemp -d "${TMPDIR:-/tmp}/dedup-bench-brokers.XXXXXX")}
  # shellcheck source=lib/rabbitmq.sh
  source "$root/scripts/lib/rabbitmq.sh"
  _RABBITMQ_TRAP_SET=1
  trap "$(trap -p EXIT | sed -E "s/^trap -- '(.*)' EXIT$/\1/"); cleanup_brokers" EXIT
  if rabbitmq_start 5688 "$broker_dir/rabbitmq"; then
    export DEDUP_BENCH_AMQP_URI="amqp://guest:guest@127.0.0.1:5688/"
  else
    echo "bench.sh: RabbitMQ did not start; broker_consumers runs without it" >&2
  fi
fi
if [[ -z "${DEDUP_BENCH_NATS_URI:-}" ]] && grep -q '^DEDUP_WITH_NATS:BOOL=ON' "$build/CMakeCache.txt" &&
  command -v "${NATS_SERVER_BIN:-nats-server}" >/dev/null; then
  if [[ -z "$broker_dir" ]]; then
    broker_dir=$(mktemp -d "${TMPDIR:-/tmp}/dedup-bench-brokers.XXXXXX")
    trap "$(trap -p EXIT | sed -E "s/^trap -- '(.*)' EXIT$/\1/"); cleanup_brokers" EXIT
  fi
  # shellcheck source=lib/nats.sh
  source "$root/scripts/lib/nats.sh"
  _NATS_TRAP_SET=1
  if nats_start 4238 "$broker_dir/nats"; then
    export DEDUP_BENCH_NATS_URI="nats://127.0.0.1:4238"
  else
    echo "bench.sh: NATS did not start; broker_consumers runs without it" >&2
  fi
fi
"$build/src/cli/dedup" bench --plots "$root/docs" --markdown "$root/docs/PERFORMANCE.figures.md" \
  --json "$@" >"$tmp" || rc=$?
cat "$tmp" >"$root/docs/PERFORMANCE.json"
# Splice the figures into PERFORMANCE.md between its markers.
page="$root/docs/PERFORMANCE.md"
if [[ -f "$page" ]] && grep -q '<!-- figures:begin -->' "$page"; then
  awk -v figs="$root/docs/PERFORMANCE.figures.md" '
    /<!-- figures:begin -->/ { print; while ((getline l < figs) > 0) print l; skip = 1; next }
    /<!-- figures:end -->/ { skip = 0 }
    !skip { print }' "$page" >"$page.tmp" && mv "$page.tmp" "$page"
fi
echo "wrote docs/PERFORMANCE.figures.md, docs/PERFORMANCE.json, docs/bench_*.png (exit ${rc:-0})"
exit "${rc:-0}"
