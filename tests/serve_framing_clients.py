#!/usr/bin/env python3
"""Requests whose framing serve's head reader and cpp-httplib could read apart
(tests/serve_framing_test.sh). One line per case on stdout:

    NAME CODES... CLOSED|OPEN SECONDS

CODES are the status codes answered on the connection, in order; CLOSED when the
server closed it within 3 s of the last answer, OPEN otherwise. When CLOSED, a
second line `NAME announced yes|no`: whether the last answer said
`Connection: close` (a keep-alive client not told sends its next request on the
closed connection, and fails).

    serve_framing_clients.py PORT
"""
import re
import socket
import sys
import time

PORT = int(sys.argv[1])
HOST = b"Host: 127.0.0.1\r\n"
JSON = b"Content-Type: application/json\r\n"
HEALTHZ = b"GET /healthz HTTP/1.1\r\n" + HOST + b"\r\n"


def case(name, parts, gap=0.0):
    """Sends PARTS (GAP s apart) on one connection; reads until it is closed or
    quiet for 3 s."""
    s = socket.create_connection(("127.0.0.1", PORT))
    t0 = time.monotonic()
    for i, part in enumerate(parts):
        if i and gap:
            time.sleep(gap)
        try:
            s.sendall(part)
        except OSError:
            break
    s.settimeout(3)
    got, closed = b"", False
    try:
        while True:
            d = s.recv(65536)
            if not d:
                closed = True
                break
            got += d
    except socket.timeout:
        pass
    except OSError:
        closed = True
    s.close()
    codes = [c.decode() for c in re.findall(rb"HTTP/1\.1 (\d{3}) ", got)]
    # A server that stays open is seen after the 3 s of quiet: don't count them.
    took = time.monotonic() - t0 - (0 if closed else 3)
    print(name, " ".join(codes) or "-", "CLOSED" if closed else "OPEN", "%.1f" % took, flush=True)
    if closed and codes:
        last = got[got.rfind(b"HTTP/1.1 "):].split(b"\r\n\r\n", 1)[0].lower()
        print(name, "announced", "yes" if b"\r\nconnection: close" in last else "no", flush=True)


# ---- where the head ends: only at a line that is exactly CRLF, as cpp-httplib
# reads it (a bare LF ends no head there; its lines are skipped).
# A bare-LF "blank line" then a 200 KB header line: the head is larger than the
# bound and must be refused (431) before cpp-httplib reads the line.
case("lf_blank_big", [b"GET /healthz HTTP/1.1\r\n" + HOST + b"\n" + b"X-Pad: " + b"a" * 200000
                      + b"\r\n\r\n"])
# A bare-LF "blank line" then header lines trickled past --header-timeout (1 s).
case("lf_blank_trickle", [b"GET /healthz HTTP/1.1\r\n" + HOST + b"\n"]
     + [b"X-%d: a\r\n" % i for i in range(8)] + [b"\r\n"], gap=0.4)
# A head whose lines all end in a bare LF is no request to cpp-httplib: no answer
# for each of its lines, one 408 at the deadline.
case("lf_only", [b"GET /healthz HTTP/1.1\nHost: 127.0.0.1\n\n"])

# ---- a head cpp-httplib could not parse: one answer, then the connection ends
# (where the next request would start is unknown).
case("long_header_line", [b"GET /healthz HTTP/1.1\r\n" + HOST + b"X-Long: " + b"a" * 8200
                          + b"\r\n\r\n" + HEALTHZ])
case("long_request_line", [b"GET /healthz?" + b"a" * 8200 + b" HTTP/1.1\r\n" + HOST + b"\r\n"
                           + HEALTHZ])

# ---- a body the answer left unread, or framed two ways: one answer, then the
# connection ends (else the body is read as the next request).
smuggled = b"GET /healthz HTTP/1.1\r\n" + HOST + b"\r\n"
# A Range cpp-httplib cannot parse (a unit other than bytes) is ignored, as any
# Range on serve's own answers (cpp-httplib answered it 416 itself, before serve
# saw the request): the claim, then the GET behind it.
case("range_unknown_unit", [b"POST /v1/keys/k8/claim HTTP/1.1\r\n" + HOST + JSON
                            + b"Range: items=0-9\r\nContent-Length: 2\r\n\r\n{}" + HEALTHZ])
case("get_with_body", [b"GET /healthz HTTP/1.1\r\n" + HOST + b"Content-Length: %d\r\n\r\n"
                       % len(smuggled) + smuggled])
case("refused_post_body", [b"POST /v1/keys/k1/claim HTTP/1.1\r\n" + HOST + JSON
                           + b"X-Bad : 1\r\nContent-Length: %d\r\n\r\n" % len(smuggled)
                           + smuggled])
case("cl_and_te", [b"POST /v1/keys/k2/claim HTTP/1.1\r\n" + HOST + JSON
                   + b"Content-Length: 4\r\nTransfer-Encoding: chunked\r\n\r\n"
                   + b"2\r\n{}\r\n0\r\n\r\n" + smuggled])
case("two_lengths", [b"POST /v1/keys/k3/claim HTTP/1.1\r\n" + HOST + JSON
                     + b"Content-Length: 2\r\nContent-Length: %d\r\n\r\n{}" % (2 + len(smuggled))
                     + smuggled])
case("chunked_trailer", [b"POST /v1/keys/k4/claim HTTP/1.1\r\n" + HOST + JSON
                         + b"Transfer-Encoding: chunked\r\n\r\n2\r\n{}\r\n0\r\nX-T: 1\r\n\r\n"
                         + smuggled])

# ---- what must keep working: pipelined requests after a body, split heads,
# HEAD, Expect: 100-continue, a chunked body.
case("pipelined_after_body", [b"POST /v1/keys/k5/claim HTTP/1.1\r\n" + HOST + JSON
                              + b"Content-Length: 2\r\n\r\n{}" + HEALTHZ])
case("head_then_get", [b"HEAD /healthz HTTP/1.1\r\n" + HOST + b"\r\n" + HEALTHZ])
case("expect_continue", [b"POST /v1/keys/k6/claim HTTP/1.1\r\n" + HOST + JSON
                         + b"Content-Length: 2\r\nExpect: 100-continue\r\n\r\n", b"{}"], gap=0.2)
case("chunked", [b"POST /v1/keys/k7/claim HTTP/1.1\r\n" + HOST + JSON
                 + b"Transfer-Encoding: chunked\r\n\r\n2;x=1\r\n{}\r\n0\r\n\r\n"])
# ---- framing fields two readers could read apart: refused before the request
# runs (cpp-httplib read "abc" as 0 and "3abc" as 3, and ran the claim with the
# body cut short), then the connection ends. Each names its own key; `unrun`
# below asks for its record.
def claim_with(key, fields, body=b"{}"):
    return (b"POST /v1/keys/%s/claim HTTP/1.1\r\n" % key + JSON + fields + b"\r\n" + body)


BAD_FRAMING = {
    "length_word": HOST + b"Content-Length: abc\r\n",
    "length_plus": HOST + b"Content-Length: +2\r\n",
    "length_suffix": HOST + b"Content-Length: 2x\r\n",
    "length_list": HOST + b"Content-Length: 2, 2\r\n",
    "te_gzip": HOST + b"Transfer-Encoding: gzip\r\n",
    "no_host": b"Content-Length: 2\r\n",
    "two_hosts": HOST + b"Host: evil.example\r\nContent-Length: 2\r\n",
}
for name, fields in BAD_FRAMING.items():
    case(name, [claim_with(b"bad-" + name.encode(), fields) + smuggled])


# A Content-Length over the body bound: 413 at once, before any 100 Continue and
# without waiting for a body (it came after the 10 s read timeout, once
# cpp-httplib had read and dropped as much of the body as came).
case("too_large_continue", [b"POST /v1/keys/big/claim HTTP/1.1\r\n" + HOST + JSON
                            + b"Content-Length: 3000000\r\nExpect: 100-continue\r\n\r\n"])
case("too_large", [b"POST /v1/keys/big/claim HTTP/1.1\r\n" + HOST + JSON
                   + b"Content-Length: 3000000\r\n\r\n{}"])


# A method cpp-httplib does not read: 501 naming it (it was a 400 that spoke of a
# missing body). A POST with neither Content-Length nor Transfer-Encoding has an
# empty body (RFC 9112 6.3), as "curl -X POST" sends it: answered, kept alive.
case("unknown_method", [b"PROPFIND /v1/keys/x HTTP/1.1\r\n" + HOST + b"\r\n"])
case("post_unframed", [b"POST /v1/keys/unframed/claim HTTP/1.1\r\n" + HOST + b"\r\n" + HEALTHZ])


def exchange(*parts):
    """Sends PARTS on a new connection (a short pause between them) and returns
    all it answers until the server closes it."""
    s = socket.create_connection(("127.0.0.1", PORT))
    for i, part in enumerate(parts):
        if i:
            time.sleep(0.002)
        s.sendall(part)
    s.settimeout(5)
    got = b""
    while True:
        d = s.recv(65536)
        if not d:
            break
        got += d
    s.close()
    return got


def unrun(name):
    """NAME unrun CODE: what GET /v1/keys/bad-NAME answers (404: no record)."""
    got = exchange(b"GET /v1/keys/bad-%s HTTP/1.1\r\n" % name.encode() + HOST
                   + b"Connection: close\r\n\r\n")
    m = re.match(rb"HTTP/1\.1 (\d{3}) ", got)
    print(name, "unrun", m.group(1).decode() if m else "-", flush=True)


for name in BAD_FRAMING:
    unrun(name)

# The same claim and GET, split once at every byte.
def split_request(i):
    return (b"POST /v1/keys/split-%03d/claim HTTP/1.1\r\n" % i + HOST + JSON
            + b"Content-Length: 2\r\n\r\n{}GET /healthz HTTP/1.1\r\n" + HOST
            + b"Connection: close\r\n\r\n")


bad = []
for i in range(1, len(split_request(0))):
    req = split_request(i)
    got = exchange(req[:i], req[i:])
    codes = " ".join(c.decode() for c in re.findall(rb"HTTP/1\.1 (\d{3}) ", got))
    if codes not in ("201 200", "200 200"):
        bad.append("%d:%s" % (i, codes))
print("split_every_byte", len(split_request(0)) - 1, "bad", len(bad), " ".join(bad[:5]), flush=True)
