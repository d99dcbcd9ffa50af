#!/usr/bin/env bash
# Start-up checks of the Redis store (issue 13, item 8), against a real Redis:
# an evicting maxmemory-policy and appendonly no are warnings printed once with the
# fix; noeviction + appendonly yes prints none; an ACL user that may not run a
# command dedup needs is refused before the handler runs, naming the command; a
# user without CONFIG still gets the checks (they read INFO).
#
#   tests/redis_warnings_test.sh DEDUP_CLI
#
# Starts its own redis-server on 127.0.0.1:${DEDUP_WARNINGS_REDIS_PORT:-6493}
# (docs/PORTS.md) in a temporary directory and stops it by PID on exit.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
dedup=${1:?usage: redis_warnings_test.sh DEDUP_CLI}
port=${DEDUP_WARNINGS_REDIS_PORT:-6493}
source "$here/../scripts/lib/redis.sh"
tmp=$(mktemp -d)
trap 'redis_stop_all; rm -rf "$tmp"' EXIT
source "$here/../scripts/lib/check.sh"
PW=Pw0rdXyz

redis_start "$port" "$tmp/redis"
rc() { redis-cli -p "$port" "$@" >/dev/null; }
n=0
# run URI: runs `dedup exec` once with a fresh key; sets out (stderr+stdout) and code.
run() {
  n=$((n + 1))
  rm -f "$tmp/ran"
  code=0
  out=$(timeout 20 "$dedup" exec --store "$1" --key "k$n" -- touch "$tmp/ran" 2>&1) || code=$?
}
count() { grep -c -- "$1" <<<"$out" || true; }
plain="redis://127.0.0.1:$port?prefix=w:"

# 1. allkeys-lru (the default server here also has appendonly no).
rc config set maxmemory-policy allkeys-lru
run "$plain"
check "allkeys-lru: exec still runs" "0 yes" "$code $([[ -e $tmp/ran ]] && echo yes)"
check "allkeys-lru: one eviction warning" 1 "$(count 'maxmemory-policy is allkeys-lru')"
check "allkeys-lru: the fix is named" 1 "$(count 'set maxmemory-policy noeviction')"
check "appendonly no: one AOF warning" 1 "$(count 'appendonly is no')"
check "appendonly no: the fix is named" 1 "$(count 'set appendonly yes')"

# 2. volatile-* evicts our keys too (every record has a TTL).
rc config set maxmemory-policy volatile-ttl
rc config set appendonly yes
run "$plain"
check "volatile-ttl: eviction warning" 1 "$(count 'maxmemory-policy is volatile-ttl')"
check "appendonly yes: no AOF warning" 0 "$(count 'appendonly is no')"

# 3. noeviction + appendonly yes: silent.
rc config set maxmemory-policy noeviction
run "$plain"
check "noeviction + appendonly yes: runs, says nothing" "0 yes 0" \
  "$code $([[ -e $tmp/ran ]] && echo yes) $(count 'warning\|note')"

# 4. An ACL user without EVALSHA: refused at start, the handler never runs.
rc acl setuser noevalsha on ">$PW" '~*' '+@all' '-evalsha'
run "redis://noevalsha:$PW@127.0.0.1:$port?prefix=w:"
check "no EVALSHA: exec fails, handler not run" "fail no" \
  "$([[ $code != 0 ]] && echo fail) $([[ -e $tmp/ran ]] && echo yes || echo no)"
check "no EVALSHA: the error names it" 1 "$(count "user 'noevalsha' may not run EVALSHA on keys")"
check "no EVALSHA: no password printed" 0 "$(count "$PW")"

# 5. A user limited to other keys: every keyed command is named.
rc acl setuser otherkeys on ">$PW" '~other:*' '+@all'
run "redis://otherkeys:$PW@127.0.0.1:$port?prefix=w:"
check "wrong key pattern: refused, handler not run" "fail no" \
  "$([[ $code != 0 ]] && echo fail) $([[ -e $tmp/ran ]] && echo yes || echo no)"
check "wrong key pattern: names the commands and keys" 1 \
  "$(count "may not run EVALSHA, EVAL, SET, GET, PEXPIRE, PEXPIRETIME on keys 'w:\*'")"

# 6. A user without EVAL at all (the probe itself is refused).
rc acl setuser noeval on ">$PW" '~*' '+@all' '-eval'
run "redis://noeval:$PW@127.0.0.1:$port?prefix=w:"
check "no EVAL: refused naming it, handler not run" "fail 1 no" \
  "$([[ $code != 0 ]] && echo fail) $(count "user 'noeval' may not run EVAL;") $([[ -e $tmp/ran ]] && echo yes || echo no)"

# 7. A user without CONFIG: never an error, and the settings are still checked.
rc acl setuser noconfig on ">$PW" '~*' '+@all' '-config'
rc config set maxmemory-policy allkeys-random
run "redis://noconfig:$PW@127.0.0.1:$port?prefix=w:"
check "no CONFIG: runs" "0 yes" "$code $([[ -e $tmp/ran ]] && echo yes)"
check "no CONFIG: eviction still reported" 1 "$(count 'maxmemory-policy is allkeys-random')"
check "no CONFIG: no password printed" 0 "$(count "$PW")"

check_done redis_warnings_test
