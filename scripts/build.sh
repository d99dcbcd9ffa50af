#!/usr/bin/env bash
# Configures and builds dedup into ./build (or $DEDUP_BUILD_DIR) with 2 jobs.
# Extra arguments go to the CMake configure step, e.g. -DDEDUP_WITH_ASAN=ON.
set -euo pipefail
cd "$(dirname "$0")/.."
build_dir=${DEDUP_BUILD_DIR:-build}
jobs=${DEDUP_JOBS:-2}
# ccache, when installed, makes rebuilds in several checkouts cheap; nothing needs it.
launcher=()
if command -v ccache >/dev/null 2>&1; then
  launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
fi
cmake -S . -B "$build_dir" -DCMAKE_BUILD_TYPE=${DEDUP_BUILD_TYPE:-RelWithDebInfo} "${launcher[@]}" "$@" >/dev/null
cmake --build "$build_dir" -j "$jobs" ${DEDUP_TARGETS:+--target $DEDUP_TARGETS}
