#!/usr/bin/env bash
# Installs every Debian package dedup needs to build, test and benchmark.
# Idempotent: packages already present are left alone. Run as root (or with sudo).
set -euo pipefail

packages=(
  build-essential cmake pkg-config
  librocksdb-dev          # the embedded, durable default store
  libhiredis-dev          # the Redis / Redis Cluster store
  libabsl-dev             # flat_hash_map for the memory store and the RocksDB index
  libssl-dev              # SHA-256 for payload fingerprints and content-hash keys
  libcli11-dev            # the dedup command line
  libfmt-dev              # formatting in the CLI
  nlohmann-json3-dev      # --json output, the serve API
  libcpp-httplib-dev      # dedup serve: HTTP API, proxy, web view, /metrics (src/serve/)
  curl chromium           # serve tests: a shell client, and the page in a headless browser
  libgtest-dev            # tests (GoogleTest; GMock is not used)
  libbenchmark-dev        # microbenchmarks in bench/
  redis-server redis-tools # real servers for store and worker tests
  libpq-dev               # the PostgreSQL store (libpq: the client library PostgreSQL ships)
  postgresql              # a real PostgreSQL server for its store and chaos tests
  gnuplot-nox             # plots in docs/
  bc                      # scripts/bench_exec_spawn.sh (docs/PERFORMANCE.md, "Handler spawn") does its arithmetic with it
  python3                 # the chaos tests' ledger checkers, the serve tests' clients
  python3-yaml            # tests/serve_openapi_statuses.py reads docs/openapi.yaml
  librabbitmq-dev         # the RabbitMQ source (rabbitmq-c), src/brokers/rabbitmq
  rabbitmq-server         # a real RabbitMQ node for its source test and chaos test
  libnats-dev             # the NATS JetStream source (nats.c), src/brokers/nats
  nats-server             # a real NATS server with JetStream for its tests
)

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  echo "install-deps: all ${#packages[@]} packages present"
  exit 0
fi
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -q
$SUDO apt-get install -y -q --no-install-recommends "${missing[@]}"
