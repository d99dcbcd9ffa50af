#!/usr/bin/env python3
"""A keep-alive client while serve's waiting places are taken, for
tests/serve_reconnect_test.sh.

  serve_keepalive_shed_clients.py PORT IDLE REQUESTS

Opens IDLE connections that send nothing (they hold serve's places for
connections waiting for a head, as the idle kept-alive connections of other
clients do), then makes REQUESTS POST claims one after the other on one
http.client connection: it keeps the connection unless an answer says
`Connection: close`, and then opens another (as HTTP/1.1 clients do; a POST
is not retried by a client). Prints one line:
  ok=.. failed=.. connections=.. closed_unannounced=.. errors={...}
closed_unannounced counts answers without `Connection: close` after which
serve closed the connection.
"""
import http.client
import socket
import sys
import time

port, idle_n, n = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
idle = [socket.create_connection(("127.0.0.1", port)) for _ in range(idle_n)]
time.sleep(0.3)  # let them take their places
c = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
ok = failed = connections = unannounced = 0
errors = {}
for i in range(n):
    try:
        if c.sock is None:
            connections += 1
        c.request("POST", "/v1/keys/keepalive-%d-%d/claim" % (i, time.time_ns()), body=b"{}",
                  headers={"Content-Type": "application/json"})
        r = c.getresponse()
        r.read()
        if r.status == 201:
            ok += 1
        else:
            failed += 1
            errors[r.status] = errors.get(r.status, 0) + 1
        if (r.getheader("Connection") or "").lower() != "close" and c.sock is not None:
            # Kept: did serve close it anyway? (A FIN or a reset within 200 ms.)
            c.sock.settimeout(0.2)
            try:
                if c.sock.recv(1, socket.MSG_PEEK) == b"":
                    unannounced += 1
            except socket.timeout:
                pass
            except OSError:
                unannounced += 1
            c.sock.settimeout(10)
    except (OSError, http.client.HTTPException) as e:
        failed += 1
        errors[type(e).__name__] = errors.get(type(e).__name__, 0) + 1
        c.close()
print("ok=%d failed=%d connections=%d closed_unannounced=%d errors=%s"
      % (ok, failed, connections, unannounced, errors), flush=True)
