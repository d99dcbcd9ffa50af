#!/usr/bin/env bash
# `dedup publish` and broker URIs against real brokers, one broker per run:
#
#   tests/publish_brokers_test.sh DEDUP_CLI redis|nats|rabbitmq
#
#   redis     a Redis out of memory (maxmemory 1 byte, noeviction) answers XADD with
#             OOM: publish exits 75 (try again later), as on READONLY or LOADING,
#             not 2 (bad usage).
#   nats      a password-protected nats-server: password_file= authenticates the
#             publish and the worker; a wrong, missing or empty file and a password
#             given twice are refused naming the problem, never the password; a
#             publish to a stream that is not there says it made it (as to Redis);
#             a message over max_payload, over the stream's own max_msg_size, or
#             to a subject the existing stream does not hold, is 2, not 'try again
#             later'.
#   nats-token  a nats-server with token authentication (--auth TOKEN): the token
#             as NATS clients read a URL (nats://TOKEN@HOST) or from token_file=
#             authenticates the publish and the worker; a wrong token, a missing
#             or empty file, and a token with a user or given twice are refused,
#             never echoing the token (nor does the worker's log).
#   rabbitmq  the same password_file= checks against a RabbitMQ node (user dedup);
#             a full queue (reject-publish nacks) is 75, a refused write 2, a
#             message over the node's max_message_size (406) 2.
#
# Ports (docs/PORTS.md): Redis 6520, NATS 4239, NATS with a token 4245, RabbitMQ
# 5684 (dist 25684, epmd 4374). Servers run in a temporary directory and are
# stopped by PID at exit.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
dedup=${1:?usage: publish_brokers_test.sh DEDUP_CLI redis|nats|nats-token|rabbitmq}
broker=${2:?usage: publish_brokers_test.sh DEDUP_CLI redis|nats|nats-token|rabbitmq}
source "$here/../scripts/lib/check.sh"
tmp=$(mktemp -d)
# The servers stop (by PID) before their directories go: this trap alone.
_REDIS_TRAP_SET=1 _NATS_TRAP_SET=1 _RABBITMQ_TRAP_SET=1
cleanup() {
  [[ -n "$(type -t redis_stop_all)" ]] && redis_stop_all
  [[ -n "$(type -t nats_stop)" ]] && nats_stop
  [[ -n "$(type -t rabbitmq_stop)" ]] && rabbitmq_stop
  rm -rf "$tmp"
}
trap cleanup EXIT
ok() { echo "ok   $*"; }
# expect_rc NAME RC CMD...: runs CMD, checks its exit code; output in $out.
expect_rc() {
  local name=$1 want=$2; shift 2
  set +e; out=$(timeout 60 "$@" 2>&1); local rc=$?; set -e
  [[ $rc -eq $want ]] && ok "$name (rc $rc)" || fail "$name: rc $rc, want $want: $out"
}

# nats_add_stream PORT USER PASS NAME SUBJECT MAX_MSG_SIZE [MAX_MSGS DISCARD]:
# makes a JetStream stream with a max_msg_size of its own (and a max_msgs, and
# discard old or new; default -1, old), over the NATS protocol itself (no NATS
# client tool is installed): CONNECT, then a request to $JS.API.STREAM.CREATE.
nats_add_stream() {
  python3 - "$@" <<'PY'
import json, socket, sys
port, user, pw, name, subject, size = sys.argv[1:7]
max_msgs = int(sys.argv[7]) if len(sys.argv) > 7 else -1
discard = sys.argv[8] if len(sys.argv) > 8 else "old"
s = socket.create_connection(("127.0.0.1", int(port)), timeout=10)
f = s.makefile("rb")
f.readline()  # INFO
cfg = json.dumps({"name": name, "subjects": [subject], "max_msg_size": int(size),
                  "storage": "file", "retention": "limits", "discard": discard,
                  "max_msgs": max_msgs, "max_bytes": -1, "max_consumers": -1,
                  "num_replicas": 1}).encode()
connect = json.dumps({"verbose": False, "pedantic": False, "user": user, "pass": pw}).encode()
s.sendall(b"CONNECT " + connect + b"\r\nSUB _INBOX.mk 1\r\nPUB $JS.API.STREAM.CREATE." +
          name.encode() + b" _INBOX.mk " + str(len(cfg)).encode() + b"\r\n" + cfg + b"\r\n")
while True:
    line = f.readline()
    if not line or line.startswith(b"-ERR"):
        sys.exit("nats: %r" % line)
    if line.startswith(b"PING"):
        s.sendall(b"PONG\r\n")
    if line.startswith(b"MSG"):
        reply = json.loads(f.read(int(line.split()[-1]) + 2))
        if "error" in reply:
            sys.exit("stream create: %r" % reply["error"])
        break
PY
}

# password_file= in a URI of SCHEME: BASE is the URI before its query, without a
# password ("nats://dedup@127.0.0.1:4239"), QUERY its parameters, PW the password.
password_file_checks() {
  local scheme=$1 base=$2 query=$3 pw=$4 inline=$5
  printf '%s\n' "$pw" >"$tmp/pw"
  printf 'not-%s\n' "$pw" >"$tmp/wrong"
  : >"$tmp/empty"
  expect_rc "$scheme: publish with password_file= authenticates" 0 \
    "$dedup" publish --broker "$base?$query&password_file=$tmp/pw" --id-prefix pf- --count 3 --quiet
  expect_rc "$scheme: a wrong password in password_file= is refused" 2 \
    "$dedup" publish --broker "$base?$query&password_file=$tmp/wrong" --id-prefix pf- --count 1 --quiet
  [[ "$out" != *"not-$pw"* ]] || fail "$scheme: the wrong password was echoed: $out"
  local name file want
  for name in missing empty twice; do
    case $name in
      missing) file="$tmp/none"; uri="$base?$query&password_file=$file"; want="cannot read password_file" ;;
      empty) file="$tmp/empty"; uri="$base?$query&password_file=$file"; want="is empty" ;;
      twice) uri="$inline?$query&password_file=$tmp/pw"; want="both inline and in password_file=" ;;
    esac
    expect_rc "$scheme: password_file= $name is refused" 2 \
      "$dedup" publish --broker "$uri" --id-prefix pf- --count 1 --quiet
    [[ "$out" == *"$scheme URI"* && "$out" == *"$want"* ]] ||
      fail "$scheme: password_file= $name: the problem or the scheme not named: $out"
    [[ "$out" != *"$pw"* ]] || fail "$scheme: password_file= $name echoed the password: $out"
    # The worker checks its --broker the same way, before it opens the store.
    expect_rc "$scheme: worker --broker with password_file= $name is refused" 2 \
      "$dedup" worker --broker "$uri" --store "rocksdb:$tmp/never" --exec true
    [[ "$out" == *"$scheme URI"* && "$out" == *"$want"* && "$out" != *"$pw"* ]] ||
      fail "$scheme: worker, password_file= $name: $out"
    [[ ! -e "$tmp/never" ]] || fail "$scheme: worker made its store before refusing the broker"
  done
}

# A worker with password_file= consumes what was published: DONE names the file
# its handler appends to, and the worker stops once it holds N lines.
worker_consumes() {
  local scheme=$1 uri=$2 n=$3 how=${4:-password_file=}
  : >"$tmp/done"
  timeout 60 "$dedup" worker --broker "$uri" --store "memory:" --summary-interval 0 \
    --exec "cat >/dev/null; echo \$DEDUP_KEY >>$tmp/done" >"$tmp/worker.log" 2>&1 &
  local pid=$! i
  for i in $(seq 1 300); do
    (($(wc -l <"$tmp/done") >= n)) && break
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.1
  done
  kill -TERM "$pid" 2>/dev/null || true
  wait "$pid" 2>/dev/null || true
  check "$scheme: the worker with $how ran every message" "$n" "$(sort -u "$tmp/done" | wc -l)"
}

case $broker in
redis)
  source "$here/../scripts/lib/redis.sh"
  port=6520
  redis_start "$port" "$tmp/redis" --maxmemory 1 --maxmemory-policy noeviction
  expect_rc "publish to a Redis out of memory is 'try again later'" 75 \
    "$dedup" publish --broker "redis://127.0.0.1:$port?stream=oom" --field id=1
  [[ "$out" == *OOM* ]] || fail "the OOM reply is not shown: $out"
  # A Redis at maxclients answers a new connection "ERR max number of clients
  # reached" and closes it: later, when a client has gone, it takes one - 75, as
  # for OOM, not 2.
  redis-cli -p "$port" CONFIG SET maxclients 1 >/dev/null
  exec 3<>"/dev/tcp/127.0.0.1/$port"  # the one client
  sleep 0.2
  expect_rc "publish to a Redis at maxclients is 'try again later'" 75 \
    "$dedup" publish --broker "redis://127.0.0.1:$port?stream=oom" --field id=1
  [[ "$out" == *"max number of clients"* ]] || fail "the refusal is not shown: $out"
  exec 3>&-
  ;;
nats)
  source "$here/../scripts/lib/nats.sh"
  port=4239 pw='nats-s3cret'
  NATS_SERVER_ARGS=(--user dedup --pass "$pw")
  nats_start "$port" "$tmp/nats"
  # A stream that is not there is made by the publish: said on stderr, once.
  expect_rc "publish to a missing NATS stream" 0 \
    "$dedup" publish --broker "nats://dedup:$pw@127.0.0.1:$port?stream=JBOS" --id-prefix n- --count 2
  [[ "$out" == *"stream 'JBOS' did not exist; this publish created it"* ]] ||
    fail "publish made stream JBOS without saying so: $out"
  expect_rc "publish to the stream, now there" 0 \
    "$dedup" publish --broker "nats://dedup:$pw@127.0.0.1:$port?stream=JBOS" --id-prefix n- --count 2
  [[ "$out" != *"did not exist"* ]] || fail "an existing stream was said to be made: $out"
  # --field id=VALUE is the key, as on a Redis stream: it goes to Nats-Msg-Id, so the
  # worker has a key (it dead-lettered a keyless message) and the stream's duplicate
  # window drops the same id published again.
  expect_rc "--field id=42: stored" 0 \
    "$dedup" publish --broker "nats://dedup:$pw@127.0.0.1:$port?stream=JBOS" --field id=42 --field amount=7
  [[ "$out" == *"1 stored, 0 dropped"* ]] || fail "--field id=42 was not stored once: $out"
  expect_rc "--field id=42 again: dropped by the duplicate window" 0 \
    "$dedup" publish --broker "nats://dedup:$pw@127.0.0.1:$port?stream=JBOS" --field id=42 --field amount=7
  [[ "$out" == *"0 stored, 1 dropped"* ]] || fail "--field id=42 did not set Nats-Msg-Id: $out"
  expect_rc "--quiet says nothing, not even that" 0 \
    "$dedup" publish --broker "nats://dedup:$pw@127.0.0.1:$port?stream=QUIET" --id-prefix n- --quiet
  [[ -z "$out" ]] || fail "--quiet printed: $out"

  # A stream that exists but does not hold the subject published to: no stream
  # takes the message ("no responders"), and no retry changes that - 2, naming
  # the stream's subjects, not 'try again later' for ever.
  expect_rc "publish to a subject the existing stream does not hold is refused (2)" 2 \
    "$dedup" publish --broker "nats://dedup:$pw@127.0.0.1:$port?stream=JBOS&subject=other.in" --id-prefix n- --quiet
  [[ "$out" == *"JBOS"* && "$out" == *"other.in"* && "$out" != *"$pw"* ]] || fail "the stream and subject are not named: $out"

  # A new stream on a subject another stream holds already: JetStream refuses
  # to make it (error 10065, subjects overlap), and will every time - 2, naming
  # the overlap, not 'try again later' for ever (nor the worker's restart loop).
  expect_rc "a new stream on a subject another stream holds is refused (2)" 2 \
    "$dedup" publish --broker "nats://dedup:$pw@127.0.0.1:$port?stream=OTHER&subject=JBOS" --id-prefix n- --quiet
  [[ "$out" == *"overlap"* && "$out" == *"OTHER"* && "$out" != *"$pw"* ]] || fail "the overlap is not named: $out"
  expect_rc "a worker on it is refused too (2)" 2 \
    "$dedup" worker --broker "nats://dedup:$pw@127.0.0.1:$port?stream=OTHER&consumer=w&subject=JBOS" \
    --store "memory:" --exec true
  [[ "$out" == *"overlap"* && "$out" != *"$pw"* ]] || fail "the worker does not name the overlap: $out"

  # A subject with a wildcard is a filter, not a subject to publish to: the
  # server stored the message under the literal subject "wild.*" (read by
  # every consumer whose filter it matches, the dead-letter rules aside).
  # Refused, naming the subject, before anything is made or sent.
  expect_rc "publish to a wildcard subject is refused (2)" 2 \
    "$dedup" publish --broker "nats://dedup:$pw@127.0.0.1:$port?stream=WILD&subject=wild.*" --id-prefix n- --quiet
  [[ "$out" == *"wild.*"* && "$out" == *"wildcard"* && "$out" != *"$pw"* ]] || fail "the wildcard is not named: $out"
  expect_rc "publish to a subject with '>' is refused (2)" 2 \
    "$dedup" publish --broker "nats://dedup:$pw@127.0.0.1:$port?stream=WILD&subject=wild.>" --id-prefix n- --quiet
  expect_rc "the refused publishes made no stream" 0 \
    "$dedup" publish --broker "nats://dedup:$pw@127.0.0.1:$port?stream=WILD&subject=wild.in" --id-prefix n-
  [[ "$out" == *"stream 'WILD' did not exist; this publish created it"* ]] ||
    fail "a refused publish made stream WILD: $out"

  # A message over the server's max_payload (1 MiB by default) is refused before
  # it is sent; no later fixes its size: 2, not 'try again later' for ever.
  big=$(head -c 120000 /dev/zero | tr '\0' x)
  fields=()
  for i in 1 2 3 4 5 6 7 8 9; do fields+=(--field "f$i=$big"); done
  expect_rc "a message over max_payload is refused (2)" 2 \
    "$dedup" publish --broker "nats://dedup:$pw@127.0.0.1:$port?stream=BIG" "${fields[@]}" --quiet
  [[ "$out" == *"Maximum Payload"* || "$out" == *"max_payload"* ]] || fail "the limit is not named: $out"
  # The stream's own limit (max_msg_size, below the server's max_payload): the
  # server refuses the message (JetStream error 10054) and will refuse it every
  # time - 2, naming the limit, not 'try again later' for ever.
  nats_add_stream "$port" dedup "$pw" SMALL small.in 1000 || fail "could not make stream SMALL"
  expect_rc "a message within the stream's max_msg_size is stored" 0 \
    "$dedup" publish --broker "nats://dedup:$pw@127.0.0.1:$port?stream=SMALL&subject=small.in" --field f=short --quiet
  expect_rc "a message over the stream's max_msg_size is refused (2)" 2 \
    "$dedup" publish --broker "nats://dedup:$pw@127.0.0.1:$port?stream=SMALL&subject=small.in" \
    --field "f=$(head -c 2000 /dev/zero | tr '\0' y)" --quiet
  [[ "$out" == *"max_msg_size"* && "$out" == *"SMALL"* && "$out" != *"$pw"* ]] ||
    fail "the stream's limit is not named: $out"

  # A stream full with discard new (max_msgs=1): the server refuses the message
  # (JetStream error 10077, "maximum messages exceeded"). 75, as a RabbitMQ queue
  # at its length limit with reject-publish: the stream empties when consumers
  # ack (work-queue or interest retention), its messages age out (max_age), or
  # an operator purges it or raises the limit. The message names the limit.
  nats_add_stream "$port" dedup "$pw" FULL full.in -1 1 new || fail "could not make stream FULL"
  expect_rc "a message to an empty stream of max_msgs=1 is stored" 0 \
    "$dedup" publish --broker "nats://dedup:$pw@127.0.0.1:$port?stream=FULL&subject=full.in" --field id=1 --quiet
  expect_rc "a message to a full stream with discard new is 'try again later' (75)" 75 \
    "$dedup" publish --broker "nats://dedup:$pw@127.0.0.1:$port?stream=FULL&subject=full.in" --field id=2 --quiet
  [[ "$out" == *"10077"* && "$out" == *"maximum messages exceeded"* && "$out" != *"$pw"* ]] ||
    fail "the full stream's limit is not named: $out"

  password_file_checks nats "nats://dedup@127.0.0.1:$port" "stream=PF&consumer=w" "$pw" \
    "nats://dedup:$pw@127.0.0.1:$port"
  worker_consumes nats "nats://dedup@127.0.0.1:$port?stream=PF&consumer=w&password_file=$tmp/pw" 3
  ;;
nats-token)
  source "$here/../scripts/lib/nats.sh"
  port=4245 token='tok-s3cret-7f1'
  NATS_SERVER_ARGS=(--auth "$token")
  nats_start "$port" "$tmp/nats"
  # The token where every NATS client reads it in a URL: nats://TOKEN@HOST (it
  # was sent as a user name, and the server refused it: 'Authorization Violation').
  expect_rc "publish with the token in the URI (nats://TOKEN@HOST)" 0 \
    "$dedup" publish --broker "nats://$token@127.0.0.1:$port?stream=TOK" --id-prefix t- --count 3 --quiet
  printf '%s\n' "$token" >"$tmp/token"
  printf 'not-%s\n' "$token" >"$tmp/wrong"
  : >"$tmp/empty"
  expect_rc "publish with token_file=" 0 \
    "$dedup" publish --broker "nats://127.0.0.1:$port?stream=TOK&token_file=$tmp/token" \
    --id-prefix t- --start 3 --count 3 --quiet
  expect_rc "a wrong token is refused (2)" 2 \
    "$dedup" publish --broker "nats://not-$token@127.0.0.1:$port?stream=TOK" --id-prefix t- --quiet
  [[ "$out" != *"$token"* ]] || fail "the wrong token was echoed: $out"
  expect_rc "a wrong token in token_file= is refused (2)" 2 \
    "$dedup" publish --broker "nats://127.0.0.1:$port?stream=TOK&token_file=$tmp/wrong" --id-prefix t- --quiet
  [[ "$out" != *"$token"* ]] || fail "the wrong token was echoed: $out"
  for name in missing empty inline user password; do
    case $name in
      missing) uri="nats://127.0.0.1:$port?stream=TOK&token_file=$tmp/none"; want="cannot read token_file" ;;
      empty) uri="nats://127.0.0.1:$port?stream=TOK&token_file=$tmp/empty"; want="is empty" ;;
      inline) uri="nats://$token@127.0.0.1:$port?stream=TOK&token_file=$tmp/token"; want="token_file=" ;;
      user) uri="nats://u:$token@127.0.0.1:$port?stream=TOK&token_file=$tmp/token"; want="token_file=" ;;
      password) uri="nats://127.0.0.1:$port?stream=TOK&token_file=$tmp/token&password_file=$tmp/token"; want="token_file=" ;;
    esac
    expect_rc "token_file= $name is refused" 2 "$dedup" publish --broker "$uri" --id-prefix t- --quiet
    [[ "$out" == *"nats URI"* && "$out" == *"$want"* ]] || fail "token_file= $name: the problem is not named: $out"
    [[ "$out" != *"$token"* ]] || fail "token_file= $name echoed the token: $out"
  done
  # The worker authenticates the same way, and its log never shows the token.
  worker_consumes nats "nats://$token@127.0.0.1:$port?stream=TOK&consumer=w" 6 "the token in the URI"
  [[ "$(cat "$tmp/worker.log")" != *"$token"* ]] || fail "the worker's log shows the token: $(cat "$tmp/worker.log")"
  worker_consumes nats "nats://127.0.0.1:$port?stream=TOK&consumer=w2&token_file=$tmp/token" 6 token_file=
  [[ "$(cat "$tmp/worker.log")" != *"$token"* ]] || fail "the worker's log shows the token: $(cat "$tmp/worker.log")"
  ;;
rabbitmq)
  source "$here/../scripts/lib/rabbitmq.sh"
  port=5684 pw='amqp-s3cret'
  rabbitmq_start "$port" "$tmp/rmq"
  rabbitmqctl_node -q add_user dedup "$pw" >/dev/null
  rabbitmqctl_node -q set_permissions -p / dedup '.*' '.*' '.*' >/dev/null
  password_file_checks amqp "amqp://dedup@127.0.0.1:$port/" "queue=pf" "$pw" \
    "amqp://dedup:$pw@127.0.0.1:$port/"
  worker_consumes amqp "amqp://dedup@127.0.0.1:$port/?queue=pf&password_file=$tmp/pw" 3

  # A queue at its length limit with overflow reject-publish nacks what it cannot
  # take: its consumers drain it, so a later publish works - 'try again later'
  # (75), as for a Redis out of memory.
  rabbitmqctl_node -q set_policy -p / full '^full$' '{"max-length":1,"overflow":"reject-publish"}' \
    --apply-to queues >/dev/null
  expect_rc "publish to a full queue (reject-publish) is 'try again later'" 75 \
    "$dedup" publish --broker "amqp://dedup:$pw@127.0.0.1:$port/?queue=full" --id-prefix f- --count 3 --quiet
  [[ "$out" == *"nack"* ]] || fail "the nack is not named: $out"
  # A user who may not write to the default exchange (its queue's dead-letter
  # topology it may write): refused by the broker's permissions, as a refused
  # password or vhost is - 2, not 'try again later' for ever.
  rabbitmqctl_node -q add_user reader "$pw" >/dev/null
  rabbitmqctl_node -q set_permissions -p / reader '.*' '.*dead.*' '.*' >/dev/null
  expect_rc "publish the user may not write is refused (2)" 2 \
    "$dedup" publish --broker "amqp://reader:$pw@127.0.0.1:$port/?queue=ro" --id-prefix r- --count 1 --quiet
  [[ "$out" == *"ACCESS_REFUSED"* && "$out" != *"$pw"* ]] || fail "the refusal is not named: $out"
  # A message over the node's max_message_size: the broker closes the channel
  # with 406 PRECONDITION_FAILED, and will for every try - 2, naming the limit,
  # not 'try again later' for ever. (Set at run time: a channel reads it when
  # it opens, and each publish opens its own.)
  rabbitmqctl_node -q eval 'application:set_env(rabbit, max_message_size, 4096).' >/dev/null
  expect_rc "a message within max_message_size is published" 0 \
    "$dedup" publish --broker "amqp://dedup:$pw@127.0.0.1:$port/?queue=sized" --field f=short --quiet
  expect_rc "a message over max_message_size is refused (2)" 2 \
    "$dedup" publish --broker "amqp://dedup:$pw@127.0.0.1:$port/?queue=sized" \
    --field "f=$(head -c 8000 /dev/zero | tr '\0' y)" --quiet
  [[ "$out" == *"PRECONDITION_FAILED"* && "$out" == *"max size"* && "$out" != *"$pw"* ]] ||
    fail "the limit is not named: $out"
  # A message_id over 255 bytes (an AMQP short string): rabbitmq-c's "invalid AMQP
  # data", UNAVAILABLE, was 'try again later' (75) for ever. Refused, 2, naming it.
  expect_rc "a message_id of 256 bytes is refused (2)" 2 \
    "$dedup" publish --broker "amqp://dedup:$pw@127.0.0.1:$port/?queue=longid" \
    --field "id=$(head -c 256 /dev/zero | tr '\0' L)" --quiet
  [[ "$out" == *"message_id is 256 bytes"* && "$out" == *"255"* ]] || fail "the limit is not named: $out"
  # The same key as a header value goes (key=header:NAME), and the count says
  # one distinct message (it said 3: --count, whatever the key).
  expect_rc "a 256-byte key in a header is published" 0 \
    "$dedup" publish --broker "amqp://dedup:$pw@127.0.0.1:$port/?queue=longid&key=header:k" \
    --field "id=$(head -c 256 /dev/zero | tr '\0' L)" --count 3
  [[ "$out" == *"published 3 messages (1 distinct)"* && "$out" == *"vhost=/ "* ]] ||
    fail "one key published 3 times: $out"
  ;;
*)
  echo "usage: publish_brokers_test.sh DEDUP_CLI redis|nats|nats-token|rabbitmq" >&2
  exit 2
  ;;
esac
check_done "publish_brokers ($broker)"
