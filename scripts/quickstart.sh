#!/usr/bin/env bash
# The main job from nothing: installs the Debian packages, builds, and runs
# `dedup simulate` on the embedded RocksDB store (a fresh temporary directory),
# followed by the textbook guard under the same seeded fault schedule.
# Extra arguments go to both simulations, e.g. --messages 100000 --seed 7.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/install-deps.sh
DEDUP_TARGETS=dedup_cli ./scripts/build.sh
echo
echo "== dedup simulate (dedup's guard, RocksDB store) =="
./build/src/cli/dedup simulate "$@"
echo
echo "== the textbook guard (SET NX EX / DEL) under the same faults =="
./build/src/cli/dedup simulate --pattern textbook "$@" || true
