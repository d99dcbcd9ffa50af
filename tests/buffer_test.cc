// Copyright dedup authors. Licensed under the Apache License 2.0.
//
// The Buffer and its claim guard: the worker table of SPEC.md, heartbeats, release
// on failure, fail-closed on store errors.

#include "dedup/buffer.h"

#include <gtest/gtest.h>

#include <atomic>
#include <thread>
#include <variant>
#include <vector>

#include "core/printable.h"
#include "corrupt_store.h"
#include "dedup/memory_store.h"
#ifdef DEDUP_WITH_REDIS_STREAMS
#include "dedup/worker.h"
#endif

namespace dedup {
namespace {

using namespace std::chrono_literals;

// Fails chosen operations with UNAVAILABLE: the store is "down".
class FlakyStore : public StoreWrapper {
 public:
  using StoreWrapper::StoreWrapper;
  std::atomic<int> fail_claims{0}, fail_completes{0}, fail_extends{0};
  std::atomic<int> completes{0};

  StatusOr<ClaimResult> Claim(const ClaimRequest& req) override {
    if (fail_claims > 0) {
      --fail_claims;
      return Status::Unavailable("flaky: claim");
    }
    return StoreWrapper::Claim(req);
  }
  StatusOr<WriteResult> Extend(std::string_view key, Token token, Millis lease) override {
    if (fail_extends > 0) {
      --fail_extends;
      return Status::Unavailable("flaky: extend");
    }
    return StoreWrapper::Extend(key, token, lease);
  }
  StatusOr<WriteResult> Complete(std::string_view key, Token token, Millis retention,
                                 CompletionStatus status, std::string_view result) override {
    ++completes;
    if (fail_completes > 0) {
      --fail_completes;
      return Status::Unavailable("flaky: complete");
    }
    return StoreWrapper::Complete(key, token, retention, status, result);
  }
  std::atomic<int> fail_complete_batches{0}, complete_batches{0};
  StatusOr<std::vector<AckedWrite>> CompleteBatch(
      std::span<const CompleteRequest> reqs) override {
    ++complete_batches;
    if (fail_complete_batches > 0) {
      --fail_complete_batches;
      return Status::Unavailable("flaky: complete batch");
    }
    return StoreWrapper::CompleteBatch(reqs);
  }
};

class BufferTest : public ::testing::Test {
 protected:
  BufferTest() {
    MemoryStoreOptions o;
    o.clock = &clock_;
    store_ = NewMemoryStore(o);
  }
  SimulatedClock clock_;
  std::unique_ptr<Store> store_;
};

TEST_F(BufferTest, RunsOnceAndAcksDuplicatesWithTheResult) {
  Buffer buffer(store_.get());
  int runs = 0;
  auto handler = [&](ClaimGuard& g) {
    ++runs;
    EXPECT_EQ(g.attempt(), 1u);
    EXPECT_GE(g.fence(), 1u);
    return HandlerResult::Done("receipt-1");
  };
  Processed p = buffer.ProcessOnce("pay:1", "{}", handler);
  EXPECT_TRUE(p.status.ok());
  EXPECT_TRUE(p.ran);
  EXPECT_EQ(p.action, BrokerAction::kAck);
  Processed again = buffer.ProcessOnce("pay:1", "{}", handler);
  EXPECT_FALSE(again.ran);
  EXPECT_EQ(again.action, BrokerAction::kAck);
  EXPECT_EQ(again.claim.outcome, ClaimOutcome::kDuplicate);
  EXPECT_EQ(again.result, "receipt-1");
  EXPECT_EQ(runs, 1);
}

TEST_F(BufferTest, ThrowingHandlerReleasesForRetry) {
  Buffer buffer(store_.get());
  Processed p = buffer.ProcessOnce("k", "", [](ClaimGuard&) -> HandlerResult {
    throw std::runtime_error("db timeout");
  });
  EXPECT_TRUE(p.ran);
  EXPECT_EQ(p.action, BrokerAction::kRetry);
  EXPECT_NE(p.reason.find("db timeout"), std::string::npos);
  auto rec = store_->Inspect("k");
  ASSERT_TRUE(rec.ok() && rec->has_value());
  EXPECT_EQ((*rec)->state, RecordState::kReleased);
  Processed second = buffer.ProcessOnce("k", "", [](ClaimGuard& g) {
    EXPECT_EQ(g.attempt(), 2u);
    return HandlerResult::Done();
  });
  EXPECT_TRUE(second.ran);
  EXPECT_EQ(second.action, BrokerAction::kAck);
}

TEST_F(BufferTest, RetryAndPermanentFailure) {
  Buffer buffer(store_.get());
  Processed r = buffer.ProcessOnce("a", "", [](ClaimGuard&) { return HandlerResult::Retry("later"); });
  EXPECT_EQ(r.action, BrokerAction::kRetry);
  EXPECT_EQ(r.retry_after, buffer.options().retry_delay);
  Processed f = buffer.ProcessOnce("b", "", [](ClaimGuard&) { return HandlerResult::Fail("bad card"); });
  EXPECT_EQ(f.action, BrokerAction::kDeadLetter);
  EXPECT_EQ(f.reason, "bad card");
  Processed again = buffer.ProcessOnce("b", "", [](ClaimGuard&) {
    ADD_FAILURE() << "must not run";
    return HandlerResult::Done();
  });
  // Dead-lettered again: the first worker may have died before its dead-letter.
  EXPECT_EQ(again.action, BrokerAction::kDeadLetter);
  EXPECT_EQ(again.reason, "completed earlier as failed");
  EXPECT_EQ(again.claim.status, CompletionStatus::kFailed);
}

// A Fail reason cut to fit a record is cut between characters: a cut inside
// one left bytes that are not UTF-8 in the record and in the dead letter's
// reason (a reader decoding it as text fails on it).
TEST_F(BufferTest, AReasonCutToFitARecordSplitsNoCharacter) {
  Buffer buffer(store_.get());
  std::string reason = "x";  // then 2-byte characters: the cut lands inside one
  while (reason.size() <= kMaxResultBytes + 1000) reason += "\xc3\xbc";
  Processed p = buffer.ProcessOnce("cut", "", [&](ClaimGuard&) {
    return HandlerResult::Fail(reason);
  });
  EXPECT_EQ(p.action, BrokerAction::kDeadLetter);
  EXPECT_TRUE(internal::IsValidUtf8(p.reason)) << p.reason.substr(p.reason.size() - 80);
  auto rec = store_->Inspect("cut");
  ASSERT_TRUE(rec.ok() && rec->has_value());
  EXPECT_LE((*rec)->result.size(), kMaxResultBytes);
  EXPECT_TRUE(internal::IsValidUtf8((*rec)->result));
  EXPECT_EQ((*rec)->result.substr(0, 1001), reason.substr(0, 1001));
  EXPECT_NE((*rec)->result.find(std::to_string(reason.size()) + " bytes in all"), std::string::npos);
}

// An outcome no record can hold (a result over kMaxResultBytes) would fail the
// same way on every delivery: releasing the claim for a retry runs the handler,
// side effect and all, again and again. It is a permanent failure instead,
// recorded with a reason that names the size, and dead-lettered; a Fail reason
// that long is recorded cut to fit. (PostgresStore::RunInTransaction does the
// same for the inbox.) Also through CompleteBatch, the Consumer's completer.
TEST_F(BufferTest, AnOutcomeTooLargeForARecordIsDeadLetteredNotRetried) {
  Buffer buffer(store_.get());
  int runs = 0;
  const std::string big(kMaxResultBytes + 1, 'x');
  auto too_big = [&](ClaimGuard&) {
    ++runs;
    return HandlerResult::Done(big);
  };
  Processed p = buffer.ProcessOnce("big", "", too_big);
  EXPECT_TRUE(p.ran);
  EXPECT_EQ(p.action, BrokerAction::kDeadLetter) << p.reason;
  EXPECT_NE(p.reason.find(std::to_string(kMaxResultBytes + 1)), std::string::npos) << p.reason;
  auto rec = store_->Inspect("big");
  ASSERT_TRUE(rec.ok() && rec->has_value());
  EXPECT_EQ((*rec)->state, RecordState::kCompleted);
  EXPECT_EQ((*rec)->status, CompletionStatus::kFailed);
  Processed again = buffer.ProcessOnce("big", "", too_big);
  EXPECT_FALSE(again.ran);
  EXPECT_EQ(again.action, BrokerAction::kDeadLetter);
  EXPECT_EQ(runs, 1) << "the handler ran again";

  Processed f = buffer.ProcessOnce("long-reason", "", [&](ClaimGuard&) {
    return HandlerResult::Fail(big);
  });
  EXPECT_EQ(f.action, BrokerAction::kDeadLetter) << f.reason.substr(0, 200);
  rec = store_->Inspect("long-reason");
  ASSERT_TRUE(rec.ok() && rec->has_value());
  EXPECT_EQ((*rec)->status, CompletionStatus::kFailed);
  EXPECT_LE((*rec)->result.size(), kMaxResultBytes);
  EXPECT_EQ((*rec)->result.substr(0, 100), big.substr(0, 100));

  // Batched with a good one: each gets its own answer.
  std::vector<PendingOutcome> pending;
  for (const char* k : {"batch-big", "batch-ok"}) {
    auto r = buffer.ProcessOnceDeferred(k, "", [&](ClaimGuard& g) {
      return g.key() == "batch-big" ? HandlerResult::Done(big) : HandlerResult::Done("fine");
    });
    ASSERT_TRUE(std::holds_alternative<PendingOutcome>(r));
    pending.push_back(std::move(std::get<PendingOutcome>(r)));
  }
  std::vector<Processed> ps = buffer.CompleteBatch(pending);
  ASSERT_EQ(ps.size(), 2u);
  EXPECT_EQ(ps[0].action, BrokerAction::kDeadLetter) << ps[0].reason;
  EXPECT_EQ(ps[1].action, BrokerAction::kAck);
  rec = store_->Inspect("batch-big");
  ASSERT_TRUE(rec.ok() && rec->has_value());
  EXPECT_EQ((*rec)->status, CompletionStatus::kFailed);
}

TEST_F(BufferTest, BusyIsNeverAcked) {
  Buffer buffer(store_.get());
  auto held = buffer.Claim("k");
  ASSERT_TRUE(held.ok());
  ASSERT_TRUE(held->acquired());
  Processed p = buffer.ProcessOnce("k", "", [](ClaimGuard&) {
    ADD_FAILURE() << "must not run while another owner holds the lease";
    return HandlerResult::Done();
  });
  EXPECT_FALSE(p.ran);
  EXPECT_EQ(p.claim.outcome, ClaimOutcome::kBusy);
  EXPECT_EQ(p.action, BrokerAction::kRetry);
  EXPECT_GT(p.retry_after, 0ms);
  EXPECT_LE(p.retry_after, buffer.options().lease);
  EXPECT_EQ(*held->Complete(), WriteResult::kOk);
}

TEST_F(BufferTest, MismatchAndExhaustedAreDeadLettered) {
  BufferOptions o;
  o.fingerprint_payloads = true;
  o.max_attempts = 1;
  Buffer buffer(store_.get(), o);
  EXPECT_EQ(buffer.ProcessOnce("m", "amount=10", [](ClaimGuard&) { return HandlerResult::Done(); })
                .action,
            BrokerAction::kAck);
  Processed m = buffer.ProcessOnce("m", "amount=99", [](ClaimGuard&) { return HandlerResult::Done(); });
  EXPECT_EQ(m.claim.outcome, ClaimOutcome::kMismatch);
  EXPECT_EQ(m.action, BrokerAction::kDeadLetter);

  EXPECT_EQ(buffer.ProcessOnce("x", "", [](ClaimGuard&) { return HandlerResult::Retry("t"); }).action,
            BrokerAction::kRetry);
  Processed e = buffer.ProcessOnce("x", "", [](ClaimGuard&) { return HandlerResult::Done(); });
  EXPECT_EQ(e.claim.outcome, ClaimOutcome::kExhausted);
  EXPECT_EQ(e.action, BrokerAction::kDeadLetter);
  EXPECT_FALSE(e.ran);
}

// A release records no reason in the store, so an EXHAUSTED dead letter said only
// "attempts exhausted after N": the operator had to find the failures in the
// log. The Buffer that ran the last attempt remembers why it was given up.
TEST_F(BufferTest, AnExhaustedDeadLetterSaysWhyTheLastAttemptFailed) {
  BufferOptions o;
  o.max_attempts = 2;
  Buffer buffer(store_.get(), o);
  int runs = 0;
  const auto failing = [&runs](ClaimGuard&) {
    return HandlerResult::Retry("card declined (run " + std::to_string(++runs) + ")");
  };
  EXPECT_EQ(buffer.ProcessOnce("pay-1", "", failing).action, BrokerAction::kRetry);
  EXPECT_EQ(buffer.ProcessOnce("pay-1", "", failing).action, BrokerAction::kRetry);
  Processed e = buffer.ProcessOnce("pay-1", "", failing);
  EXPECT_EQ(e.claim.outcome, ClaimOutcome::kExhausted);
  EXPECT_EQ(e.action, BrokerAction::kDeadLetter);
  EXPECT_EQ(e.reason, "attempts exhausted after 2; the last failure: card declined (run 2)");
  EXPECT_EQ(runs, 2);

  // Another worker (Buffer) that ran none of the attempts says so.
  ASSERT_TRUE(buffer.ProcessOnce("pay-2", "", failing).action == BrokerAction::kRetry);
  ASSERT_TRUE(buffer.ProcessOnce("pay-2", "", failing).action == BrokerAction::kRetry);
  Buffer other(store_.get(), o);
  Processed elsewhere = other.ProcessOnce("pay-2", "", failing);
  EXPECT_EQ(elsewhere.claim.outcome, ClaimOutcome::kExhausted);
  EXPECT_NE(elsewhere.reason.find("attempts exhausted after 2 (no failure of its last attempt was seen here"),
            std::string::npos)
      << elsewhere.reason;

  // A key that failed, then succeeded, leaves nothing behind: forgotten at its
  // outcome, so a later EXHAUSTED of it (after its retention) shows no stale reason.
  bool fail = true;
  const auto once = [&fail](ClaimGuard&) {
    if (fail) {
      fail = false;
      return HandlerResult::Retry("transient");
    }
    return HandlerResult::Done();
  };
  EXPECT_EQ(buffer.ProcessOnce("pay-3", "", once).action, BrokerAction::kRetry);
  EXPECT_EQ(buffer.ProcessOnce("pay-3", "", once).action, BrokerAction::kAck);
  ASSERT_TRUE(store_->Forget("pay-3").ok());
  ClaimRequest r;
  r.key = "pay-3";
  auto held = store_->Claim(r);  // attempt 1 elsewhere ...
  ASSERT_TRUE(held.ok());
  ASSERT_TRUE(store_->Release("pay-3", held->token, 1min).ok());
  auto again = store_->Claim(r);  // ... and 2, both given up there
  ASSERT_TRUE(again.ok());
  ASSERT_TRUE(store_->Release("pay-3", again->token, 1min).ok());
  Processed late = buffer.ProcessOnce("pay-3", "", once);
  EXPECT_EQ(late.claim.outcome, ClaimOutcome::kExhausted);
  EXPECT_EQ(late.reason.find("transient"), std::string::npos) << late.reason;

  // Attempt 1 failed here, attempt 2 (the last) elsewhere: this Buffer's reason
  // is not the last one's, and is not given as such.
  EXPECT_EQ(buffer.ProcessOnce("pay-4", "", failing).action, BrokerAction::kRetry);
  r.key = "pay-4";
  auto second = store_->Claim(r);
  ASSERT_TRUE(second.ok());
  ASSERT_EQ(second->attempt, 2u);
  ASSERT_TRUE(store_->Release("pay-4", second->token, 1min).ok());
  Processed blamed = buffer.ProcessOnce("pay-4", "", failing);
  EXPECT_EQ(blamed.claim.outcome, ClaimOutcome::kExhausted);
  EXPECT_NE(blamed.reason.find("no failure of its last attempt was seen here"), std::string::npos)
      << blamed.reason;

  // A long reason is kept cut at a character, not inside one.
  const std::string long_reason = std::string(511, 'x') + "\u00e9\u00e9";  // é: 2 bytes, the first across 512
  EXPECT_EQ(buffer.ProcessOnce("pay-5", "", [&](ClaimGuard&) {
                  return HandlerResult::Retry(long_reason);
                }).action,
            BrokerAction::kRetry);
  EXPECT_EQ(buffer.ProcessOnce("pay-5", "", [&](ClaimGuard&) {
                  return HandlerResult::Retry(long_reason);
                }).action,
            BrokerAction::kRetry);
  Processed cut = buffer.ProcessOnce("pay-5", "", failing);
  EXPECT_NE(cut.reason.find(std::string(511, 'x') + "... [cut: "), std::string::npos) << cut.reason;
  EXPECT_TRUE(internal::IsValidUtf8(cut.reason));
}

// A Buffer constructed of bad options answered every message "retry" for ever
// (its claims were refused as InvalidArgument); the constructor now stops the
// process with what Buffer::Create returns as a status.
TEST(BufferDeathTest, TheConstructorRefusesBadOptionsAsCreateDoes) {
  auto store = NewMemoryStore();
  BufferOptions zero;
  zero.lease = 0ms;
  EXPECT_FALSE(Buffer::Create(store.get(), zero).ok());
  EXPECT_DEATH(Buffer(store.get(), zero), "Buffer constructed with INVALID_ARGUMENT: .*lease");
  EXPECT_DEATH(Buffer(nullptr), "no store given");
}

TEST_F(BufferTest, StoreDownFailsClosed) {
  FlakyStore flaky(store_.get());
  flaky.fail_claims = 1;
  Buffer buffer(&flaky);
  Processed p = buffer.ProcessOnce("k", "", [](ClaimGuard&) {
    ADD_FAILURE() << "no handler runs without a claim";
    return HandlerResult::Done();
  });
  EXPECT_FALSE(p.ran);
  EXPECT_EQ(p.status.code(), StatusCode::kUnavailable);
  EXPECT_EQ(p.action, BrokerAction::kRetry);
}

TEST_F(BufferTest, CompleteIsRetriedWhileTheStoreBlinks) {
  FlakyStore flaky(store_.get());
  flaky.fail_completes = 2;
  Buffer buffer(&flaky);
  Processed p = buffer.ProcessOnce("k", "", [](ClaimGuard&) { return HandlerResult::Done("r"); });
  EXPECT_EQ(p.action, BrokerAction::kAck);
  EXPECT_EQ(flaky.completes.load(), 3);
}

TEST_F(BufferTest, CompleteThatNeverLandsIsNotAcked) {
  FlakyStore flaky(store_.get());
  flaky.fail_completes = 100;
  BufferOptions o;
  o.complete_tries = 2;
  Buffer buffer(&flaky, o);
  Processed p = buffer.ProcessOnce("k", "", [](ClaimGuard&) { return HandlerResult::Done("r"); });
  EXPECT_TRUE(p.ran);
  EXPECT_EQ(p.action, BrokerAction::kRetry);
  EXPECT_EQ(p.status.code(), StatusCode::kUnavailable);
}

// ---- records no one can read (issue 13, item 5) -----------------------------

using testing::CorruptRecordStore;

HandlerResult MustNotRun(ClaimGuard& g) {
  ADD_FAILURE() << "the handler ran for '" << g.key() << "' without a readable record";
  return HandlerResult::Done();
}

TEST_F(BufferTest, CorruptRecordIsRetriedThenDeadLetteredWithTheReason) {
  CorruptRecordStore store(store_.get());
  store.Corrupt("bad");
  BufferOptions o;
  o.corrupt_record_tries = 3;
  o.retry_delay = 250ms;
  Buffer buffer(&store, o);
  for (int i = 1; i <= 2; ++i) {
    Processed p = buffer.ProcessOnce("bad", "", MustNotRun);
    EXPECT_FALSE(p.ran);
    EXPECT_EQ(p.status.code(), StatusCode::kDataLoss);
    EXPECT_EQ(p.action, BrokerAction::kRetry) << "try " << i;
    EXPECT_EQ(p.retry_after, 250ms);
    EXPECT_NE(p.reason.find("corrupt record (try " + std::to_string(i) + " of 3)"),
              std::string::npos) << p.reason;
  }
  Processed p = buffer.ProcessOnce("bad", "", MustNotRun);
  EXPECT_EQ(p.action, BrokerAction::kDeadLetter);
  EXPECT_NE(p.reason.find("cannot be decoded"), std::string::npos) << "the store's reason: " << p.reason;
  EXPECT_NE(p.reason.find("unreadable on 3 tries"), std::string::npos) << p.reason;
  EXPECT_EQ(store.claims("bad"), 3);
  // Other keys are not disturbed; a redelivery of the dead-lettered message
  // (its dead-letter write failed) starts a new count.
  EXPECT_EQ(buffer.ProcessOnce("good", "", [](ClaimGuard&) { return HandlerResult::Done(); }).action,
            BrokerAction::kAck);
  EXPECT_EQ(buffer.ProcessOnce("bad", "", MustNotRun).action, BrokerAction::kRetry);
}

TEST_F(BufferTest, CorruptRecordCountStartsAgainOnceTheKeyIsReadable) {
  CorruptRecordStore store(store_.get());
  BufferOptions o;
  o.corrupt_record_tries = 2;
  Buffer buffer(&store, o);
  store.Corrupt("k");
  EXPECT_EQ(buffer.ProcessOnce("k", "", MustNotRun).action, BrokerAction::kRetry);
  store.Mend("k");  // e.g. an operator forgot the record
  EXPECT_EQ(buffer.ProcessOnce("k", "", [](ClaimGuard&) { return HandlerResult::Retry("later"); })
                .action,
            BrokerAction::kRetry);
  store.Corrupt("k");
  EXPECT_EQ(buffer.ProcessOnce("k", "", MustNotRun).action, BrokerAction::kRetry)
      << "one DataLoss since the key was last answered is not two";
  EXPECT_EQ(buffer.ProcessOnce("k", "", MustNotRun).action, BrokerAction::kDeadLetter);
}

TEST_F(BufferTest, TransientStoreErrorsRetryForeverAndNeverDeadLetter) {
  CorruptRecordStore store(store_.get());
  BufferOptions o;
  o.corrupt_record_tries = 1;  // the strictest bound: still never for these
  Buffer buffer(&store, o);
  store.FailNext("slow", 50, StatusCode::kDeadlineExceeded);
  store.FailNext("down", 50, StatusCode::kUnavailable);
  for (int i = 0; i < 50; ++i) {
    for (const char* key : {"slow", "down"}) {
      Processed p = buffer.ProcessOnce(key, "", MustNotRun);
      ASSERT_EQ(p.action, BrokerAction::kRetry) << key << " try " << i << ": " << p.reason;
      EXPECT_EQ(p.reason.find("corrupt"), std::string::npos) << p.reason;
    }
  }
  EXPECT_EQ(buffer.ProcessOnce("down", "", [](ClaimGuard&) { return HandlerResult::Done(); }).action,
            BrokerAction::kAck);
}

TEST_F(BufferTest, BatchClaimPutsDataLossOnTheCorruptKeyOnly) {
  CorruptRecordStore store(store_.get());
  store.Corrupt("bad");
  Buffer buffer(&store);
  const std::vector<ClaimItem> items = {{"a", ""}, {"bad", ""}, {"b", ""}};
  std::vector<StatusOr<ClaimGuard>> claims = buffer.ClaimBatch(items);
  ASSERT_EQ(claims.size(), 3u);
  ASSERT_TRUE(claims[0].ok()) << claims[0].status();
  EXPECT_TRUE(claims[0]->acquired());
  EXPECT_EQ(claims[1].status().code(), StatusCode::kDataLoss);
  ASSERT_TRUE(claims[2].ok()) << claims[2].status();
  EXPECT_TRUE(claims[2]->acquired());
  Processed p = buffer.ProcessClaimed("bad", std::move(claims[1]), MustNotRun);
  EXPECT_EQ(p.action, BrokerAction::kRetry);
  EXPECT_NE(p.reason.find("try 1 of 3"), std::string::npos) << "default bound 3: " << p.reason;
  EXPECT_EQ(store.failed_batches.load(), 1);
  // While it is counted, the corrupt key is claimed alone: the batch of the
  // others goes through.
  const std::vector<ClaimItem> next = {{"c", ""}, {"bad", ""}, {"d", ""}};
  claims = buffer.ClaimBatch(next);
  EXPECT_EQ(store.failed_batches.load(), 1);
  EXPECT_TRUE(claims[0].ok() && claims[0]->acquired());
  EXPECT_EQ(claims[1].status().code(), StatusCode::kDataLoss);
  EXPECT_TRUE(claims[2].ok() && claims[2]->acquired());
}

// One ClaimBatch of a batch that mixes every answer (ACQUIRED, BUSY held by
// another owner, DUPLICATE of done and of failed work, MISMATCH, EXHAUSTED, and
// a key twice in the batch) answers each item, and ProcessClaimed then acts on
// each, exactly as one Claim per item in the same order does on the same store
// history (guards kept while the later items are claimed, as a batch keeps
// them). A guard for a property the conformance suite checks only in part.
TEST(BufferBatch, AMixedBatchAnswersAsSingleClaimsInOrder) {
  struct Answer {
    StatusCode code;
    ClaimOutcome outcome;
    uint32_t attempt;
    uint64_t fence;
    CompletionStatus status;
    std::string result;
    BrokerAction action;
    std::string reason;
    bool operator==(const Answer&) const = default;
  };
  const std::vector<std::pair<std::string, std::string>> batch = {
      {"new", "p"},  {"done", "p"}, {"busy", "p"}, {"failed", "p"},
      {"mm", "p2"},  {"exh", "p"},  {"new", "p"},  {"other", "p"}};
  std::vector<Answer> answers[2];
  for (int batched = 0; batched < 2; ++batched) {
    SimulatedClock clock;
    MemoryStoreOptions mo;
    mo.clock = &clock;
    auto store = NewMemoryStore(mo);
    BufferOptions o;
    o.fingerprint_payloads = true;
    o.max_attempts = 1;
    Buffer buffer(store.get(), o);
    auto done = [](ClaimGuard&) { return HandlerResult::Done("r"); };
    ASSERT_EQ(buffer.ProcessOnce("done", "p", done).action, BrokerAction::kAck);
    ASSERT_EQ(buffer.ProcessOnce("failed", "p", [](ClaimGuard&) { return HandlerResult::Fail("x"); })
                  .action,
              BrokerAction::kDeadLetter);
    ASSERT_EQ(buffer.ProcessOnce("mm", "p1", done).action, BrokerAction::kAck);
    ASSERT_EQ(buffer.ProcessOnce("exh", "p", [](ClaimGuard&) { return HandlerResult::Retry("t"); })
                  .action,
              BrokerAction::kRetry);
    Buffer other(store.get(), o);
    auto held = other.Claim("busy", PayloadFingerprint("p"));
    ASSERT_TRUE(held.ok() && held->acquired());
    clock.Advance(1'000ms);

    std::vector<StatusOr<ClaimGuard>> claims;
    if (batched == 1) {
      std::vector<ClaimItem> items;
      for (const auto& [k, p] : batch) items.push_back(ClaimItem{k, p});
      claims = buffer.ClaimBatch(items);
    } else {
      for (const auto& [k, p] : batch) claims.push_back(buffer.Claim(k, PayloadFingerprint(p)));
    }
    ASSERT_EQ(claims.size(), batch.size());
    for (size_t i = 0; i < batch.size(); ++i) {
      Answer a{};
      a.code = claims[i].status().code();
      if (claims[i].ok()) {
        const ClaimResult& r = claims[i]->result();
        a.outcome = r.outcome;
        a.attempt = r.attempt;
        a.fence = r.fence;
        a.status = r.status;
        a.result = r.result;
      }
      Processed p = buffer.ProcessClaimed(batch[i].first, std::move(claims[i]), done);
      a.action = p.action;
      a.reason = p.reason;
      answers[batched].push_back(a);
    }
    EXPECT_EQ(*held->Complete(), WriteResult::kOk);
  }
  ASSERT_EQ(answers[0].size(), answers[1].size());
  for (size_t i = 0; i < answers[0].size(); ++i) {
    EXPECT_TRUE(answers[0][i] == answers[1][i])
        << batch[i].first << " (item " << i << "): single "
        << ClaimOutcomeName(answers[0][i].outcome) << " " << BrokerActionName(answers[0][i].action)
        << " '" << answers[0][i].reason << "', batch " << ClaimOutcomeName(answers[1][i].outcome)
        << " " << BrokerActionName(answers[1][i].action) << " '" << answers[1][i].reason << "'";
  }
  // What the items are, so that the comparison covers every answer.
  const std::vector<ClaimOutcome> want = {
      ClaimOutcome::kAcquired, ClaimOutcome::kDuplicate, ClaimOutcome::kBusy,
      ClaimOutcome::kDuplicate, ClaimOutcome::kMismatch, ClaimOutcome::kExhausted,
      ClaimOutcome::kBusy, ClaimOutcome::kAcquired};
  for (size_t i = 0; i < want.size(); ++i) {
    EXPECT_EQ(answers[1][i].outcome, want[i]) << batch[i].first << " (item " << i << ")";
  }
}

TEST_F(BufferTest, TooManyCorruptKeysAtOnceAreDeadLetteredAtTheFirstTry) {
  CorruptRecordStore store(store_.get());
  BufferOptions o;
  o.corrupt_record_tries = 2;
  Buffer buffer(&store, o);
  for (size_t i = 0; i <= kMaxCorruptKeys; ++i) store.Corrupt("c" + std::to_string(i));
  for (size_t i = 0; i < kMaxCorruptKeys; ++i) {
    ASSERT_EQ(buffer.ProcessOnce("c" + std::to_string(i), "", MustNotRun).action,
              BrokerAction::kRetry);
  }
  Processed p = buffer.ProcessOnce("c" + std::to_string(kMaxCorruptKeys), "", MustNotRun);
  EXPECT_EQ(p.action, BrokerAction::kDeadLetter);
  EXPECT_NE(p.reason.find("too many corrupt keys"), std::string::npos) << p.reason;
  // The counted ones still reach their bound.
  EXPECT_EQ(buffer.ProcessOnce("c0", "", MustNotRun).action, BrokerAction::kDeadLetter);
}

TEST_F(BufferTest, CorruptRecordTriesIsValidated) {
  for (int bad : {0, -1, 1001}) {
    BufferOptions o;
    o.corrupt_record_tries = bad;
    auto b = Buffer::Create(store_.get(), o);
    ASSERT_FALSE(b.ok()) << bad;
    EXPECT_EQ(b.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(b.status().message().find("corrupt-record-tries"), std::string::npos)
        << b.status();
  }
  BufferOptions o;
  o.corrupt_record_tries = 1000;
  EXPECT_TRUE(Buffer::Create(store_.get(), o).ok());
}

TEST_F(BufferTest, DroppedGuardReleases) {
  Buffer buffer(store_.get());
  {
    auto g = buffer.Claim("k");
    ASSERT_TRUE(g.ok() && g->acquired());
  }
  auto rec = store_->Inspect("k");
  ASSERT_TRUE(rec.ok() && rec->has_value());
  EXPECT_EQ((*rec)->state, RecordState::kReleased);
  auto again = buffer.Claim("k");
  ASSERT_TRUE(again.ok());
  EXPECT_TRUE(again->acquired());
  EXPECT_EQ(again->attempt(), 2u);
}

TEST_F(BufferTest, GuardMisuseIsAStatus) {
  Buffer buffer(store_.get());
  auto g = buffer.Claim("k");
  ASSERT_TRUE(g.ok());
  EXPECT_EQ(*g->Complete(), WriteResult::kOk);
  EXPECT_EQ(g->Complete().status().code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(g->Release().status().code(), StatusCode::kFailedPrecondition);
  auto busy_dup = buffer.Claim("k");
  ASSERT_TRUE(busy_dup.ok());
  EXPECT_EQ(busy_dup->outcome(), ClaimOutcome::kDuplicate);
  EXPECT_EQ(busy_dup->Complete().status().code(), StatusCode::kFailedPrecondition);
}

// Real time from here on: the heartbeat runs on a real thread against a store on
// the system clock, with short leases.
TEST(BufferHeartbeat, WorkLongerThanTheLeaseKeepsItsClaim) {
  auto store = NewMemoryStore();
  BufferOptions o;
  o.lease = 300ms;
  Buffer buffer(store.get(), o);
  std::atomic<bool> started{false}, running{true};
  std::atomic<int> stolen{0}, busy{0};
  std::thread rival([&] {
    Buffer other(store.get(), o);
    while (!started) std::this_thread::sleep_for(1ms);
    while (running) {
      auto c = other.Claim("long");
      if (c.ok() && c->acquired()) {
        ++stolen;
        (void)c->Release();
      } else if (c.ok() && c->outcome() == ClaimOutcome::kBusy) {
        ++busy;
      }
      std::this_thread::sleep_for(20ms);
    }
  });
  Processed p = buffer.ProcessOnce("long", "", [&](ClaimGuard& g) {
    started = true;
    std::this_thread::sleep_for(1200ms);  // four leases
    EXPECT_FALSE(g.lost());
    return HandlerResult::Done();
  });
  running = false;
  rival.join();
  EXPECT_EQ(p.action, BrokerAction::kAck);
  EXPECT_EQ(p.completion, WriteResult::kOk);
  EXPECT_EQ(stolen.load(), 0);
  EXPECT_GT(busy.load(), 10);
  EXPECT_GE(buffer.stats().heartbeats, 3u);
}

// Abandon() (a drain whose store does not answer): nothing is sent, the heartbeat
// stops, so the claim stays held until its lease runs out and the next claim is a
// takeover; the guard can write nothing afterwards, and its destructor releases
// nothing.
TEST(BufferHeartbeat, AbandonedClaimRunsOutWithItsLeaseAndWritesNothingMore) {
  auto store = NewMemoryStore();
  BufferOptions o;
  o.lease = 300ms;  // heartbeat every 100 ms
  Buffer buffer(store.get(), o);
  Buffer other(store.get(), o);
  {
    auto g = buffer.Claim("a");
    ASSERT_TRUE(g.ok() && g->acquired());
    g->Abandon();
    EXPECT_FALSE(g->active());
    EXPECT_EQ(g->Complete().status().code(), StatusCode::kFailedPrecondition);
    EXPECT_EQ(g->Release().status().code(), StatusCode::kFailedPrecondition);
    auto busy = other.Claim("a");
    ASSERT_TRUE(busy.ok());
    EXPECT_EQ(busy->outcome(), ClaimOutcome::kBusy) << "held until its lease runs out";
  }
  auto rec = store->Inspect("a");
  ASSERT_TRUE(rec.ok() && rec->has_value());
  EXPECT_EQ((*rec)->state, RecordState::kInProgress) << "the destructor released nothing";
  std::this_thread::sleep_for(600ms);  // two leases: an extend would have kept it
  auto taken = other.Claim("a");
  ASSERT_TRUE(taken.ok());
  EXPECT_TRUE(taken->acquired());
  EXPECT_EQ(taken->attempt(), 2u) << "a takeover";
}

TEST(BufferHeartbeat, LostLeaseIsReportedAndNotAcked) {
  auto store = NewMemoryStore();
  BufferOptions o;
  o.lease = 300ms;
  Buffer buffer(store.get(), o);
  Processed p = buffer.ProcessOnce("k", "", [&](ClaimGuard& g) {
    // An operator forgets the key and another worker claims it.
    EXPECT_TRUE(*store->Forget("k", ForgetOptions{.force = true}));
    ClaimRequest r;
    r.key = "k";
    EXPECT_TRUE(store->Claim(r)->acquired());
    for (int i = 0; i < 100 && !g.lost(); ++i) std::this_thread::sleep_for(20ms);
    EXPECT_TRUE(g.lost());
    return HandlerResult::Done();
  });
  EXPECT_EQ(p.completion, WriteResult::kLost);
  EXPECT_EQ(p.action, BrokerAction::kRetry);
  EXPECT_GE(buffer.stats().heartbeat_lost, 1u);
}

// A claim made ahead (a fetched batch) that waited in a queue while no heartbeat
// got through for a whole lease: its handler must not start, since another owner
// may already hold the key. (Found by the fault-proxy test: a 5.5 s stall of every
// connection, then handlers started on 4 s leases and ran a second time.)
TEST(BufferHeartbeat, HandlerDoesNotStartOnALeaseThatRanOut) {
  auto inner = NewMemoryStore();
  FlakyStore flaky(inner.get());
  flaky.fail_extends = 1'000'000;
  BufferOptions o;
  o.lease = 200ms;
  Buffer buffer(&flaky, o);
  const ClaimItem items[] = {{"k", ""}};
  std::vector<StatusOr<ClaimGuard>> claims = buffer.ClaimBatch(items);
  ASSERT_EQ(claims.size(), 1u);
  ASSERT_TRUE(claims[0].ok()) << claims[0].status();
  std::this_thread::sleep_for(400ms);  // two leases, every heartbeat refused
  bool ran = false;
  Processed p = buffer.ProcessClaimed("k", std::move(claims[0]), [&](ClaimGuard&) {
    ran = true;
    return HandlerResult::Done();
  });
  EXPECT_FALSE(ran);
  EXPECT_FALSE(p.ran);
  EXPECT_EQ(p.action, BrokerAction::kRetry);
  EXPECT_NE(p.reason.find("lease ran out"), std::string::npos) << p.reason;
}

TEST(BufferHeartbeat, HeartbeatSurvivesStoreBlips) {
  auto inner = NewMemoryStore();
  FlakyStore flaky(inner.get());
  flaky.fail_extends = 1;
  BufferOptions o;
  o.lease = 300ms;
  Buffer buffer(&flaky, o);
  Processed p = buffer.ProcessOnce("k", "", [&](ClaimGuard& g) {
    std::this_thread::sleep_for(500ms);
    EXPECT_FALSE(g.lost());
    return HandlerResult::Done();
  });
  EXPECT_EQ(p.action, BrokerAction::kAck);
  EXPECT_GE(buffer.stats().heartbeat_errors, 1u);
}

// ---- outcomes written later, several at once (Buffer::CompleteBatch) ---------

TEST_F(BufferTest, BatchCompleteAnswersAsProcessClaimedWould) {
  Buffer buffer(store_.get());
  auto defer = [&](const std::string& key, HandlerResult hr) {
    return buffer.ProcessOnceDeferred(key, "", [&](ClaimGuard&) {
      if (key == "stolen") {
        // Another owner takes over while the handler runs: the write answers LOST.
        EXPECT_TRUE(*store_->Forget(key, ForgetOptions{.force = true}));
        ClaimRequest r;
        r.key = key;
        EXPECT_TRUE(store_->Claim(r)->acquired());
      }
      return hr;
    });
  };
  std::vector<PendingOutcome> pending;
  for (auto [key, hr] : {std::pair{"done", HandlerResult::Done("r1")},
                         std::pair{"failed", HandlerResult::Fail("bad input")},
                         std::pair{"stolen", HandlerResult::Done("r3")}}) {
    auto r = defer(key, hr);
    ASSERT_TRUE(std::holds_alternative<PendingOutcome>(r)) << key;
    pending.push_back(std::move(std::get<PendingOutcome>(r)));
    EXPECT_TRUE(pending.back().active());
  }
  // A retry is settled at once (the claim released), never deferred.
  auto retry = defer("retried", HandlerResult::Retry("later"));
  ASSERT_TRUE(std::holds_alternative<Processed>(retry));
  EXPECT_EQ(std::get<Processed>(retry).action, BrokerAction::kRetry);
  EXPECT_EQ(store_->Inspect("retried")->value().state, RecordState::kReleased);
  // Nothing written before CompleteBatch.
  EXPECT_EQ(store_->Inspect("done")->value().state, RecordState::kInProgress);

  std::vector<Processed> ps = buffer.CompleteBatch(pending);
  ASSERT_EQ(ps.size(), 3u);
  EXPECT_EQ(ps[0].action, BrokerAction::kAck);
  EXPECT_EQ(ps[0].completion, WriteResult::kOk);
  EXPECT_EQ(ps[0].result, "r1");
  EXPECT_TRUE(ps[0].ran);
  EXPECT_EQ(ps[1].action, BrokerAction::kDeadLetter);
  EXPECT_EQ(ps[1].reason, "bad input");
  // LOST from a batch is exactly what a single LOST is.
  EXPECT_EQ(ps[2].action, BrokerAction::kRetry);
  EXPECT_EQ(ps[2].completion, WriteResult::kLost);
  EXPECT_EQ(ps[2].reason, "lease lost to another owner before the outcome was recorded");
  for (const PendingOutcome& p : pending) EXPECT_FALSE(p.active());

  Processed single = buffer.ProcessOnce("stolen2", "", [&](ClaimGuard&) {
    EXPECT_TRUE(*store_->Forget("stolen2", ForgetOptions{.force = true}));
    ClaimRequest r;
    r.key = "stolen2";
    EXPECT_TRUE(store_->Claim(r)->acquired());
    return HandlerResult::Done("r3");
  });
  EXPECT_EQ(single.action, ps[2].action);
  EXPECT_EQ(single.completion, ps[2].completion);
  EXPECT_EQ(single.reason, ps[2].reason);

  // The records as single completions leave them.
  Processed again = buffer.ProcessOnce("done", "", [](ClaimGuard&) {
    ADD_FAILURE() << "ran twice";
    return HandlerResult::Done();
  });
  EXPECT_EQ(again.action, BrokerAction::kAck);
  EXPECT_EQ(again.result, "r1");
  EXPECT_EQ(store_->Inspect("failed")->value().status, CompletionStatus::kFailed);
  // An empty batch does nothing.
  EXPECT_TRUE(buffer.CompleteBatch({}).empty());
}

// Handlers that all report Done, their outcomes not written yet.
std::vector<PendingOutcome> DeferDone(Buffer& buffer, std::initializer_list<const char*> keys) {
  std::vector<PendingOutcome> pending;
  for (const char* key : keys) {
    auto r = buffer.ProcessOnceDeferred(key, "", [](ClaimGuard&) { return HandlerResult::Done(); });
    EXPECT_TRUE(std::holds_alternative<PendingOutcome>(r)) << key;
    if (auto* p = std::get_if<PendingOutcome>(&r)) pending.push_back(std::move(*p));
  }
  return pending;
}

TEST_F(BufferTest, BatchCompleteIsRetriedWhileTheStoreBlinks) {
  FlakyStore flaky(store_.get());
  Buffer buffer(&flaky);
  std::vector<PendingOutcome> pending = DeferDone(buffer, {"a", "b"});
  flaky.fail_complete_batches = 2;
  std::vector<Processed> ps = buffer.CompleteBatch(pending);
  for (const Processed& p : ps) EXPECT_EQ(p.action, BrokerAction::kAck) << p.reason;
  EXPECT_EQ(flaky.complete_batches.load(), 3);
}

TEST_F(BufferTest, BatchCompleteThatNeverLandsIsNotAcked) {
  FlakyStore flaky(store_.get());
  Buffer buffer(&flaky);
  std::vector<PendingOutcome> pending = DeferDone(buffer, {"a", "b"});
  flaky.fail_complete_batches = 100;
  std::vector<Processed> ps = buffer.CompleteBatch(pending);
  for (const Processed& p : ps) {
    EXPECT_EQ(p.action, BrokerAction::kRetry);
    EXPECT_EQ(p.status.code(), StatusCode::kUnavailable);
  }
}

// One request's own error (here: its owner is gone) fails a whole batch call. The
// others must still be recorded: left unwritten, their leases would run out and
// a takeover would run their handlers a second time.
class RefusesOneOwner : public StoreWrapper {
 public:
  using StoreWrapper::StoreWrapper;
  std::string refused_key;
  StatusOr<WriteResult> Complete(std::string_view key, Token token, Millis retention,
                                 CompletionStatus status, std::string_view result) override {
    if (key == refused_key) return Status(StatusCode::kAborted, "this owner's process is gone");
    return StoreWrapper::Complete(key, token, retention, status, result);
  }
  // The generic loop over Complete, as a store without a native batch has.
  StatusOr<std::vector<AckedWrite>> CompleteBatch(
      std::span<const CompleteRequest> reqs) override {
    return Store::CompleteBatch(reqs);  // NOLINT(bugprone-parent-virtual-call)
  }
};

TEST_F(BufferTest, OneRequestsErrorDoesNotLeaveTheOthersOfItsBatchUnwritten) {
  RefusesOneOwner store(store_.get());
  store.refused_key = "b";
  Buffer buffer(&store);
  std::vector<PendingOutcome> pending = DeferDone(buffer, {"a", "b", "c"});
  std::vector<Processed> ps = buffer.CompleteBatch(pending);
  ASSERT_EQ(ps.size(), 3u);
  // "a" was written by the failed call (the loop got that far): written again
  // alone it answers LOST, but its record shows this very outcome under its
  // token, fence and attempt, so it is OK and acked (outcome_retry.h).
  EXPECT_EQ(ps[0].action, BrokerAction::kAck) << ps[0].reason;
  EXPECT_EQ(ps[0].completion, WriteResult::kOk);
  EXPECT_EQ(ps[1].action, BrokerAction::kRetry);
  EXPECT_EQ(ps[1].status.code(), StatusCode::kAborted);
  // "c" was never reached by the failed call: recorded by its own write.
  EXPECT_EQ(ps[2].action, BrokerAction::kAck) << ps[2].reason;
  for (const char* key : {"a", "c"}) {
    auto rec = store_->Inspect(key);
    ASSERT_TRUE(rec.ok() && rec->has_value()) << key;
    EXPECT_EQ((*rec)->state, RecordState::kCompleted) << key;
    Processed again = buffer.ProcessOnce(key, "", [](ClaimGuard&) {
      ADD_FAILURE() << "a recorded outcome's handler ran again";
      return HandlerResult::Done();
    });
    EXPECT_EQ(again.claim.outcome, ClaimOutcome::kDuplicate) << key;
    EXPECT_EQ(again.action, BrokerAction::kAck) << key;
  }
}

TEST(BufferHeartbeat, PendingOutcomeKeepsItsLeaseUntilWritten) {
  auto store = NewMemoryStore();
  BufferOptions o;
  o.lease = 600ms;  // beats every 200 ms: a loaded machine may delay one a little
  Buffer buffer(store.get(), o);
  auto r = buffer.ProcessOnceDeferred("k", "", [](ClaimGuard&) { return HandlerResult::Done("x"); });
  ASSERT_TRUE(std::holds_alternative<PendingOutcome>(r));
  std::vector<PendingOutcome> pending;
  pending.push_back(std::move(std::get<PendingOutcome>(r)));
  // Waiting for the batch write longer than the lease: the heartbeat holds it.
  for (int i = 0; i < 8; ++i) {
    std::this_thread::sleep_for(200ms);
    ClaimRequest c;
    c.key = "k";
    EXPECT_EQ(store->Claim(c)->outcome, ClaimOutcome::kBusy) << "after " << (i + 1) * 200 << "ms";
  }
  std::vector<Processed> ps = buffer.CompleteBatch(pending);
  EXPECT_EQ(ps[0].action, BrokerAction::kAck);
  EXPECT_EQ(ps[0].completion, WriteResult::kOk);
  EXPECT_GE(buffer.stats().heartbeats, 2u);
}

TEST(BufferHeartbeat, PendingOutcomeWhoseLeaseWasLostIsNotWritten) {
  auto store = NewMemoryStore();
  BufferOptions o;
  o.lease = 300ms;
  Buffer buffer(store.get(), o);
  std::vector<PendingOutcome> pending = DeferDone(buffer, {"lost", "kept"});
  EXPECT_TRUE(*store->Forget("lost", ForgetOptions{.force = true}));
  ClaimRequest c;
  c.key = "lost";
  const ClaimResult other = *store->Claim(c);
  ASSERT_TRUE(other.acquired());
  for (int i = 0; i < 100 && buffer.stats().heartbeat_lost == 0; ++i) {
    std::this_thread::sleep_for(20ms);
  }
  ASSERT_GE(buffer.stats().heartbeat_lost, 1u);
  std::vector<Processed> ps = buffer.CompleteBatch(pending);
  EXPECT_EQ(ps[0].action, BrokerAction::kRetry);
  EXPECT_EQ(ps[0].completion, WriteResult::kLost);
  EXPECT_EQ(ps[1].action, BrokerAction::kAck);
  auto rec = store->Inspect("lost");
  EXPECT_EQ((*rec)->state, RecordState::kInProgress);
  EXPECT_EQ((*rec)->token, other.token);
}

TEST(PayloadFingerprint, SixteenBytesOfSha256) {
  std::string f = PayloadFingerprint("abc");
  ASSERT_EQ(f.size(), 16u);
  // SHA-256("abc") = ba7816bf 8f01cfea 414140de 5dae2223 ...
  EXPECT_EQ(static_cast<unsigned char>(f[0]), 0xba);
  EXPECT_EQ(static_cast<unsigned char>(f[15]), 0x23);
  EXPECT_NE(PayloadFingerprint("abd"), f);
}

#ifdef DEDUP_WITH_REDIS_STREAMS
// The worked example of docs/REDIS_PROTOCOL.md ("Payload fingerprints"), whose bytes
// were computed there with python3 hashlib and sha256sum: another language that
// follows the page must get what the C++ worker gets.
TEST(PayloadFingerprint, DocumentedStreamExample) {
  StreamMessage m;
  m.id = "1700000000000-0";
  m.fields = {{"order", "42"}, {"amount", "9.99"}};
  const std::string payload = m.CanonicalPayload();
  EXPECT_EQ(payload, "5:order2:426:amount4:9.99");
  const std::string f = PayloadFingerprint(payload);
  ASSERT_EQ(f.size(), 16u);
  std::string hex;
  for (unsigned char c : f) {
    static constexpr char kDigits[] = "0123456789abcdef";
    hex += kDigits[c >> 4];
    hex += kDigits[c & 15];
  }
  EXPECT_EQ(hex, "5d49bc0a07d52fee92a6dd875917dacb");
}
#endif

}  // namespace
}  // namespace dedup
