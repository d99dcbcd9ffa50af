#!/usr/bin/env bash
# Runs the examples of docs/REDIS_PROTOCOL.md and compares their output with what
# the document says, so that the page cannot drift from the scripts.
#
#   tests/redis_protocol_doc_test.sh DEDUP_CLI LUA_DIR [DOC]
#
# An example is a ```console block right after a line `<!-- doc-test -->`: lines
# starting with "$ " are commands, the lines up to the next command or the end of
# the block are that command's stdout (trailing empty lines ignored). Commands run
# in bash, one after another, in LUA_DIR (the build's runnable scripts, so that
# "$(cat claim.lua)" works), with `redis-cli` and `dedup` meaning this test's server
# and DEDUP_CLI; "127.0.0.1:6379" in a command becomes this test's server.
#
# Starts its own redis-server on 127.0.0.1:${DEDUP_PROTOCOL_DOC_TEST_PORT:-6508}
# (docs/PORTS.md) in a temporary directory and stops it by PID on exit.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
cli_bin=$(realpath "$1")
lua_dir=$(realpath "$2")
doc=$(realpath "${3:-$here/../docs/REDIS_PROTOCOL.md}")
if grep -q -- '--@dedup-include' "$lua_dir"/*.lua; then
  echo "redis_protocol_doc_test.sh: $lua_dir holds templates; pass the build's src/stores/redis/lua" >&2
  exit 2
fi
port=${DEDUP_PROTOCOL_DOC_TEST_PORT:-6508}
source "$here/../scripts/lib/redis.sh"
source "$here/../scripts/lib/check.sh"
tmp=$(mktemp -d)
trap 'redis_stop_all; rm -rf "$tmp"' EXIT
redis_start "$port" "$tmp/redis"

cat >"$tmp/prelude.sh" <<EOF
redis-cli() { command redis-cli -h 127.0.0.1 -p $port "\$@"; }
dedup() { "$cli_bin" "\$@"; }
cd "$lua_dir"
EOF

examples=0
cmd=""
expected=""
run_pending() {
  [[ -n "$cmd" ]] || return 0
  local actual run=${cmd//127.0.0.1:6379/127.0.0.1:$port}
  examples=$((examples + 1))
  actual=$(bash -c "source '$tmp/prelude.sh'; $run" 2>"$tmp/stderr") || true
  check "$cmd" "$(printf '%s' "$expected")" "$actual"
  if [[ "$(printf '%s' "$expected")" != "$actual" ]]; then sed 's/^/  stderr:   /' "$tmp/stderr"; fi
  cmd=""
  expected=""
}

armed=0
in_block=0
lineno=0
while IFS= read -r line; do
  lineno=$((lineno + 1))
  if ((in_block)); then
    if [[ "$line" == '```' ]]; then
      run_pending
      in_block=0
    elif [[ "$line" == '$ '* ]]; then
      run_pending
      cmd=${line#\$ }
    elif [[ -n "$cmd" ]]; then
      expected+="$line"$'\n'
    else
      fail "$doc:$lineno: output before any command in a doc-test block"
    fi
    continue
  fi
  if ((armed)); then
    armed=0
    if [[ "$line" == '```console' ]]; then in_block=1; continue; fi
    fail "$doc:$lineno: <!-- doc-test --> is not followed by a \`\`\`console block"
  fi
  [[ "$line" == '<!-- doc-test -->' ]] && armed=1
done <"$doc"
((in_block)) && fail "$doc: a doc-test block is not closed"
((examples > 0)) || fail "no doc-test example found in $doc"
echo "$examples example command(s) run"
check_done redis_protocol_doc_test
