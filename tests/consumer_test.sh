#!/usr/bin/env bash
# Installs the built library into a temporary prefix and builds + runs a tiny
# project against it with find_package(dedup), as a user would.
set -euo pipefail
src=$1    # source tree
build=$2  # the build tree to install from
work=$(mktemp -d "${TMPDIR:-/tmp}/dedup-consumer.XXXXXX")
trap 'rm -rf "$work"' EXIT
cmake --install "$build" --prefix "$work/prefix" >/dev/null
cmake -S "$src/tests/consumer" -B "$work/build" -DCMAKE_PREFIX_PATH="$work/prefix" >/dev/null
cmake --build "$work/build" -j2 >/dev/null
"$work/build/consumer"
