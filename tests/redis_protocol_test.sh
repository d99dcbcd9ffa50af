#!/usr/bin/env bash
# Drives the dedup Lua scripts with redis-cli alone, following nothing but
# docs/REDIS_PROTOCOL.md: proof that another client (any language) can speak the
# protocol and share records with the C++ store.
#
#   tests/redis_protocol_test.sh [LUA_DIR]     (default: build/src/stores/redis/lua)
#
# LUA_DIR holds the runnable scripts, as the build writes them (the files in
# src/stores/redis/lua/ are templates that include record.lua).
#
# Starts its own redis-server on 127.0.0.1:${DEDUP_PROTOCOL_TEST_PORT:-6395} in a
# temporary directory and stops it by PID on exit.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
lua_dir=${1:-$here/../build/src/stores/redis/lua}
if grep -q -- '--@dedup-include' "$lua_dir"/*.lua; then
  echo "redis_protocol_test.sh: $lua_dir holds templates; pass the build's src/stores/redis/lua" >&2
  exit 2
fi
port=${DEDUP_PROTOCOL_TEST_PORT:-6395}
source "$here/../scripts/lib/redis.sh"
tmp=$(mktemp -d)
trap 'redis_stop_all; rm -rf "$tmp"' EXIT
redis_start "$port" "$tmp/redis"

cli() { redis-cli -h 127.0.0.1 -p "$port" "$@"; }
source "$here/../scripts/lib/check.sh"

# 1. Load the scripts; the SHA1 is what EVALSHA takes.
declare -A sha
for s in claim extend complete release inspect forget; do
  sha[$s]=$(cli SCRIPT LOAD "$(cat "$lua_dir/$s.lua")")
done
claim()    { cli EVALSHA "${sha[claim]}" 1 "$@" | lines; }
extend()   { cli EVALSHA "${sha[extend]}" 1 "$@" | lines; }
complete() { cli EVALSHA "${sha[complete]}" 1 "$@" | lines; }
release()  { cli EVALSHA "${sha[release]}" 1 "$@" | lines; }
inspect()  { cli EVALSHA "${sha[inspect]}" 1 "$@" | lines; }
forget()   { cli EVALSHA "${sha[forget]}" 1 "$@" | lines; }

A=00000000000000aa
B=00000000000000bb

# 2. claim / BUSY / complete / DUPLICATE.
check "first claim acquires: fence 1, attempt 1" "0 1 1" "$(claim p:k1 $A 60000 600000 '' 0)"
busy=$(claim p:k1 $B 60000 600000 '' 0)
check "second claim is BUSY" "1 1 1" "$(cut -d' ' -f1-3 <<<"$busy")"
# A claim sent again with its own token (its reply was lost) is its own.
check "the first claim's try again (same token) is ACQUIRED, fence 1, attempt 1" "0 1 1" \
  "$(claim p:k1 $A 60000 600000 '' 0)"
left=$(cut -d' ' -f4 <<<"$busy")
((left > 59000 && left <= 60000)) && echo "ok   lease_left $left ms" || { echo "FAIL lease_left $left"; failures=$((failures + 1)); }
check "wrong token cannot complete" "0" "$(complete p:k1 $B 600000 0 nope)"
check "extend by owner" "1" "$(extend p:k1 $A 90000)"
check "complete by owner" "1" "$(complete p:k1 $A 600000 0 'the result')"
check "claim after complete is DUPLICATE with the result" "2 1 1 0 0 the result" \
  "$(claim p:k1 $B 60000 600000 '' 0)"
check "outcome writes after complete are LOST" "0 0 0" \
  "$(extend p:k1 $A 1000) $(complete p:k1 $A 1000 0 x) $(release p:k1 $A 1000)"

# 3. The record bytes are the documented layout (format 2): flags 0x42 (format 2,
#    COMPLETED, status ok, no fingerprint), token, fence 1, attempt 1 (varints), result.
val=$(cli --raw GET p:k1 | head -c 21 | od -An -tx1 | tr -d ' \n')
check "value: flags 42, token, fence 1, attempt 1, result" \
  "42${A}0101$(printf 'the result' | od -An -tx1 | tr -d ' \n')" "$val"
ttl=$(cli PTTL p:k1)
((ttl > 590000 && ttl <= 600000)) && echo "ok   PEXPIRETIME = retention deadline" || { echo "FAIL pttl $ttl"; failures=$((failures + 1)); }
ins=$(inspect p:k1)
check "inspect: state, status, token, fence, attempt" "2 0 $A 1 1" "$(cut -d' ' -f1-5 <<<"$ins")"
check "inspect: fingerprint (empty) and result" "|the result" "$(cut -d' ' -f8 <<<"$ins")|$(cut -d' ' -f9- <<<"$ins")"
lean=$(inspect p:k1 noresult)
check "inspect noresult: the same record" "$(cut -d' ' -f1-7 <<<"$ins")" "$(cut -d' ' -f1-7 <<<"$lean")"
check "inspect noresult: the result left out, its length (10 bytes) after it" "|10" \
  "$(cut -d' ' -f9 <<<"$lean")|$(cut -d' ' -f10- <<<"$lean")"
check "inspect with another argument: DEDUPARGS" "DEDUPARGS" "$(inspect p:k1 nores | cut -d' ' -f1)"

# 4. Release keeps fence and attempts; the next claim is attempt 2, fence 2.
check "claim k2" "0 1 1" "$(claim p:k2 $A 60000 600000 fp1 0)"
check "release k2" "1" "$(release p:k2 $A 600000)"
check "claim after release" "0 2 2" "$(claim p:k2 $B 60000 600000 fp1 0)"
check "different fingerprint is MISMATCH" "3 2 2" "$(claim p:k2 $A 60000 600000 fp2 0)"
check "old owner is LOST" "0" "$(release p:k2 $A 600000)"

# 5. The server clock ends a lease: takeover with fence + 1; max_attempts exhausts.
check "claim k3 with a 200 ms lease" "0 1 1" "$(claim p:k3 $A 200 600000 '' 2)"
sleep 0.4
check "takeover after the lease" "0 2 2" "$(claim p:k3 $B 200 600000 '' 2)"
check "late write of the first owner is LOST" "0" "$(complete p:k3 $A 600000 0 x)"
sleep 0.4
check "third attempt with max 2 is EXHAUSTED" "4 2 2" "$(claim p:k3 $A 200 600000 '' 2)"
check "its try again (same token) reads its own EXHAUSTED" "4 2 2" "$(claim p:k3 $A 200 600000 '' 2)"
check "then DUPLICATE with status exhausted" "2 2 2 0 2" "$(claim p:k3 $B 200 600000 '' 2 | cut -d' ' -f1-5)"

# 6. Records written by hand from the document are read by the scripts.
#    Format 2: IN_PROGRESS with fingerprint (flags 0x51), token bb, fence 300 (ac 02),
#    attempt 3, keep 600000 (c0 cf 24), fingerprint "xy"; expiry in 660 s, so the
#    lease ends in 60 s.
# (redis-cli reads commands from stdin; "\xHH" in double quotes is one byte.)
echo 'SET p:hand2 "\x51\x00\x00\x00\x00\x00\x00\x00\xbb\xac\x02\x03\xc0\xcf\x24\x02xy" PX 660000' |
  cli >/dev/null
ins=$(inspect p:hand2)
check "format 2 by hand: inspect state, status, token, fence, attempt" "1 0 $B 300 3" \
  "$(cut -d' ' -f1-5 <<<"$ins")"
ld=$(cut -d' ' -f6 <<<"$ins"); rd=$(cut -d' ' -f7 <<<"$ins")
check "format 2 by hand: lease deadline = PEXPIRETIME - keep" "600000" "$((rd - ld))"
busy=$(claim p:hand2 $A 60000 600000 '' 0)
check "format 2 by hand is BUSY" "1 300 3" "$(cut -d' ' -f1-3 <<<"$busy")"
check "format 2 by hand: fingerprint answers MISMATCH" "3 300 3" "$(claim p:hand2 $A 60000 600000 zz 0)"
check "format 2 by hand: extend keeps keep" "1" "$(extend p:hand2 $B 1000)"
ttl=$(cli PTTL p:hand2)
((ttl > 600000 && ttl <= 601000)) && echo "ok   extend: expiry = now + lease + keep" || { echo "FAIL extend pttl $ttl"; failures=$((failures + 1)); }
check "format 2 by hand: completes" "1" "$(complete p:hand2 $B 600000 0 '')"
check "completed, fingerprint \"xy\", empty result: 15 bytes" \
  "5200000000000000bbac0203027879" "$(cli --raw GET p:hand2 | head -c 15 | od -An -tx1 | tr -d ' \n')"

#    Format 1 (still read, rewritten as format 2 by the next write): IN_PROGRESS,
#    token bb, fence 7, attempt 3, lease until 2^47 ms, fingerprint "xy".
printf '\x01\x01\x00\x00\x00\x00\x00\x00\x00\xbb\x00\x00\x00\x00\x00\x07\x00\x00\x00\x03\x80\x00\x00\x00\x00\x00\x02xy' |
  cli -x SET p:hand >/dev/null
cli PEXPIREAT p:hand 140737488355328 >/dev/null
check "format 1 record is BUSY" "1 7 3" "$(claim p:hand $A 60000 600000 '' 0 | cut -d' ' -f1-3)"
check "format 1 fingerprint answers MISMATCH" "3 7 3" "$(claim p:hand $A 60000 600000 zz 0)"
check "its owner completes it" "1" "$(complete p:hand $B 600000 1 failed-reason)"
check "then DUPLICATE, status failed" "2 7 3 0 1 failed-reason" "$(claim p:hand $A 60000 600000 xy 0)"
check "rewritten as format 2 (flags 0x56: COMPLETED, failed, fingerprint)" "56" \
  "$(cli --raw GET p:hand | head -c 1 | od -An -tx1 | tr -d ' \n')"
check "a value that is no record is DEDUPCORRUPT" "DEDUPCORRUPT" \
  "$(cli SET p:junk processing >/dev/null; claim p:junk $A 1000 1000 '' 0 2>&1 | cut -c1-12)"
check "an empty value is DEDUPCORRUPT too (complete)" "DEDUPCORRUPT" \
  "$(cli SET p:empty '' >/dev/null; complete p:empty $A 1000 0 x 2>&1 | cut -c1-12)"
#    A completion's status goes into the flags: IN_PROGRESS 0x41, fence 128 (80 01),
#    attempt 2, keep 1 (01), completed as failed: 0x46, token, 80 01, 02, result.
echo 'SET p:st "\x41\x00\x00\x00\x00\x00\x00\x00\xbb\x80\x01\x02\x01" PX 60000' | cli >/dev/null
check "multi-byte fence: completes as failed" "1" "$(complete p:st $B 600000 1 why)"
check "flags 0x46, token, fence, attempt, result" \
  "4600000000000000bb800102$(printf why | od -An -tx1 | tr -d ' \n')" \
  "$(cli --raw GET p:st | head -c 15 | od -An -tx1 | tr -d ' \n')"

# 6b. The claim fast path: SET key <fresh IN_PROGRESS record> NX PX lease+retention GET.
#     Fresh record: flags 0x41, token aa, fence 1, attempt 1, keep 600000.
fresh() {  # fresh PX: the SET NX GET command
  echo "SET p:fast \"\\x41\\x00\\x00\\x00\\x00\\x00\\x00\\x00\\xaa\\x01\\x01\\xc0\\xcf\\x24\" NX PX $1 GET"
}
check "fast path on a new key: nil (ACQUIRED, fence 1, attempt 1)" "" \
  "$(fresh 660000 | cli)"
check "then the claim script sees it BUSY" "1 1 1" "$(claim p:fast $B 60000 600000 '' 0 | cut -d' ' -f1-3)"
check "fast path on an existing key returns it, writes nothing" \
  "4100000000000000aa0101c0cf24" "$(fresh 1 | cli --raw | head -c 14 | od -An -tx1 | tr -d ' \n')"
check "its owner completes it" "1" "$(complete p:fast $A 600000 0 done)"
check "fast path on a completed key: the record (flags 0x42) = DUPLICATE" \
  "4200000000000000aa0101$(printf done | od -An -tx1 | tr -d ' \n')" \
  "$(fresh 1 | cli --raw | head -c 15 | od -An -tx1 | tr -d ' \n')"

# 7. No record: writes are LOST, inspect is nil. forget.lua: a running lease is
#    refused unless forced; forced, a fence floor keeps the next fence higher.
check "extend of absent key is LOST" "0" "$(extend p:none $A 1000)"
check "inspect of absent key is nil" "" "$(inspect p:none)"
check "forget of an absent key: 0" "0 0" "$(forget p:none 0)"
check "forget with a bad force is DEDUPARGS" "DEDUPARGS forget: force must be 0 or 1" \
  "$(cli EVALSHA "${sha[forget]}" 1 p:k2 yes 2>&1)"
check "forget of a running lease is refused (2)" "2" "$(forget p:k2 0 | cut -d' ' -f1)"
check "forced, it becomes a fence floor (3)" "3" "$(forget p:k2 1 | cut -d' ' -f1)"
check "the floor: RELEASED, attempt 0, fence kept (flags 0x43)" "4300000000000000bb0200" \
  "$(cli --raw GET p:k2 | head -c 11 | od -An -tx1 | tr -d ' \n')"
check "a floor is no record to inspect" "" "$(inspect p:k2)"
check "nor to forget" "0 0" "$(forget p:k2 1)"
check "the forgotten owner is LOST" "0" "$(complete p:k2 $B 600000 0 late)"
check "the next claim: fence 3, attempt 1, any fingerprint" "0 3 1" \
  "$(claim p:k2 $A 60000 600000 fp2 0)"

# 8. NOSCRIPT after SCRIPT FLUSH; EVAL of the same body works and reloads it.
cli SCRIPT FLUSH >/dev/null
check "EVALSHA after flush is NOSCRIPT" "NOSCRIPT" \
  "$(cli EVALSHA "${sha[inspect]}" 1 p:k1 2>&1 | cut -c1-8)"
check "EVAL reloads" "2 0 $A" "$(cli EVAL "$(cat "$lua_dir/inspect.lua")" 1 p:k1 | lines | cut -d' ' -f1-3)"
check "EVALSHA works again" "2 0 $A" "$(inspect p:k1 | cut -d' ' -f1-3)"

check_done "redis protocol"
