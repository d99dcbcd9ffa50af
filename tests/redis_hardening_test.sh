#!/usr/bin/env bash
# The Redis scripts and decoders under hostile input (issue 13, item 2): every
# script checks its arguments as the C++ API does (src/core/store.cc) and answers
# 'DEDUPARGS <script>: <what>' with nothing changed; the record decoders, in Lua
# (record.lua) and in C++ (the store's claim fast path), refuse what
# docs/REDIS_PROTOCOL.md refuses: a status on a record that is not COMPLETED
# (flags 0x45), a fingerprint longer than 64 bytes, non-canonical varints.
#
#   tests/redis_hardening_test.sh DEDUP_CLI LUA_DIR
#
# Starts its own redis-server on 127.0.0.1:${DEDUP_HARDENING_REDIS_PORT:-6490}
# (docs/PORTS.md) in a temporary directory and stops it by PID on exit.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
dedup=${1:?usage: redis_hardening_test.sh DEDUP_CLI LUA_DIR}
lua_dir=${2:?usage: redis_hardening_test.sh DEDUP_CLI LUA_DIR}
port=${DEDUP_HARDENING_REDIS_PORT:-6490}
source "$here/../scripts/lib/redis.sh"
tmp=$(mktemp -d)
trap 'redis_stop_all; rm -rf "$tmp"' EXIT
redis_start "$port" "$tmp/redis"

cli() { redis-cli -h 127.0.0.1 -p "$port" "$@"; }
source "$here/../scripts/lib/check.sh"
declare -A sha
for s in claim extend complete release inspect complete_ack forget unclaim; do
  sha[$s]=$(cli SCRIPT LOAD "$(cat "$lua_dir/$s.lua")")
done
run() { local s=$1; shift; cli EVALSHA "${sha[$s]}" 1 "$@" 2>&1 | lines; }
# The first word of the reply (the error prefix, or the outcome).
first() { run "$@" | cut -d' ' -f1; }
raw() { cli --raw GET "$1" | head -c -1 | od -An -tx1 | tr -d ' \n'; }

A=00000000000000aa
B=00000000000000bb

# 1. Arguments. A live record, and the same record after every refused call.
check "claim k" "0 1 1" "$(run claim p:k $A 60000 600000 '' 0)"
before=$(raw p:k)
ttl_before=$(cli PTTL p:k)
for lease in -700000 0 -500 1.5 1e3 0x10 '' ' 5' 5x 315360000001 0100; do
  check "extend lease '$lease' is DEDUPARGS" "DEDUPARGS" "$(first extend p:k $A "$lease")"
done
for tok in 0000000000000000 00000000000000AA 0x000000000000aa 00000000000000a 00000000000000aaa \
           ' 00000000000000a' ''; do
  check "extend token '$tok' is DEDUPARGS" "DEDUPARGS" "$(first extend p:k "$tok" 1000)"
  check "complete token '$tok' is DEDUPARGS" "DEDUPARGS" "$(first complete p:k "$tok" 1000 0 x)"
  check "release token '$tok' is DEDUPARGS" "DEDUPARGS" "$(first release p:k "$tok" 1000)"
  check "unclaim token '$tok' is DEDUPARGS" "DEDUPARGS" "$(first unclaim p:k "$tok" 1000)"
  check "claim token '$tok' is DEDUPARGS" "DEDUPARGS" "$(first claim p:new "$tok" 1000 1000 '' 0)"
done
for ret in 0 -1 1.5 '' 315360000001; do
  check "complete retention '$ret' is DEDUPARGS" "DEDUPARGS" "$(first complete p:k $A "$ret" 0 x)"
  check "release retention '$ret' is DEDUPARGS" "DEDUPARGS" "$(first release p:k $A "$ret")"
  check "unclaim retention '$ret' is DEDUPARGS" "DEDUPARGS" "$(first unclaim p:k $A "$ret")"
  check "claim retention '$ret' is DEDUPARGS" "DEDUPARGS" "$(first claim p:new $A 1000 "$ret" '' 0)"
done
for st in 3 -1 1.0 '' 01; do
  check "complete status '$st' is DEDUPARGS" "DEDUPARGS" "$(first complete p:k $A 1000 "$st" x)"
done
for ma in -1 1.5 '' 4294967296; do
  check "claim max_attempts '$ma' is DEDUPARGS" "DEDUPARGS" "$(first claim p:new $A 1000 1000 '' "$ma")"
done
fp65=$(printf 'f%.0s' $(seq 65))
check "claim fingerprint of 65 bytes is DEDUPARGS" "DEDUPARGS" "$(first claim p:new $A 1000 1000 "$fp65" 0)"
check "claim lease 0 is DEDUPARGS" "DEDUPARGS" "$(first claim p:new $A 0 1000 '' 0)"
check "the message names the argument" \
  "DEDUPARGS extend: lease must be an integer of ms, 1 to 315360000000" \
  "$(run extend p:k $A -700000)"
check "nothing was created by refused claims" "0" "$(cli EXISTS p:new)"
check "the record is unchanged by every refused call" "$before" "$(raw p:k)"
ttl_after=$(cli PTTL p:k)
((ttl_after > 0 && ttl_after <= ttl_before)) && echo "ok   its expiry is unchanged" ||
  { echo "FAIL expiry moved: $ttl_before -> $ttl_after"; failures=$((failures + 1)); }
check "the lease still runs: a second claim is BUSY with fence 1" "1 1 1" \
  "$(run claim p:k $B 60000 600000 '' 0 | cut -d' ' -f1-3)"
check "the limits themselves are accepted" "1" "$(run extend p:k $A 315360000000)"
check "complete with a 1-byte fingerprint-free result" "1" "$(run complete p:k $A 1 2 r)"
check "complete_ack refuses bad arguments too" "DEDUPARGS" \
  "$(cli EVALSHA "${sha[complete_ack]}" 2 p:k2 s $A -5 0 x g 1-1 2>&1 | cut -d' ' -f1)"
# Missing arguments are refused as bad ones are, naming the first one missing
# (before the completion scripts' single-match read, complete.lua did; since, a
# missing result is a Lua runtime error and a missing retention is blamed on the
# status).
check "complete without a result is DEDUPARGS" "DEDUPARGS" "$(first complete p:k $A 1000 0)"
check "complete without a retention names the arguments it needs" \
  "DEDUPARGS complete: needs 1 key and 4 arguments, got 1 and 1" \
  "$(run complete p:k $A)"

# 2. Decoders refuse what the document refuses, with DEDUPCORRUPT, nothing changed.
#    flags 0x45: IN_PROGRESS with status 1.
printf '\x45\x00\x00\x00\x00\x00\x00\x00\xaa\x01\x01\x01' | cli -x SET p:f45 >/dev/null
cli PEXPIRE p:f45 600000 >/dev/null
check "flags 0x45: claim is DEDUPCORRUPT" "DEDUPCORRUPT" "$(first claim p:f45 $B 1000 1000 '' 0)"
check "flags 0x45: inspect is DEDUPCORRUPT" "DEDUPCORRUPT" "$(first inspect p:f45)"
#    A COMPLETED record whose fingerprint is 65 bytes (flags 0x52).
{ printf '\x52\x00\x00\x00\x00\x00\x00\x00\xaa\x01\x01\x41'; printf '%s' "$fp65"; } |
  cli -x SET p:fp65 >/dev/null
cli PEXPIRE p:fp65 600000 >/dev/null
check "stored fingerprint of 65 bytes: claim is DEDUPCORRUPT" "DEDUPCORRUPT" \
  "$(first claim p:fp65 $B 1000 1000 '' 0)"
check "stored fingerprint of 65 bytes: inspect is DEDUPCORRUPT" "DEDUPCORRUPT" "$(first inspect p:fp65)"
#    A COMPLETED record whose fence is 1 encoded in two bytes (81 00).
printf '\x42\x00\x00\x00\x00\x00\x00\x00\xaa\x81\x00\x01done' | cli -x SET p:nc >/dev/null
cli PEXPIRE p:nc 600000 >/dev/null
check "non-canonical varint: claim is DEDUPCORRUPT" "DEDUPCORRUPT" "$(first claim p:nc $B 1000 1000 '' 0)"
check "non-canonical varint: inspect is DEDUPCORRUPT" "DEDUPCORRUPT" "$(first inspect p:nc)"
check "the canonical form of the same record is read" "2 1 1 0 0 done" \
  "$(printf '\x42\x00\x00\x00\x00\x00\x00\x00\xaa\x01\x01done' | cli -x SET p:c >/dev/null
     run claim p:c $B 1000 1000 '' 0)"

# 3. The C++ store (its claim fast path decodes COMPLETED records itself) refuses
#    the same records: an error, never a replay of a record it cannot read.
store="redis://127.0.0.1:$port?prefix=p:"
for key in nc fp65 f45; do
  set +e
  out=$("$dedup" exec --store "$store" --key "$key" -- echo ran 2>&1)
  rc=$?
  set -e
  if [[ $rc -ne 0 && "$out" == *DATA_LOSS* && "$out" != *ran* ]]; then
    echo "ok   dedup exec on corrupt record '$key' is DATA_LOSS (rc $rc)"
  else
    echo "FAIL dedup exec on corrupt record '$key': rc $rc: $out"; failures=$((failures + 1))
  fi
done
check "and left it as it was" "4200000000000000aa810001646f6e65" "$(raw p:nc)"

# 4. Fences past what a Lua number holds exactly (clusterreview). The scripts read
#    varints as Lua numbers (doubles): a fence of 2^53 or more, written by another
#    client, was read rounded, and a takeover of a RELEASED record at fence 2^53
#    answered ACQUIRED at fence 2^53 again (2^53 + 1 rounds to 2^53): two claims
#    with one fence, where SPEC.md says fences strictly increase. Fences (and
#    attempts, keeps) are at most 2^53 - 1: a record holding more is refused as
#    corrupt by the scripts and by the C++ fast path alike, and a claim that would
#    raise a fence past it is refused, nothing changed.
rec() {  # rec FLAGS FENCE [RESULT]: a format-2 record, token aa, attempt 1
  python3 -c '
import sys
def uv(n):
    out = b""
    while n >= 128:
        out += bytes([n % 128 + 128]); n //= 128
    return out + bytes([n])
flags, fence = int(sys.argv[1], 16), int(sys.argv[2])
sys.stdout.buffer.write(bytes([flags]) + bytes(7) + b"\xaa" + uv(fence) + uv(1) + sys.argv[3].encode())
' "$@"
}
put() { cli -x SET "$1" >/dev/null; cli PEXPIRE "$1" 600000 >/dev/null; }
rec 43 9007199254740992 '' | put p:f53
before=$(raw p:f53)
check "a RELEASED record at fence 2^53: claim is DEDUPCORRUPT" "DEDUPCORRUPT" \
  "$(first claim p:f53 $B 1000 1000 '' 0)"
check "and it is unchanged" "$before" "$(raw p:f53)"
rec 43 9007199254740991 '' | put p:fmax
before=$(raw p:fmax)
check "a RELEASED record at fence 2^53 - 1: the takeover is refused" "DEDUPCORRUPT" \
  "$(first claim p:fmax $B 1000 1000 '' 0)"
check "and it is unchanged" "$before" "$(raw p:fmax)"
rec 43 9007199254740990 '' | put p:fok
check "at fence 2^53 - 2 the takeover gets 2^53 - 1" "0 9007199254740991 2" \
  "$(run claim p:fok $B 1000 1000 '' 0)"
rec 42 9007199254740993 'done' | put p:fc
check "a COMPLETED record at fence 2^53 + 1: claim.lua is DEDUPCORRUPT" "DEDUPCORRUPT" \
  "$(first claim p:fc $B 1000 1000 '' 0)"
check "inspect too" "DEDUPCORRUPT" "$(first inspect p:fc)"
set +e
out=$("$dedup" exec --store "$store" --key fc -- echo ran 2>&1)
rc=$?
set -e
if [[ $rc -ne 0 && "$out" == *DATA_LOSS* && "$out" != *ran* ]]; then
  echo "ok   the C++ fast path refuses it too: DATA_LOSS (rc $rc)"
else
  echo "FAIL the C++ fast path read a fence of 2^53 + 1: rc $rc: $out"; failures=$((failures + 1))
fi

# 5. The record key missing (numkeys 0), as a client in another language may send
#    it (clusterreview): answered a bare Lua error ('ERR Lua redis lib command
#    arguments must be strings or integers ... on @user_script:92') that names
#    no argument. Now DEDUPARGS naming the key, nothing changed.
for s in claim extend complete release inspect forget unclaim; do
  check "$s without its key is DEDUPARGS" "DEDUPARGS $s: needs 1 key (the record key), got 0" \
    "$(cli EVALSHA "${sha[$s]}" 0 $A 1000 1000 '' 0 2>&1)"
done
check "complete_ack without keys is DEDUPARGS" "DEDUPARGS" \
  "$(cli EVALSHA "${sha[complete_ack]}" 0 $A 1000 0 x g 1-1 2>&1 | cut -d' ' -f1)"

# 6. unclaim.lua (a failed claim batch gives back its claims): the attempt the
#    claim counted is given back and the fence kept; the first claim of a key
#    becomes a fence floor. Another token, or a record not IN_PROGRESS: 0,
#    nothing changed. An extra argument is refused, not ignored.
check "claim u1" "0 1 1" "$(run claim p:u1 $A 60000 600000 '' 0)"
check "unclaim u1 with another token: LOST" "0" "$(run unclaim p:u1 $B 600000)"
check "unclaim u1 with an extra argument: DEDUPARGS" "DEDUPARGS" "$(first unclaim p:u1 $A 600000 x)"
check "unclaim u1" "1" "$(run unclaim p:u1 $A 600000)"
check "... a fence floor: no record to inspect" "" "$(run inspect p:u1)"
check "... the next claim: fence 2, attempt 1" "0 2 1" "$(run claim p:u1 $B 60000 600000 '' 1)"
check "release u1, claim again: attempt 2" "0 3 2" \
  "$(run release p:u1 $B 600000 >/dev/null; run claim p:u1 $A 60000 600000 '' 0)"
check "unclaim u1: back to attempt 1, fence 3" "1" "$(run unclaim p:u1 $A 600000)"
check "... the next claim with max_attempts 2: fence 4, attempt 2" "0 4 2" \
  "$(run claim p:u1 $B 60000 600000 '' 2)"
check "unclaim of a COMPLETED record: 0, unchanged" "0" \
  "$(run complete p:u1 $B 600000 0 r >/dev/null; run unclaim p:u1 $B 600000)"

# 6a. A second key or an extra argument is refused, not ignored (only the batch
#     scripts checked their arity; complete and complete_ack since 2026-12-02).
check "claim with 2 keys: DEDUPARGS" "DEDUPARGS claim: needs 1 key and 5 arguments, got 2 and 5" \
  "$(cli EVALSHA "${sha[claim]}" 2 p:a1 p:a2 $A 1000 1000 '' 0 2>&1)"
check "claim with an extra argument: DEDUPARGS" "DEDUPARGS" "$(first claim p:a1 $A 1000 1000 '' 0 x)"
check "extend with an extra argument: DEDUPARGS" "DEDUPARGS" "$(first extend p:a1 $A 1000 x)"
check "release with an extra argument: DEDUPARGS" "DEDUPARGS" "$(first release p:a1 $A 1000 x)"
check "inspect with an argument: DEDUPARGS" "DEDUPARGS" "$(first inspect p:a1 x)"
check "forget with an extra argument: DEDUPARGS" "DEDUPARGS" "$(first forget p:a1 0 x)"
check "complete with an extra argument: DEDUPARGS" "DEDUPARGS" "$(first complete p:a1 $A 1000 0 r x)"
check "complete with 2 keys: DEDUPARGS" "DEDUPARGS complete: needs 1 key and 4 arguments, got 2 and 4" \
  "$(cli EVALSHA "${sha[complete]}" 2 p:a1 p:a2 $A 1000 0 r 2>&1)"
check "complete_ack with 1 key: DEDUPARGS" "DEDUPARGS complete_ack: needs 2 keys and 6 arguments, got 1 and 6" \
  "$(cli EVALSHA "${sha[complete_ack]}" 1 p:a1 $A 1000 0 r g 1-1 2>&1)"
check "complete_ack with an extra argument: DEDUPARGS" "DEDUPARGS" \
  "$(cli EVALSHA "${sha[complete_ack]}" 2 p:a1 s $A 1000 0 r g 1-1 x 2>&1 | cut -d' ' -f1)"
check "... nothing was created" "0" "$(cli EXISTS p:a1 p:a2)"

# 6b. A try again of the claim that exhausted a key (its reply lost) reads it as
#     its own EXHAUSTED (docs/REDIS_PROTOCOL.md), as the C++ fast path does;
#     claim.lua answered DUPLICATE. Another token: DUPLICATE.
check "claim ex" "0 1 1" "$(run claim p:ex $A 1 600000 '' 1)"
sleep 0.05
check "claim ex with max_attempts 1 after the lease: EXHAUSTED" "4 1 1" "$(run claim p:ex $B 60000 600000 '' 1)"
check "... the same claim again: EXHAUSTED" "4 1 1" "$(run claim p:ex $B 60000 600000 '' 1)"
check "... another token: DUPLICATE" "2" "$(first claim p:ex $A 60000 600000 '' 1)"

# 7. forget.lua removes a value that is not a record, and with force a key of
#    another Redis type (GET met a hash with WRONGTYPE, and forget failed); without
#    force that key is refused, DEDUPTYPE naming its type: under a shared prefix
#    it may be a broker's stream, which a listing of undecodable keys shows.
cli HSET p:h f v >/dev/null
check "forget of a hash, force 0: DEDUPTYPE" "DEDUPTYPE forget: the key holds a hash, not a dedup record; force removes it" "$(run forget p:h 0)"
check "... and it is kept" "hash" "$(cli TYPE p:h)"
check "forget of a hash, force 1: removed" "1 0" "$(run forget p:h 1)"
check "... and it is gone" "none" "$(cli TYPE p:h)"
cli RPUSH p:l x >/dev/null
check "forget of a list, force 1: removed" "1 0" "$(run forget p:l 1)"
check "forget of no key: 0" "0 0" "$(run forget p:none 0)"

check_done "redis hardening"
