// Copyright dedup authors. Licensed under the Apache License 2.0.
//
// The transition table on its own, without a store around it.

#include "core/state_machine.h"

#include <gtest/gtest.h>

#include <string>
#include <string_view>

namespace dedup::internal {
namespace {

// DecideClaim's at-limit words; empty but in the tests of the limits.
std::string g_limit;

ClaimRequest Req(Millis lease = Millis(1000), Millis retention = Millis(5000)) {
  ClaimRequest r;
  r.key = "k";
  r.lease = lease;
  r.retention = retention;
  return r;
}

TEST(StateMachine, AbsentKeyIsAcquiredWithDeadlines) {
  Record next;
  bool write = false;
  ClaimResult r = DecideClaim(nullptr, Req(), 100, Token{7}, &next, &write, &g_limit);
  EXPECT_TRUE(write);
  EXPECT_EQ(r.outcome, ClaimOutcome::kAcquired);
  EXPECT_EQ(next.state, RecordState::kInProgress);
  EXPECT_EQ(next.fence, 1u);
  EXPECT_EQ(next.lease_deadline, 1100);
  EXPECT_EQ(next.retention_deadline, 6100) << "in-progress records are kept lease + retention";
}

TEST(StateMachine, ExpiredRecordCarriesItsFence) {
  Record old;
  old.state = RecordState::kCompleted;
  old.fence = 41;
  old.attempt = 3;
  old.retention_deadline = 50;
  Record next;
  bool write = false;
  ClaimResult r = DecideClaim(&old, Req(), 100, Token{9}, &next, &write, &g_limit);
  EXPECT_EQ(r.outcome, ClaimOutcome::kAcquired);
  EXPECT_EQ(r.fence, 42u);
  EXPECT_EQ(r.attempt, 1u);
}

// Stores may hand DecideClaim a *next that still holds another record (the
// memory store reuses one per thread). A claim of an absent or expired key sets
// every field (Record::key aside, which is the store's): nothing of the old
// record is carried over, with a fingerprint in the request or without.
TEST(StateMachine, AbsentOrExpiredKeyStartsEveryFieldOfAReusedRecord) {
  Record expired;
  expired.fence = 41;
  expired.attempt = 3;
  expired.retention_deadline = 50;
  const Record* const curs[] = {nullptr, &expired};
  for (const Record* cur : curs) {
    for (std::string_view fp : {std::string_view(), std::string_view("new-fp")}) {
      Record stale;
      stale.key = "other";
      stale.state = RecordState::kCompleted;
      stale.token = Token{99};
      stale.fence = 500;
      stale.attempt = 9;
      stale.lease_deadline = 7;
      stale.retention_deadline = 8;
      stale.fingerprint = "old-fp";
      stale.status = CompletionStatus::kFailed;
      stale.result = "old result";
      ClaimRequest req = Req();
      req.fingerprint = fp;
      bool write = false;
      const ClaimResult r = DecideClaim(cur, req, 100, Token{7}, &stale, &write, &g_limit);
      Record want;
      want.key = "other";  // left alone
      want.state = RecordState::kInProgress;
      want.token = Token{7};
      want.fence = cur == nullptr ? 1 : 42;
      want.attempt = 1;
      want.lease_deadline = 1100;
      want.retention_deadline = 6100;
      want.fingerprint = std::string(fp);
      want.status = CompletionStatus::kOk;
      EXPECT_TRUE(write);
      EXPECT_EQ(r.outcome, ClaimOutcome::kAcquired);
      EXPECT_EQ(r.fence, want.fence);
      EXPECT_EQ(stale, want) << (cur == nullptr ? "absent" : "expired") << ", fingerprint '" << fp << "'";
    }
  }
}

TEST(StateMachine, LeaseBoundaryIsExclusive) {
  Record cur;
  bool write = false;
  DecideClaim(nullptr, Req(Millis(10)), 0, Token{1}, &cur, &write, &g_limit);
  Record next;
  EXPECT_EQ(DecideClaim(&cur, Req(), 9, Token{2}, &next, &write, &g_limit).outcome, ClaimOutcome::kBusy);
  EXPECT_FALSE(write);
  EXPECT_EQ(DecideClaim(&cur, Req(), 10, Token{2}, &next, &write, &g_limit).outcome,
            ClaimOutcome::kAcquired);
  EXPECT_TRUE(write);
}

TEST(StateMachine, ExtendKeepsTheRetentionGap) {
  Record cur;
  bool write = false;
  DecideClaim(nullptr, Req(Millis(10), Millis(100)), 0, Token{1}, &cur, &write, &g_limit);
  EXPECT_EQ(DecideExtend(&cur, Token{1}, Millis(50), 5), WriteResult::kOk);
  EXPECT_EQ(cur.lease_deadline, 55);
  EXPECT_EQ(cur.retention_deadline, 155);
  EXPECT_EQ(DecideExtend(&cur, Token{2}, Millis(50), 5), WriteResult::kLost);
  EXPECT_EQ(DecideExtend(nullptr, Token{1}, Millis(50), 5), WriteResult::kLost);
}

TEST(StateMachine, OwnerWritesOnExpiredRecordAreLost) {
  Record cur;
  bool write = false;
  DecideClaim(nullptr, Req(Millis(10), Millis(100)), 0, Token{1}, &cur, &write, &g_limit);
  Record copy = cur;
  EXPECT_EQ(DecideComplete(&cur, Token{1}, Millis(5), CompletionStatus::kOk, "", 110),
            WriteResult::kLost);
  EXPECT_EQ(cur, copy);
}

TEST(StateMachine, ExhaustedKeepsFence) {
  Record cur;
  bool write = false;
  ClaimRequest req = Req();
  req.max_attempts = 1;
  DecideClaim(nullptr, req, 0, Token{1}, &cur, &write, &g_limit);
  ASSERT_EQ(DecideRelease(&cur, Token{1}, Millis(100), 1), WriteResult::kOk);
  Record next;
  ClaimResult r = DecideClaim(&cur, req, 2, Token{2}, &next, &write, &g_limit);
  EXPECT_EQ(r.outcome, ClaimOutcome::kExhausted);
  EXPECT_TRUE(write);
  EXPECT_EQ(next.fence, cur.fence);
  EXPECT_EQ(next.state, RecordState::kCompleted);
  EXPECT_EQ(next.status, CompletionStatus::kExhausted);
}

TEST(StateMachine, ForgetRefusesARunningLeaseAndRemovesTheRest) {
  Record cur;
  bool write = false;
  DecideClaim(nullptr, Req(Millis(10)), 0, Token{1}, &cur, &write, &g_limit);
  Record floor;
  EXPECT_EQ(DecideForget(nullptr, false, 5, &floor), ForgetAction::kNone);
  EXPECT_EQ(DecideForget(&cur, false, 9, &floor), ForgetAction::kRefuse);
  EXPECT_EQ(DecideForget(&cur, false, 10, &floor), ForgetAction::kRemove) << "lease over";
  EXPECT_EQ(DecideForget(&cur, true, 10, &floor), ForgetAction::kRemove) << "no floor needed";
  EXPECT_EQ(DecideForget(&cur, false, cur.retention_deadline, &floor), ForgetAction::kNone);
  ASSERT_EQ(DecideRelease(&cur, Token{1}, Millis(100), 5), WriteResult::kOk);
  EXPECT_EQ(DecideForget(&cur, false, 6, &floor), ForgetAction::kRemove);
}

TEST(StateMachine, ForcedForgetLeavesAFloorThatClaimsStepOver) {
  ClaimRequest fp = Req(Millis(10), Millis(5000));
  fp.fingerprint = "A";
  fp.max_attempts = 1;
  Record cur;
  bool write = false;
  DecideClaim(nullptr, fp, 0, Token{1}, &cur, &write, &g_limit);
  cur.fence = 41;
  Record floor;
  ASSERT_EQ(DecideForget(&cur, true, 4, &floor), ForgetAction::kFloor);
  EXPECT_TRUE(IsFenceFloor(floor));
  EXPECT_EQ(floor.fence, 41u);
  EXPECT_EQ(floor.retention_deadline, 10) << "kept until the forgotten lease ends";
  EXPECT_EQ(DecideForget(&floor, true, 5, &floor), ForgetAction::kNone) << "never removed";
  Record copy = floor;
  EXPECT_EQ(DecideComplete(&copy, Token{1}, Millis(100), CompletionStatus::kOk, "", 5),
            WriteResult::kLost);
  fp.fingerprint = "B";
  Record next;
  ClaimResult r = DecideClaim(&floor, fp, 5, Token{2}, &next, &write, &g_limit);
  EXPECT_EQ(r.outcome, ClaimOutcome::kAcquired);
  EXPECT_EQ(r.fence, 42u);
  EXPECT_EQ(r.attempt, 1u);
  EXPECT_EQ(next.fingerprint, "B");
  EXPECT_FALSE(IsFenceFloor(next));
}

}  // namespace
}  // namespace dedup::internal

namespace dedup::internal {
namespace {

// A fence or attempt at the largest its type holds (only a corrupt or
// hand-written record): a takeover would wrap it to 0, a fence smaller than
// every one before. Nothing is written, and the words say which.
TEST(StateMachine, AFenceOrAttemptAtItsLargestIsNotRaised) {
  Record cur;
  cur.state = RecordState::kReleased;
  cur.token = Token{3};
  cur.fence = ~uint64_t{0};
  cur.attempt = 2;
  cur.lease_deadline = 0;
  cur.retention_deadline = 1000;
  Record next;
  bool write = true;
  std::string limit;
  ClaimResult r = DecideClaim(&cur, Req(), 10, Token{4}, &next, &write, &limit);
  EXPECT_FALSE(write);
  EXPECT_NE(r.outcome, ClaimOutcome::kAcquired);
  EXPECT_EQ(limit, "fence 18446744073709551615 cannot be raised (the largest fence is 2^64 - 1)");
  // Past its retention (absent), the fence still goes on: refused too.
  (void)DecideClaim(&cur, Req(), 5000, Token{4}, &next, &write, &limit);
  EXPECT_FALSE(write);
  EXPECT_NE(limit.find("fence 18446744073709551615"), std::string::npos);
  cur.fence = 7;
  cur.attempt = ~uint32_t{0};
  r = DecideClaim(&cur, Req(), 10, Token{4}, &next, &write, &limit);
  EXPECT_FALSE(write);
  EXPECT_EQ(limit, "attempt 4294967295 cannot be raised (the largest attempt is 2^32 - 1)");
  // Past its retention the attempt starts again at 1: taken.
  r = DecideClaim(&cur, Req(), 5000, Token{4}, &next, &write, &limit);
  EXPECT_TRUE(write);
  EXPECT_TRUE(limit.empty());
  EXPECT_EQ(r.outcome, ClaimOutcome::kAcquired);
  EXPECT_EQ(next.fence, 8u);
  EXPECT_EQ(next.attempt, 1u);
  // One below: raised to the largest.
  cur.attempt = ~uint32_t{0} - 1;
  r = DecideClaim(&cur, Req(), 10, Token{4}, &next, &write, &limit);
  EXPECT_TRUE(write && limit.empty());
  EXPECT_EQ(next.attempt, ~uint32_t{0});
}

}  // namespace
}  // namespace dedup::internal
