#!/usr/bin/env python3
"""Provokes the answers `dedup serve` gives, then compares what it answered with
docs/openapi.yaml (tests/serve_openapi_test.sh).

  serve_openapi_statuses.py provoke PORT MODE [TOKEN]
      MODE token: every status a request can get from serve with a token and
      short deadlines (--header-timeout 1s --body-timeout 1s);
      MODE open: the browser guards of serve without a token (403, 421);
      MODE down: the store stopped (503).
  serve_openapi_statuses.py compare OPENAPI METRICS_FILE...
      Every (route, code) in dedup_serve_requests_total of the metrics files must
      be a response the operation of that route lists (route = operationId);
      route "other" (refused before its path was read) must be listed by every
      operation. Every operation must list 408, 414 and 431. Exits 1 otherwise.
"""
import http.client
import json
import re
import socket
import sys
import time

import yaml


def request(port, method, path, body=None, headers=None):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    h = dict(headers or {})
    data = None
    if body is not None:
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        h.setdefault("Content-Type", "application/json")
    c.request(method, path, body=data, headers=h)
    r = c.getresponse()
    out = r.status, r.read()
    c.close()
    return out


def raw(port, data, wait=0.0, then=b""):
    """Sends data (and `then` after `wait` s); returns the status of the first answer."""
    s = socket.create_connection(("127.0.0.1", port), timeout=10)
    s.sendall(data)
    if wait:
        time.sleep(wait)
    if then:
        try:
            s.sendall(then)
        except OSError:
            pass
    got = b""
    while b"\r\n" not in got:
        d = s.recv(4096)
        if not d:
            break
        got += d
    s.close()
    m = re.match(rb"HTTP/1.1 (\d+)", got)
    return int(m.group(1)) if m else 0


def provoke_token(port, token):
    auth = {"Authorization": "Bearer " + token}
    k = "/v1/keys/"
    seen = []

    def do(method, path, body=None, headers=None, auth_=True):
        h = dict(auth if auth_ else {})
        h.update(headers or {})
        status, _ = request(port, method, path, body, h)
        seen.append((method, path, status))
        return status

    do("GET", "/healthz")
    do("GET", "/metrics")
    do("GET", "/metrics", auth_=False)
    do("GET", "/v1/info")
    do("GET", "/v1/info", auth_=False)
    do("GET", "/v1/info?nope=1")
    c = json.loads(request(port, "POST", k + "a/claim", {"lease_ms": 60000}, auth)[1])
    do("POST", k + "a/claim", {})                         # 409
    do("POST", k + "a/claim", {"lease_ms": -1})           # 400
    do("POST", k + "a/claim", {}, auth_=False)            # 401
    do("POST", k + "a/claim", {"x": "y" * 3_000_000})     # 413
    do("POST", k + "a/extend", {"token": c["token"]})     # 200
    do("POST", k + "a/extend", {"token": "0000000000000001"})  # 412
    do("POST", k + "a/extend", {})                        # 400
    do("POST", k + "a/complete", {"token": "0000000000000001"})  # 412
    do("POST", k + "a/complete", {"token": c["token"], "result": "r"})  # 200
    do("POST", k + "a/claim", {})                         # 200 duplicate
    do("POST", k + "a/release", {"token": c["token"]})    # 412
    c2 = json.loads(request(port, "POST", k + "b/claim", {"fingerprint": "f"}, auth)[1])
    do("POST", k + "b/claim", {"fingerprint": "g"})       # 422
    do("POST", k + "b/release", {"token": c2["token"]})   # 200
    do("POST", k + "b/release", {})                       # 400
    do("POST", k + "c/claim", {"max_attempts": 1})        # 201
    do("POST", k + "c/claim", {"max_attempts": 1, "lease_ms": 1})  # 409 (lease running)
    time.sleep(0.01)
    request(port, "POST", k + "d/claim", {"max_attempts": 1, "lease_ms": 1}, auth)
    time.sleep(0.05)
    do("POST", k + "d/claim", {"max_attempts": 1})        # 410
    do("GET", k + "a")                                    # 200
    do("GET", k + "zz")                                   # 404
    do("GET", k + "a", auth_=False)                       # 401
    request(port, "POST", k + "e/claim", {"lease_ms": 60000}, auth)
    do("DELETE", k + "e")                                 # 409
    do("DELETE", k + "e?force=maybe")                     # 400
    do("DELETE", k + "e?force=true")                      # 200
    do("DELETE", k + "e")                                 # 404
    do("GET", "/v1/keys?prefix=")                         # 200
    do("GET", "/v1/keys?limit=0")                         # 400
    do("GET", "/v1/nope")                                 # 404 (route other)
    do("GET", "/v1/info", headers={"Range": "bytes=x"})   # 200 (ignored)
    do("GET", "/v1/info", headers={"Range": "bytes=0-3"})  # 206?
    do("POST", k + "a/claim", {}, headers={"Range": "bytes=0-3"})
    many = {"X-H-%d" % i: "v" for i in range(101)}
    do("GET", "/v1/info", headers=many)                   # 431 (routed)
    # Whitespace before a field name's colon: 400 on every route.
    head = "GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Bad : 1\r\n\r\n"
    seen.append(("GET", "/healthz bad field", raw(port, head.encode())))
    # Refused before the path is read: 408 (head), 414, 431; 408 (body) on claim.
    seen.append(("GET", "head trickled", raw(port, b"GET /healthz HTTP/1.1\r\n", wait=2.5)))
    seen.append(("GET", "414", raw(port, b"GET /" + b"a" * 9000 + b" HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")))
    big = b"GET /healthz HTTP/1.1\r\n" + b"".join(
        b"X-Big-%d: %s\r\n" % (i, b"b" * 4000) for i in range(25))
    seen.append(("GET", "431 head", raw(port, big)))
    body_late = ("POST " + k + "late/claim HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer "
                 + token + "\r\nContent-Type: application/json\r\nContent-Length: 10\r\n\r\n{")
    seen.append(("POST", "body trickled", raw(port, body_late.encode(), wait=2.5)))
    for s in seen:
        print(*s)


def provoke_open(port):
    for method, path, headers in (
            ("POST", "/v1/keys/a/claim", {"Origin": "http://evil.example"}),
            ("POST", "/v1/keys/a/extend", {"Sec-Fetch-Site": "cross-site"}),
            ("POST", "/v1/keys/a/complete", {"Origin": "http://evil.example"}),
            ("POST", "/v1/keys/a/release", {"Origin": "http://evil.example"}),
            ("DELETE", "/v1/keys/a", {"Origin": "http://evil.example"}),
            ("GET", "/v1/keys/a", {"Host": "evil.example"}),
            ("GET", "/v1/keys", {"Host": "evil.example"}),
            ("GET", "/v1/info", {"Host": "evil.example"}),
            ("GET", "/metrics", {"Host": "evil.example"}),
            ("GET", "/healthz", {"Host": "evil.example"}),
            ("POST", "/v1/keys/a/claim", {"Host": "evil.example"})):
        body = {} if method == "POST" else None
        print(method, path, request(port, method, path, body, headers)[0])


def provoke_down(port):
    for method, path, body in (
            ("POST", "/v1/keys/a/claim", {}),
            ("POST", "/v1/keys/a/extend", {"token": "0000000000000001"}),
            ("POST", "/v1/keys/a/complete", {"token": "0000000000000001"}),
            ("POST", "/v1/keys/a/release", {"token": "0000000000000001"}),
            ("DELETE", "/v1/keys/a", None),
            ("GET", "/v1/keys/a", None),
            ("GET", "/v1/keys", None)):
        print(method, path, request(port, method, path, body)[0])


def compare(spec_path, metric_files):
    spec = yaml.safe_load(open(spec_path))
    ops = {}
    for path, methods in spec["paths"].items():
        for op in methods.values():
            # /metrics and /healthz: their route is their path.
            ops[op.get("operationId", path.strip("/"))] = set(op["responses"])
    fails = 0
    for name, codes in sorted(ops.items()):
        missing = {"408", "414", "431"} - codes
        if missing:
            print("FAIL openapi: %s does not list %s" % (name, ", ".join(sorted(missing))))
            fails += 1
    every = set.intersection(*ops.values())
    pattern = re.compile(r'^dedup_serve_requests_total\{route="([^"]+)",code="(\d+)"\} (\d+)')
    answered = set()
    for f in metric_files:
        for line in open(f):
            m = pattern.match(line)
            if m and int(m.group(3)) > 0:
                answered.add((m.group(1), m.group(2)))
    for route, code in sorted(answered):
        if route in ("page", "asset", "proxy"):
            continue  # not the API's: the web view and the application's answers
        if route == "other":
            ok = code in every or code == "404"  # 404: no such route
            where = "every operation"
        else:
            ok = route in ops and code in ops[route]
            where = "operation " + route
        print(("ok   " if ok else "FAIL ") + "serve answered %s on route %s; %s %s it" %
              (code, route, where, "lists" if ok else "does not list"))
        fails += not ok
    print("%d (route, code) pairs answered" % len(answered))
    return fails


if __name__ == "__main__":
    if sys.argv[1] == "compare":
        sys.exit(1 if compare(sys.argv[2], sys.argv[3:]) else 0)
    port, mode = int(sys.argv[2]), sys.argv[3]
    if mode == "token":
        provoke_token(port, sys.argv[4])
    elif mode == "open":
        provoke_open(port)
    else:
        provoke_down(port)
