#!/usr/bin/env python3
"""A small HTTP application for the proxy tests: it counts every call it serves in a
file (one line per call: method, path, Idempotency-Key, Dedup-Fence), so a test can
tell how many times a request really ran, and with which fence.

  serve_app.py PORT CALLS_FILE

  GET  /healthz                 200 "ok" (not counted)
  GET  /count                   the number of calls so far (not counted)
  POST /charge[?sleep_ms=N]     counted; sleeps N ms, then 201 with a JSON body that
                                names the call number and echoes the body; sets
                                X-App-Call, Location and a Set-Cookie header
  POST /status?code=N[&sleep_ms=M] counted; sleeps M ms, then that status
                                (Retry-After: 1 on 429 and 503)
  POST /big?bytes=N[&headers=H] counted; 200 with N bytes of body, an ETag (and H
                                headers X-Big-i of 8000 bytes each)
  GET  /header?value=V          counted; 200 with the header X-Echo-Value: V (V
                                as the query gives it, once decoded, each %XX one
                                byte)
  anything else[?sleep_ms=N]    counted; sleeps N ms, then 200 echoing method, path,
                                headers and body seen
"""
import json
import sys
import threading
import time
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

PORT = int(sys.argv[1])
CALLS = sys.argv[2]
lock = threading.Lock()


def count_call(line):
    with lock:
        with open(CALLS, "a") as f:
            f.write(line + "\n")
        with open(CALLS) as f:
            return sum(1 for _ in f)


def calls_so_far():
    try:
        with open(CALLS) as f:
            return sum(1 for _ in f)
    except FileNotFoundError:
        return 0


class App(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, fmt, *args):
        pass

    def reply(self, status, body, ctype="application/json", extra=()):
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        for k, v in extra:
            self.send_header(k, v)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def handle_any(self):
        url = urllib.parse.urlsplit(self.path)
        query = urllib.parse.parse_qs(url.query)
        n = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(n) if n else b""
        if url.path == "/healthz":
            return self.reply(200, b"ok", "text/plain")
        if url.path == "/count":
            return self.reply(200, str(calls_so_far()).encode(), "text/plain")
        if url.path == "/ranges":  # an application that says it serves ranges
            return self.reply(200, b"0123456789", "text/plain", extra=[("Accept-Ranges", "bytes")])
        call = count_call(json.dumps({"method": self.command, "path": self.path,
                                      "key": self.headers.get("Idempotency-Key"),
                                      "fence": self.headers.get("Dedup-Fence")}))
        if url.path == "/charge":
            time.sleep(int(query.get("sleep_ms", ["0"])[0]) / 1000)
            out = json.dumps({"call": call, "body": body.decode("utf-8", "replace")}).encode()
            return self.reply(201, out, extra=[("X-App-Call", str(call)),
                                               ("Location", "/charges/%d" % call),
                                               ("Set-Cookie", "session=secret-%d" % call)])
        if url.path == "/status":  # ?code=N: that status, with Retry-After on 429 / 503
            code = int(query.get("code", ["200"])[0])
            time.sleep(int(query.get("sleep_ms", ["0"])[0]) / 1000)
            return self.reply(code, json.dumps({"call": call}).encode(),
                              extra=[("Retry-After", "1")] if code in (429, 503) else [])
        if url.path == "/big":
            size = int(query.get("bytes", ["0"])[0])
            big = [("X-Big-%d" % i, "h" * 8000)
                   for i in range(int(query.get("headers", ["0"])[0]))]
            return self.reply(200, b"x" * size, "application/octet-stream",
                              extra=big + [("ETag", '"big-%d"' % size)])
        if url.path == "/header":
            # Byte for byte: each %XX one byte (latin-1, as the header is written),
            # so that bytes which are not UTF-8 reach the proxy as they are.
            raw = urllib.parse.parse_qs(url.query, encoding="latin-1")
            return self.reply(200, b"{}", extra=[("X-Echo-Value", raw["value"][0])])
        time.sleep(int(query.get("sleep_ms", ["0"])[0]) / 1000)
        seen = {"call": call, "method": self.command, "path": self.path,
                "headers": {k: v for k, v in self.headers.items()},
                "body": body.decode("utf-8", "replace")}
        return self.reply(200, json.dumps(seen).encode(), extra=[("X-App-Call", str(call))])

    do_GET = do_HEAD = do_POST = do_PUT = do_PATCH = do_DELETE = handle_any


ThreadingHTTPServer.daemon_threads = True
ThreadingHTTPServer(("127.0.0.1", PORT), App).serve_forever()
