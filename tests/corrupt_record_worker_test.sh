#!/usr/bin/env bash
# A record no one can read, end to end (issue 13, item 5): a real Redis (port
# CORRUPT_REDIS_PORT, default 6500, docs/PORTS.md), a stream of five messages,
# and the store records of two of their keys overwritten by hand with bytes that
# are no dedup record (a string, and a hash: WRONGTYPE). One key holds a terminal
# escape sequence. `dedup worker --exec` must
#   * dead-letter both messages to jobs:dead with the store's reason, after the
#     bounded number of tries (3, BufferOptions::corrupt_record_tries), never
#     running their handler,
#   * log one line for each naming the key (escaped: no raw ESC reaches the log)
#     and the reason,
#   * process the three other messages, and leave nothing pending,
#   * leave the corrupt records as they were (nothing changed).
#
#   tests/corrupt_record_worker_test.sh DEDUP_BIN HANDLER_BIN
set -euo pipefail

dedup=$(realpath "$1")
handler=$(realpath "$2")
here=$(cd "$(dirname "$0")" && pwd)
port=${CORRUPT_REDIS_PORT:-6500}
work=$(mktemp -d "${TMPDIR:-/tmp}/dedup-corrupt.XXXXXX")
worker_pid=""
cleanup() {
  [ -n "$worker_pid" ] && kill -KILL "$worker_pid" 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT
source "$here/../scripts/lib/redis.sh"
source "$here/../scripts/lib/stream_outstanding.sh"
redis_start "$port" "$work/redis" --appendonly yes --maxmemory-policy noeviction
rcli() { redis-cli -p "$port" "$@"; }
fail() { echo "FAIL: $*"; echo "--- worker log"; cat "$work/worker.log"; exit 1; }

esc_key=$(printf 'bad\033[31m-2')
rcli XGROUP CREATE jobs workers '$' MKSTREAM >/dev/null
for key in good-1 bad-1 good-2 "$esc_key" good-3; do
  rcli XADD jobs '*' id "$key" body "payload of $key" >/dev/null
done
rcli SET "dedup:bad-1" "not a record" >/dev/null
rcli HSET "$(printf 'dedup:bad\033[31m-2')" f v >/dev/null

export LEDGER=$work/ledger WORK_MS=1
touch "$LEDGER"
"$dedup" worker --broker "redis://127.0.0.1:$port?stream=jobs&group=workers&consumer=w0" \
  --store "redis://127.0.0.1:$port?prefix=dedup:" --exec "$handler" --no-shell \
  --concurrency 2 --lease 3s --retry-delay 200ms >"$work/worker.log" 2>&1 &
worker_pid=$!

deadline=$((SECONDS + 60))
until [ "$(rcli XLEN jobs:dead)" = 2 ] && [ "$(stream_outstanding_count "$port" jobs workers)" = 0 ]; do
  [ $SECONDS -lt $deadline ] || fail "after 60 s: $(rcli XLEN jobs:dead) dead-lettered, \
$(stream_outstanding_count "$port" jobs workers) outstanding"
  kill -0 "$worker_pid" 2>/dev/null || fail "the worker exited"
  sleep 0.2
done
kill -TERM "$worker_pid"
wait "$worker_pid" || true
worker_pid=""

# Dead letters: the message's fields, the key and the store's reason.
for key in bad-1 "$esc_key"; do
  entry=$(rcli --raw XRANGE jobs:dead - + | tr '\n' '\t')
  case "$entry" in
    *"id	$key	"*) ;;
    *) fail "no dead letter for key $(printf %q "$key"): $entry" ;;
  esac
done
reasons=$(rcli --raw XRANGE jobs:dead - + | awk 'prev == "reason" { print } { prev = $0 }')
[ "$(grep -c 'corrupt record: .*unreadable on 3 tries' <<<"$reasons")" = 2 ] ||
  fail "reasons: $reasons"
grep -q 'not dedup format\|DEDUPCORRUPT' <<<"$reasons" || fail "the store's reason is missing: $reasons"
grep -q 'WRONGTYPE' <<<"$reasons" || fail "the hash's reason is missing: $reasons"

# The log: one line per dead letter naming the key, escaped.
grep -q "key 'bad-1'.*corrupt record" "$work/worker.log" || fail "no log line for bad-1"
grep -qF "key 'bad\\x1b[31m-2'" "$work/worker.log" || fail "no escaped log line for the ESC key"
if grep -q $'\033' "$work/worker.log"; then fail "a raw ESC reached the log"; fi

# The other messages ran once each; the corrupt ones never ran.
ran=$(awk '{ print $1 }' "$LEDGER" | sort | tr '\n' ' ')
[ "$ran" = "good-1 good-2 good-3 " ] || fail "handler runs: '$ran'"
[ "$(rcli XPENDING jobs workers | head -1)" = 0 ] || fail "messages left pending"
[ "$(rcli GET dedup:bad-1)" = "not a record" ] || fail "the corrupt record was changed"
grep "dead-lettered" "$work/worker.log"

# The operator's view: inspect --prefix lists the three records and both
# corrupt ones with why (it failed whole on the first it met), exits 2 as
# inspect of one of them does; forget removes them.
store="redis://127.0.0.1:$port?prefix=dedup:"
rc=0
"$dedup" inspect --store "$store" --prefix '' >"$work/inspect.out" 2>"$work/inspect.err" || rc=$?
[ "$rc" = 2 ] || fail "inspect --prefix exit $rc: $(cat "$work/inspect.out" "$work/inspect.err")"
for key in good-1 good-2 good-3; do
  grep -qx "$key" "$work/inspect.out" || fail "inspect --prefix did not list $key: $(cat "$work/inspect.out")"
done
grep -q "undecodable  record is not dedup format" "$work/inspect.out" || fail "no why for bad-1: $(cat "$work/inspect.out")"
grep -q "undecodable  the key holds a value of another type" "$work/inspect.out" ||
  fail "no why for the hash: $(cat "$work/inspect.out")"
grep -q "2 records cannot be decoded" "$work/inspect.err" || fail "inspect stderr: $(cat "$work/inspect.err")"
if grep -q $'\033' "$work/inspect.out"; then fail "a raw ESC reached inspect's output"; fi
hex=$(awk '/key_hex/ { print $2 }' "$work/inspect.out")
[ -n "$hex" ] || fail "no key_hex for the escaped key: $(cat "$work/inspect.out")"
"$dedup" inspect --store "$store" --prefix bad --json >"$work/inspect.json" 2>/dev/null || rc=$?
python3 - "$work/inspect.json" <<'PY' || fail "inspect --json: $(cat "$work/inspect.json")"
import json, sys
entries = json.load(open(sys.argv[1]))
assert sorted(e["key"] for e in entries) == ["bad\x1b[31m-2", "bad-1"], entries
assert all(e["undecodable"] for e in entries), entries
PY
# The escaped key holds a hash: no record at all but another Redis type (under a
# shared prefix it could be a broker's stream), removed only with --force.
rc=0
"$dedup" forget --store "$store" --key-hex "$hex" 2>"$work/forget.err" || rc=$?
[ "$rc" = 2 ] || fail "forget of the hash without --force: exit $rc (waiting does not cure it: not 75)"
grep -q "the key holds a hash, not a dedup record; force removes it" "$work/forget.err" ||
  fail "forget of the hash: $(cat "$work/forget.err")"
[ "$(rcli TYPE "$(printf 'dedup:bad\033[31m-2')")" = hash ] || fail "the hash was removed without --force"
"$dedup" forget --store "$store" --force --key-hex "$hex" || fail "forget --force --key-hex $hex"
# A key that holds the words of the running-lease refusal is still not a running
# lease: 2, not 75 (those words were looked for anywhere in the message).
lookalike='x": its lease is still running (y'
rcli HSET "dedup:$lookalike" a b >/dev/null
rc=0
"$dedup" forget --store "$store" "$lookalike" 2>"$work/forget.err" || rc=$?
[ "$rc" = 2 ] || fail "forget of a hash whose key quotes the lease refusal: exit $rc, not 2: $(cat "$work/forget.err")"
"$dedup" forget --store "$store" --force "$lookalike" || fail "forget --force of the look-alike key"
"$dedup" forget --store "$store" bad-1 || fail "forget bad-1"
# Keys no call can name (the prefix alone, over 1024 bytes) are not listed: no
# claim meets them and no forget could remove them.
rcli SET "dedup:" stray >/dev/null
rcli SET "dedup:$(printf 'L%.0s' $(seq 2000))" stray >/dev/null
"$dedup" inspect --store "$store" --prefix '' >"$work/inspect.out" 2>&1 ||
  fail "inspect --prefix after the forgets: $(cat "$work/inspect.out")"
if grep -q undecodable "$work/inspect.out"; then fail "a key no call can name was listed"; fi
# A record whose expiry was removed by hand (PERSIST) is kept for ever: "never".
"$dedup" exec --store "$store" --key persist-1 -- true >/dev/null || fail "exec persist-1"
rcli PERSIST dedup:persist-1 >/dev/null
out=$("$dedup" inspect --store "$store" persist-1) || fail "inspect persist-1: $out"
grep -q "retention  until never" <<<"$out" || fail "a record without expiry: $out"
out=$("$dedup" inspect --store "$store" persist-1 --json)
grep -q '"retention_deadline":"never"' <<<"$out" || fail "a record without expiry, JSON: $out"
echo "PASS: 2 corrupt records dead-lettered with the reason and logged; 3 messages processed; listed and forgotten"
