#!/usr/bin/env bash
# No password in any message of any command (issue 13, item 6), for well-formed and
# mistyped URIs; and the ways to give a Redis password without the command line
# (password_file=, DEDUP_REDIS_PASSWORD), against a real password-protected Redis.
#
#   tests/secrets_hardening_test.sh DEDUP_CLI
#
# Starts its own redis-server (requirepass) on 127.0.0.1:${DEDUP_SECRETS_REDIS_PORT:-6491},
# and one without the AUTH command on ${DEDUP_SECRETS_NOAUTH_PORT:-6480} (docs/PORTS.md),
# in temporary directories, and stops them by PID on exit. Nothing listens on
# 127.0.0.1:1, where the mistyped URIs point.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
dedup=${1:?usage: secrets_hardening_test.sh DEDUP_CLI}
port=${DEDUP_SECRETS_REDIS_PORT:-6491}
# shellcheck source=lib/cli_test.sh
source "$here/lib/cli_test.sh"
cli_test_begin  # $tmp; Redis and the worker (worker_pid) stopped at exit
P=S3cr3tPW

# 1. Every command, every typo: the password is never printed.
uris=(
  "redis://$P@127.0.0.1:1" "redis://:$P@127.0.0.1:1" "redis://u:$P@127.0.0.1:1"
  "redis:/$P@127.0.0.1:1" "redis:/:$P@127.0.0.1:1" "redis:$P@127.0.0.1" "redis:/u:$P@h"
  ":$P@127.0.0.1" "$P" "$P@127.0.0.1:1" "redis//:$P@h" "redis:///:$P@h"
  "redis://:$P@h:badport" "redis://:$P@127.0.0.1:1?prefx=a" "redis://:$P@127.0.0.1:1/notanumber"
  "redis://:S3%ZZcr3tPW@h" "redis://:$P@" "redis://:$P@h:1/0/extra" "rediss://:$P@h"
  "redis+cluster://:$P@h1,h2:bad" "redis+cluster://:$P@127.0.0.1:1" "redis://:$P@127.0.0.1:1?db=x"
  "redis://:$P@[::1" "redis://:$P:more@127.0.0.1:1" "redis://:$P@@127.0.0.1:1" "redis://:$P%@h"
  "redis://:$P@h:1?prefix" "redis://:$P@h:1?=x" "redis:/:$P" "redis://:$P"
  "postgres://u:$P@127.0.0.1:1/db" "redis://:$P@127.0.0.1:99999" "redis://:$P@:6379"
  "REDIS://:$P@h" "redis://:$P@h:1,h2:2" "redis://$P:@127.0.0.1:1" "redis ://:$P@h"
  "redis://:$P@h:1?timeout=abc" "redis://:$P@127.0.0.1:1?password_file=/nonexistent"
  # The '@host' forgotten: the password reads as a port on every scheme.
  "amqp://u:$P?queue=q" "nats://u:$P?stream=s&consumer=c" "postgres://u:$P/db"
  "postgres://u:$P,h/db" "amqp://u:$P@h:0?queue=q"
)
checked=0
for u in "${uris[@]}"; do
  for cmd in inspect forget exec worker-broker worker-store publish bench; do
    case $cmd in
      inspect) args=(inspect --store "$u" k) ;;
      forget) args=(forget --store "$u" k) ;;
      exec) args=(exec --store "$u" --key k -- true) ;;
      worker-broker) args=(worker --broker "$u" --store memory: --exec true) ;;
      worker-store) args=(worker --broker "redis://127.0.0.1:1?stream=s" --store "$u" --exec true) ;;
      publish) args=(publish --broker "$u" --count 1) ;;
      bench) args=(bench --redis "$u" --quick --no-rocksdb) ;;
    esac
    # "redis ://..." is a URI split by a blank: CLI11 echoes the stray words.
    [[ "$u" == *" "* ]] && read -ra args <<<"${args[*]}"
    out=$(timeout 20 "$dedup" "${args[@]}" 2>&1 </dev/null) || true
    checked=$((checked + 1))
    if [[ "$out" == *"$P"* || "$out" == *S3%ZZ* ]]; then
      fail "dedup ${args[*]} printed the password:"; grep -m2 -E "$P|S3%ZZ" <<<"$out" | sed 's/^/    /'
    fi
  done
done
for p in "http://u:$P" "https://u:$P" "http://u:$P/x" "http://u:$P@127.0.0.1:1" "https://u:$P@127.0.0.1:1"; do
  out=$(timeout 20 "$dedup" serve --store memory: --listen 127.0.0.1:1 --proxy "$p" 2>&1 </dev/null) || true
  checked=$((checked + 1))
  if [[ "$out" == *"$P"* ]]; then fail "dedup serve --proxy $p printed the password: $out"; fi
done
# A handler refused at start is named (worker --exec, also through the shell
# since a plain path is checked there; dedup exec's command): a URL with a
# password in that first word was printed whole. A mistyped option is named too.
for args in "worker --broker redis://127.0.0.1:1?stream=s --store memory: --exec https://u:$P@h/hook" \
            "worker --broker redis://127.0.0.1:1?stream=s --store memory: --no-shell --exec https://u:$P@h/hook" \
            "exec --store memory: --key k -- https://u:$P@h/hook" \
            "inspect --stor=redis://:$P@127.0.0.1:1 k" "inspect --store:redis://:$P@127.0.0.1:1 k" \
            "inspect --redis://:$P@127.0.0.1:1 k" "worker --brokerredis://u:$P@h:1?stream=s"; do
  read -ra argv <<<"$args"
  out=$(timeout 20 "$dedup" "${argv[@]}" 2>&1 </dev/null) || true
  checked=$((checked + 1))
  if [[ "$out" == *"$P"* ]]; then fail "dedup $args printed the password: $out"; fi
done
echo "ok   $checked command lines with a password checked"

# 2. A password-protected Redis, reached without a password on the command line.
REDIS_CLI_AUTH="-a $P --no-auth-warning" redis_start "$port" "$tmp/redis" --requirepass "$P" --appendonly yes  # no AOF warning in the outputs compared below
store="redis://127.0.0.1:$port?prefix=s:"
printf '%s\n' "$P" >"$tmp/pw"
out=$("$dedup" exec --store "$store&password_file=$tmp/pw" --key a -- echo ran 2>&1) &&
  [[ "$out" == ran ]] && echo "ok   password_file= authenticates" || fail "password_file=: $out"
# A password_file= that is no password file is named for what it is, at once,
# for every scheme that takes one: a directory was "is empty", and /dev/zero (or
# any endless or huge file) was read into memory without end (240 MB in 3 s).
mkdir "$tmp/pwdir"
for uri in "redis://127.0.0.1:$port?stream=st&password_file=$tmp/pwdir|is a directory" \
           "redis://127.0.0.1:$port?stream=st&password_file=/dev/zero|larger than" \
           "amqp://u@127.0.0.1:1/?queue=q&password_file=/dev/zero|larger than" \
           "nats://u@127.0.0.1:1?stream=S&password_file=$tmp/pwdir|is a directory"; do
  want=${uri##*|} uri=${uri%|*}
  set +e; out=$(timeout 10 "$dedup" publish --broker "$uri" --field id=1 2>&1); rc=$?; set -e
  [[ $rc -eq 2 && "$out" == *"$want"* ]] && echo "ok   password_file= $want is refused: ${uri%%:*}" ||
    fail "password_file= $want: ${uri%%:*}: rc $rc: ${out:0:300}"
done
out=$(DEDUP_REDIS_PASSWORD=$P "$dedup" inspect --store "$store" a 2>&1) &&
  [[ "$out" == *completed* && "$out" != *"$P"* ]] && echo "ok   DEDUP_REDIS_PASSWORD authenticates; inspect shows no password" ||
  fail "DEDUP_REDIS_PASSWORD: $out"
out=$(DEDUP_REDIS_PASSWORD=$P "$dedup" inspect --store "$store" --prefix '' --json 2>&1) &&
  [[ "$out" != *"$P"* ]] && echo "ok   inspect --json shows no password" || fail "inspect --json: $out"
out=$("$dedup" inspect --store "redis://:wrong$P@127.0.0.1:$port" a 2>&1) && fail "wrong password accepted" ||
  { [[ "$out" == *UNAUTHENTICATED* && "$out" != *"$P"* ]] && echo "ok   a wrong password is UNAUTHENTICATED, not echoed" ||
    fail "wrong password: $out"; }
# No password: UNAUTHENTICATED, and the advice is a way that keeps it out of ps
# (password_file=, DEDUP_REDIS_PASSWORD), never a URI holding it (redis://:pass@host).
out=$("$dedup" inspect --store "$store" a 2>&1) && fail "no password accepted" ||
  { [[ "$out" == *UNAUTHENTICATED* ]] && echo "ok   no password is UNAUTHENTICATED" || fail "no password: $out"; }
[[ "$out" == *password_file=*DEDUP_REDIS_PASSWORD* && "$out" != *pass@host* ]] &&
  echo "ok   NOAUTH advises password_file= or DEDUP_REDIS_PASSWORD" || fail "NOAUTH advice: $out"
# The worker's broker URI takes the same sources.
out=$("$dedup" publish --broker "redis://127.0.0.1:$port?stream=st&password_file=$tmp/pw" --id-prefix m --count 1 2>&1) &&
  echo "ok   broker URI with password_file= publishes" || fail "publish with password_file=: $out"
out=$(DEDUP_REDIS_PASSWORD=$P "$dedup" publish --broker "redis://127.0.0.1:$port?stream=st" --id-prefix m --count 1 2>&1) &&
  echo "ok   broker URI with DEDUP_REDIS_PASSWORD publishes" || fail "publish with env: $out"
# A handler is the user's command: it does not inherit the worker's (or dedup
# exec's) store password from DEDUP_REDIS_PASSWORD, while the worker still
# authenticates with it. Everything else of the environment is inherited.
shown() { grep -m1 DEDUP_REDIS_PASSWORD | sed "s/$P/PASSWORD/"; }  # never the password
export DEDUP_TEST_PLAIN=plain
out=$(DEDUP_REDIS_PASSWORD=$P "$dedup" exec --store "$store" --key env-exec -- env 2>&1) &&
  [[ "$out" == *DEDUP_KEY=env-exec* && "$out" == *DEDUP_TEST_PLAIN=plain* ]] ||
  fail "dedup exec with DEDUP_REDIS_PASSWORD: ${out:0:300}"
[[ "$out" != *DEDUP_REDIS_PASSWORD* && "$out" != *"$P"* ]] &&
  echo "ok   dedup exec's command does not inherit DEDUP_REDIS_PASSWORD" ||
  fail "dedup exec's command got DEDUP_REDIS_PASSWORD: $(shown <<<"$out")"
envs="redis://127.0.0.1:$port?stream=envs"
DEDUP_REDIS_PASSWORD=$P "$dedup" publish --broker "$envs" --field id=env-w --quiet
DEDUP_REDIS_PASSWORD=$P "$dedup" worker --broker "$envs" --store "$store" \
  --exec "env >$tmp/handler-env.part && mv $tmp/handler-env.part $tmp/handler-env" \
  </dev/null >"$tmp/worker.log" 2>&1 &
worker_pid=$!
for _ in $(seq 100); do [[ -e "$tmp/handler-env" ]] && break; sleep 0.1; done
kill -TERM "$worker_pid" 2>/dev/null; wait "$worker_pid" 2>/dev/null || true
worker_pid=
env_out=$(cat "$tmp/handler-env" 2>/dev/null) || true
if [[ "$env_out" != *DEDUP_KEY=env-w* || "$env_out" != *DEDUP_TEST_PLAIN=plain* ]]; then
  fail "worker --exec with DEDUP_REDIS_PASSWORD: no handler ran: $(head -c 300 "$tmp/worker.log")"
elif [[ "$env_out" == *DEDUP_REDIS_PASSWORD* || "$env_out" == *"$P"* ]]; then
  fail "worker --exec: the handler got DEDUP_REDIS_PASSWORD: $(shown <<<"$env_out")"
else
  echo "ok   worker --exec authenticates with DEDUP_REDIS_PASSWORD; its handler does not inherit it"
fi
# Nor does a handler read it where dedup's environment is shown as it was started:
# /proc/PID/environ of its worker ($DEDUP_WORKER_PID) or of dedup exec (its parent),
# which the user's other processes read (ps e) and which setenv never rewrites.
# The handlers read the rest of it there (DEDUP_TEST_PLAIN): the file was read.
out=$(DEDUP_REDIS_PASSWORD=$P "$dedup" exec --store "$store" --key env-proc -- \
        sh -c 'tr "\0" "\n" </proc/$PPID/environ' 2>&1) &&
  [[ "$out" == *DEDUP_TEST_PLAIN=plain* ]] ||
  fail "dedup exec: its command could not read /proc/\$PPID/environ: $(sed "s/$P/PASSWORD/g" <<<"${out:0:300}")"
[[ "$out" != *"$P"* ]] &&
  echo "ok   dedup exec's /proc/PID/environ does not show DEDUP_REDIS_PASSWORD to its command" ||
  fail "dedup exec's command read DEDUP_REDIS_PASSWORD in /proc/\$PPID/environ: $(shown <<<"$out")"
# A worker running its handler without a shell (--no-shell): the same.
printf '#!/bin/sh\n{ env; tr "\\0" "\\n" </proc/$DEDUP_WORKER_PID/environ; } >%s.part && mv %s.part %s\n' \
  "$tmp/proc-env" "$tmp/proc-env" "$tmp/proc-env" >"$tmp/proc-env.sh"
chmod +x "$tmp/proc-env.sh"
DEDUP_REDIS_PASSWORD=$P "$dedup" publish --broker "$envs" --field id=env-proc-w --quiet
DEDUP_REDIS_PASSWORD=$P "$dedup" worker --broker "$envs" --store "$store" --no-shell \
  --exec "$tmp/proc-env.sh" </dev/null >"$tmp/worker.log" 2>&1 &
worker_pid=$!
for _ in $(seq 100); do [[ -e "$tmp/proc-env" ]] && break; sleep 0.1; done
kill -TERM "$worker_pid" 2>/dev/null; wait "$worker_pid" 2>/dev/null || true
worker_pid=
env_out=$(cat "$tmp/proc-env" 2>/dev/null) || true
if [[ "$env_out" != *DEDUP_KEY=env-proc-w* || $(grep -c DEDUP_TEST_PLAIN=plain <<<"$env_out") != 2 ]]; then
  fail "worker --no-shell: no handler read its worker's environ: $(head -c 300 "$tmp/worker.log")"
elif [[ "$env_out" == *"$P"* ]]; then
  fail "worker --no-shell: the handler read DEDUP_REDIS_PASSWORD: $(shown <<<"$env_out")"
else
  echo "ok   worker --no-shell: neither the handler's environment nor its worker's /proc/PID/environ shows DEDUP_REDIS_PASSWORD"
fi
# bench --redis says why it cannot use a server.
out=$(timeout 60 "$dedup" bench --redis "redis://:wrong$P@127.0.0.1:$port" --quick 2>&1) || true
[[ "$out" == *WRONGPASS* && "$out" != *"$P"* ]] && echo "ok   bench --redis with a wrong password says so" ||
  fail "bench wrong password: $out"
# bench --redis with password_file=: the store's rows use that password, and
# redis-benchmark, which takes one only on its command line (which ps shows to
# every user), is not given it. A stand-in redis-benchmark records its arguments.
mkdir "$tmp/bin"
printf '#!/bin/sh\nprintf "%%s\\n" "$*" >>"%s"\nexit 1\n' "$tmp/benchmark-args" >"$tmp/bin/redis-benchmark"
chmod +x "$tmp/bin/redis-benchmark"
out=$(PATH="$tmp/bin:$PATH" timeout 120 "$dedup" bench --redis "redis://127.0.0.1:$port?password_file=$tmp/pw" \
        --quick --no-rocksdb --phase throughput --no-progress 2>&1) || true
[[ "$out" == *"| redis | dedup claim |"* && "$out" != *NOAUTH* ]] &&
  echo "ok   bench --redis with password_file= measures the Redis store with it" ||
  fail "bench --redis password_file=: the Redis store's rows: $(grep -m3 -E 'NOAUTH|redis' <<<"$out")"
if [[ -e "$tmp/benchmark-args" ]] && grep -q "$P" "$tmp/benchmark-args"; then
  fail "bench --redis password_file=: redis-benchmark got the password on its command line: $(sed "s/$P/PASSWORD/g" "$tmp/benchmark-args" | head -1)"
else
  echo "ok   bench --redis with password_file= puts the password on no command line"
fi
[[ "$out" != *"$P"* ]] || fail "bench --redis password_file= printed the password"
out=$(timeout 60 "$dedup" bench --redis "redis://127.0.0.1:1" --quick 2>&1) || true
[[ "$out" == *"onnection refused"* ]] && echo "ok   bench --redis with the server down says so" ||
  fail "bench server down: $out"
# bench --redis: the URI's user name reaches redis-benchmark as one argument, never
# through a shell (an ACL user name may hold ';', '$' and '>').
user="x;touch\${IFS}$tmp/injected;#"
redis-cli -h 127.0.0.1 -p "$port" -a "$P" --no-auth-warning ACL SETUSER "$user" on ">$P" '~*' '+@all' >/dev/null
enc_user=$(python3 -c 'import sys, urllib.parse; print(urllib.parse.quote(sys.argv[1], safe=""))' "$user")
out=$(timeout 120 "$dedup" bench --redis "redis://$enc_user:$P@127.0.0.1:$port" \
        --quick --no-rocksdb --phase throughput --no-progress 2>&1) || true
if [[ -e "$tmp/injected" ]]; then
  fail "bench --redis: the ACL user name ran as a shell command (redis-benchmark started through a shell)"
elif [[ "$out" != *"| redis | redis-benchmark SET NX EX (-P 1) |"*[0-9]* ]]; then
  fail "bench --redis with an ACL user: no redis-benchmark row: $(grep -m3 -iE 'redis-benchmark|error' <<<"$out")"
else
  echo "ok   bench --redis passes the ACL user name to redis-benchmark as one argument, no shell"
fi
[[ "$out" != *"$P"* ]] || fail "bench --redis with an ACL user printed the password"

# A /db in the broker URI is honoured, not ignored (issue 13, item 9).
out=$(DEDUP_REDIS_PASSWORD=$P "$dedup" publish --broker "redis://127.0.0.1:$port/3?stream=db3" \
        --id-prefix m --count 1 2>&1) || fail "publish to /3: $out"
n3=$(redis-cli -h 127.0.0.1 -p "$port" -a "$P" --no-auth-warning -n 3 XLEN db3)
n0=$(redis-cli -h 127.0.0.1 -p "$port" -a "$P" --no-auth-warning -n 0 XLEN db3)
[[ "$n3" == 1 && "$n0" == 0 ]] && echo "ok   a /db in the broker URI is honoured" || fail "broker /3: db3=$n3 db0=$n0"

# A server that does not know AUTH (renamed away in a hardened config; some RESP
# proxies) answers "ERR unknown command 'AUTH', with args beginning with: 'user'
# 'password'": that reply was printed as it came, password and all.
noauth_port=${DEDUP_SECRETS_NOAUTH_PORT:-6480}
redis_start "$noauth_port" "$tmp/noauth" --rename-command AUTH "" --appendonly yes
# A password that is a word of the reply ("AUTH") is no sign of a wrong one.
set +e; out=$(timeout 20 "$dedup" inspect --store "redis://:AUTH@127.0.0.1:$noauth_port" k 2>&1); rc=$?; set -e
[[ $rc -eq 2 && "$out" == *"FAILED_PRECONDITION"*"AUTH: "* ]] &&
  echo "ok   a password that is a word of the reply: still a server without AUTH" ||
  fail "password AUTH against a server without AUTH: rc $rc: ${out:0:300}"
for args in "inspect --store redis://usr:$P@127.0.0.1:$noauth_port k" \
            "worker --broker redis://:$P@127.0.0.1:$noauth_port?stream=s --store memory: --exec true" \
            "publish --broker redis://:$P@127.0.0.1:$noauth_port?stream=s --field id=1"; do
  read -ra a <<<"$args"
  set +e; out=$(timeout 20 "$dedup" "${a[@]}" 2>&1 </dev/null); rc=$?; set -e
  if [[ "$out" == *"$P"* ]]; then
    fail "dedup ${a[0]} against a server without AUTH printed the password: ${out:0:300}"
  elif [[ $rc -eq 0 || "$out" != *"AUTH: ERR unknown command"* ]]; then
    fail "dedup ${a[0]} against a server without AUTH: rc $rc: ${out:0:300}"
  else
    echo "ok   dedup ${a[0]}: a server without AUTH is named, its reply without the password"
  fi
done

check_done "secrets"
