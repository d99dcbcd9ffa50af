// Copyright dedup authors. Licensed under the Apache License 2.0.
//
// FaultInjectionStore (src/sim) forwards what it does not fault to the store it
// wraps, the batch calls to the wrapped store's batch calls (the paths production
// runs), and still faults every completion of a batch: a killed owner's write is
// refused, an outage refuses all, AfterComplete fires once per recorded outcome.
// The wrapped store is a real memory store, seen through a counting StoreWrapper.

#include "sim/fault_injection_store.h"

#include <gtest/gtest.h>

#include <atomic>
#include <memory>
#include <string>
#include <vector>

namespace dedup {
namespace {

class CountingStore : public StoreWrapper {
 public:
  using StoreWrapper::StoreWrapper;
  StatusOr<WriteResult> Complete(std::string_view key, Token token, Millis retention,
                                 CompletionStatus status, std::string_view result) override {
    ++completes;
    return StoreWrapper::Complete(key, token, retention, status, result);
  }
  StatusOr<std::vector<AckedWrite>> CompleteBatch(
      std::span<const CompleteRequest> reqs) override {
    ++complete_batches;
    return StoreWrapper::CompleteBatch(reqs);
  }
  StatusOr<std::vector<ClaimResult>> ClaimBatch(std::span<const ClaimRequest> reqs) override {
    ++claim_batches;
    return StoreWrapper::ClaimBatch(reqs);
  }
  int completes = 0, complete_batches = 0, claim_batches = 0;
};

class FaultInjectionStoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    StatusOr<std::unique_ptr<Store>> s = OpenStore("memory:");
    ASSERT_TRUE(s.ok()) << s.status();
    memory_ = std::move(s).value();
    counting_ = std::make_unique<CountingStore>(memory_.get());
    faulty_ = std::make_unique<FaultInjectionStore>(counting_.get());
  }

  std::vector<ClaimResult> ClaimAll(const std::vector<std::string>& keys) {
    std::vector<ClaimRequest> reqs;
    for (const std::string& k : keys) reqs.push_back(ClaimRequest{k});
    StatusOr<std::vector<ClaimResult>> r = faulty_->ClaimBatch(reqs);
    EXPECT_TRUE(r.ok()) << r.status();
    return r.ok() ? *r : std::vector<ClaimResult>{};
  }

  RecordState StateOf(const std::string& key) {
    StatusOr<std::optional<Record>> r = faulty_->Inspect(key);
    EXPECT_TRUE(r.ok() && r->has_value()) << key;
    return r.ok() && r->has_value() ? (*r)->state : RecordState::kReleased;
  }

  std::unique_ptr<Store> memory_;
  std::unique_ptr<CountingStore> counting_;
  std::unique_ptr<FaultInjectionStore> faulty_;
};

TEST_F(FaultInjectionStoreTest, BatchCallsReachTheWrappedStoresBatchCalls) {
  const std::vector<ClaimResult> c = ClaimAll({"a", "b", "c"});
  ASSERT_EQ(c.size(), 3u);
  EXPECT_EQ(counting_->claim_batches, 1);
  std::vector<CompleteRequest> reqs;
  for (size_t i = 0; i < c.size(); ++i) {
    ASSERT_TRUE(c[i].acquired());
    reqs.push_back(CompleteRequest{std::string_view(i == 0 ? "a" : i == 1 ? "b" : "c"),
                                   c[i].token});
  }
  int fired = 0;
  faulty_->AfterComplete(c[1].token, [&fired] { ++fired; });
  StatusOr<std::vector<AckedWrite>> r = faulty_->CompleteBatch(reqs);
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->size(), 3u);
  for (const AckedWrite& w : *r) EXPECT_EQ(w.write, WriteResult::kOk);
  // One batch call on the wrapped store, not one Complete per item.
  EXPECT_EQ(counting_->complete_batches, 1);
  EXPECT_EQ(counting_->completes, 0);
  EXPECT_EQ(fired, 1);
  for (const char* k : {"a", "b", "c"}) EXPECT_EQ(StateOf(k), RecordState::kCompleted) << k;
}

TEST_F(FaultInjectionStoreTest, AKilledOwnerInABatchIsRefusedAndNothingOfTheBatchIsWritten) {
  const std::vector<ClaimResult> c = ClaimAll({"a", "b"});
  ASSERT_EQ(c.size(), 2u);
  faulty_->KillOwner(c[0].token);
  const std::vector<CompleteRequest> reqs = {CompleteRequest{"a", c[0].token},
                                             CompleteRequest{"b", c[1].token}};
  StatusOr<std::vector<AckedWrite>> r = faulty_->CompleteBatch(reqs);
  // A dead process writes nothing: the batch fails whole, not retryable, and the
  // caller (Buffer::CompleteBatch) writes each alone, where only "b" is recorded.
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kAborted);
  EXPECT_FALSE(r.status().retryable());
  EXPECT_EQ(StateOf("a"), RecordState::kInProgress);
  EXPECT_EQ(StateOf("b"), RecordState::kInProgress);
  EXPECT_FALSE(faulty_->Complete("a", c[0].token, kDefaultRetention, CompletionStatus::kOk, "")
                   .ok());
  EXPECT_EQ(faulty_->refused_outcomes(), 1u);  // counted once, when written alone
  StatusOr<WriteResult> b =
      faulty_->Complete("b", c[1].token, kDefaultRetention, CompletionStatus::kOk, "");
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(*b, WriteResult::kOk);
}

TEST_F(FaultInjectionStoreTest, AnOutageRefusesEveryCallOfABatch) {
  const std::vector<ClaimResult> c = ClaimAll({"a", "b"});
  ASSERT_EQ(c.size(), 2u);
  faulty_->SetUnavailable(true);
  const std::vector<CompleteRequest> reqs = {CompleteRequest{"a", c[0].token},
                                             CompleteRequest{"b", c[1].token}};
  StatusOr<std::vector<AckedWrite>> r = faulty_->CompleteBatch(reqs);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kUnavailable);
  std::vector<ClaimRequest> more = {ClaimRequest{"x"}, ClaimRequest{"y"}};
  EXPECT_EQ(faulty_->ClaimBatch(more).status().code(), StatusCode::kUnavailable);
  EXPECT_EQ(counting_->complete_batches, 0);
  faulty_->SetUnavailable(false);
  EXPECT_EQ(StateOf("a"), RecordState::kInProgress);
}

}  // namespace
}  // namespace dedup
