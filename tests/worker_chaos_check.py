#!/usr/bin/env python3
# Reads the ledger and the kill log of tests/worker_chaos_test.sh and reports:
#   lost        messages whose handler never completed although the stream no
#               longer holds them (acked, or gone): the guarantee is broken
#   unfinished  messages whose handler never completed and that are still
#               undelivered or pending when the drain ended (--outstanding, one
#               key per line): the run was too slow, a failure of its own, never
#               counted as lost
#   reruns      extra completed runs of a key; "explained" when the earlier run's
#               worker was SIGKILLed after that run started (and, the line being
#               written, after its effect: a kill between effect and complete),
#               or explained by the Redis restart when the store is that Redis (the
#               outcome could not be recorded), "unexplained" otherwise (= doubled)
#   overlaps    two runs of one key that were running at the same time
#   fence order runs of one key whose fences do not strictly increase (dedup only)
# Exit 1 when the dedup pattern breaks a check; the textbook pattern only reports.
import argparse
import collections
import json
import sys

ap = argparse.ArgumentParser()
for name in ("ledger", "kills", "outage", "outstanding", "pattern", "store"):
    ap.add_argument("--" + name, required=True)
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

runs = collections.defaultdict(list)
for line in open(a.ledger):
    parts = line.split()
    if len(parts) != 6:
        continue
    key, fence, attempt, start, end, pid = parts
    runs[key].append((int(start), int(end), int(fence), int(attempt), pid))

expected = {"m-%d" % i for i in range(a.messages)}
outstanding = {line.strip() for line in open(a.outstanding) if line.strip()}
never_ran = expected - set(runs)
unfinished = sorted(never_ran & outstanding)
lost = sorted(never_ran - outstanding)
extra_keys = sorted(set(runs) - expected)
explained = outage_reruns = unexplained = overlaps = fence_bad = 0
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
        # it), so a run of that worker that started before the logged time was
        # cut off before its outcome could be recorded.
        if any(t >= r[0] for t in kills.get(r[4], [])):
            explained += 1
        elif in_outage(r[1]):
            outage_reruns += 1
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
    "reruns_explained_by_store_outage": outage_reruns, "doubled_unexplained": unexplained,
    "overlapping_runs": overlaps, "fence_order_violations": fence_bad,
    "pending_at_end": a.pending, "dead_lettered": a.dead,
}
print("chaos report: " + json.dumps(report))
for e in examples[:10]:
    print("  example:", e)
if lost:
    print("  lost (first 10):", lost[:10])
if a.pattern != "dedup":
    sys.exit(0)
ok = (not lost and not extra_keys and unexplained == 0 and overlaps == 0 and fence_bad == 0
      and a.dead == 0)
if outstanding or a.pending:
    # Not a lost message: the drain ended (stall or deadline) with work left.
    print("chaos check: UNFINISHED: %d messages still undelivered or pending when the drain "
          "ended (%d of them never ran); the run was too slow, nothing was lost by it"
          % (len(outstanding), len(unfinished)))
    ok = False
print("chaos check: " + ("PASS" if ok else "FAIL"))
sys.exit(0 if ok else 1)
