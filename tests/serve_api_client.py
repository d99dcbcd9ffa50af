#!/usr/bin/env python3
"""A client of the dedup serve API in Python, standard library only: the pattern a
service in any language follows to run a piece of work once per key.

  serve_api_client.py BASE_URL       e.g. http://127.0.0.1:8070

Exits 0 when every step answered as docs/openapi.yaml says, 1 otherwise.
"""
import base64
import json
import sys
import urllib.error
import urllib.parse
import urllib.request

BASE = sys.argv[1].rstrip("/")
failures = 0


def call(method, path, body=None):
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(BASE + path, data=data, method=method,
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, dict(r.headers), json.loads(r.read() or b"{}")
    except urllib.error.HTTPError as e:
        return e.code, dict(e.headers), json.loads(e.read() or b"{}")


def key_path(key: bytes) -> str:
    return "/v1/keys/" + urllib.parse.quote(key, safe="")


def check(what, ok):
    global failures
    print(("ok   " if ok else "FAIL ") + "python: " + what)
    if not ok:
        failures += 1


def run_once(key: bytes, work):
    """Claims key, runs work() when acquired, records its result. Returns
    (ran, result bytes)."""
    status, headers, c = call("POST", key_path(key) + "/claim", {"lease_ms": 10000})
    if status == 201:
        result = work(c["fence"])
        status, _, done = call("POST", key_path(key) + "/complete",
                               {"token": c["token"],
                                "result_b64": base64.b64encode(result).decode()})
        check("complete answers OK", status == 200 and done["result"] == "OK")
        return True, result
    if status == 200:
        check("a duplicate is marked as a replay", headers.get("Idempotent-Replayed") == "true")
        return False, base64.b64decode(c["result_b64"])
    raise RuntimeError("claim answered %d %s" % (status, c))


runs = []
key = b"py-\x00\xfe-payment"  # any bytes
ran1, r1 = run_once(key, lambda fence: runs.append(fence) or b"\x01receipt\xff")
ran2, r2 = run_once(key, lambda fence: runs.append(fence) or b"other")
check("the work ran once for two deliveries", ran1 and not ran2 and len(runs) == 1 and runs[0] >= 1)
check("the repeat got the first result's bytes back", r2 == b"\x01receipt\xff")

status, _, rec = call("GET", key_path(key))
check("inspect shows a completed record", status == 200 and rec["state"] == "completed")
check("a binary key travels as key_b64", base64.b64decode(rec["key_b64"]) == key
      and "key" not in rec)

status, headers, c = call("POST", key_path(b"py-busy") + "/claim", {"lease_ms": 60000})
status2, headers2, c2 = call("POST", key_path(b"py-busy") + "/claim", {})
check("a concurrent claim gets 409 with Retry-After",
      status == 201 and status2 == 409 and int(headers2.get("Retry-After", "0")) >= 1)
status, _, r = call("POST", key_path(b"py-busy") + "/release", {"token": c["token"]})
check("release answers OK", status == 200 and r["result"] == "OK")

status, _, page = call("GET", "/v1/keys?prefix=" + urllib.parse.quote(b"py-", safe="") + "&limit=1")
status2, _, page2 = call("GET", "/v1/keys?prefix=py-&limit=1&after=" + page["next"])
check("a prefix lists page by page", status == 200 and len(page["records"]) == 1
      and page["next"] and len(page2["records"]) == 1
      and page2["records"][0]["key_b64"] != page["records"][0]["key_b64"])

status, _, err = call("POST", key_path(b"py-bad") + "/claim", {"lease_ms": -5})
check("a negative lease is a 400 problem", status == 400 and "lease" in err.get("detail", ""))

sys.exit(1 if failures else 0)
