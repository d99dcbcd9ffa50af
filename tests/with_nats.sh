#!/usr/bin/env bash
# Runs a command beside a private NATS server with JetStream (scripts/lib/nats.sh):
#
#   tests/with_nats.sh PORT COMMAND [ARGS...]
#
# The server listens on 127.0.0.1:PORT (4230-4249, docs/PORTS.md) with its store in
# a temporary directory, and stops (by PID) when the command ends. The command sees
#   DEDUP_TEST_NATS_URI       nats://127.0.0.1:PORT
#   DEDUP_TEST_NATS_RESTART   a file: the command writes a line to it to ask for a
#                             server restart, and the line is removed once the
#                             server is back (same store directory)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
port=$1
shift
source "$here/../scripts/lib/nats.sh"
work=$(mktemp -d "${TMPDIR:-/tmp}/dedup-nats.XXXXXX")
trap 'nats_stop; rm -rf "$work"' EXIT
nats_start "$port" "$work/server"
echo "with_nats.sh: server on port $port started in ${NATS_START_MS}ms" >&2
export DEDUP_TEST_NATS_URI="nats://127.0.0.1:$port"
export DEDUP_TEST_NATS_RESTART="$work/restart"
: >"$DEDUP_TEST_NATS_RESTART"
"$@" &
cmd=$!
while kill -0 "$cmd" 2>/dev/null; do
  if [[ -s "$DEDUP_TEST_NATS_RESTART" ]]; then
    echo "with_nats.sh: restarting the server" >&2; nats_restart
    : >"$DEDUP_TEST_NATS_RESTART"
  fi
  sleep 0.05
done
wait "$cmd"
