#!/usr/bin/env python3
"""Slow connections that come back, and a well-behaved client beside them.

  serve_reconnect_clients.py PORT N SECONDS [idle|head]

Keeps N connections to serve open for SECONDS: each sends a request head one
byte a second and never ends it ("head", the default) or sends nothing
("idle"), and is opened again as soon as serve closes it. Meanwhile a
well-behaved client sends GET /healthz on a new connection every 0.2 s (each
given 30 s). Prints one line:
  N=.. mode=.. requests=.. p50_ms=.. p90_ms=.. p99_ms=.. max_ms=.. failed=.. reopened=..
"""
import socket
import sys
import threading
import time

port, n, seconds = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])
mode = sys.argv[4] if len(sys.argv) > 4 else "head"
stop = time.monotonic() + seconds
reopened = [0]
lock = threading.Lock()


def slow():
    while time.monotonic() < stop:
        try:
            s = socket.create_connection(("127.0.0.1", port), timeout=1)
            if mode == "head":
                s.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ")
        except OSError:
            time.sleep(0.05)
            continue
        s.settimeout(1)
        while time.monotonic() < stop:
            try:
                if s.recv(4096) == b"":
                    break  # closed by serve: come back at once
            except socket.timeout:
                if mode == "head":
                    try:
                        s.send(b"a")
                    except OSError:
                        break
            except OSError:
                break
        s.close()
        with lock:
            reopened[0] += 1


threads = [threading.Thread(target=slow, daemon=True) for _ in range(n)]
for t in threads:
    t.start()
time.sleep(1)  # let them take their threads
lat = []
failed = 0
req = b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"
while time.monotonic() < stop - 1:
    t0 = time.monotonic()
    try:
        c = socket.create_connection(("127.0.0.1", port), timeout=30)
        c.sendall(req)
        got = b""
        while True:
            d = c.recv(4096)
            if not d:
                break
            got += d
        c.close()
        if not got.startswith(b"HTTP/1.1 200"):
            failed += 1
        else:
            lat.append((time.monotonic() - t0) * 1000)
    except OSError:
        failed += 1
    time.sleep(max(0.0, 0.2 - (time.monotonic() - t0)))
lat.sort()


def pct(p):
    return lat[min(len(lat) - 1, int(p * len(lat)))] if lat else -1


print("N=%d mode=%s requests=%d p50_ms=%.1f p90_ms=%.1f p99_ms=%.1f max_ms=%.1f failed=%d reopened=%d"
      % (n, mode, len(lat), pct(0.5), pct(0.9), pct(0.99), lat[-1] if lat else -1, failed,
         reopened[0]), flush=True)
