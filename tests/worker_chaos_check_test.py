#!/usr/bin/env python3
# Self-test of tests/worker_chaos_check.py, the judge of every chaos test
# (worker_chaos_test.sh, rabbitmq_nats_chaos_test.sh, redis_fault_proxy_test.sh): a
# checker that cannot fail is a test that cannot fail. It feeds the checker
# synthetic ledgers, kill logs and broker states (lost, duplicate, unfinished,
# mixed, truncated and unreadable lines, late kills, ...) and asserts its verdict
# (exit code) and the counts of its report, so that a lost message is never taken
# for an unfinished one and the reverse.
#
#   tests/worker_chaos_check_test.py [CHECKER]     (default: next to this file)
#
# Runs in about a second; no server.
import json
import os
import subprocess
import sys
import tempfile

here = os.path.dirname(os.path.abspath(__file__))
checker = sys.argv[1] if len(sys.argv) > 1 else os.path.join(here, "worker_chaos_check.py")
T0 = 1_700_000_000_000_000  # us
failures = 0


def rec(key, fence, start_ms, end_ms, pid, attempt=1):
    return "%s %d %d %d %d %d\n" % (key, fence, attempt, T0 + start_ms * 1000,
                                    T0 + end_ms * 1000, pid)


def clean(n=4, pid=100):
    """One run per key m-0 .. m-(n-1), 10 ms each, one after another."""
    return "".join(rec("m-%d" % i, 1, 10 * i, 10 * i + 5, pid) for i in range(n))


def run(ledger, kills=(), outage=(), outstanding=None, pending=0, dead=0, messages=4,
        pattern="dedup", store="rocksdb", faults=None, extra=()):
    with tempfile.TemporaryDirectory() as d:
        def put(name, text):
            p = os.path.join(d, name)
            with open(p, "w") as f:
                f.write(text)
            return p
        args = [sys.executable, checker,
                "--ledger", put("ledger", ledger),
                "--kills", put("kills", "".join("%d %d\n" % (T0 + t * 1000, pid)
                                                for t, pid in kills)),
                "--outage", put("outage", " ".join(str(T0 + t * 1000) for t in outage)),
                "--messages", str(messages), "--published", str(messages),
                "--pending", str(pending), "--dead", str(dead), "--pattern", pattern,
                "--store", store, "--workers", "1", "--redis-restarts", "0",
                "--elapsed", "1"]
        if outstanding is not None:
            args += ["--outstanding", put("outstanding", "".join(k + "\n" for k in outstanding))]
        if faults is not None:
            args += ["--faults", put("faults", faults)]
        args += list(extra)
        p = subprocess.run(args, capture_output=True, text=True)
    report = {}
    for line in p.stdout.splitlines():
        if line.startswith("chaos report: "):
            report = json.loads(line[len("chaos report: "):])
    return p.returncode, report, p.stdout + p.stderr


def case(name, got, want_rc, says=(), **want):
    """want: report field -> expected value; says: verdict lines the output must hold."""
    global failures
    rc, report, out = got
    bad = ["no line %r" % line for line in says if line not in out]
    if rc != want_rc:
        bad.append("exit %d, expected %d" % (rc, want_rc))
    for k, v in want.items():
        if report.get(k) != v:
            bad.append("%s = %r, expected %r" % (k, report.get(k), v))
    if bad:
        failures += 1
        print("FAIL %s: %s" % (name, "; ".join(bad)))
        print("  " + out.replace("\n", "\n  "))
    else:
        print("ok   %s" % name)


PASS, FAIL = 0, 1

case("clean run passes", run(clean(), outstanding=[]), PASS,
     lost=0, unfinished=0, doubled_unexplained=0, completed_keys=4, effects=4)

# Lost and unfinished, told apart by what the broker still holds.
no_m2 = clean().replace(rec("m-2", 1, 20, 25, 100), "")
case("never ran and gone from the broker: lost", run(no_m2, outstanding=[]), FAIL,
     lost=1, unfinished=0)
case("never ran and still queued: unfinished, not lost", run(no_m2, outstanding=["m-2"]), FAIL,
     lost=0, unfinished=1, outstanding_at_end=1)
no_m1_m2 = no_m2.replace(rec("m-1", 1, 10, 15, 100), "")
case("mixed: one lost, one unfinished", run(no_m1_m2, outstanding=["m-2"]), FAIL,
     says=["chaos check: LOST: 1 messages", "chaos check: UNFINISHED: 1 messages"],
     lost=1, unfinished=1)
case("every key ran but a copy is still pending: unfinished, nothing lost",
     run(clean(), outstanding=["m-3"]), FAIL, lost=0, unfinished=0, outstanding_at_end=1)
case("count-only broker, nothing left: never-ran is lost", run(no_m2, pending=0), FAIL,
     lost=1, unfinished=0)
case("count-only broker, some left: never-ran is unfinished", run(no_m2, pending=3), FAIL,
     lost=0, unfinished=1)
case("dead-lettered entries fail the run", run(clean(), outstanding=[], dead=1), FAIL, lost=0)
case("textbook pattern only reports", run(no_m2, outstanding=[], pattern="textbook"), PASS,
     lost=1)

# Duplicates: explained only by a kill of the earlier run's worker in time.
twice = clean() + rec("m-1", 2, 100, 105, 101)
case("rerun without a kill: doubled", run(twice, outstanding=[]), FAIL, doubled_unexplained=1)
case("rerun after the earlier worker's kill mid-run: explained",
     run(twice, kills=[(16, 100)], outstanding=[]), PASS,
     doubled_unexplained=0, reruns_explained_by_kill=1)
case("--min-kill-hits: a kill that cut a run off between effect and complete passes",
     run(twice, kills=[(16, 100)], outstanding=[], extra=["--min-kill-hits", "1"]), PASS,
     reruns_explained_by_kill=1)
case("--min-kill-hits: kills that never landed in that window fail the run",
     run(clean(), kills=[(16, 100)], outstanding=[], extra=["--min-kill-hits", "1"]), FAIL,
     lost=0, doubled_unexplained=0, reruns_explained_by_kill=0)
case("rerun whose earlier worker was killed 1 s after its effect (complete retried): explained",
     run(twice, kills=[(1_015, 100)], outstanding=[]), PASS, reruns_explained_by_kill=1)
case("rerun whose earlier worker was killed 60 s after that run ended: doubled",
     run(twice, kills=[(60_015, 100)], outstanding=[]), FAIL, doubled_unexplained=1)
case("rerun whose earlier worker was killed before that run began: doubled",
     run(twice, kills=[(5, 100)], outstanding=[]), FAIL, doubled_unexplained=1)
case("rerun after a kill of another worker: doubled",
     run(twice, kills=[(16, 999)], outstanding=[]), FAIL, doubled_unexplained=1)
case("rerun ending in the Redis restart, Redis store: explained",
     run(twice, outage=(14, 500), store="redis", outstanding=[]), PASS,
     reruns_explained_by_store_outage=1)
case("same rerun, RocksDB store: doubled",
     run(twice, outage=(14, 500), store="rocksdb", outstanding=[]), FAIL, doubled_unexplained=1)
overlap = clean() + rec("m-1", 2, 12, 30, 101)
case("two runs of one key at once: overlap",
     run(overlap, kills=[(16, 100)], outstanding=[]), FAIL, overlapping_runs=1)
stale = clean() + rec("m-1", 1, 100, 105, 101)
case("rerun with a fence not above the earlier one",
     run(stale, kills=[(16, 100)], outstanding=[]), FAIL, fence_order_violations=1)
case("an effect of a key never published", run(clean() + rec("m-9", 1, 1, 2, 100),
                                              outstanding=[]), FAIL, unexpected_keys=1)

# The ledger itself: a handler SIGKILLed inside its write() leaves a line without
# its newline, and the next append continues it. The cut-off record is no effect;
# the record glued to it is one and must not vanish.
full_m1 = rec("m-1", 1, 10, 15, 100)
cut = full_m1[:17]  # "m-1 1 1 170000000"
glued = clean().replace(full_m1, "").replace(rec("m-2", 1, 20, 25, 100),
                                             cut + rec("m-2", 1, 20, 25, 100))
rerun_m1 = rec("m-1", 2, 100, 105, 101)
case("truncated line glued to the next record: both read right",
     run(glued + rerun_m1, kills=[(16, 100)], outstanding=[]), PASS,
     lost=0, completed_keys=4, effects=4, truncated_records=1)
case("truncated record of a key that never ran again: lost",
     run(glued, kills=[(16, 100)], outstanding=[]), FAIL, lost=1, truncated_records=1)
case("truncated last line (no newline)",
     run(clean() + rec("m-1", 2, 100, 105, 101)[:20], outstanding=[]), PASS,
     effects=4, truncated_records=1)
case("an unreadable ledger line fails the run",
     run(clean() + "m-1 2 1 garbage\n", outstanding=[]), FAIL, unreadable_lines=1)
case("a record hidden in garbage is not read as an effect",
     run(clean().replace(rec("m-3", 1, 30, 35, 100), "") + "xx" + rec("m-3", 1, 30, 35, 100),
         outstanding=[]), FAIL, unreadable_lines=1)

if failures:
    print("%d checker case(s) failed" % failures)
    sys.exit(1)
print("all checker cases passed")
