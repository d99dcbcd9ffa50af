#!/usr/bin/env bash
# The command line under hostile content and bad flags (issue 13, items 1, 7, 9):
#   * inspect/forget never create a store at a mistyped path;
#   * inspect --json never aborts on a key that is not UTF-8 (documented encoding:
#     "key" printable, "key_hex" exact), and is ASCII only;
#   * keys printed to a terminal or a log are escaped (no ESC byte reaches it);
#   * a NUL in a message key is refused (dead-lettered with the reason), never cut
#     into DEDUP_KEY;
#   * numeric flags reject empty, non-numeric, negative and out-of-range values;
#     an unknown subcommand is named;
#   * forget refuses a key whose lease is running unless --force (item 5), and a
#     forced forget keeps the key's fences increasing.
#
#   tests/cli_hardening_test.sh DEDUP_CLI
#
# Starts its own redis-server on 127.0.0.1:${DEDUP_CLI_HARDENING_REDIS_PORT:-6492}
# (docs/PORTS.md) in a temporary directory and stops it, and the worker it starts,
# by PID on exit. The serve cases are refused before serve binds 127.0.0.1:8139
# (docs/PORTS.md); one that were not would hold it only until its 5 s timeout.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
dedup=${1:?usage: cli_hardening_test.sh DEDUP_CLI}
port=${DEDUP_CLI_HARDENING_REDIS_PORT:-6492}
# shellcheck source=lib/cli_test.sh
source "$here/lib/cli_test.sh"
cli_test_begin  # $tmp; Redis and the worker (worker_pid) stopped at exit
ok() { echo "ok   $*"; }
# expect_rc NAME RC CMD...: runs CMD, checks its exit code; output in $out.
expect_rc() {
  local name=$1 want=$2; shift 2
  set +e; out=$("$@" 2>&1); local rc=$?; set -e
  [[ $rc -eq $want ]] && ok "$name (rc $rc)" || fail "$name: rc $rc, want $want: $out"
}

# 1. Admin commands on a mistyped path create nothing.
expect_rc "inspect of a missing store is an error" 2 "$dedup" inspect --store "rocksdb:$tmp/typo" k
[[ "$out" == *NOT_FOUND* ]] || fail "inspect missing: $out"
expect_rc "forget of a missing store is an error" 2 "$dedup" forget --store "rocksdb:$tmp/typo" k
[[ ! -e "$tmp/typo" ]] && ok "no directory was created" || fail "$tmp/typo was created"

# 2. Keys that are not UTF-8, and keys that carry terminal escapes.
db="rocksdb:$tmp/db"
"$dedup" exec --store "$db" --key $'m-\xff\xfe' -- true
"$dedup" exec --store "$db" --key $'m-\e[2J\e[31mred\a' -- true
"$dedup" exec --store "$db" --key $'m-\xe2\x80\xaeevil' -- true
"$dedup" exec --store "$db" --key 'm-plain' -- true
expect_rc "inspect --json with a non-UTF-8 key" 0 "$dedup" inspect --store "$db" --prefix m- --json
json=$out
if python3 - "$json" <<'PY'
import json, sys
text = sys.argv[1]
assert text.isascii(), "output is not ASCII"
recs = {bytes.fromhex(r["key_hex"]) if "key_hex" in r else r["key"].encode(): r
        for r in json.loads(text)}
assert b"m-\xff\xfe" in recs, recs.keys()
assert recs[b"m-\xff\xfe"]["key"] == "m-\\xff\\xfe", recs[b"m-\xff\xfe"]
assert "key_hex" not in recs[b"m-plain"]
assert b"m-\x1b[2J\x1b[31mred\x07" in recs
assert "m-\u202eevil".encode() in recs
PY
then ok "inspect --json: valid JSON, ASCII only, key_hex exact for non-UTF-8 keys"; else fail "inspect --json: $json"; fi
# A key shown escaped cannot be typed back: its exact bytes are shown (key_hex),
# and inspect and forget take them (--key-hex). Before, such a key could not be
# forgotten from the command line.
expect_rc "inspect --key-hex of a non-UTF-8 key" 0 "$dedup" inspect --store "$db" --key-hex 6d2dfffe
[[ "$out" == *"key_hex    6d2dfffe"* ]] || fail "inspect --key-hex: $out"
expect_rc "KEY and --key-hex together are refused" 2 "$dedup" inspect --store "$db" m-plain --key-hex 6d
expect_rc "--key-hex that is not hex is refused" 2 "$dedup" forget --store "$db" --key-hex 6d2
[[ "$out" == *"two a byte"* ]] || fail "forget --key-hex 6d2: $out"
expect_rc "an empty KEY is named as empty" 2 "$dedup" inspect --store "$db" ''
[[ "$out" == *"KEY is empty"* ]] || fail "inspect '': $out"
expect_rc "--limit without --prefix is refused" 2 "$dedup" inspect --store "$db" --limit 5 m-plain
[[ "$out" == *"--limit is for --prefix"* ]] || fail "inspect --limit: $out"
"$dedup" exec --store "$db" --key $'m-gone' -- true
expect_rc "forget --key-hex of a key with a control byte" 0 "$dedup" forget --store "$db" --key-hex 6d2d01676f6e65
expect_rc "... and it is gone" 1 "$dedup" inspect --store "$db" --key-hex 6d2d01676f6e65
# A user:password whose '@' was left out read as "an IPv6 address must be in
# brackets"; sslmode= (empty) was libpq's default without a word.
expect_rc "postgres://u:PW127.0.0.1:5432 names the missing '@'" 2 \
  "$dedup" exec --store 'postgres://shop:Hunter2x127.0.0.1:5432/shop' --key k -- true
[[ "$out" == *"needs its '@' before the host"* && "$out" != *Hunter2x* ]] || fail "missing @: $out"
expect_rc "postgres sslmode= is refused" 2 "$dedup" exec --store 'postgres://u@127.0.0.1:5432/d?sslmode=' --key k -- true
[[ "$out" == *"sslmode= is empty"* ]] || fail "sslmode=: $out"
expect_rc "inspect text output" 0 "$dedup" inspect --store "$db" --prefix m-
if grep -q $'\e' <<<"$out" || grep -q $'\a' <<<"$out" || grep -q $'\xe2\x80\xae' <<<"$out"; then
  fail "a terminal control reached the screen: $(printf %q "$out")"
else
  ok "inspect escapes keys for the terminal"
fi
[[ "$out" == *'m-\x1b[2J\x1b[31mred\x07'* && "$out" == *'m-\xff\xfe'* ]] && ok "escapes are \\xNN" ||
  fail "escape form: $(printf %q "$out")"

# 3. A NUL in a message key: refused, dead-lettered with the reason, never run.
redis_start "$port" "$tmp/redis"
redis_pid=$REDIS_LAST_PID
rcli() { redis-cli -h 127.0.0.1 -p "$port" "$@"; }
rs="redis://127.0.0.1:$port?prefix=t:"
"$dedup" exec --store "$rs" --key $'busy-\e[31m' --lease 1h -- sleep 3 &
busy_pid=$!
sleep 1
expect_rc "exec of a running key says so" 75 "$dedup" exec --store "$rs" --key $'busy-\e[31m' -- true
wait "$busy_pid"
[[ "$out" != *$'\e'* && "$out" == *'\x1b'* ]] && ok "exec prints the key escaped" || fail "exec: $(printf %q "$out")"
# run_worker STREAM DEAD RAN LOG: a worker on STREAM (memory store; its handler
# appends "$DEDUP_KEY|" to RAN) until STREAM:dead holds DEAD entries and RAN is
# not empty, at most 15 s; then SIGKILLed.
run_worker() {
  local stream=$1 dead=$2 ran=$3 log=$4
  "$dedup" worker --broker "redis://127.0.0.1:$port?stream=$stream&group=g&dead=$stream:dead" \
    --store "memory:" --exec "printf '%s|' \"\$DEDUP_KEY\" >>$ran" --retry-delay 100ms \
    >"$log" 2>&1 &
  worker_pid=$!
  for _ in $(seq 150); do
    [[ "$(rcli XLEN "$stream:dead")" -ge "$dead" && -s "$ran" ]] && break
    sleep 0.1
  done
  kill -0 "$worker_pid" 2>/dev/null || echo "worker exited early ($(wait "$worker_pid"; echo rc $?)): $(cat "$log")"
  { kill -9 "$worker_pid"; wait "$worker_pid"; } 2>/dev/null || true
  worker_pid=
}
printf 'XADD jobs * id "a\\x00b"\nXADD jobs * id "a"\n' | rcli >/dev/null
run_worker jobs 1 "$tmp/ran" "$tmp/worker.log"
[[ "$(cat "$tmp/ran" 2>/dev/null)" == "a|" ]] && ok "the handler ran for 'a' only, never for a cut 'a\\0b'" ||
  fail "handler ran for: $(cat "$tmp/ran" 2>/dev/null | od -c | head -2)"
[[ "$(rcli XLEN jobs:dead)" == 1 ]] && ok "the NUL key was dead-lettered" || fail "dead: $(rcli XLEN jobs:dead)"
grep -q 'NUL byte' "$tmp/worker.log" && grep -q "key 'a\\\\x00b'" "$tmp/worker.log" &&
  ok "the log names the reason and the escaped key" || fail "worker log: $(cat "$tmp/worker.log")"

# 3b. An entry the handler's JSON on stdin cannot carry as it is: refused
#     (dead-lettered with the reason), never run. The key was made from the first
#     of two "id" fields and the JSON held the last (three keys ran "order 42"
#     from `dedup publish --id-prefix m- --field id=42`); a repeated other field
#     kept its last value; bytes that are not UTF-8 became U+FFFD.
printf 'XADD jobs2 * id dup-1 id dup-2\nXADD jobs2 * id rep other 1 other 2\nXADD jobs2 * id bin data "\\xff\\xfe"\nXADD jobs2 * id ok-1 data plain\n' |
  rcli >/dev/null
run_worker jobs2 3 "$tmp/ran2" "$tmp/worker2.log"
[[ "$(cat "$tmp/ran2" 2>/dev/null)" == "ok-1|" ]] && ok "the handler ran for ok-1 only" ||
  fail "handler ran for: $(cat "$tmp/ran2" 2>/dev/null)"
[[ "$(rcli XLEN jobs2:dead)" == 3 ]] && ok "three entries dead-lettered" || fail "dead: $(rcli XLEN jobs2:dead)"
grep -q "key field 'id' given twice" "$tmp/worker2.log" && grep -q "'other' is given twice" "$tmp/worker2.log" &&
  grep -q "'data' holds bytes that are not UTF-8" "$tmp/worker2.log" &&
  ok "the log names each reason" || fail "worker log: $(cat "$tmp/worker2.log")"
# 3c. Why a message is retried is in the worker's log: a handler that asked for a
#     retry (exit 75) was retried for ever with only "retries=N" to show. At most
#     one such line a second, with how many were left out.
rcli XADD jobs4 '*' id again >/dev/null
"$dedup" worker --broker "redis://127.0.0.1:$port?stream=jobs4&group=g" --store "memory:" \
  --exec 'exit 75' --retry-delay 50ms >"$tmp/worker4.log" 2>&1 &
worker_pid=$!
sleep 3
{ kill -9 "$worker_pid"; wait "$worker_pid"; } 2>/dev/null || true
worker_pid=
lines=$(grep -c "retry of .* (key 'again') in 50 ms: handler exit 75" "$tmp/worker4.log" || true)
[[ $lines -ge 1 && $lines -le 4 ]] && ok "the retry's reason is logged, $lines lines in 3 s" ||
  fail "retry lines: $lines: $(head -c 2000 "$tmp/worker4.log")"
grep -q "more retries since the last such line, not shown" "$tmp/worker4.log" &&
  ok "the lines say how many retries they left out" || fail "no count of left-out retries: $(head -c 2000 "$tmp/worker4.log")"
expect_rc "publish --field id=42 beside --id-prefix (which sets id): refused" 2 \
  "$dedup" publish --broker "redis://127.0.0.1:$port?stream=jobs3" --id-prefix m- --field id=42
[[ "$out" == *"'id' is given twice"* ]] || fail "publish: $out"
expect_rc "publish --field a=1 --field a=2: refused" 2 \
  "$dedup" publish --broker "redis://127.0.0.1:$port?stream=jobs3" --field a=1 --field a=2
[[ "$(rcli EXISTS jobs3)" == 0 ]] && ok "nothing was published" || fail "jobs3 exists"

# 3c. inspect and forget on a store that cannot be reached: 75 (try again later),
#     as exec and worker answer it, not 2 (bad usage).
expect_rc "inspect of an unreachable store: 75" 75 "$dedup" inspect --store redis://127.0.0.1:1 k
expect_rc "inspect --prefix of an unreachable store: 75" 75 "$dedup" inspect --store redis://127.0.0.1:1 --prefix k
expect_rc "forget of an unreachable store: 75" 75 "$dedup" forget --store redis://127.0.0.1:1 k

# 4. Numeric flags: negative and out-of-range values are refused, never wrapped.
for args in "inspect --store $db --prefix m- --limit -1" \
            "inspect --store $db --prefix m- --limit 0" \
            "publish --broker redis://127.0.0.1:$port?stream=x --id-prefix m --count 0" \
            "publish --broker redis://127.0.0.1:$port?stream=x --id-prefix m --count 1000000000000" \
            "publish --broker redis://127.0.0.1:$port?stream=x --id-prefix m --count -1" \
            "publish --broker redis://127.0.0.1:$port?stream=x --id-prefix m --seed -1" \
            "publish --broker redis://127.0.0.1:$port?stream=x --id-prefix m --start -5" \
            "exec --store $db --key k --max-attempts -1 -- true" \
            "exec --store $db --key k --lease -5s -- true" \
            "worker --broker redis://127.0.0.1:$port?stream=x --store memory: --exec true --max-attempts -1" \
            "worker --broker redis://127.0.0.1:$port?stream=x --store memory: --exec true --concurrency 0" \
            "worker --broker redis://127.0.0.1:$port?stream=x --store memory: --exec true --drain-timeout -1s" \
            "worker --broker redis://127.0.0.1:$port?stream=x --store memory: --exec true --drain-timeout 2d" \
            "worker --broker redis://127.0.0.1:$port?stream=x --store memory: --exec true --prefetch -2" \
            "worker --broker redis://127.0.0.1:$port?stream=x --store memory: --exec true --corrupt-record-tries 0" \
            "worker --broker redis://127.0.0.1:$port?stream=x --store memory: --exec true --corrupt-record-tries 1001" \
            "simulate --seed -1" "simulate --messages -5" "bench --workers -2 --no-redis" \
            "simulate --timeout 0" "simulate --visibility-timeout 0" "simulate --textbook-ttl 0" \
            "bench --round 0 --no-redis"; do
  read -ra argv <<<"$args"
  set +e; out=$(timeout 20 "$dedup" "${argv[@]}" 2>&1); rc=$?; set -e
  [[ $rc -eq 2 ]] && ok "refused: dedup $args" || fail "dedup $args: rc $rc: $(head -c 300 <<<"$out")"
done
# An empty or non-numeric value of any numeric flag of any command is refused,
# naming the flag: CLI11 read '' as 0 (serve --max-connections '' was the default,
# --threads '' no thread), "nan" passed a 0-to-1 range, "010" was octal 8. The
# flags are those --help shows as INT, UINT, FLOAT or FRACTION, so a new one is
# checked too. An accepted value fails later (nothing listens on 127.0.0.1:1) or
# runs until the timeout (serve, on a port of its own choosing).
declare -A base=(
  [inspect]="--store memory: k" [exec]="--store memory: --key k"
  [publish]="--broker redis://127.0.0.1:1?stream=x"
  [worker]="--broker redis://127.0.0.1:1?stream=x --store memory: --exec true"
  [simulate]="" [bench]="--no-redis --no-rocksdb" [serve]="--store memory: --listen 127.0.0.1:0"
)
numeric=0 numeric_failed=$failures
for cmd in "${!base[@]}"; do
  # "  --max-connections INT=0  ...", "  --concurrency INT:INT in [1 - 1024]=4": a
  # flag and its type name.
  flags=$("$dedup" "$cmd" --help |
            grep -oE -- '^ +(-[a-z], )?--[a-z-]+ (INT|UINT|FLOAT|FRACTION)\b' |
            awk '{print $(NF-1) " " $NF}') || true
  while read -r flag type; do
    [[ -n "$flag" ]] || continue
    numeric=$((numeric + 1))
    read -ra b <<<"${base[$cmd]}"
    bad=('' abc 12x 0x10); [[ $type == FLOAT || $type == FRACTION ]] && bad=('' abc nan inf 1e)
    for v in "${bad[@]}"; do
      tail=(); [[ $cmd == exec ]] && tail=(-- true)
      set +e
      out=$(timeout 10 "$dedup" "$cmd" "${b[@]}" "$flag" "$v" "${tail[@]}" 2>&1 </dev/null); rc=$?
      set -e
      [[ $rc -eq 2 && "$out" == *"$flag: must be"* ]] ||
        fail "dedup $cmd $flag '$v' ($type): rc $rc: $(head -c 300 <<<"$out")"
    done
  done <<<"$flags"
done
if ((numeric < 25)); then
  fail "only $numeric numeric flags found in --help"
elif ((failures == numeric_failed)); then
  ok "$numeric numeric flags refuse an empty or non-numeric value, naming the flag"
fi
expect_rc "serve --max-connections '' is refused" 2 timeout 5 "$dedup" serve --store memory: \
  --listen 127.0.0.1:0 --max-connections ''
[[ "$out" == *"--max-connections: must be a whole number, got an empty value"* ]] ||
  fail "serve --max-connections '': $out"
# serve --listen's port is decimal digits: std::stoi alone took "+8130" and " 8130".
for l in '127.0.0.1:+8130' '127.0.0.1: 8130' '127.0.0.1:8130x' '127.0.0.1:-1' \
  '127.0.0.1:65536' '127.0.0.1:0x10'; do
  expect_rc "serve --listen '$l' is refused" 2 timeout 5 "$dedup" serve --store memory: --listen "$l"
  [[ "$out" == *"--listen: bad port in '$l'"* ]] || fail "serve --listen '$l': $out"
done
# A comma-separated list with an empty item is refused, naming the flag: CLI11
# dropped the item (`bench --workers 1,,2` ran at 1 and 2, `--phase consumer,`
# as if the comma were not there).
for args in "--workers 1,,2" "--workers=1," "--workers ,2" "--workers 1 2,,8" \
  "--phase throughput,,consumer" "--phase=consumer,"; do
  read -ra argv <<<"$args"
  expect_rc "bench $args is refused" 2 timeout 20 "$dedup" bench --no-redis --no-rocksdb \
    --quick --no-progress "${argv[@]}"
  [[ "$out" == *"--"*": an empty item in '"* ]] || fail "bench $args: $out"
done
redis-cli -h 127.0.0.1 -p "$port" DEL octal >/dev/null
"$dedup" publish --broker "redis://127.0.0.1:$port?stream=octal" --id-prefix o --count 010 --quiet
check "publish --count 010 is ten messages (decimal, not octal)" 10 \
  "$(redis-cli -h 127.0.0.1 -p "$port" XLEN octal)"
# An empty --exec would run `/bin/sh -c ''`, exit 0 for every message: each one
# recorded done and acked with nothing run. Refused, with or without a shell.
for cmd in '' '   ' $'\t'; do
  for shell in "" --no-shell; do
    expect_rc "an empty --exec is refused ${shell:-(shell)}" 2 "$dedup" worker \
      --broker "redis://127.0.0.1:$port?stream=x" --store memory: --exec "$cmd" $shell
    [[ "$out" == *"empty command"* ]] || fail "empty --exec: $out"
  done
done
# Through the shell, a command that runs nothing but redirections (an unset
# "$HANDLER" in front of them) recorded every message done with nothing run, and
# one the shell cannot parse failed every message (dead-lettered): both refused
# at start (exec17).
for cmd in '>>/tmp/dedup-nothing.log 2>&1' '2>&1' '# comment' ' &' '> out'; do
  expect_rc "--exec '$cmd' (runs nothing) is refused" 2 "$dedup" worker \
    --broker "redis://127.0.0.1:$port?stream=x" --store memory: --exec "$cmd"
  [[ "$out" == *"runs nothing"* ]] || fail "--exec '$cmd': $out"
done
expect_rc "--exec with a syntax error is refused" 2 "$dedup" worker \
  --broker "redis://127.0.0.1:$port?stream=x" --store memory: --exec './handle.sh "$DEDUP_KEY'
[[ "$out" == *"the shell cannot parse the command"*"Unterminated quoted string"* ]] ||
  fail "--exec with a syntax error: $out"
# A first word that is an unset variable: the shell ran the next word as the
# command, or (alone) nothing, exit 0: every message recorded done, nothing run.
expect_rc "--exec '\$UNSET_HANDLER' is refused at start" 2 env -u DEDUP_UNSET_HANDLER "$dedup" worker \
  --broker "redis://127.0.0.1:$port?stream=x" --store memory: --exec '$DEDUP_UNSET_HANDLER'
[[ "$out" == *'$DEDUP_UNSET_HANDLER, is unset'*"record every message as done"* ]] ||
  fail "--exec '\$DEDUP_UNSET_HANDLER': $out"
# A duration above the library's limit is a usage error at parse time, naming the
# flag, even when the broker cannot be reached (port 1: refused). Before, it was
# found only by Consumer::Make, after the broker was opened: exit 75 (a service
# manager restarts it forever) and a message without the flag's name.
for args in "--prefetch-time 2m" "--drain-timeout 2d"; do
  read -ra extra <<<"$args"
  expect_rc "out of range $args is refused before the broker is opened" 2 "$dedup" worker \
    --broker "redis://127.0.0.1:1?stream=x" --store memory: --exec true "${extra[@]}"
  [[ "$out" == *"${extra[0]} must be at most"* ]] || fail "$args: the flag is not named: $out"
done
# --textbook-ttl: SET ... EX takes whole seconds, and 0 or 500ms silently became
# 1 s (1.5s became 2 s). Refused at parse time, naming the flag (port 1: nothing starts).
for ttl in 0 0s 500ms 1500ms; do
  expect_rc "--textbook-ttl $ttl is refused" 2 timeout 20 "$dedup" worker \
    --broker "redis://127.0.0.1:1?stream=x" --pattern textbook --exec true --textbook-ttl "$ttl"
  [[ "$out" == *"--textbook-ttl must be a whole number of seconds"* ]] || fail "--textbook-ttl $ttl: $out"
done
# The textbook flags were silently ignored without --pattern textbook.
for flag in "--textbook-ttl 5s" "--textbook-redis redis://127.0.0.1:1"; do
  read -ra fl <<<"$flag"
  expect_rc "$flag without --pattern textbook is refused" 2 timeout 20 "$dedup" worker \
    --broker "redis://127.0.0.1:1?stream=x" --store memory: --exec true "${fl[@]}"
  [[ "$out" == *"${fl[0]} needs --pattern textbook"* ]] || fail "$flag: $out"
done
# --textbook-redis on a redis:// broker was ignored too (the stream's Redis keeps the keys).
# The Buffer's flags given with --pattern textbook were ignored: a comparison
# run with another lease or store than the one asked for.
for flag in "--store memory:" "--lease 5s" "--max-attempts 3" "--keep-output" "--fingerprint"; do
  read -ra fl <<<"$flag"
  expect_rc "$flag with --pattern textbook is refused" 2 timeout 20 "$dedup" worker \
    --broker "redis://127.0.0.1:1?stream=x" --pattern textbook --exec true "${fl[@]}"
  [[ "$out" == *"${fl[0]} is not used by --pattern textbook"* ]] || fail "$flag with textbook: $out"
done
expect_rc "--textbook-redis on a redis:// broker is refused" 2 timeout 20 "$dedup" worker \
  --broker "redis://127.0.0.1:1?stream=x" --pattern textbook --exec true \
  --textbook-redis redis://127.0.0.1:1
[[ "$out" == *"--textbook-redis is for amqp://"* ]] || fail "textbook-redis on redis://: $out"
# Its URI's pool=, pipeline=, spin= and redis+cluster:// were silently ignored:
# refused, naming the option. timeout= is honoured (a good one passes these
# checks and fails later, on the unreachable broker, with another exit code).
for uri in "redis://127.0.0.1:1?pool=2" "redis://127.0.0.1:1?pipeline=off" \
             "redis://127.0.0.1:1?spin=50" "redis+cluster://127.0.0.1:1"; do
  expect_rc "--textbook-redis $uri is refused" 2 timeout 20 "$dedup" worker \
    --broker "amqp://guest:guest@127.0.0.1:1/%2f?queue=q" --pattern textbook --exec true \
    --textbook-redis "$uri"
  [[ ( "$out" == *--textbook-redis:* && "$out" == *"not supported by --pattern textbook"* ) ||
     ( "$out" == *"--textbook-redis"*"unknown parameter '"*"(known: timeout, password_file)"* ) ]] ||
    fail "--textbook-redis $uri: $out"
done
set +e
out=$(timeout 20 "$dedup" worker --broker "amqp://guest:guest@127.0.0.1:1/%2f?queue=q" \
  --pattern textbook --exec true --textbook-redis "redis://127.0.0.1:1?timeout=300ms" 2>&1)
rc=$?; set -e
[[ "$out" != *--textbook-redis* ]] && ok "--textbook-redis ...?timeout=300ms passes its checks (rc $rc)" ||
  fail "timeout= refused: rc $rc: $out"
expect_rc "an unknown subcommand is an error" 2 "$dedup" frobnicate --x
[[ "$out" == *frobnicate* ]] && ok "and it is named" || fail "unknown subcommand: $out"
# Proxy-mode flags without --proxy were ignored (serve started without them).
for flag in "--lease 5s" "--retention 1h" "--key-prefix p:" "--max-response-bytes 100"; do
  read -ra fl <<<"$flag"
  expect_rc "serve $flag without --proxy is refused" 2 timeout 5 "$dedup" serve --store memory: \
    --listen 127.0.0.1:0 "${fl[@]}"
  [[ "$out" == *--proxy* ]] || fail "serve $flag: $out"
done
# --proxy values that are not an application's address, each named for what is
# wrong: a query was "the port is not a number", host:PORT without http:// was
# "scheme '127.0.0.1' is not http", and serve's own address was accepted (every
# request forwarded to itself until no connection thread was left).
for case in "http://localhost:3000?x=1|without a path, query" \
            "http://127.0.0.1:3000/api|without a path, query" \
            "127.0.0.1:3000|has no scheme" \
            "http://127.0.0.1:8139|own --listen address" \
            "http://localhost:8139|own --listen address"; do
  IFS='|' read -r value want <<<"$case"
  expect_rc "serve --proxy $value is refused" 2 timeout 5 "$dedup" serve --store memory: \
    --listen 127.0.0.1:8139 --proxy "$value"
  [[ "$out" == *"$want"* ]] || fail "serve --proxy $value: want '$want': $out"
done
printf 'tok-%s\n' 0123456789abcdef >"$tmp/token16"
expect_rc "serve --proxy to its own port on 0.0.0.0 is refused" 2 timeout 5 "$dedup" serve \
  --store memory: --listen 0.0.0.0:8139 --auth-token-file "$tmp/token16" --proxy http://127.0.0.1:8139
[[ "$out" == *"own --listen address"* ]] || fail "0.0.0.0 self-proxy: $out"
# A --auth-token-file given as "" was read as no token file at all.
expect_rc 'serve --auth-token-file "" is refused' 2 timeout 5 "$dedup" serve --store memory: \
  --listen 127.0.0.1:8139 --auth-token-file ""
[[ "$out" == *--auth-token-file* && "$out" == *empty* ]] || fail 'auth-token-file "": '"$out"
# A port that is not a number is hidden (it may be a password) and the message says
# why, instead of showing '***' as if the user had typed a secret there.
expect_rc "redis://127.0.0.1:abc is refused" 2 "$dedup" exec --store "redis://127.0.0.1:abc" --key k -- true
[[ "$out" == *"not shown"* && "$out" != *abc* ]] || fail "redis port abc: $out"
# dedup publish: an empty --id-prefix was "give --field NAME=VALUE or --id-prefix";
# --start near 2^64 wrapped to id=x-0; a key over 1024 bytes was published for
# every worker to dead-letter. Each refused before connecting (nothing on port 1).
expect_rc "publish --id-prefix '' is refused" 2 "$dedup" publish \
  --broker "redis://127.0.0.1:1?stream=s" --id-prefix '' --count 2
[[ "$out" == *"--id-prefix is empty"* ]] || fail "publish --id-prefix '': $out"
expect_rc "publish --start past 2^64 is refused" 2 "$dedup" publish \
  --broker "redis://127.0.0.1:1?stream=s" --id-prefix x- --start 18446744073709551615 --count 2
[[ "$out" == *"runs past"* ]] || fail "publish --start overflow: $out"
expect_rc "publish of a 1025-byte key is refused" 2 "$dedup" publish \
  --broker "redis://127.0.0.1:1?stream=s" --field "id=$(head -c 1025 /dev/zero | tr '\0' k)"
[[ "$out" == *"would be 1025 bytes"* ]] || fail "publish 1025-byte key: $out"
# --textbook-ttl without --pattern textbook was accepted by simulate (and ignored).
expect_rc "simulate --textbook-ttl without --pattern textbook is refused" 2 \
  "$dedup" simulate --messages 10 --textbook-ttl 5s
[[ "$out" == *"needs --pattern textbook"* ]] || fail "simulate --textbook-ttl: $out"
# A lease under 1s ("30ms" typed for "30s") runs, with a warning saying so.
expect_rc "exec --lease 30ms runs" 0 "$dedup" exec --store memory: --key k --lease 30ms -- true
[[ "$out" == *"warning: --lease 30ms is under 1s"* ]] || fail "exec --lease 30ms: no warning: $out"
expect_rc "exec --lease 30s gives no such warning" 0 "$dedup" exec --store memory: --key k --lease 30s -- true
[[ "$out" != *"--lease"* ]] || fail "exec --lease 30s warned: $out"
# A %00 in a RocksDB path: the file system cut the path at the NUL and created the
# directory before it.
expect_rc "a NUL in a rocksdb: path is refused" 2 "$dedup" exec --store "rocksdb:$tmp/nul%00x" --key k -- true
[[ "$out" == *NUL* && ! -e "$tmp/nul" ]] && ok "named, and nothing was created" || fail "NUL path: $out"

# 5. forget of a key whose lease is running (issue 13, item 5): refused without
#    --force (exit 75, the key escaped, the time left named, --force suggested);
#    forced, the key reads absent and its next run gets a higher fence.
run_key=$'run-\e[1m'
"$dedup" exec --store "$rs" --key "$run_key" --lease 1h -- sleep 30 &
run_pid=$!
for _ in $(seq 100); do
  "$dedup" inspect --store "$rs" "$run_key" >/dev/null 2>&1 && break
  sleep 0.1
done
expect_rc "forget of a running lease is refused" 75 "$dedup" forget --store "$rs" "$run_key"
[[ "$out" == *'run-\x1b[1m'* && "$out" != *$'\e'* && "$out" == *left* && "$out" == *--force* ]] &&
  ok "the refusal names the escaped key, the time left and --force" || fail "refusal: $(printf %q "$out")"
expect_rc "the refused forget changed nothing" 0 "$dedup" inspect --store "$rs" "$run_key"
[[ "$out" == *in_progress* ]] || fail "after the refusal: $out"
fence_forgotten=$(sed -n 's/^  fence *//p' <<<"$out")
expect_rc "forget --force removes it" 0 "$dedup" forget --force --store "$rs" "$run_key"
expect_rc "then the key reads absent" 1 "$dedup" inspect --store "$rs" "$run_key"
expect_rc "a second run of the key starts" 0 "$dedup" exec --store "$rs" --key "$run_key" -- true
expect_rc "and completes" 0 "$dedup" inspect --store "$rs" "$run_key"
fence_next=$(sed -n 's/^  fence *//p' <<<"$out")
[[ -n "$fence_forgotten" && "$fence_next" -gt "$fence_forgotten" ]] &&
  ok "its fence $fence_next is above the forgotten run's $fence_forgotten" ||
  fail "fences: forgotten '$fence_forgotten', next '$fence_next': $out"
kill -TERM "$run_pid" 2>/dev/null || true
wait "$run_pid" 2>/dev/null || true
expect_rc "the forgotten run recorded nothing over the new one" 0 "$dedup" inspect --store "$rs" "$run_key"
[[ "$(sed -n 's/^  fence *//p' <<<"$out")" == "$fence_next" && "$out" == *completed* ]] &&
  ok "the new run's record stands" || fail "after the forgotten run stopped: $out"

# 6. A newcomer's mistakes: each one refused at start, naming the problem.
# A duration flag without a unit: "--retention 86400" read as 86,400 ms (86 s, and
# every repeat after that ran the work again), "--lease 30" as a 30 ms lease.
# A flag needs a unit (0 needs none); URIs keep "a bare number is milliseconds".
for case in "--lease|worker --broker redis://127.0.0.1:1?stream=x --store memory: --exec true --lease 30" \
            "--retention|worker --broker redis://127.0.0.1:1?stream=x --store memory: --exec true --retention 86400" \
            "--drain-timeout|worker --broker redis://127.0.0.1:1?stream=x --store memory: --exec true --drain-timeout 1.5" \
            "--retention|exec --store memory: --key k --retention 3600 -- true" \
            "--lease|simulate --lease 200 --messages 10"; do
  flag=${case%%|*} args=${case#*|}
  read -ra argv <<<"$args"
  expect_rc "a duration without a unit is refused: dedup $args" 2 timeout 20 "$dedup" "${argv[@]}"
  [[ "$out" == *"$flag"* && "$out" == *"unit"* ]] || fail "no unit, $flag: the flag or the fix is not named: $out"
done
# The fix offered must itself be accepted: ".5" was told "write e.g. .5s", and
# ".5s" is not a duration; "5." was told "5.s".
for v in .5 5.; do
  expect_rc "--lease $v is refused" 2 "$dedup" exec --store memory: --key k --lease "$v" -- true
  fix=$(sed -n "s/.*write e\.g\. \([^ ]*\).*/\1/p" <<<"$out")
  if [[ -n "$fix" ]]; then
    expect_rc "and the fix it offers ($fix) is accepted" 0 "$dedup" exec --store memory: --key k --lease "$fix" -- true
  else
    [[ "$out" == *"is not a duration"* ]] && ok "--lease $v: not a duration" || fail "--lease $v: $out"
  fi
done
set +e
out=$(timeout 20 "$dedup" worker --broker "redis://127.0.0.1:1?stream=x" --store memory: --exec true \
  --summary-interval 0 --drain-timeout 0 2>&1); rc=$?
set -e
[[ $rc -eq 75 && "$out" != *unit* ]] && ok "--summary-interval 0 --drain-timeout 0 pass (then the broker is down: rc 75)" ||
  fail "bare 0: rc $rc: $out"
# A handler path that cannot run: through /bin/sh it exited 126 / 127 at every
# message, each one released and retried for ever with nothing in the log.
printf '#!/bin/sh\nexit 0\n' >"$tmp/handler-noexec.sh"
chmod 644 "$tmp/handler-noexec.sh"
for cmd in "$tmp/handler-noexec.sh" "$tmp/handler-missing.sh --flag" "$tmp"; do
  for shell in "" --no-shell; do
    expect_rc "--exec '$cmd' ${shell:-(shell)} is refused at start" 2 timeout 20 "$dedup" worker \
      --broker "redis://127.0.0.1:1?stream=x" --store memory: --exec "$cmd" $shell
    [[ "$out" == *--exec* && "$out" == *"${cmd%% *}"* ]] || fail "--exec '$cmd': not named: $out"
  done
done
# A script whose #! line names an interpreter that is not there (or "/bin/sh\r",
# a file saved with CRLF line ends): execve fails ENOENT, the shell exits 127 at
# every message, retried for ever; it passed the check at start.
printf '#!/nonexistent/interp\nexit 0\n' >"$tmp/handler-nointerp.sh"
printf '#!/bin/sh\r\nexit 0\r\n' >"$tmp/handler-crlf.sh"
chmod 755 "$tmp/handler-nointerp.sh" "$tmp/handler-crlf.sh"
for cmd in "$tmp/handler-nointerp.sh" "$tmp/handler-crlf.sh --flag"; do
  for shell in "" --no-shell; do
    expect_rc "--exec '$cmd' ${shell:-(shell)}: its interpreter is missing, refused at start" 2 timeout 20 \
      "$dedup" worker --broker "redis://127.0.0.1:1?stream=x" --store memory: --exec "$cmd" $shell
    [[ "$out" == *interpreter* && "$out" == *"${cmd%% *}"* ]] || fail "--exec '$cmd': interpreter not named: $out"
  done
done
printf '#! /bin/sh -e\nexit 0\n' >"$tmp/handler-args.sh"
printf '#!/usr/bin/env sh\nexit 0\n' >"$tmp/handler-env.sh"
printf 'exit 0\n' >"$tmp/handler-noshebang.sh"
chmod 755 "$tmp/handler-args.sh" "$tmp/handler-env.sh" "$tmp/handler-noshebang.sh"
for cmd in "$tmp/handler-args.sh" "$tmp/handler-env.sh" "$tmp/handler-noshebang.sh"; do
  expect_rc "--exec '$cmd' (a working script) passes (then the broker is down)" 75 timeout 20 \
    "$dedup" worker --broker "redis://127.0.0.1:1?stream=x" --store memory: --exec "$cmd"
done
# What only the shell can judge is left to it: a builtin, a variable, a pipeline.
for cmd in 'exit 0' 'X=1 true' 'true | cat' '"$HOME/../../bin/true"'; do
  set +e
  out=$(timeout 20 "$dedup" worker --broker "redis://127.0.0.1:1?stream=x" --store memory: --exec "$cmd" 2>&1); rc=$?
  set -e
  [[ $rc -eq 75 ]] && ok "--exec '$cmd' goes to the shell (rc 75: the broker is down)" || fail "--exec '$cmd': rc $rc: $out"
done

# A mistyped Redis URI is answered with the form to write, readable: the hint
# "expected redis://HOST:PORT" went through the password filter and came out as
# "redis://HOST:***" (PORT taken for a password), hiding the very fix.
for uri in "redis:/127.0.0.1:6379?stream=x" "redis://?stream=x"; do
  expect_rc "--broker '$uri' is refused" 2 timeout 20 "$dedup" worker --broker "$uri" --store memory: --exec true
  [[ "$out" == *"expected 'redis://HOST:6379'"* && "$out" != *'***'* ]] || fail "--broker '$uri': the hint is not readable: $out"
done
expect_rc "--store redis:/127.0.0.1:6379 is refused" 2 "$dedup" inspect --store "redis:/127.0.0.1:6379" k
[[ "$out" == *"expected 'redis://HOST:6379'"* && "$out" != *'***'* ]] || fail "--store redis:/: the hint is not readable: $out"

# A store the user may not read is not "no such directory": inspect as another
# user said "NOT_FOUND: ... no store here (no such directory)" of a store that is
# there, behind a directory it could not enter, and "the directory has no RocksDB
# database" of one it could not list.
# Root may enter any directory: it runs the commands as nobody. Any other user
# closes its own directories to itself (it was skipped then, and CI may not be root).
mkdir -p "$tmp/locked" "$tmp/open"
"$dedup" exec --store "rocksdb:$tmp/locked/db" --key k -- true >/dev/null
"$dedup" exec --store "rocksdb:$tmp/open/db" --key k -- true >/dev/null
if [[ $(id -u) -eq 0 ]]; then
  chmod 711 "$tmp"
  chmod 700 "$tmp/locked" "$tmp/open/db"
  chmod 755 "$tmp/open"
  as_other=(setpriv --reuid=nobody --regid=nogroup --clear-groups)
else
  chmod 000 "$tmp/locked"  # may not enter
  chmod 300 "$tmp/open/db"  # may enter, may not list
  as_other=()
fi
for db in "$tmp/locked/db" "$tmp/open/db"; do
  expect_rc "inspect of a store it may not read ($db)" 2 "${as_other[@]}" "$dedup" inspect --store "rocksdb:$db" k
  [[ "$out" == *PERMISSION_DENIED* && "$out" == *"Permission denied"* && "$out" != *"no store here"* ]] ||
    fail "unreadable store $db: $out"
  expect_rc "exec on a store it may not read ($db)" 2 "${as_other[@]}" "$dedup" exec --store "rocksdb:$db" --key k2 -- true
  [[ "$out" == *PERMISSION_DENIED* ]] || fail "exec, unreadable store $db: $out"
done
chmod 700 "$tmp" "$tmp/locked" "$tmp/open/db"
# A path that can never be opened is a usage error (2), not "try again later"
# (75, and a supervisor restarting the worker for ever): a symbolic link loop, a
# name longer than NAME_MAX. exec said UNAVAILABLE, 75, for both.
ln -s loop "$tmp/loop"
for path in "$tmp/loop" "$tmp/loop/db" "$tmp/$(printf 'n%.0s' {1..300})/db"; do
  expect_rc "exec on a store path that cannot be opened (${path:0:60}...)" 2 "$dedup" exec --store "rocksdb:$path" --key k -- true
  [[ "$out" == *INVALID_ARGUMENT* ]] || fail "store path ${path:0:60}: $out"
done

# A mistyped option is named, with the nearest real one. CLI11 alone answered
# "--broker is required" to --brokr, and "The following arguments were not
# expected: 2 --concurency" to --concurency.
for case in "--brokr|--broker|worker --brokr redis://127.0.0.1:1?stream=x --store memory: --exec true" \
            "--concurency|--concurrency|worker --broker redis://127.0.0.1:1?stream=x --store memory: --exec true --concurency 2" \
            "--leese|--lease|exec --store memory: --key k --leese 2s -- true" \
            "--mesages|--messages|simulate --mesages=5"; do
  IFS='|' read -r typo right args <<<"$case"
  read -ra argv <<<"$args"
  expect_rc "a mistyped option is refused: dedup $args" 2 timeout 20 "$dedup" "${argv[@]}"
  [[ "$out" == *"unknown option '$typo'"* && "$out" == *"did you mean $right?"* ]] ||
    fail "$typo: not named, or $right not suggested: $out"
done
expect_rc "what follows -- is the command's: dedup exec ... -- true --weird" 0 "$dedup" exec --store memory: --key k -- true --weird

# A broker URI that is not one is answered as a broker URI: "--broker x" was told
# "store URI has no scheme (expected e.g. memory:, rocksdb:PATH, ...)", and
# publish to http:// that it "is not redis:// or redis+cluster://".
expect_rc "worker --broker without a scheme" 2 "$dedup" worker --broker jobs --store memory: --exec true
[[ "$out" == *"broker URI has no scheme"* && "$out" == *redis://* && "$out" != *"store URI"* ]] ||
  fail "worker --broker jobs: $out"
for uri in "jobs" "http://127.0.0.1:1?stream=x"; do
  expect_rc "publish --broker $uri" 2 "$dedup" publish --broker "$uri" --field id=1
  [[ "$out" == *"not a broker URI"* && "$out" == *amqp://* && "$out" != *"store URI"* ]] ||
    fail "publish --broker $uri: $out"
done

# A value with no known scheme is never echoed past its first ':': "u:PASSWORD"
# (a user:password pair given where a URI belongs) is not a URI the build knows,
# and what follows the ':' may be a password. Only the scheme text is named, and
# the schemes that would do. --broker said "broker URI 'u:hunter2': scheme 'u'
# ...", --store "unknown store scheme 'u' in 'u:hunter2'", --proxy "got 'u:hunter2'".
secret='hunter2-Zq'
for case in "--broker|worker --broker u:$secret --store memory: --exec true|redis://" \
            "--broker|publish --broker u:$secret --field id=1|redis://" \
            "--store|exec --store u:$secret --key k -- true|rocksdb:" \
            "--store|inspect --store u:$secret k|rocksdb:" \
            "--store|worker --broker redis://127.0.0.1:1?stream=x --store u:$secret --exec true|memory:" \
            "--proxy|serve --store memory: --proxy u:$secret|http://"; do
  IFS='|' read -r flag args known <<<"$case"
  read -ra argv <<<"$args"
  expect_rc "$flag u:PASSWORD is refused: dedup ${argv[0]}" 2 timeout 20 "$dedup" "${argv[@]}"
  [[ "$out" != *"$secret"* ]] || fail "$flag u:PASSWORD echoed what follows the ':': $out"
  [[ "$out" == *"'u'"* && "$out" == *"$known"* ]] || fail "$flag u:PASSWORD: the scheme or the known ones not named: $out"
done
# The Redis-only URIs too (--textbook-redis, bench --redis): "u:x?PASSWORD" was
# parsed before its scheme was looked at, and the parser quoted the parameter.
for args in "worker --broker nats://127.0.0.1:1?stream=s&consumer=c --exec true --pattern textbook --textbook-redis u:x?$secret" \
            "bench --quick --redis u:x?$secret"; do
  read -ra argv <<<"$args"
  expect_rc "a Redis URI flag with scheme u: is refused: dedup ${argv[0]}" 2 timeout 20 "$dedup" "${argv[@]}"
  [[ "$out" != *"$secret"* && "$out" == *"'u'"* ]] || fail "Redis URI u:x?PASSWORD: $out"
done
# A scheme that is not printable or is long is not named either.
expect_rc "--store with an unprintable scheme" 2 "$dedup" exec --store $'\e[2Jx:'"$secret" --key k -- true
[[ "$out" != *"$secret"* && "$out" != *$'\e'* ]] || fail "unprintable scheme echoed: $(printf %q "$out")"
long=$(printf 'a%.0s' {1..200})
expect_rc "--broker with a 200-byte scheme" 2 "$dedup" publish --broker "$long:$secret" --field id=1
[[ "$out" != *"$secret"* && "$out" != *"$long"* ]] || fail "long scheme echoed: $out"
# "USER:PASSWORD" where the user's name is itself a known scheme: postgres (the
# default PostgreSQL user), nats, amqp, memory. Without the '//' the rest is no
# host: it is refused naming the scheme, as redis:PASSWORD is ("redis: no '//'
# after 'redis:'"), never echoed. --store postgres:PW said "postgres URI
# 'postgres:PW' has no host", --broker nats:PW "broker URI 'nats:PW' needs stream=NAME".
for case in "--store|exec --store postgres:$secret --key k -- true" \
            "--store|exec --store postgresql:$secret --key k -- true" \
            "--store|exec --store memory:$secret --key k -- true" \
            "--broker|worker --broker nats:$secret --store memory: --exec true" \
            "--broker|publish --broker nats:$secret --field id=1" \
            "--broker|worker --broker amqp:$secret --store memory: --exec true" \
            "--broker|publish --broker amqp:$secret?queue=q --field id=1"; do
  IFS='|' read -r flag args <<<"$case"
  read -ra argv <<<"$args"
  expect_rc "$flag SCHEME:PASSWORD is refused: dedup $args" 2 timeout 20 "$dedup" "${argv[@]}"
  [[ "$out" != *"$secret"* ]] || fail "$flag SCHEME:PASSWORD echoed what follows the ':': $out"
done

# The worker's first line names its store, and where a relative rocksdb: path
# lands (it named the broker only: rocksdb:db quietly made a store in the cwd).
set +e
dedup_abs=$(realpath "$dedup")
out=$(cd "$tmp" && timeout 2 "$dedup_abs" worker --broker "redis://127.0.0.1:$port?stream=rel" \
  --store rocksdb:rel-db --exec true --summary-interval 0 2>&1)
set -e
[[ "$out" == *"store rocksdb:rel-db ($tmp/rel-db)"* ]] && ok "the worker names its store, with the absolute path" ||
  fail "worker start line: $out"

# publish to a stream that is not there makes it (XADD): said, so that a
# mistyped stream= does not fill a stream no worker reads without a word.
expect_rc "publish to a new stream" 0 "$dedup" publish --broker "redis://127.0.0.1:$port?stream=jbos" --field id=1
[[ "$out" == *"stream 'jbos' did not exist; this publish created it"* ]] || fail "publish to a new stream: $out"
expect_rc "publish to it again" 0 "$dedup" publish --broker "redis://127.0.0.1:$port?stream=jbos" --field id=2
[[ "$out" != *"did not exist"* ]] || fail "publish to an existing stream: $out"
# publish said 75 (try again later) to every error, a wrong password too; the
# worker says 2. Last: the server keeps this password until the test ends.
expect_rc "publish to a server that is down is 75" 75 "$dedup" publish --broker "redis://127.0.0.1:1?stream=x" --field id=1
# 75 stays "try again later" for every error a later run can get past: a read-only
# replica (a failover under way: READONLY), a replica whose primary is gone
# (MASTERDOWN), a server loading its dataset or busy in a script (LOADING, BUSY).
# publish answered these 2 ("your usage is wrong"), so a retrying caller gave up.
rcli REPLICAOF 127.0.0.1 1 >/dev/null
expect_rc "publish to a read-only replica (READONLY) is 75" 75 "$dedup" publish --broker "redis://127.0.0.1:$port?stream=x" --field id=1
[[ "$out" == *READONLY* ]] || fail "publish to a replica: $out"
rcli CONFIG SET replica-serve-stale-data no >/dev/null
expect_rc "publish to a replica without its primary (MASTERDOWN) is 75" 75 "$dedup" publish --broker "redis://127.0.0.1:$port?stream=x" --field id=1
[[ "$out" == *MASTERDOWN* ]] || fail "publish, MASTERDOWN: $out"
rcli CONFIG SET replica-serve-stale-data yes >/dev/null
rcli REPLICAOF NO ONE >/dev/null
# A broker that accepts the connection and then says nothing (stopped, overloaded)
# is "try again later" too, never "login refused": the Redis server above,
# SIGSTOPped, is such a peer (the kernel still completes the TCP handshake).
kill -STOP "$redis_pid"
for uri in "amqp://u:p@127.0.0.1:$port/?queue=q&timeout=500ms" "nats://127.0.0.1:$port?stream=s&consumer=c&timeout=500ms"; do
  expect_rc "publish to a silent peer (${uri%%:*}) is 75" 75 timeout 20 "$dedup" publish --broker "$uri" --field id=1
  [[ "$out" != *UNAUTHENTICATED* && "$out" != *refused* ]] || fail "publish, silent peer, ${uri%%:*}: $out"
  expect_rc "a worker on a silent peer (${uri%%:*}) is 75" 75 timeout 20 "$dedup" worker --broker "$uri" --store memory: --exec true
  [[ "$out" != *UNAUTHENTICATED* && "$out" != *refused* ]] || fail "worker, silent peer, ${uri%%:*}: $out"
done
kill -CONT "$redis_pid"
redis_wait_ready "$port"
rcli CONFIG SET requirepass right-pw >/dev/null
expect_rc "publish with a wrong password is 2" 2 "$dedup" publish --broker "redis://:wrong-pw@127.0.0.1:$port?stream=x" --field id=1
[[ "$out" == *UNAUTHENTICATED* && "$out" != *wrong-pw* ]] || fail "publish, wrong password: $out"

# A typo in --broker left a new, empty RocksDB store at --store's path: the store
# was opened before the broker URI was read.
for uri in "redis://127.0.0.1:1?strem=x" "nats://127.0.0.1:1?stream=x" "amqp://u:p@127.0.0.1:1/?queu=q" "jobs"; do
  rm -rf "$tmp/typo-db"
  expect_rc "--broker '$uri' is refused" 2 "$dedup" worker --broker "$uri" --store "rocksdb:$tmp/typo-db" --exec true
  [[ ! -e "$tmp/typo-db" ]] && ok "and no store was made" || fail "--broker '$uri': a store was made at $tmp/typo-db"
done

# --store memory: in a process of its own is no guard across runs: exec ran the
# command every time, a restarted worker ran every message again, silently.
expect_rc "exec --store memory: runs" 0 "$dedup" exec --store memory: --key k -- true
[[ "$out" == *"warning: --store memory:"*"runs every time"* ]] || fail "exec memory: no warning: $out"
set +e
out=$(timeout 20 "$dedup" worker --broker "redis://127.0.0.1:1?stream=x" --store memory: --exec true 2>&1)
set -e
[[ "$out" == *"warning: --store memory:"*"run again"* ]] && ok "the worker warns of memory:" || fail "worker memory: no warning: $out"

# A flag's bad value is named escaped, as a key is: an ESC byte in it would reach
# the terminal (recolour it, move the cursor) through CLI11's message.
esc=$'\e'
for args in "exec --store memory: --key k --lease 5${esc}[31ms -- true" \
            "exec --store memory: --key k --max-attempts 5${esc}[2J -- true" \
            "worker --broker redis://127.0.0.1:1?stream=s --store memory: --exec true --concurrency 5${esc}[2J"; do
  read -ra argv <<<"$args"
  set +e; out=$("$dedup" "${argv[@]}" 2>&1 </dev/null); rc=$?; set -e
  [[ $rc -eq 2 && "$out" != *"$esc"* && "$out" == *'\x1b'* ]] &&
    ok "a bad flag value is shown escaped: ${argv[0]}" ||
    fail "a bad flag value with an ESC byte: rc $rc: $(printf '%q' "$out")"
done

check_done "cli hardening"
