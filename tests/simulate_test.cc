// Copyright dedup authors. Licensed under the Apache License 2.0.
//
// Small seeded runs of `dedup simulate`: the dedup pattern never applies an effect
// twice (beyond the documented crash between effect and complete) and never loses
// a message, on every embedded store; the textbook guard, under the same faults,
// does both.

#include "sim/simulation.h"

#include "sim/ledger.h"

#include <gtest/gtest.h>

#include <atomic>
#include <string>
#include <vector>

namespace dedup::sim {
namespace {

// Faults well above the CLI defaults, so that a few thousand messages meet every
// kind many times; durations short, so that a run takes a few seconds. The lease
// leaves room for the heartbeat thread to be starved by a loaded 2-core machine
// (CI runs tests two at a time): a heartbeat late by more than a lease is a real
// takeover, which the fence exists for, not a defect of the guard.
SimulateOptions Faulty(uint64_t seed) {
  SimulateOptions o;
  o.messages = 3000;
  o.workers = 8;
  o.seed = seed;
  o.lease = Millis(600);
  o.visibility_timeout = Millis(700);
  o.textbook_ttl = Millis(1200);
  o.retry_delay = Millis(20);
  o.duplicate_fraction = 0.1;
  o.duplicate_delay = Millis(2500);  // some copies arrive after the textbook TTL
  o.crash_before_work = 0.01;
  o.crash_after_effect = 0.01;
  o.crash_after_complete = 0.01;
  o.transient_failure = 0.02;
  o.slow_handler = 0.003;
  o.slow_handler_time = Millis(1500);
  o.poison = 0.005;
  o.timeout = Millis(60'000);
  return o;
}

void ExpectAddsUp(const SimulateReport& r) {
  EXPECT_EQ(r.exactly_once + r.reapplied_after_crash + r.applied_twice_otherwise + r.lost +
                r.not_applied_dead_lettered + r.not_applied_unfinished,
            r.messages);
  EXPECT_EQ(r.acked + r.dead_lettered + r.unfinished, r.published);
}

void ExpectDedupHolds(const SimulateReport& r) {
  SCOPED_TRACE(FormatReport(r));
  ExpectAddsUp(r);
  EXPECT_EQ(r.applied_twice_otherwise, 0u);
  EXPECT_EQ(r.lost, 0u);
  EXPECT_EQ(r.unfinished, 0u);
  EXPECT_EQ(r.stale_fence_effects, 0u);
  EXPECT_TRUE(r.passed());
  // The faults did happen, and were survived the documented way.
  EXPECT_GT(r.crashed_before_work, 0u);
  EXPECT_GT(r.crashed_after_effect, 0u);
  EXPECT_GT(r.crashed_after_complete, 0u);
  EXPECT_GT(r.slow_handlers, 0u);
  EXPECT_GT(r.transient_failures, 0u);
  EXPECT_GT(r.duplicates_suppressed, 0u);
  EXPECT_GT(r.takeovers, 0u);
  EXPECT_GT(r.heartbeats, 0u);
  // Every crash between effect and complete re-applies once; nothing else does.
  EXPECT_GT(r.reapplied_after_crash, 0u);
  EXPECT_LE(r.reapplied_after_crash, r.crashed_after_effect);
  // Poison messages are dead-lettered, not applied, not lost; nothing else is.
  EXPECT_EQ(r.not_applied_dead_lettered, r.poison_messages);
  EXPECT_EQ(r.dead_lettered_not_poison, 0u);
}

TEST(SimulateTest, DedupOnMemoryNeverDoublesNorLoses) {
  for (uint64_t seed : {1, 2, 3}) {
    SimulateOptions o = Faulty(seed);
    o.store_uri = "memory:";
    StatusOr<SimulateReport> r = RunSimulation(o);
    ASSERT_TRUE(r.ok()) << r.status();
    ExpectDedupHolds(*r);
  }
}

#ifdef DEDUP_WITH_ROCKSDB
TEST(SimulateTest, DedupOnRocksDBNeverDoublesNorLoses) {
  SimulateOptions o = Faulty(7);
  o.store_uri = "";  // the default: RocksDB in a fresh temporary directory
  StatusOr<SimulateReport> r = RunSimulation(o);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->store.rfind("rocksdb:", 0), 0u) << r->store;
  ExpectDedupHolds(*r);
}
#endif

TEST(SimulateTest, TextbookGuardLosesAndDoublesUnderTheSameFaults) {
  SimulateOptions o = Faulty(1);
  o.pattern = Pattern::kTextbook;
  StatusOr<SimulateReport> r = RunSimulation(o);
  ASSERT_TRUE(r.ok()) << r.status();
  SCOPED_TRACE(FormatReport(*r));
  ExpectAddsUp(*r);
  EXPECT_EQ(r->unfinished, 0u);
  // Defect 4: the redelivery of a crashed claim finds the key and is acked.
  EXPECT_GT(r->lost, 0u);
  // Defects 1 and 5: a duplicate after the TTL runs the work again.
  EXPECT_GT(r->applied_twice_otherwise, 0u);
  EXPECT_FALSE(r->passed());
}

// Without faults or duplicates both guards apply every effect exactly once: the
// ledger and the broker themselves invent nothing.
TEST(SimulateTest, NoFaultsMeansExactlyOnceForBothPatterns) {
  for (Pattern p : {Pattern::kDedup, Pattern::kTextbook}) {
    SimulateOptions o;
    o.messages = 2000;
    o.pattern = p;
    o.store_uri = "memory:";
    o.duplicate_fraction = 0;
    o.crash_before_work = o.crash_after_effect = o.crash_after_complete = 0;
    o.transient_failure = o.slow_handler = o.poison = 0;
    StatusOr<SimulateReport> r = RunSimulation(o);
    ASSERT_TRUE(r.ok()) << r.status();
    SCOPED_TRACE(FormatReport(*r));
    EXPECT_EQ(r->exactly_once, 2000u);
    EXPECT_EQ(r->deliveries, 2000u);
    EXPECT_EQ(r->acked, 2000u);
    EXPECT_TRUE(r->passed());
  }
}

// The fault schedule is a function of the seed, not of thread timing. Without
// duplicates or slow handlers no delivery meets BUSY, so the deliveries that reach
// a handler, and the faults they meet, are the same on every run. (How many
// deliveries meet DUPLICATE is not: a crash also loses the acks that were
// waiting to be coalesced, and how many that is depends on timing.)
TEST(SimulateTest, SameSeedSameFaults) {
  auto run = [](uint64_t seed) {
    SimulateOptions o = Faulty(seed);
    o.store_uri = "memory:";
    o.duplicate_fraction = 0;
    o.slow_handler = 0;
    StatusOr<SimulateReport> r = RunSimulation(o);
    EXPECT_TRUE(r.ok()) << r.status();
    return r.ok() ? *r : SimulateReport{};
  };
  auto faults = [](const SimulateReport& r) {
    return std::to_string(r.crashed_before_work) + "/" + std::to_string(r.crashed_after_effect) +
           "/" + std::to_string(r.crashed_after_complete) + "/" +
           std::to_string(r.transient_failures) + "/" + std::to_string(r.poison_messages) + "/" +
           std::to_string(r.deliveries - r.duplicates_suppressed);
  };
  const SimulateReport a = run(11), b = run(11), c = run(12);
  EXPECT_EQ(faults(a), faults(b));
  EXPECT_NE(faults(a), faults(c));
}

// A run stopped early says so: unfinished messages fail the run, and are not
// mistaken for lost ones.
TEST(SimulateTest, StoppedEarlyIsUnfinishedNotLost) {
  for (bool cancel_it : {false, true}) {
    SimulateOptions o = Faulty(5);
    o.store_uri = "memory:";
    o.messages = 200'000;
    std::atomic<bool> cancel{cancel_it};
    if (cancel_it) {
      o.cancel = &cancel;
    } else {
      o.timeout = Millis(150);
    }
    StatusOr<SimulateReport> r = RunSimulation(o);
    ASSERT_TRUE(r.ok()) << r.status();
    SCOPED_TRACE(FormatReport(*r));
    ExpectAddsUp(*r);
    EXPECT_GT(r->unfinished, 0u);
    EXPECT_GT(r->not_applied_unfinished, 0u);
    EXPECT_EQ(r->lost, 0u);
    EXPECT_FALSE(r->passed());
  }
}

// The ledger's tally, fed by hand: every verdict it can give, and never lost for
// unfinished or the reverse.
TEST(SimulateLedgerTest, TallyTellsEveryOutcomeApart) {
  Ledger l(9);
  l.Apply(0, 1, 1, false);  // 0: exactly once
  // 1: never applied, nothing left at the broker: lost
  // 2: never applied, still at the broker: unfinished
  l.MarkDeadLettered(3);  // 3: never applied, dead-lettered
  l.Apply(4, 1, 1, true);  // 4: crash between effect and complete, re-applied
  l.Apply(4, 2, 2, false);
  l.Apply(5, 1, 1, false);  // 5: applied twice, no crash
  l.Apply(5, 2, 2, false);
  l.Apply(6, 1, 1, true);  // 6: one excused re-application, then one more
  l.Apply(6, 2, 2, false);
  l.Apply(6, 3, 3, false);
  l.Apply(7, 1, 1, false);  // 7: applied, yet a copy is still open: not lost
  l.Apply(8, 2, 2, true);   // 8: re-applied under a fence not above the first
  l.Apply(8, 2, 3, false);
  std::vector<bool> open(9, false);
  open[2] = open[7] = true;
  SimulateReport r;
  l.Tally(open, r);
  EXPECT_EQ(r.exactly_once, 2u);  // 0 and 7
  EXPECT_EQ(r.lost, 1u);
  EXPECT_EQ(r.not_applied_unfinished, 1u);
  EXPECT_EQ(r.not_applied_dead_lettered, 1u);
  EXPECT_EQ(r.reapplied_after_crash, 2u);  // 4 and 8
  EXPECT_EQ(r.applied_twice_otherwise, 2u);  // 5 and 6
  EXPECT_EQ(l.stale_fence(), 1u);
}

// passed() is the verdict `dedup simulate` exits with (and scripts/quickstart.sh
// shows): every count the dedup pattern must keep at zero fails it.
TEST(SimulateLedgerTest, PassedFailsOnEveryMustBeZeroCount) {
  SimulateReport ok;
  ok.messages = ok.exactly_once = 10;
  EXPECT_TRUE(ok.passed());
  SimulateReport r = ok;
  r.lost = 1;
  EXPECT_FALSE(r.passed());
  r = ok;
  r.unfinished = 1;
  EXPECT_FALSE(r.passed());
  r = ok;
  r.applied_twice_otherwise = 1;
  EXPECT_FALSE(r.passed());
  r = ok;
  r.stale_fence_effects = 1;  // a downstream fence check would refuse an effect
  EXPECT_FALSE(r.passed());
  r = ok;
  r.dead_lettered_not_poison = 1;  // a good message thrown away
  EXPECT_FALSE(r.passed());
}

TEST(SimulateTest, BadStoreUriIsAClearError) {
  SimulateOptions o;
  o.messages = 10;
  o.store_uri = "nosuchstore://x";
  StatusOr<SimulateReport> r = RunSimulation(o);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("nosuchstore"), std::string::npos) << r.status();
}

TEST(SimulateTest, BadOptionsAreRefused) {
  SimulateOptions o;
  o.store_uri = "memory:";
  o.lease = Millis(0);
  EXPECT_EQ(RunSimulation(o).status().code(), StatusCode::kInvalidArgument);
  o = SimulateOptions{};
  o.store_uri = "memory:";
  o.crash_before_work = 0.4;
  o.transient_failure = 0.4;  // 0.8 of all deliveries faulty would hardly finish
  EXPECT_EQ(RunSimulation(o).status().code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace dedup::sim
