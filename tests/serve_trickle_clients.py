#!/usr/bin/env python3
"""Clients that trickle a request to `dedup serve`, for tests/serve_trickle_test.sh.

  serve_trickle_clients.py PORT MODE N SECONDS

Opens N connections and keeps each one busy for SECONDS, sending one byte every
second (each byte within serve's read timeout):
  head  the request head never ends: "GET /healthz HTTP/1.1", a Host line and
        then a header value one byte at a time;
  body  the whole head of a claim (Content-Length: 4096) at once, then its body
        one byte at a time;
  metrics-body  the same with a POST to /metrics of 100 bytes (within the
        worker's metrics listener's 1 KiB bound on a body).
Prints "open" once every connection is open, then, for each connection, one line
"N STATUS AFTER CLOSED": the status code of the server's answer (or "none"), the
seconds from the connection's first byte to that answer (or to the end), and
"closed" when the server closed the connection after it, else "open".
"""
import socket
import sys
import time

port, mode, n, seconds = int(sys.argv[1]), sys.argv[2], int(sys.argv[3]), float(sys.argv[4])
if mode == "head":
    first = b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: "
elif mode == "body":
    first = (b"POST /v1/keys/trickle/claim HTTP/1.1\r\nHost: 127.0.0.1\r\n"
             b"Content-Type: application/json\r\nContent-Length: 4096\r\n\r\n")
elif mode == "metrics-body":
    first = b"POST /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 100\r\n\r\n"
else:
    sys.exit("mode must be head, body or metrics-body")


class Conn:
    def __init__(self):
        self.sock = socket.create_connection(("127.0.0.1", port))
        self.sock.sendall(first)
        self.sock.setblocking(False)
        self.start = time.monotonic()
        self.answer = b""
        self.answered_at = None
        self.closed = False

    def poll(self):
        """Reads what the server sent; True once it closed the connection."""
        while not self.closed:
            try:
                data = self.sock.recv(65536)
            except BlockingIOError:
                return False
            except OSError:
                data = b""
            if not data:
                self.closed = True
            else:
                if self.answered_at is None:
                    self.answered_at = time.monotonic() - self.start
                self.answer += data
        return True


conns = [Conn() for _ in range(n)]
print("open", flush=True)
end = time.monotonic() + seconds


def done(c):
    return c.closed or c.answered_at is not None


while time.monotonic() < end and not all(done(c) for c in conns):
    for c in conns:
        c.poll()
        if not done(c):
            try:
                c.sock.send(b"a")
            except OSError:
                pass
    # The next byte in a second; meanwhile, note when answers come.
    next_byte = min(end, time.monotonic() + 1.0)
    while time.monotonic() < next_byte and not all(done(c) for c in conns):
        for c in conns:
            c.poll()
        time.sleep(0.05)
time.sleep(0.2)  # a close right after the answer
for i, c in enumerate(conns):
    c.poll()
    status = c.answer.split(b" ", 2)[1].decode() if c.answer.startswith(b"HTTP/") else "none"
    after = c.answered_at if c.answered_at is not None else time.monotonic() - c.start
    print("%d %s %.1f %s" % (i, status, after, "closed" if c.closed else "open"), flush=True)
