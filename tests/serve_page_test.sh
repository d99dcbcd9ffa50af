#!/usr/bin/env bash
# The web view of `dedup serve` in headless Chromium, against a real server on a
# password-protected Redis, with an auth token (tests/serve_page_test.py).
#   serve_page_test.sh DEDUP_BINARY [SCREENSHOT.png]   (ports 8090-8091, docs/PORTS.md)
# With SERVE_PAGE_MODE=proxy, the same page under /_dedup/ of a proxy (ports 8096-8098:
# Redis, serve, the application), whose cookie is for /_dedup/ only.
set -euo pipefail
shot=${2:+$(realpath -m "$2")}
root=$(cd "$(dirname "$0")/.." && pwd)
if ! command -v chromium >/dev/null && [ ! -x "${CHROMIUM:-/usr/bin/chromium}" ]; then
  echo "serve_page_test: chromium is not installed (scripts/install-deps.sh installs it)"
  exit 1
fi
# shellcheck source=lib/serve_test.sh
source "$root/tests/lib/serve_test.sh"
serve_test_begin serve-page "$1"
redis_port=8090
port=8091
proxy_args=()
if [ "${SERVE_PAGE_MODE:-api}" = proxy ]; then
  redis_port=8096
  port=8097
  serve_start 8098 "$tmp/app.log" python3 "$root/tests/serve_app.py" 8098 "$tmp/calls"
  proxy_args=(--proxy http://127.0.0.1:8098)
fi
password="pw-$(head -c 8 /dev/urandom | od -An -tx1 | tr -d ' \n')"
token="tok-$(head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \n')"
echo "$token" >"$tmp/token"
REDIS_CLI_AUTH="-a $password --no-auth-warning" redis_start $redis_port "$tmp/redis" --requirepass "$password"
serve_start $port "$tmp/serve.log" "$dedup" serve --store "redis://:$password@127.0.0.1:$redis_port" \
  --listen 127.0.0.1:$port --auth-token-file "$tmp/token" "${proxy_args[@]}"
base="http://127.0.0.1:$port${proxy_args:+/_dedup}"
claim() {  # claim KEY JSON
  curl -fsS -o /dev/null -H "Authorization: Bearer $token" -X POST \
    "$base/v1/keys/$(python3 -c 'import sys,urllib.parse; print(urllib.parse.quote(sys.argv[1], safe=""))' "$1")/claim" -d "$2" || true
}
t=$(curl -fsS -H "Authorization: Bearer $token" -X POST "$base/v1/keys/web-completed/claim" -d '{}' |
    python3 -c 'import json,sys; print(json.load(sys.stdin)["token"])')
curl -fsS -o /dev/null -H "Authorization: Bearer $token" -X POST "$base/v1/keys/web-completed/complete" \
  -d "{\"token\":\"$t\",\"result\":\"done\"}"
claim web-stuck '{"lease_ms":300}'
claim web-forget-me '{"lease_ms":600000}'
claim 'web-<script>window.pwned=1</script>' '{"lease_ms":600000}'
claim 'web-<img src=x onerror="window.pwned=2">' '{"lease_ms":600000}'
# A record no one can read (written by hand): listed as undecodable, forgettable.
redis-cli -p $redis_port -a "$password" --no-auth-warning SET dedup:web-unreadable "not a record" >/dev/null
sleep 0.5  # web-stuck's lease runs out
python3 "$root/tests/serve_page_test.py" "$base" "$token" "$password" ${shot:+"$shot"}
if grep -q "$password" "$tmp/serve.log"; then
  echo "FAIL the store's password appears in serve's log"
  exit 1
fi
echo "serve_page_test: all checks passed"
