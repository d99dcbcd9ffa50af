#!/usr/bin/env bash
# Rerun `dedup bench` and regenerate what docs/PERFORMANCE.md shows: the figures
# (docs/PERFORMANCE.figures.md, spliced into PERFORMANCE.md between its
# <!-- figures:begin/end --> markers), the raw JSON
# (docs/PERFORMANCE.json) and the plots (docs/bench_*.png).
#
#   scripts/bench.sh [BUILD_DIR=build-bench] [extra dedup bench flags, e.g. --full]
#
# Builds dedup_cli in BUILD_DIR first (-j2). Starts its own Redis on a free port in
# 127.0.0.1:6420-6429 (stopped by PID at the end) unless --redis URI is given.
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
