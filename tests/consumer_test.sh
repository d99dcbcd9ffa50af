#!/usr/bin/env bash
# Installs the built library into a temporary prefix and builds + runs a tiny
# project against it with find_package(dedup), as a user would. The build's
# install_manifest.txt (the list a user's own `cmake --install build` left there to
# uninstall with) ends as it began.
set -euo pipefail
src=$1    # source tree
build=$2  # the build tree to install from
work=$(mktemp -d "${TMPDIR:-/tmp}/dedup-consumer.XXXXXX")
trap 'rm -rf "$work"' EXIT
manifest="$build/install_manifest.txt"
manifest_before=$(cat "$manifest" 2>/dev/null || echo "(none)")
# cmake --install writes the manifest: the one that was there is put back (as
# tests/install_test.sh does), or the new one removed.
[[ -e "$manifest" ]] && cp -p "$manifest" "$work/manifest.saved"
installed=0
cmake --install "$build" --prefix "$work/prefix" >/dev/null || installed=$?
if [[ -e "$work/manifest.saved" ]]; then cp -p "$work/manifest.saved" "$manifest"; else rm -f "$manifest"; fi
((installed == 0)) || exit "$installed"
cmake -S "$src/tests/consumer" -B "$work/build" -DCMAKE_PREFIX_PATH="$work/prefix" >/dev/null
cmake --build "$work/build" -j2 >/dev/null
"$work/build/consumer"
if [[ "$(cat "$manifest" 2>/dev/null || echo "(none)")" != "$manifest_before" ]]; then
  echo "FAIL the build's install_manifest.txt now lists $(head -1 "$manifest")" >&2
  exit 1
fi
