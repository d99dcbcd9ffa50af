#!/usr/bin/env python3
"""Slow and idle clients for tests/serve_keepalive_test.sh.

  serve_slow_clients.py PORT SLOW IDLE SECONDS

Opens SLOW connections that send a request head one byte every 0.5 s (a header
line that never ends), then IDLE connections that send nothing, prints "open",
and keeps trickling for SECONDS. For each idle connection it then prints
"idle_closed_after S" (seconds from its connect until the server closed it) or
"idle_open" when the server had not closed it by then.
"""
import socket
import sys
import time

port, n_slow, n_idle, seconds = (int(a) for a in sys.argv[1:5])
slow = []
for _ in range(n_slow):
    s = socket.create_connection(("127.0.0.1", port))
    s.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ")
    slow.append(s)
idle = []
for _ in range(n_idle):
    s = socket.create_connection(("127.0.0.1", port))
    s.setblocking(False)
    idle.append([s, time.monotonic(), None])
print("open", flush=True)
end = time.monotonic() + seconds
while time.monotonic() < end:
    for s in slow:
        try:
            s.sendall(b"a")
        except OSError:
            pass
    for entry in idle:
        if entry[2] is None:
            try:
                if entry[0].recv(1) == b"":
                    entry[2] = time.monotonic() - entry[1]
            except BlockingIOError:
                pass
            except OSError:
                entry[2] = time.monotonic() - entry[1]
    time.sleep(0.5)
for s, _, closed in idle:
    print("idle_open" if closed is None else "idle_closed_after %.1f" % closed, flush=True)
