#!/usr/bin/env python3
"""Clients that do not read their answers, for tests/serve_slow_reader_test.sh.

  serve_slow_readers.py PORT MODE SECONDS

Each client's socket has a tiny receive buffer (SO_RCVBUF 1024, set before
connecting), so that serve's answers fill the buffers between them at once:
  pipelined  sends 3000 pipelined `GET /v1/keys?limit=1000` (as fast as serve
             reads them) and never reads an answer;
  big        sends one `GET /v1/keys?limit=1000` (an answer of 2.5 MB in the
             test) and never reads it;
  trickle    sends the same and reads its answer 1 KiB every 10 ms (~50 KB/s
             through its 1 KiB buffer): serve's writes make progress within
             every write timeout, and it takes ~45 s to read it all.
Prints "open" once its requests are sent; after SECONDS, reads what is queued and
prints "MODE closed" when serve had closed (or reset) the connection, else
"MODE open". How long a client held serve's thread, the test measures from the
outside: a request behind it on `--threads 1 --max-connections 1`.
"""
import errno
import socket
import sys
import time

port, mode, seconds = int(sys.argv[1]), sys.argv[2], float(sys.argv[3])
REQUEST = b"GET /v1/keys?limit=1000 HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"

s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1024)
s.connect(("127.0.0.1", port))
t0 = time.monotonic()
if mode == "pipelined":
    s.setblocking(False)
    data = REQUEST * 3000
    sent = 0
    # Sends what serve takes for up to 2 s (its own buffers fill once it stops
    # reading requests to write answers nobody reads).
    while sent < len(data) and time.monotonic() - t0 < 2:
        try:
            sent += s.send(data[sent:])
        except BlockingIOError:
            time.sleep(0.01)
else:
    s.sendall(REQUEST)
    s.setblocking(False)
print("open", flush=True)


def closed():
    """True once serve closed or reset the connection: what is queued is read
    (and dropped) to see the end, as a client would when it finally reads."""
    try:
        while True:
            d = s.recv(1 << 20)
            if not d:
                return True
    except BlockingIOError:
        return False
    except OSError as e:
        return e.errno in (errno.ECONNRESET, errno.EPIPE)


end = t0 + seconds
while time.monotonic() < end:
    if mode == "trickle":
        try:
            if not s.recv(1024):
                break
        except BlockingIOError:
            pass
        except OSError:
            break
    time.sleep(0.01 if mode == "trickle" else 0.1)
# Whether serve has closed by now: drain what is queued and look for the end.
t_check = time.monotonic()
result = "open"
while time.monotonic() - t_check < 3:
    if closed():
        result = "closed"
        break
    time.sleep(0.05)
print(mode, result, flush=True)
