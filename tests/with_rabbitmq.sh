#!/usr/bin/env bash
# Runs a command beside a private RabbitMQ node (scripts/lib/rabbitmq.sh):
#
#   tests/with_rabbitmq.sh PORT COMMAND [ARGS...]
#
# The node listens on 127.0.0.1:PORT (5680-5689, docs/PORTS.md) with its data in a
# temporary directory, and stops (by PID) when the command ends. The command sees
#   DEDUP_TEST_AMQP_URI       amqp://guest:guest@127.0.0.1:PORT/
#   DEDUP_TEST_RABBITMQCTL    a script that runs rabbitmqctl against this node
#                             (e.g. `close_all_connections why`, to cut connections)
#   DEDUP_TEST_RABBITMQ_EVAL  a script that evaluates its one argument, an Erlang
#                             expression, on this node in milliseconds and prints
#                             {ok, Result} (scripts/lib/rabbitmq.sh, rabbitmq_eval)
#   DEDUP_TEST_RABBITMQ_LOG   this node's log file (warnings and above)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
port=$1
shift
source "$here/../scripts/lib/rabbitmq.sh"
work=$(mktemp -d "${TMPDIR:-/tmp}/dedup-rmq.XXXXXX")
trap 'rabbitmq_stop; rm -rf "$work"' EXIT
rabbitmq_start "$port" "$work/node"
echo "with_rabbitmq.sh: node on port $port started in ${RABBITMQ_START_SECONDS}s" >&2
cat >"$work/ctl" <<CTL
#!/usr/bin/env bash
source "$here/../scripts/lib/rabbitmq.sh"
RABBITMQ_PORT=$port RABBITMQ_DIR="$work/node"
rabbitmqctl_node "\$@"
CTL
chmod +x "$work/ctl"
cat >"$work/eval" <<EVAL
#!/usr/bin/env bash
source "$here/../scripts/lib/rabbitmq.sh"
RABBITMQ_PORT=$port RABBITMQ_DIR="$work/node"
rabbitmq_eval "\$1"
EVAL
chmod +x "$work/eval"
export DEDUP_TEST_AMQP_URI="amqp://guest:guest@127.0.0.1:$port/"
export DEDUP_TEST_RABBITMQCTL="$work/ctl"
export DEDUP_TEST_RABBITMQ_EVAL="$work/eval"
export DEDUP_TEST_RABBITMQ_LOG="$work/node/log/dedup-$port@localhost.log"
"$@"
