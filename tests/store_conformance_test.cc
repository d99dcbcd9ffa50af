// Copyright dedup authors. Licensed under the Apache License 2.0.
//
// The one conformance suite: every row of SPEC.md's tables, run unchanged against
// every store this build and environment can reach (see store_envs.h). A store is
// done when it passes this suite plus its own crash and fault tests.

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "dedup/store.h"
#include "store_envs.h"

namespace dedup {
namespace {

using testing::AvailableStoreNames;
using testing::MakeStoreEnv;
using testing::StoreEnv;
using namespace std::chrono_literals;

// Durations safe for server clocks too: "long" never runs out during a test,
// "short" is always over after kPastShort.
constexpr Millis kLong = 120s;
constexpr Millis kShort = 250ms;
constexpr Millis kPastShort = 700ms;

class StoreConformance : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    env_ = MakeStoreEnv(GetParam());
    ASSERT_NE(env_, nullptr) << GetParam();
    store_ = env_->Open();
    ASSERT_NE(store_, nullptr) << "could not open a " << GetParam() << " store";
  }

  ClaimRequest Req(std::string_view key, Millis lease = kLong, Millis retention = kLong) {
    ClaimRequest r;
    r.key = key;
    r.lease = lease;
    r.retention = retention;
    return r;
  }

  ClaimResult MustClaim(const ClaimRequest& r) {
    auto res = store_->Claim(r);
    EXPECT_TRUE(res.ok()) << res.status();
    return res.ok() ? *res : ClaimResult{};
  }
  ClaimResult MustClaim(std::string_view key, Millis lease = kLong) {
    return MustClaim(Req(key, lease));
  }

  WriteResult MustComplete(std::string_view key, Token t, std::string_view result = {},
                           CompletionStatus st = CompletionStatus::kOk, Millis retention = kLong) {
    auto res = store_->Complete(key, t, retention, st, result);
    EXPECT_TRUE(res.ok()) << res.status();
    return res.ok() ? *res : WriteResult::kLost;
  }
  WriteResult MustRelease(std::string_view key, Token t, Millis retention = kLong) {
    auto res = store_->Release(key, t, retention);
    EXPECT_TRUE(res.ok()) << res.status();
    return res.ok() ? *res : WriteResult::kOk;
  }
  WriteResult MustExtend(std::string_view key, Token t, Millis lease = kLong) {
    auto res = store_->Extend(key, t, lease);
    EXPECT_TRUE(res.ok()) << res.status();
    return res.ok() ? *res : WriteResult::kOk;
  }
  std::optional<Record> MustInspect(std::string_view key) {
    auto res = store_->Inspect(key);
    EXPECT_TRUE(res.ok()) << res.status();
    return res.ok() ? *res : std::nullopt;
  }

  std::unique_ptr<StoreEnv> env_;
  std::unique_ptr<Store> store_;
};

// ---- claim results ---------------------------------------------------------

TEST_P(StoreConformance, FirstClaimAcquires) {
  ClaimResult r = MustClaim("k");
  EXPECT_EQ(r.outcome, ClaimOutcome::kAcquired);
  EXPECT_TRUE(r.token.valid());
  EXPECT_GE(r.fence, 1u);
  EXPECT_EQ(r.attempt, 1u);
  auto rec = MustInspect("k");
  ASSERT_TRUE(rec.has_value());
  EXPECT_EQ(rec->key, "k");
  EXPECT_EQ(rec->state, RecordState::kInProgress);
  EXPECT_EQ(rec->token, r.token);
  EXPECT_EQ(rec->fence, r.fence);
  EXPECT_EQ(rec->attempt, 1u);
  EXPECT_GT(rec->lease_deadline, 0);
  EXPECT_GT(rec->retention_deadline, rec->lease_deadline);
}

TEST_P(StoreConformance, ClaimWhileLeasedIsBusyAndNeverAcquires) {
  ClaimResult first = MustClaim("k");
  ClaimResult second = MustClaim("k");
  EXPECT_EQ(second.outcome, ClaimOutcome::kBusy);
  EXPECT_EQ(second.fence, first.fence);
  EXPECT_EQ(second.attempt, 1u);
  EXPECT_GT(second.lease_left.count(), 0);
  EXPECT_LE(second.lease_left, kLong);
  EXPECT_FALSE(second.token.valid()) << "BUSY must not hand out a token";
}

TEST_P(StoreConformance, CompleteThenClaimIsDuplicateWithResult) {
  ClaimResult r = MustClaim("k");
  const std::string result("charged\0 42 \xff", 13);
  EXPECT_EQ(MustComplete("k", r.token, result), WriteResult::kOk);
  ClaimResult d = MustClaim("k");
  EXPECT_EQ(d.outcome, ClaimOutcome::kDuplicate);
  EXPECT_EQ(d.status, CompletionStatus::kOk);
  EXPECT_EQ(d.result, result);
  EXPECT_EQ(d.fence, r.fence);
  auto rec = MustInspect("k");
  ASSERT_TRUE(rec.has_value());
  EXPECT_EQ(rec->state, RecordState::kCompleted);
  EXPECT_EQ(rec->result, result);
}

TEST_P(StoreConformance, FailedCompletionIsReplayedAsFailed) {
  ClaimResult r = MustClaim("k");
  EXPECT_EQ(MustComplete("k", r.token, "card declined", CompletionStatus::kFailed),
            WriteResult::kOk);
  ClaimResult d = MustClaim("k");
  EXPECT_EQ(d.outcome, ClaimOutcome::kDuplicate);
  EXPECT_EQ(d.status, CompletionStatus::kFailed);
  EXPECT_EQ(d.result, "card declined");
}

TEST_P(StoreConformance, LargestResultIsKeptWhole) {
  ClaimResult r = MustClaim("k");
  std::string big(kMaxResultBytes, 'x');
  big[0] = '\0';
  big.back() = 'z';
  EXPECT_EQ(MustComplete("k", r.token, big), WriteResult::kOk);
  ClaimResult d = MustClaim("k");
  EXPECT_EQ(d.outcome, ClaimOutcome::kDuplicate);
  EXPECT_EQ(d.result, big);
}

TEST_P(StoreConformance, ReleaseMakesKeyClaimableAtOnceKeepingFenceAndAttempts) {
  ClaimResult a = MustClaim("k");
  EXPECT_EQ(MustRelease("k", a.token), WriteResult::kOk);
  auto rec = MustInspect("k");
  ASSERT_TRUE(rec.has_value());
  EXPECT_EQ(rec->state, RecordState::kReleased);
  ClaimResult b = MustClaim("k");
  EXPECT_EQ(b.outcome, ClaimOutcome::kAcquired);
  EXPECT_EQ(b.attempt, 2u);
  EXPECT_GT(b.fence, a.fence);
  EXPECT_NE(b.token, a.token);
}

// ---- LOST for stale owners, record unchanged ---------------------------------

TEST_P(StoreConformance, StaleOwnerAfterTakeoverGetsLostAndChangesNothing) {
  ClaimResult old = MustClaim("k", kShort);
  env_->Sleep(kPastShort);
  ClaimResult now = MustClaim("k");
  ASSERT_EQ(now.outcome, ClaimOutcome::kAcquired);
  EXPECT_EQ(now.attempt, 2u);
  EXPECT_GT(now.fence, old.fence);
  auto before = MustInspect("k");
  ASSERT_TRUE(before.has_value());

  EXPECT_EQ(MustExtend("k", old.token), WriteResult::kLost);
  EXPECT_EQ(MustInspect("k"), before);
  EXPECT_EQ(MustComplete("k", old.token, "stale"), WriteResult::kLost);
  EXPECT_EQ(MustInspect("k"), before);
  EXPECT_EQ(MustRelease("k", old.token), WriteResult::kLost);
  EXPECT_EQ(MustInspect("k"), before);

  // The new owner is unaffected.
  EXPECT_EQ(MustComplete("k", now.token, "fresh"), WriteResult::kOk);
  EXPECT_EQ(MustClaim("k").result, "fresh");
}

TEST_P(StoreConformance, WrongTokenIsLostAndChangesNothing) {
  ClaimResult a = MustClaim("k");
  auto before = MustInspect("k");
  Token wrong{a.token.value ^ 0x5a5a5a5a5a5a5a5aull};
  EXPECT_EQ(MustExtend("k", wrong), WriteResult::kLost);
  EXPECT_EQ(MustComplete("k", wrong), WriteResult::kLost);
  EXPECT_EQ(MustRelease("k", wrong), WriteResult::kLost);
  EXPECT_EQ(MustInspect("k"), before);
}

TEST_P(StoreConformance, WritesToAbsentKeyAreLost) {
  Token t = Token::Random();
  EXPECT_EQ(MustExtend("nothing", t), WriteResult::kLost);
  EXPECT_EQ(MustComplete("nothing", t), WriteResult::kLost);
  EXPECT_EQ(MustRelease("nothing", t), WriteResult::kLost);
  EXPECT_EQ(MustInspect("nothing"), std::nullopt);
}

TEST_P(StoreConformance, OwnerWritesAfterOutcomeAreLost) {
  ClaimResult a = MustClaim("k");
  EXPECT_EQ(MustComplete("k", a.token, "one"), WriteResult::kOk);
  EXPECT_EQ(MustComplete("k", a.token, "two"), WriteResult::kLost);
  EXPECT_EQ(MustRelease("k", a.token), WriteResult::kLost);
  EXPECT_EQ(MustExtend("k", a.token), WriteResult::kLost);
  EXPECT_EQ(MustClaim("k").result, "one");

  ClaimResult b = MustClaim("r");
  EXPECT_EQ(MustRelease("r", b.token), WriteResult::kOk);
  EXPECT_EQ(MustComplete("r", b.token), WriteResult::kLost);
  EXPECT_EQ(MustExtend("r", b.token), WriteResult::kLost);
}

TEST_P(StoreConformance, ExtendKeepsTheLeaseAlive) {
  ClaimResult a = MustClaim("k", 1500ms);
  env_->Sleep(1000ms);
  EXPECT_EQ(MustExtend("k", a.token, kLong), WriteResult::kOk);
  env_->Sleep(1000ms);  // past the original lease
  ClaimResult b = MustClaim("k");
  EXPECT_EQ(b.outcome, ClaimOutcome::kBusy);
  EXPECT_GT(b.lease_left, 60s);
  EXPECT_EQ(MustComplete("k", a.token), WriteResult::kOk);
}

TEST_P(StoreConformance, LateOutcomeWithoutTakeoverIsAccepted) {
  // The lease ran out but nobody claimed meanwhile: the owner is still the only
  // one that ever ran the work, so its outcome is recorded.
  ClaimResult a = MustClaim("k", kShort);
  env_->Sleep(kPastShort);
  EXPECT_EQ(MustComplete("k", a.token, "late"), WriteResult::kOk);
  ClaimResult d = MustClaim("k");
  EXPECT_EQ(d.outcome, ClaimOutcome::kDuplicate);
  EXPECT_EQ(d.result, "late");
}

// ---- fence and attempts ----------------------------------------------------

TEST_P(StoreConformance, FenceStrictlyIncreasesAcrossReleaseAndTakeover) {
  std::vector<uint64_t> fences;
  for (int i = 0; i < 3; ++i) {
    ClaimResult r = MustClaim("k");
    ASSERT_EQ(r.outcome, ClaimOutcome::kAcquired);
    fences.push_back(r.fence);
    EXPECT_EQ(MustRelease("k", r.token), WriteResult::kOk);
  }
  ClaimResult r = MustClaim("k", kShort);
  fences.push_back(r.fence);
  env_->Sleep(kPastShort);
  ClaimResult t = MustClaim("k");
  ASSERT_EQ(t.outcome, ClaimOutcome::kAcquired);
  fences.push_back(t.fence);
  EXPECT_EQ(t.attempt, 5u);
  for (size_t i = 1; i < fences.size(); ++i) EXPECT_GT(fences[i], fences[i - 1]) << i;
}

TEST_P(StoreConformance, AttemptsCountAndExhaustedEndsTheRecord) {
  ClaimRequest req = Req("k");
  req.max_attempts = 2;
  ClaimResult a = MustClaim(req);
  ASSERT_EQ(a.outcome, ClaimOutcome::kAcquired);
  EXPECT_EQ(MustRelease("k", a.token), WriteResult::kOk);
  ClaimResult b = MustClaim(req);
  ASSERT_EQ(b.outcome, ClaimOutcome::kAcquired);
  EXPECT_EQ(b.attempt, 2u);
  EXPECT_EQ(MustRelease("k", b.token), WriteResult::kOk);
  ClaimResult c = MustClaim(req);
  EXPECT_EQ(c.outcome, ClaimOutcome::kExhausted);
  EXPECT_EQ(c.attempt, 2u);
  auto rec = MustInspect("k");
  ASSERT_TRUE(rec.has_value());
  EXPECT_EQ(rec->state, RecordState::kCompleted);
  EXPECT_EQ(rec->status, CompletionStatus::kExhausted);
  ClaimResult d = MustClaim(req);
  EXPECT_EQ(d.outcome, ClaimOutcome::kDuplicate);
  EXPECT_EQ(d.status, CompletionStatus::kExhausted);
  EXPECT_EQ(MustRelease("k", b.token), WriteResult::kLost);
}

TEST_P(StoreConformance, AttemptsSurviveCrashedOwners) {
  // Owners that die without release (a poison message crashing its worker) still
  // use up attempts: the record outlives its lease.
  ClaimRequest req = Req("k", kShort, kLong);
  req.max_attempts = 2;
  ASSERT_EQ(MustClaim(req).outcome, ClaimOutcome::kAcquired);
  env_->Sleep(kPastShort);
  ClaimResult b = MustClaim(req);
  ASSERT_EQ(b.outcome, ClaimOutcome::kAcquired);
  EXPECT_EQ(b.attempt, 2u);
  env_->Sleep(kPastShort);
  auto rec = MustInspect("k");
  ASSERT_TRUE(rec.has_value()) << "an in-progress record is kept for lease + retention";
  EXPECT_EQ(rec->state, RecordState::kInProgress);
  EXPECT_EQ(MustClaim(req).outcome, ClaimOutcome::kExhausted);
}

TEST_P(StoreConformance, UnlimitedAttemptsByDefault) {
  for (uint32_t i = 1; i <= 12; ++i) {
    ClaimResult r = MustClaim("k");
    ASSERT_EQ(r.outcome, ClaimOutcome::kAcquired);
    EXPECT_EQ(r.attempt, i);
    EXPECT_EQ(MustRelease("k", r.token), WriteResult::kOk);
  }
}

// ---- fingerprints ------------------------------------------------------------

TEST_P(StoreConformance, DifferentPayloadIsMismatchAndChangesNothing) {
  ClaimRequest a = Req("k");
  a.fingerprint = "payload-A";
  ClaimRequest b = Req("k");
  b.fingerprint = "payload-B";
  ClaimResult first = MustClaim(a);
  ASSERT_EQ(first.outcome, ClaimOutcome::kAcquired);
  auto before = MustInspect("k");
  ClaimResult m = MustClaim(b);
  EXPECT_EQ(m.outcome, ClaimOutcome::kMismatch);
  EXPECT_EQ(m.fence, first.fence);
  EXPECT_EQ(MustInspect("k"), before);
  EXPECT_EQ(MustClaim(a).outcome, ClaimOutcome::kBusy);

  EXPECT_EQ(MustComplete("k", first.token, "done"), WriteResult::kOk);
  EXPECT_EQ(MustClaim(b).outcome, ClaimOutcome::kMismatch);
  EXPECT_EQ(MustClaim(a).outcome, ClaimOutcome::kDuplicate);
  EXPECT_EQ(MustClaim(Req("k")).outcome, ClaimOutcome::kDuplicate)
      << "a claim without fingerprint is not checked";
}

// ---- retention ---------------------------------------------------------------

TEST_P(StoreConformance, CompletedRecordAnswersUntilRetentionEnds) {
  ClaimResult a = MustClaim("k");
  auto c = store_->Complete("k", a.token, kShort, CompletionStatus::kOk, "r");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(*c, WriteResult::kOk);
  EXPECT_EQ(MustClaim("k").outcome, ClaimOutcome::kDuplicate);
  env_->Sleep(kPastShort);
  EXPECT_EQ(MustInspect("k"), std::nullopt);
  ClaimResult b = MustClaim("k");
  EXPECT_EQ(b.outcome, ClaimOutcome::kAcquired);
  EXPECT_EQ(b.attempt, 1u) << "after retention the key starts a new life";
}

TEST_P(StoreConformance, ReleasedRecordIsForgottenAfterRetention) {
  ClaimResult a = MustClaim("k");
  EXPECT_EQ(MustRelease("k", a.token, kShort), WriteResult::kOk);
  env_->Sleep(kPastShort);
  EXPECT_EQ(MustInspect("k"), std::nullopt);
  EXPECT_EQ(MustClaim("k").attempt, 1u);
}

TEST_P(StoreConformance, CompletedRecordOutlivesItsLease) {
  ClaimResult a = MustClaim("k", kShort);
  EXPECT_EQ(MustComplete("k", a.token, "ok"), WriteResult::kOk);
  env_->Sleep(kPastShort);  // past the lease, well within retention
  EXPECT_EQ(MustClaim("k").outcome, ClaimOutcome::kDuplicate);
}

// ---- admin ---------------------------------------------------------------------

TEST_P(StoreConformance, ForgetRemovesRecordsWithoutARunningLease) {
  ClaimResult done = MustClaim("done");
  ASSERT_EQ(MustComplete("done", done.token, "r"), WriteResult::kOk);
  ClaimResult failed = MustClaim("failed");
  ASSERT_EQ(MustComplete("failed", failed.token, "", CompletionStatus::kFailed),
            WriteResult::kOk);
  ClaimResult released = MustClaim("released");
  ASSERT_EQ(MustRelease("released", released.token), WriteResult::kOk);
  ClaimResult crashed = MustClaim("crashed", kShort);
  env_->Sleep(kPastShort);  // its owner's lease is over: nobody is at work
  for (const char* k : {"done", "failed", "released", "crashed"}) {
    auto f = store_->Forget(k);
    ASSERT_TRUE(f.ok()) << k << ": " << f.status();
    EXPECT_TRUE(*f) << k;
    EXPECT_EQ(MustInspect(k), std::nullopt) << k;
    ClaimResult again = MustClaim(k);
    EXPECT_EQ(again.outcome, ClaimOutcome::kAcquired) << k;
    EXPECT_EQ(again.attempt, 1u) << k;
  }
  EXPECT_EQ(MustComplete("crashed", crashed.token), WriteResult::kLost);
  auto absent = store_->Forget("absent");
  ASSERT_TRUE(absent.ok()) << absent.status();
  EXPECT_FALSE(*absent);
}

TEST_P(StoreConformance, ForgetRefusesARunningLeaseAndChangesNothing) {
  const std::string key("job\x1b[2J\n7", 9);  // escaped in the message, never raw
  ClaimResult a = MustClaim(key);
  auto before = MustInspect(key);
  auto f = store_->Forget(key);
  ASSERT_FALSE(f.ok());
  EXPECT_EQ(f.status().code(), StatusCode::kFailedPrecondition) << f.status();
  const std::string m = f.status().message();
  EXPECT_NE(m.find("job\\x1b[2J\\x0a7"), std::string::npos) << m;
  EXPECT_EQ(m.find('\x1b'), std::string::npos) << m;
  EXPECT_NE(m.find("lease"), std::string::npos) << m;
  EXPECT_NE(m.find("left"), std::string::npos) << m;
  EXPECT_NE(m.find("--force"), std::string::npos) << m;
  EXPECT_EQ(MustInspect(key), before);
  EXPECT_EQ(MustClaim(key).outcome, ClaimOutcome::kBusy) << "no second run while leased";
  EXPECT_EQ(MustExtend(key, a.token), WriteResult::kOk);
  EXPECT_EQ(MustComplete(key, a.token, "fine"), WriteResult::kOk);
}

TEST_P(StoreConformance, ForcedForgetKeepsFencesIncreasing) {
  ClaimResult a = MustClaim("k");
  ForgetOptions force;
  force.force = true;
  auto f = store_->Forget("k", force);
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_TRUE(*f);
  EXPECT_EQ(MustInspect("k"), std::nullopt);
  auto listed = store_->Scan("k", 10);
  ASSERT_TRUE(listed.ok()) << listed.status();
  EXPECT_EQ(listed->size(), 0u) << "a fence floor is no record";
  // What is left keeps the fence: forgetting it again (even forced) changes nothing.
  auto again = store_->Forget("k");
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_FALSE(*again);
  auto forced_again = store_->Forget("k", force);
  ASSERT_TRUE(forced_again.ok()) << forced_again.status();
  EXPECT_FALSE(*forced_again);
  // The forgotten owner is still running: every write of its is LOST.
  EXPECT_EQ(MustExtend("k", a.token), WriteResult::kLost);
  EXPECT_EQ(MustComplete("k", a.token, "late"), WriteResult::kLost);
  EXPECT_EQ(MustRelease("k", a.token), WriteResult::kLost);
  ClaimResult b = MustClaim("k");
  ASSERT_EQ(b.outcome, ClaimOutcome::kAcquired);
  EXPECT_EQ(b.attempt, 1u) << "a forgotten key starts a new life";
  EXPECT_GT(b.fence, a.fence) << "the next owner's fence is above the forgotten one's";
  EXPECT_EQ(MustComplete("k", a.token, "late"), WriteResult::kLost);
  // Once more on the new owner: fences go on increasing.
  ASSERT_TRUE(*store_->Forget("k", force));
  ClaimResult c = MustClaim("k");
  ASSERT_EQ(c.outcome, ClaimOutcome::kAcquired);
  EXPECT_GT(c.fence, b.fence);
  EXPECT_EQ(MustComplete("k", b.token), WriteResult::kLost);
  EXPECT_EQ(MustComplete("k", c.token, "done"), WriteResult::kOk);
  EXPECT_EQ(MustClaim("k").outcome, ClaimOutcome::kDuplicate);
}

TEST_P(StoreConformance, ForcedForgetForgetsFingerprintAndAttempts) {
  ClaimRequest r = Req("k");
  r.fingerprint = "A";
  r.max_attempts = 1;
  ClaimResult a = MustClaim(r);
  ASSERT_EQ(a.outcome, ClaimOutcome::kAcquired);
  ForgetOptions force;
  force.force = true;
  ASSERT_TRUE(*store_->Forget("k", force));
  // A new payload and a fresh attempt budget: the key was forgotten.
  ClaimRequest other = Req("k");
  other.fingerprint = "B";
  other.max_attempts = 1;
  ClaimResult b = MustClaim(other);
  EXPECT_EQ(b.outcome, ClaimOutcome::kAcquired);
  EXPECT_EQ(b.attempt, 1u);
  EXPECT_GT(b.fence, a.fence);
  auto rec = MustInspect("k");
  ASSERT_TRUE(rec.has_value());
  EXPECT_EQ(rec->fingerprint, "B");
  EXPECT_EQ(rec->state, RecordState::kInProgress);
}

TEST_P(StoreConformance, ScanFindsLiveRecordsByPrefix) {
  for (std::string k : {"order:1", "order:2", "order:3", "user:1"}) {
    ASSERT_EQ(MustClaim(k).outcome, ClaimOutcome::kAcquired);
  }
  ClaimResult gone = MustClaim("order:gone");
  ASSERT_TRUE(store_->Complete("order:gone", gone.token, kShort, CompletionStatus::kOk, "").ok());
  env_->Sleep(kPastShort);
  auto s = store_->Scan("order:", 100);
  ASSERT_TRUE(s.ok()) << s.status();
  std::set<std::string> keys;
  for (const Record& r : s->records) keys.insert(r.key);
  EXPECT_EQ(keys, (std::set<std::string>{"order:1", "order:2", "order:3"}));
  EXPECT_TRUE(s->undecodable.empty()) << "records written through the API decode";
  auto limited = store_->Scan("", 2);
  ASSERT_TRUE(limited.ok());
  EXPECT_LE(limited->size(), 2u);
}

// A listing that shows no results asks for none: the same records, every one
// with its result left empty, and the results are still kept.
TEST_P(StoreConformance, ScanWithoutResultsListsTheSameRecordsWithoutThem) {
  for (std::string k : {"res:1", "res:2"}) {
    ClaimResult c = MustClaim(k);
    ASSERT_EQ(MustComplete(k, c.token, "result of " + k), WriteResult::kOk);
  }
  ASSERT_EQ(MustClaim("res:3").outcome, ClaimOutcome::kAcquired);
  auto full = store_->Scan("res:", 100);
  ASSERT_TRUE(full.ok()) << full.status();
  ScanOptions o;
  o.with_results = false;
  auto lean = store_->Scan("res:", 100, o);
  ASSERT_TRUE(lean.ok()) << lean.status();
  ASSERT_EQ(full->records.size(), 3u);
  ASSERT_EQ(lean->records.size(), 3u);
  ASSERT_EQ(full->result_bytes.size(), 3u);
  ASSERT_EQ(lean->result_bytes.size(), 3u);
  // Each record with its result's size, by key.
  auto by_key = [](const ScanResult& r) {
    std::vector<std::pair<Record, uint64_t>> v;
    for (size_t i = 0; i < r.records.size(); ++i) v.emplace_back(r.records[i], r.result_bytes[i]);
    std::sort(v.begin(), v.end(), [](const auto& a, const auto& b) { return a.first.key < b.first.key; });
    return v;
  };
  const auto fs = by_key(*full), ls = by_key(*lean);
  std::vector<Record> f, l;
  for (size_t i = 0; i < fs.size(); ++i) {
    f.push_back(fs[i].first);
    l.push_back(ls[i].first);
    EXPECT_EQ(fs[i].second, fs[i].first.result.size()) << fs[i].first.key;
    EXPECT_EQ(ls[i].second, fs[i].first.result.size()) << fs[i].first.key;
  }
  for (size_t i = 0; i < f.size(); ++i) {
    EXPECT_EQ(l[i].key, f[i].key);
    EXPECT_EQ(l[i].state, f[i].state) << f[i].key;
    EXPECT_EQ(l[i].fence, f[i].fence) << f[i].key;
    EXPECT_EQ(l[i].attempt, f[i].attempt) << f[i].key;
    EXPECT_EQ(l[i].status, f[i].status) << f[i].key;
    EXPECT_EQ(l[i].retention_deadline, f[i].retention_deadline) << f[i].key;
    EXPECT_TRUE(l[i].result.empty()) << f[i].key;
  }
  EXPECT_EQ(f[0].result, "result of res:1");
  auto again = MustInspect("res:1");
  ASSERT_TRUE(again.has_value());
  EXPECT_EQ(again->result, "result of res:1");
}

TEST_P(StoreConformance, KeysAreArbitraryBytes) {
  const std::vector<std::string> keys = {
      std::string("a\0b", 3), std::string("a\0c", 3), "*", "?", "[x]", "{tag}", "a b\r\n",
      "\xff\xfe", "naïve", std::string(kMaxKeyBytes, 'k')};
  for (const auto& k : keys) {
    ClaimResult r = MustClaim(k);
    ASSERT_EQ(r.outcome, ClaimOutcome::kAcquired) << "key of " << k.size() << " bytes";
    EXPECT_EQ(MustComplete(k, r.token, k), WriteResult::kOk);
  }
  for (const auto& k : keys) {
    ClaimResult d = MustClaim(k);
    EXPECT_EQ(d.outcome, ClaimOutcome::kDuplicate);
    EXPECT_EQ(d.result, k) << "each key keeps its own record";
  }
}

// ---- bad input ---------------------------------------------------------------

TEST_P(StoreConformance, BadInputIsRejectedAndChangesNothing) {
  ClaimResult a = MustClaim("k");
  auto before = MustInspect("k");
  auto expect_invalid = [&](const Status& s, std::string_view words) {
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s;
    EXPECT_NE(s.message().find(words), std::string::npos) << s;
    EXPECT_EQ(MustInspect("k"), before);
  };
  expect_invalid(store_->Claim(Req("")).status(), "empty");
  expect_invalid(store_->Claim(Req(std::string(kMaxKeyBytes + 1, 'x'))).status(), "1024");
  expect_invalid(store_->Claim(Req("k", Millis(0))).status(), "lease");
  expect_invalid(store_->Claim(Req("k", Millis(-5))).status(), "lease");
  expect_invalid(store_->Claim(Req("k", kLong, Millis(0))).status(), "retention");
  ClaimRequest fp = Req("k");
  std::string long_fp(kMaxFingerprintBytes + 1, 'f');
  fp.fingerprint = long_fp;
  expect_invalid(store_->Claim(fp).status(), "fingerprint");
  expect_invalid(store_->Extend("k", a.token, Millis(0)).status(), "lease");
  expect_invalid(store_->Extend("k", Token{0}, kLong).status(), "token");
  expect_invalid(store_->Extend("", a.token, kLong).status(), "empty");
  expect_invalid(
      store_->Complete("k", a.token, kLong, CompletionStatus::kOk, std::string(kMaxResultBytes + 1, 'r'))
          .status(),
      "result");
  expect_invalid(store_->Complete("k", a.token, Millis(-1), CompletionStatus::kOk, "").status(),
                 "retention");
  expect_invalid(store_->Release("k", a.token, Millis(0)).status(), "retention");
  // A status cast from outside the enum: RocksDB wrote it, then could not decode
  // the record (DataLoss on every claim of the key until forgotten); the memory
  // store kept it as "unknown".
  expect_invalid(store_->Complete("k", a.token, kLong, static_cast<CompletionStatus>(7), "x").status(),
                 "completion status 7");
  expect_invalid(store_->Inspect("").status(), "empty");
  expect_invalid(store_->Forget(std::string(kMaxKeyBytes + 1, 'x')).status(), "1024");
  // Nothing was lost: the owner still completes.
  EXPECT_EQ(MustComplete("k", a.token, "fine"), WriteResult::kOk);
}

// ---- batch -------------------------------------------------------------------

TEST_P(StoreConformance, BatchClaimAnswersAsSingleClaims) {
  ClaimResult busy = MustClaim("busy");
  ClaimResult done = MustClaim("done");
  ASSERT_EQ(MustComplete("done", done.token, "cached"), WriteResult::kOk);
  ClaimRequest fp = Req("fp");
  fp.fingerprint = "A";
  ASSERT_EQ(MustClaim(fp).outcome, ClaimOutcome::kAcquired);
  ClaimRequest fp_other = Req("fp");
  fp_other.fingerprint = "B";

  std::vector<ClaimRequest> reqs = {Req("new"), Req("busy"), Req("done"), Req("new"), fp_other};
  auto res = store_->ClaimBatch(reqs);
  ASSERT_TRUE(res.ok()) << res.status();
  ASSERT_EQ(res->size(), reqs.size());
  EXPECT_EQ((*res)[0].outcome, ClaimOutcome::kAcquired);
  EXPECT_EQ((*res)[1].outcome, ClaimOutcome::kBusy);
  EXPECT_EQ((*res)[1].fence, busy.fence);
  EXPECT_EQ((*res)[2].outcome, ClaimOutcome::kDuplicate);
  EXPECT_EQ((*res)[2].result, "cached");
  EXPECT_EQ((*res)[3].outcome, ClaimOutcome::kBusy) << "a key repeated in a batch";
  EXPECT_EQ((*res)[4].outcome, ClaimOutcome::kMismatch);
  EXPECT_EQ(MustComplete("new", (*res)[0].token), WriteResult::kOk);

  auto empty = store_->ClaimBatch({});
  ASSERT_TRUE(empty.ok());
  EXPECT_TRUE(empty->empty());
}

TEST_P(StoreConformance, BatchWithOneBadRequestWritesNothing) {
  std::vector<ClaimRequest> reqs = {Req("b1"), Req(""), Req("b3")};
  auto res = store_->ClaimBatch(reqs);
  EXPECT_EQ(res.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(res.status().message().find("batch request 1"), std::string::npos) << res.status();
  EXPECT_EQ(MustInspect("b1"), std::nullopt);
  EXPECT_EQ(MustInspect("b3"), std::nullopt);
}

TEST_P(StoreConformance, LargeBatch) {
  std::vector<std::string> keys;
  for (int i = 0; i < 500; ++i) keys.push_back("bulk:" + std::to_string(i));
  std::vector<ClaimRequest> reqs;
  for (const auto& k : keys) reqs.push_back(Req(k));
  auto first = store_->ClaimBatch(reqs);
  ASSERT_TRUE(first.ok()) << first.status();
  for (const auto& r : *first) EXPECT_EQ(r.outcome, ClaimOutcome::kAcquired);
  auto second = store_->ClaimBatch(reqs);
  ASSERT_TRUE(second.ok()) << second.status();
  for (const auto& r : *second) EXPECT_EQ(r.outcome, ClaimOutcome::kBusy);
}

CompleteRequest Completion(std::string_view key, Token t, std::string_view result = {},
                           CompletionStatus st = CompletionStatus::kOk) {
  CompleteRequest q;
  q.key = key;
  q.token = t;
  q.retention = kLong;
  q.status = st;
  q.result = result;
  return q;
}

TEST_P(StoreConformance, BatchCompleteAnswersAsSingleCompletes) {
  const ClaimResult ok = MustClaim("c:ok");
  const ClaimResult failed = MustClaim("c:failed");
  const ClaimResult done = MustClaim("c:done");
  ASSERT_EQ(MustComplete("c:done", done.token, "first"), WriteResult::kOk);
  const ClaimResult other = MustClaim("c:other");
  const ClaimResult stale = MustClaim("c:stale", kShort);
  env_->Sleep(kPastShort);
  const ClaimResult taken = MustClaim("c:stale");
  ASSERT_EQ(taken.outcome, ClaimOutcome::kAcquired);
  // An ack no store can fuse: ignored, the completion made as without it.
  const BrokerAck foreign{"no-such-broker", "nowhere", "t", "g", "1-1"};
  const std::string with_nul("r\0k", 3);  // outlives the requests that view it
  std::vector<CompleteRequest> reqs = {
      Completion("c:ok", ok.token, with_nul),
      Completion("c:failed", failed.token, "why", CompletionStatus::kFailed),
      Completion("c:done", done.token, "second"),       // already completed: LOST
      Completion("c:absent", ok.token),                 // no record: LOST
      Completion("c:other", ok.token),                  // someone else's token: LOST
      Completion("c:stale", stale.token, "late"),       // taken over: LOST
      Completion("c:ok", ok.token, "again"),            // repeated: LOST the second time
  };
  reqs[1].ack = &foreign;
  auto res = store_->CompleteBatch(reqs);
  ASSERT_TRUE(res.ok()) << res.status();
  ASSERT_EQ(res->size(), reqs.size());
  const WriteResult want[] = {WriteResult::kOk,   WriteResult::kOk,   WriteResult::kLost,
                              WriteResult::kLost, WriteResult::kLost, WriteResult::kLost,
                              WriteResult::kLost};
  for (size_t i = 0; i < reqs.size(); ++i) {
    EXPECT_EQ((*res)[i].write, want[i]) << "request " << i;
    EXPECT_FALSE((*res)[i].acked) << "request " << i;
  }
  ClaimResult d = MustClaim("c:ok");
  EXPECT_EQ(d.outcome, ClaimOutcome::kDuplicate);
  EXPECT_EQ(d.result, std::string("r\0k", 3));
  d = MustClaim("c:failed");
  EXPECT_EQ(d.outcome, ClaimOutcome::kDuplicate);
  EXPECT_EQ(d.status, CompletionStatus::kFailed);
  EXPECT_EQ(d.result, "why");
  EXPECT_EQ(MustClaim("c:done").result, "first");
  EXPECT_EQ(MustInspect("c:absent"), std::nullopt);
  EXPECT_EQ(MustInspect("c:other")->state, RecordState::kInProgress);
  // The stale owner changed nothing; the new owner still completes.
  EXPECT_EQ(MustInspect("c:stale")->token, taken.token);
  EXPECT_EQ(MustComplete("c:stale", taken.token), WriteResult::kOk);
  EXPECT_EQ(MustComplete("c:other", other.token), WriteResult::kOk);

  auto empty = store_->CompleteBatch({});
  ASSERT_TRUE(empty.ok()) << empty.status();
  EXPECT_TRUE(empty->empty());
}

TEST_P(StoreConformance, BatchCompleteWithOneBadRequestWritesNothing) {
  const ClaimResult a = MustClaim("cb:a");
  const ClaimResult b = MustClaim("cb:b");
  std::vector<CompleteRequest> reqs = {Completion("cb:a", a.token), Completion("cb:b", Token{}),
                                       Completion("cb:b", b.token)};
  auto res = store_->CompleteBatch(reqs);
  EXPECT_EQ(res.status().code(), StatusCode::kInvalidArgument) << res.status();
  EXPECT_NE(res.status().message().find("batch request 1"), std::string::npos) << res.status();
  const std::string too_long(kMaxResultBytes + 1, 'x');  // outlives the request
  reqs[1] = Completion("cb:b", b.token, too_long);
  res = store_->CompleteBatch(reqs);
  EXPECT_EQ(res.status().code(), StatusCode::kInvalidArgument) << res.status();
  reqs[1] = Completion("cb:b", b.token);
  reqs[1].status = static_cast<CompletionStatus>(9);
  res = store_->CompleteBatch(reqs);
  EXPECT_EQ(res.status().code(), StatusCode::kInvalidArgument) << res.status();
  EXPECT_NE(res.status().message().find("batch request 1: completion status 9"), std::string::npos)
      << res.status();
  EXPECT_EQ(MustInspect("cb:a")->state, RecordState::kInProgress);
  EXPECT_EQ(MustInspect("cb:b")->state, RecordState::kInProgress);
  EXPECT_EQ(MustComplete("cb:a", a.token), WriteResult::kOk);
  EXPECT_EQ(MustComplete("cb:b", b.token), WriteResult::kOk);
}

TEST_P(StoreConformance, LargeBatchComplete) {
  std::vector<std::string> keys;
  for (int i = 0; i < 300; ++i) keys.push_back("cbulk:" + std::to_string(i));
  std::vector<ClaimRequest> claims;
  for (const auto& k : keys) claims.push_back(Req(k));
  auto claimed = store_->ClaimBatch(claims);
  ASSERT_TRUE(claimed.ok()) << claimed.status();
  std::vector<CompleteRequest> reqs;
  for (size_t i = 0; i < keys.size(); ++i) {
    reqs.push_back(Completion(keys[i], (*claimed)[i].token, keys[i]));
  }
  auto res = store_->CompleteBatch(reqs);
  ASSERT_TRUE(res.ok()) << res.status();
  for (const AckedWrite& w : *res) EXPECT_EQ(w.write, WriteResult::kOk);
  auto again = store_->ClaimBatch(claims);
  ASSERT_TRUE(again.ok()) << again.status();
  for (size_t i = 0; i < keys.size(); ++i) {
    EXPECT_EQ((*again)[i].outcome, ClaimOutcome::kDuplicate);
    EXPECT_EQ((*again)[i].result, keys[i]);
  }
}

// ---- concurrency -------------------------------------------------------------

TEST_P(StoreConformance, ConcurrentClaimsNeverGiveTwoOwners) {
  constexpr int kThreads = 8;
  constexpr int kKeys = 150;
  std::mutex mu;
  std::map<std::string, int> acquired;
  std::atomic<int> errors{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < kKeys; ++i) {
        // Threads walk the keys from different starting points so they overlap.
        std::string key = "c:" + std::to_string((i + t * 37) % kKeys);
        auto r = store_->Claim(Req(key));
        if (!r.ok()) {
          ++errors;
          continue;
        }
        if (r->outcome == ClaimOutcome::kAcquired) {
          {
            std::lock_guard lock(mu);
            ++acquired[key];
          }
          if (t % 2 == 0) {
            auto c = store_->Complete(key, r->token, kLong, CompletionStatus::kOk, "");
            if (!c.ok() || *c != WriteResult::kOk) ++errors;
          }
        } else if (r->outcome != ClaimOutcome::kBusy &&
                   r->outcome != ClaimOutcome::kDuplicate) {
          ++errors;
        }
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(errors.load(), 0);
  EXPECT_EQ(acquired.size(), static_cast<size_t>(kKeys));
  for (const auto& [k, n] : acquired) EXPECT_EQ(n, 1) << k << " had " << n << " owners";
}

TEST_P(StoreConformance, ConcurrentTakeoversKeepFencesUnique) {
  // Claims with leases that keep running out: every ACQUIRED of one key must carry
  // a fence never seen before for that key.
  constexpr int kThreads = 6;
  std::mutex mu;
  std::map<std::string, std::set<uint64_t>> fences;
  std::atomic<int> dup_fences{0}, errors{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < 60; ++i) {
        std::string key = "t:" + std::to_string(i % 5);
        auto r = store_->Claim(Req(key));
        if (!r.ok()) {
          ++errors;
          continue;
        }
        if (r->outcome != ClaimOutcome::kAcquired) continue;
        {
          std::lock_guard lock(mu);
          if (!fences[key].insert(r->fence).second) ++dup_fences;
        }
        auto rel = store_->Release(key, r->token, kLong);
        if (!rel.ok() || *rel != WriteResult::kOk) ++errors;
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(errors.load(), 0);
  EXPECT_EQ(dup_fences.load(), 0);
}

INSTANTIATE_TEST_SUITE_P(Stores, StoreConformance, ::testing::ValuesIn(AvailableStoreNames()),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace dedup
