#!/usr/bin/env python3
# A fault-injecting TCP proxy for tests/redis_fault_proxy_test.sh (issue 13, item
# 10): it forwards 127.0.0.1:LISTEN to 127.0.0.1:TARGET and, at random moments
# (seeded), injects one fault at a time:
#
#   rst       one connection is cut mid-reply: part of the next chunk the server
#             sends (or, one time in four, the client sends) is forwarded, then
#             both sides are reset (SO_LINGER 0: RST)
#   close     the same with an orderly close (FIN) instead of a reset
#   delay     one connection's traffic is held, both ways, for DELAY seconds
#   stall     every connection's traffic, and new connections', is held for DELAY
#             seconds (a network hiccup that outlasts timeouts and leases)
#
# The first four faults are one of each kind (holds at the longest delay), in a
# seeded order; later ones are drawn at random. DELAY is drawn from --delays (seconds; the test gives one longer than the
# client's timeout but shorter than the lease, and one longer than the lease).
# Held bytes are forwarded in order once the hold ends, as a slow network would.
#
# Every fault is logged, one line per fault, to --log:
#   START_US END_US KIND CONNECTION PID DETAIL
# (END_US = START_US for a cut), so that the checker can tell a rerun that such
# a fault explains. PID is the process, among those listed in --pids, whose
# socket the connection is (found through /proc/net/tcp and /proc/PID/fd), "*"
# for a stall (every process), "?" when not found. Faults stop after --duration seconds (the proxy keeps
# forwarding). Python's standard library only; the proxy exits when its parent
# dies (it polls getppid), so a killed test leaves nothing behind.
import argparse
import asyncio
import os
import random
import socket
import struct
import sys
import time

ap = argparse.ArgumentParser()
ap.add_argument("--listen", type=int, required=True)
ap.add_argument("--target", type=int, required=True)
ap.add_argument("--log", required=True)
ap.add_argument("--seed", type=int, default=1)
ap.add_argument("--every", type=float, default=2.0, help="mean seconds between faults")
ap.add_argument("--delays", default="2.5,5.5", help="hold times in seconds, comma-separated")
ap.add_argument("--duration", type=float, default=60.0, help="seconds of faults")
ap.add_argument("--ready", help="file written once the proxy listens")
ap.add_argument("--pids", help="file of client process ids, one per line (read at each fault)")
a = ap.parse_args()

rng = random.Random(a.seed)  # the schedule of faults
cut_rng = random.Random(a.seed + 1)  # where a cut falls in a chunk
delays = [float(x) for x in a.delays.split(",")]
log = open(a.log, "a", buffering=1)
parent = os.getppid()


def now_us():
    return time.time_ns() // 1000


def owner_pid(conn):
    """The listed process whose socket is the client side of `conn`, or "?"."""
    try:
        port = conn.cw.get_extra_info("peername")[1]
        want = "0100007F:%04X" % port
        inode = None
        with open("/proc/net/tcp") as f:
            for line in f:
                fields = line.split()
                if len(fields) > 9 and fields[1] == want:
                    inode = fields[9]
                    break
        if inode is None or not a.pids:
            return "?"
        target = "socket:[%s]" % inode
        with open(a.pids) as f:
            pids = [p.strip() for p in f if p.strip()]
        for pid in pids:
            try:
                for fd in os.listdir("/proc/%s/fd" % pid):
                    try:
                        if os.readlink("/proc/%s/fd/%s" % (pid, fd)) == target:
                            return pid
                    except OSError:
                        pass
            except OSError:
                pass
    except (OSError, TypeError, IndexError):
        pass
    return "?"


class Conn:
    next_id = 0

    def __init__(self, cr, cw, sr, sw):
        Conn.next_id += 1
        self.id = Conn.next_id
        self.cr, self.cw, self.sr, self.sw = cr, cw, sr, sw
        self.hold_until = 0.0  # loop time
        self.cut = None  # None, or (kind, direction) armed for the next chunk
        self.closed = False
        self.pid = "?"  # the client process, found when a fault picks this connection

    def close(self, reset):
        if self.closed:
            return
        self.closed = True
        for w in (self.cw, self.sw):
            if reset:
                sock = w.get_extra_info("socket")
                if sock is not None:
                    try:
                        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                    except OSError:
                        pass
                w.transport.abort()
            else:
                w.close()


conns = {}
stall_until = 0.0


async def pump(conn, reader, writer, direction):
    loop = asyncio.get_running_loop()
    try:
        while not conn.closed:
            data = await reader.read(65536)
            if not data:
                break
            while True:
                wait = max(conn.hold_until, stall_until) - loop.time()
                if wait <= 0:
                    break
                await asyncio.sleep(wait)
            if conn.closed:
                break
            if conn.cut is not None and conn.cut[1] == direction:
                kind = conn.cut[0]
                part = data[: cut_rng.randint(0, len(data) - 1)] if len(data) > 1 else b""
                writer.write(part)
                try:
                    await writer.drain()
                except (ConnectionError, OSError):
                    pass
                t = now_us()
                log.write("%d %d %s %d %s %s %d/%d bytes\n" % (t, t, kind, conn.id, conn.pid,
                                                               direction, len(part), len(data)))
                conn.close(reset=(kind == "rst"))
                break
            writer.write(data)
            await writer.drain()
    except (ConnectionError, OSError, asyncio.IncompleteReadError):
        pass
    finally:
        conn.close(reset=False)
        conns.pop(conn.id, None)


async def handle(cr, cw):
    try:
        sr, sw = await asyncio.open_connection("127.0.0.1", a.target)
    except OSError:
        cw.transport.abort()
        return
    conn = Conn(cr, cw, sr, sw)
    conns[conn.id] = conn
    await asyncio.gather(pump(conn, cr, sw, "request"), pump(conn, sr, cw, "reply"))


async def faults():
    global stall_until
    loop = asyncio.get_running_loop()
    end = loop.time() + a.duration
    # Every kind comes once among the first four faults, holds at the longest:
    # a run always meets each of them, whatever its luck afterwards.
    first = [("rst", None), ("close", None), ("delay", max(delays)), ("stall", max(delays))]
    rng.shuffle(first)
    while loop.time() < end:
        await asyncio.sleep(rng.uniform(0.3, 1.7) * a.every)
        if not conns:
            continue
        if first:
            kind, hold = first.pop()
        else:
            kind = rng.choice(["rst", "rst", "close", "delay", "delay", "stall"])
            hold = rng.choice(delays)
        conn = conns[rng.choice(sorted(conns))]
        if kind != "stall":
            conn.pid = owner_pid(conn)
        if kind in ("rst", "close"):
            # Mid-reply mostly; sometimes mid-request (the server sees half a command).
            conn.cut = (kind, "request" if rng.random() < 0.25 else "reply")
            loop.call_later(1.0, cut_idle, conn, kind)
        else:
            t = now_us()
            if kind == "delay":
                conn.hold_until = max(conn.hold_until, loop.time() + hold)
                log.write("%d %d delay %d %s %.1fs\n" % (t, t + int(hold * 1e6), conn.id, conn.pid,
                                                          hold))
            else:
                stall_until = max(stall_until, loop.time() + hold)
                log.write("%d %d stall 0 * %.1fs\n" % (t, t + int(hold * 1e6), hold))


def cut_idle(conn, kind):
    # No traffic came in a second: cut the idle connection as it is.
    if not conn.closed and conn.cut is not None:
        t = now_us()
        log.write("%d %d %s %d %s idle\n" % (t, t, kind, conn.id, conn.pid))
        conn.close(reset=(kind == "rst"))


async def watch_parent():
    while os.getppid() == parent:
        await asyncio.sleep(0.5)
    os._exit(0)


async def main():
    server = await asyncio.start_server(handle, "127.0.0.1", a.listen, reuse_address=True)
    if a.ready:
        with open(a.ready, "w") as f:
            f.write("%d\n" % os.getpid())
    asyncio.create_task(watch_parent())
    asyncio.create_task(faults())
    async with server:
        await server.serve_forever()


try:
    asyncio.run(main())
except KeyboardInterrupt:
    sys.exit(0)
