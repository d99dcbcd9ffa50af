#!/usr/bin/env python3
# Reads the ledger and the kill log of tests/worker_chaos_test.sh and reports:
#   lost        messages whose handler never completed although the stream no
#               longer holds them (acked, or gone): the guarantee is broken
#   unfinished  messages whose handler never completed and that are still
#               undelivered or pending when the drain ended (--outstanding, one
#               key per line): the run was too slow, a failure of its own, never
#               counted as lost. Brokers that cannot list what they still hold
#               per key (RabbitMQ, NATS) give only the count (--pending): with
#               none left, every key that never ran is lost; with some left, the
#               keys that never ran are unfinished-or-lost and fail on their own
#   reruns      extra completed runs of a key; "explained" when the earlier run's
#               worker was SIGKILLed after that run started and at most
#               --kill-slack-ms after its effect (the line being written: a kill
#               between effect and complete),
#               or explained by the Redis restart when the store is that Redis (the
#               outcome could not be recorded), or with --faults by a network
#               fault of tests/fault_proxy.py on a connection of the earlier run's
#               worker (or on all), active between that run's start and shortly
#               after its end (its heartbeats or its complete could not reach the
#               store), "unexplained" otherwise (= doubled)
#   overlaps    two runs of one key that were running at the same time
#   fence order runs of one key whose fences do not strictly increase (dedup only)
# Exit 1 when the dedup pattern breaks a check; the textbook pattern only reports.
import argparse
import collections
import json
import re
import sys

ap = argparse.ArgumentParser()
for name in ("ledger", "kills", "outage", "pattern", "store"):
    ap.add_argument("--" + name, required=True)
ap.add_argument("--outstanding", help="keys still undelivered or pending, one per line")
ap.add_argument("--faults", help="fault log of tests/fault_proxy.py: START_US END_US KIND CONN PID ...")
ap.add_argument("--fault-slack-ms", type=int, default=1500,
                help="a fault this long after a run ended may still meet its complete")
ap.add_argument("--min-kill-hits", type=int, default=0,
                help="fail unless at least this many reruns are explained by a kill: the "
                     "kills must land between an effect and its complete, or the run "
                     "tested nothing of that window")
ap.add_argument("--kill-slack-ms", type=int, default=5000,
                help="a kill this long after a run ended may still have cut its complete off")
for name in ("messages", "published", "pending", "dead", "workers", "redis-restarts", "elapsed"):
    ap.add_argument("--" + name, type=int, required=True)
a = ap.parse_args()

kills = collections.defaultdict(list)  # worker pid -> kill times (us)
nkills = 0
for line in open(a.kills):
    t, pid = line.split()
    kills[pid].append(int(t))
    nkills += 1

# The Redis restart: [down_from, up_at] in us. A run that ended in it (or just
# before: complete is sent after the effect) could not record its outcome when the
# store is that Redis; the guard fails closed and the key runs again later.
outage = [int(x) for x in open(a.outage).read().split()]
OUTAGE_SLACK_US = 200_000

def in_outage(end_us):
    return (a.store == "redis" and len(outage) == 2
            and outage[0] - OUTAGE_SLACK_US <= end_us <= outage[1])

# Network faults between the workers and the store: [start, end] in us, and the
# worker process whose connection it hit ("*": all of them; "?": not found).
faults = []
if a.faults:
    for line in open(a.faults):
        parts = line.split()
        if len(parts) >= 5:
            faults.append((int(parts[0]), int(parts[1]), parts[2], parts[4]))

def fault_during(start_us, end_us, pid):
    lo, hi = start_us, end_us + a.fault_slack_ms * 1000
    return any(fs <= hi and fe >= lo and fpid in ("*", "?", pid) for fs, fe, _, fpid in faults)

# The ledger: one line per effect, "key fence attempt start_us end_us pid\n", written
# with one O_APPEND write. A handler SIGKILLed inside that write (Linux stops a
# write to a file between pages when a fatal signal is pending) leaves a record
# cut short, without its newline, and the next append continues that line. Keys
# are m-<n>, and "m" appears nowhere else in a record, so every "m" of a line
# starts a record: the pieces before the last are cut-off records (no effect, but
# counted), the last is a whole record. Anything else is unreadable and fails the
# run: a line the checker cannot read must never be skipped in silence (it may be
# the second run of a key).
RECORD = re.compile(r"m-\d+ \d+ \d+ \d+ \d+ \d+")

def cut_short(piece):  # a non-empty proper beginning of a record
    toks = piece.split(" ")
    if len(toks) > 6:
        return False
    if len(toks) == 1:
        return re.fullmatch(r"m(-\d*)?", toks[0]) is not None
    return (re.fullmatch(r"m-\d+", toks[0]) is not None
            and all(re.fullmatch(r"\d+", t) for t in toks[1:-1])
            and re.fullmatch(r"\d*", toks[-1]) is not None)

def pieces(line):
    cuts = [i for i, ch in enumerate(line) if ch == "m"]
    if not cuts or cuts[0] != 0:
        return None
    return [line[i:j] for i, j in zip(cuts, cuts[1:] + [len(line)])]

runs = collections.defaultdict(list)
truncated = 0
unreadable = []
with open(a.ledger) as f:
    lines = f.read().split("\n")
tail = lines.pop()  # what follows the last newline: a record cut short, if anything
entries = [(line, True) for line in lines] + ([(tail, False)] if tail else [])
for n, (line, whole) in enumerate(entries, 1):  # whole: the line ended with its newline
    ps = pieces(line)
    if ps is None or not all(cut_short(p) for p in ps[:-1]) or not (
            RECORD.fullmatch(ps[-1]) if whole else cut_short(ps[-1])):
        unreadable.append((n, line))
        continue
    truncated += len(ps) - 1 if whole else len(ps)
    if whole:
        key, fence, attempt, start, end, pid = ps[-1].split()
        runs[key].append((int(start), int(end), int(fence), int(attempt), pid))

expected = {"m-%d" % i for i in range(a.messages)}
never_ran = expected - set(runs)
if a.outstanding is not None:
    outstanding = {line.strip() for line in open(a.outstanding) if line.strip()}
elif a.pending == 0:
    outstanding = set()  # the broker holds nothing: whatever never ran is lost
else:
    outstanding = set(never_ran)  # cannot tell per key: counted as unfinished below
unfinished = sorted(never_ran & outstanding)
lost = sorted(never_ran - outstanding)
extra_keys = sorted(set(runs) - expected)
explained = outage_reruns = fault_reruns = unexplained = overlaps = fence_bad = 0
examples = []
for key, rs in runs.items():
    rs.sort()
    for prev, nxt in zip(rs, rs[1:]):
        if nxt[0] < prev[1]:
            overlaps += 1
            examples.append(("overlap", key, prev, nxt))
        if a.pattern == "dedup" and nxt[2] <= prev[2]:
            fence_bad += 1
            examples.append(("fence", key, prev, nxt))
    for r in rs[:-1]:
        # The kill is logged once the worker is dead (its handler child dies with
        # it), so a run of that worker that started before the logged time may have
        # been cut off before its outcome was recorded, but only if the kill came
        # soon after the effect: the worker records the outcome right after the
        # handler ends (retrying it while its lease holds), so a kill seconds
        # later explains nothing, and a completion skipped or lost must not hide
        # behind it.
        if any(r[0] <= t <= r[1] + a.kill_slack_ms * 1000 for t in kills.get(r[4], [])):
            explained += 1
        elif in_outage(r[1]):
            outage_reruns += 1
        elif fault_during(r[0], r[1], r[4]):
            fault_reruns += 1
        else:
            unexplained += 1
            examples.append(("unexplained rerun", key, r))

report = {
    "pattern": a.pattern, "store": a.store, "workers": a.workers,
    "messages": a.messages, "published": a.published, "kills": nkills,
    "redis_restarts": a.redis_restarts, "elapsed_s": a.elapsed,
    "completed_keys": len(set(runs) & expected), "effects": sum(len(r) for r in runs.values()),
    "lost": len(lost), "unfinished": len(unfinished),
    "outstanding_at_end": len(outstanding), "reruns_explained_by_kill": explained,
    "reruns_explained_by_store_outage": outage_reruns,
    "reruns_explained_by_network_fault": fault_reruns, "doubled_unexplained": unexplained,
    "overlapping_runs": overlaps, "fence_order_violations": fence_bad,
    "pending_at_end": a.pending, "dead_lettered": a.dead,
    "unexpected_keys": len(extra_keys), "truncated_records": truncated,
    "unreadable_lines": len(unreadable),
}
if a.faults:
    kinds = collections.Counter(k for _, _, k, _ in faults)
    report["faults"] = dict(sorted(kinds.items()))
print("chaos report: " + json.dumps(report))
for e in examples[:10]:
    print("  example:", e)
if lost:
    print("  lost (first 10):", lost[:10])
if extra_keys:
    print("  effects of keys never published (first 10):", extra_keys[:10])
for n, line in unreadable[:10]:
    print("  unreadable ledger line %d: %r" % (n, line))
if a.pattern != "dedup":
    sys.exit(0)
# One line per broken check, so that a run with several failures (say lost and
# unfinished) names each, and no line reads as if the others did not happen.
verdicts = [
    (len(lost), "LOST: %d messages acked or gone from the broker without an effect"),
    (unexplained, "DOUBLED: %d reruns that no kill, outage or fault explains"),
    (overlaps, "OVERLAP: %d pairs of runs of one key at the same time"),
    (fence_bad, "FENCE: %d reruns whose fence is not above the earlier run's"),
    (a.dead, "DEAD-LETTERED: %d entries"),
    (len(extra_keys), "UNEXPECTED: %d keys that were never published have effects"),
    (len(unreadable), "UNREADABLE: %d ledger lines"),
]
ok = True
for n, text in verdicts:
    if n:
        print("chaos check: " + text % n)
        ok = False
if explained < a.min_kill_hits:
    print("chaos check: the kills missed the window between effect and complete: %d reruns "
          "explained by a kill, at least %d wanted" % (explained, a.min_kill_hits))
    ok = False
if outstanding or a.pending:
    # Not a lost message: the drain ended (stall or deadline) with work left.
    if a.outstanding is not None:
        print("chaos check: UNFINISHED: %d messages still undelivered or pending when the "
              "drain ended (%d of them never ran): the run was too slow; these are not "
              "counted as lost" % (len(outstanding), len(unfinished)))
    else:
        print("chaos check: UNFINISHED: the broker still held %d messages when the drain "
              "ended; %d keys never ran (unfinished, or lost: this broker cannot say which "
              "keys it holds)" % (a.pending, len(unfinished)))
    ok = False
print("chaos check: " + ("PASS" if ok else "FAIL"))
sys.exit(0 if ok else 1)
