// Copyright dedup authors. Licensed under the Apache License 2.0.
//
// How an outcome write is tried again (src/core/outcome_retry.h): the same policy for
// ClaimGuard::Complete, CompleteWithAck, Release and Buffer::CompleteBatch. Against
// a store that is down for a while and then comes back, on real time (the guard's
// lease deadline is steady-clock time); margins are wide for a loaded machine.

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

#include "core/outcome_retry.h"
#include "dedup/buffer.h"
#include "dedup/memory_store.h"

namespace dedup {
namespace {

using namespace std::chrono_literals;
using Steady = std::chrono::steady_clock;
using internal::OutcomeRetry;

// ---- the policy, on chosen times -------------------------------------------

const Steady::time_point kT0 = Steady::time_point() + 1h;
const Steady::time_point kForever = Steady::time_point::max();

TEST(OutcomeRetryPolicy, BacksOffExponentiallyUpTo250Ms) {
  OutcomeRetry r(3, 10s, kT0);
  std::vector<long> waits;
  for (int tries = 1; tries <= 7; ++tries) waits.push_back(r.Next(tries, kForever, kT0)->count());
  EXPECT_EQ(waits, (std::vector<long>{20, 40, 80, 160, 250, 250, 250}));
}

TEST(OutcomeRetryPolicy, TriesCompleteTriesTimesThenWithinTheTimeBound) {
  OutcomeRetry only_tries(3, 0ms, kT0);
  EXPECT_TRUE(only_tries.Next(1, kForever, kT0).has_value());
  EXPECT_TRUE(only_tries.Next(2, kForever, kT0 + 20ms).has_value());
  EXPECT_FALSE(only_tries.Next(3, kForever, kT0 + 60ms).has_value());

  OutcomeRetry bounded(3, 2s, kT0);
  EXPECT_TRUE(bounded.Next(3, kForever, kT0 + 60ms).has_value());
  EXPECT_TRUE(bounded.Next(9, kForever, kT0 + 1749ms).has_value());   // next try at 1.999 s
  EXPECT_FALSE(bounded.Next(9, kForever, kT0 + 1750ms).has_value());  // would be at 2 s
  // complete_tries holds however late the first tries came (a slow store).
  EXPECT_TRUE(bounded.Next(2, kForever, kT0 + 5s).has_value());
}

TEST(OutcomeRetryPolicy, NeverATryAtOrPastTheLeaseDeadline) {
  OutcomeRetry r(3, 2s, kT0);
  const Steady::time_point held_until = kT0 + 100ms;
  EXPECT_EQ(r.Next(1, held_until, kT0)->count(), 20);
  EXPECT_EQ(r.Next(2, held_until, kT0 + 20ms)->count(), 40);
  // Even within complete_tries: the next try would land on the deadline.
  EXPECT_FALSE(r.Next(2, held_until, kT0 + 60ms).has_value());
  EXPECT_FALSE(r.MayTry(1, held_until, held_until));
  EXPECT_TRUE(r.MayTry(1, held_until, held_until - 1ms));
  // A sleep that ended late is decided again on the time it ended.
  EXPECT_FALSE(r.MayTry(1, held_until, held_until + 1ms));
}

TEST(OutcomeRetryPolicy, RunTriesANonRetryableErrorOnceAndALeaseAlreadyOverOnce) {
  OutcomeRetry r(3, 2s);
  int calls = 0;
  StatusOr<int> a = r.Run([] { return kForever; }, [&]() -> StatusOr<int> {
    ++calls;
    return Status::InvalidArgument("no");
  });
  EXPECT_EQ(a.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(calls, 1);
  calls = 0;
  StatusOr<int> b = r.Run([] { return Steady::now() - 1ms; }, [&]() -> StatusOr<int> {
    ++calls;
    return Status::Unavailable("down");
  });
  EXPECT_EQ(b.status().code(), StatusCode::kUnavailable);
  EXPECT_EQ(calls, 1);
  calls = 0;
  StatusOr<int> c = r.Run([] { return kForever; }, [&]() -> StatusOr<int> {
    if (++calls < 3) return Status(StatusCode::kDeadlineExceeded, "slow");
    return 7;
  });
  EXPECT_EQ(*c, 7);
  EXPECT_EQ(calls, 3);
}

TEST(OutcomeRetryPolicy, CompleteRetryTimeIsValidated) {
  auto store = NewMemoryStore();
  BufferOptions o;
  o.complete_retry_time = Millis(-1);
  Status s = ValidateBufferOptions(o);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("complete-retry-time"), std::string::npos) << s;
  EXPECT_FALSE(Buffer::Create(store.get(), o).ok());
  o.complete_retry_time = Millis(0);
  EXPECT_TRUE(ValidateBufferOptions(o).ok());
}

// ---- the guard and the batch, against a store that is down a while ----------

// Every call fails with Unavailable until `down_until` (a store outage that ends, or a
// client reconnecting), or always with `refuse` when that is set. Counts the outcome
// writes and keeps the time each was sent. CompleteWithAck is fused here (the ack is
// counted, not carried out) when `fuse` is set.
class OutageStore : public StoreWrapper {
 public:
  using StoreWrapper::StoreWrapper;

  void DownFor(Steady::duration d) { down_until_.store((Steady::now() + d).time_since_epoch().count()); }
  void Up() { down_until_.store(0); }
  StatusCode refuse = StatusCode::kOk;
  bool fuse = false;
  std::atomic<int> completes{0}, completes_with_ack{0}, releases{0}, batches{0}, acks{0};

  std::vector<Steady::time_point> Writes() {
    std::lock_guard lock(mu_);
    return writes_;
  }

  StatusOr<ClaimResult> Claim(const ClaimRequest& req) override {
    DEDUP_RETURN_IF_ERROR(Fault(false));
    return StoreWrapper::Claim(req);
  }
  StatusOr<WriteResult> Extend(std::string_view key, Token token, Millis lease) override {
    DEDUP_RETURN_IF_ERROR(Fault(false));
    return StoreWrapper::Extend(key, token, lease);
  }
  StatusOr<WriteResult> Complete(std::string_view key, Token token, Millis retention,
                                 CompletionStatus status, std::string_view result) override {
    ++completes;
    DEDUP_RETURN_IF_ERROR(Fault(true));
    return StoreWrapper::Complete(key, token, retention, status, result);
  }
  bool CanCompleteWithAck(const BrokerAck&) const override { return fuse; }
  StatusOr<AckedWrite> CompleteWithAck(std::string_view key, Token token, Millis retention,
                                       CompletionStatus status, std::string_view result,
                                       const BrokerAck&) override {
    ++completes_with_ack;
    DEDUP_RETURN_IF_ERROR(Fault(true));
    StatusOr<WriteResult> w = StoreWrapper::Complete(key, token, retention, status, result);
    if (!w.ok()) return w.status();
    if (*w == WriteResult::kOk) ++acks;
    return AckedWrite{*w, *w == WriteResult::kOk};
  }
  StatusOr<std::vector<AckedWrite>> CompleteBatch(std::span<const CompleteRequest> reqs) override {
    ++batches;
    DEDUP_RETURN_IF_ERROR(Fault(true));
    return StoreWrapper::CompleteBatch(reqs);
  }
  StatusOr<WriteResult> Release(std::string_view key, Token token, Millis retention) override {
    ++releases;
    DEDUP_RETURN_IF_ERROR(Fault(true));
    return StoreWrapper::Release(key, token, retention);
  }

 private:
  Status Fault(bool outcome_write) {
    if (outcome_write) {
      std::lock_guard lock(mu_);
      writes_.push_back(Steady::now());
    }
    if (refuse != StatusCode::kOk) return Status(refuse, "outage store: refused");
    if (Steady::now().time_since_epoch().count() < down_until_.load()) {
      return Status::Unavailable("outage store: reconnecting");
    }
    return Status::Ok();
  }

  std::atomic<Steady::rep> down_until_{0};
  std::mutex mu_;
  std::vector<Steady::time_point> writes_;
};

class OutcomeRetryTest : public ::testing::Test {
 protected:
  OutcomeRetryTest() : inner_(NewMemoryStore()), store_(inner_.get()) {}

  ClaimGuard Acquire(Buffer& buffer, std::string_view key) {
    StatusOr<ClaimGuard> g = buffer.Claim(key);
    EXPECT_TRUE(g.ok()) << g.status();
    EXPECT_TRUE(g->acquired());
    return std::move(g).value();
  }
  RecordState State(std::string_view key) {
    auto rec = inner_->Inspect(key);
    EXPECT_TRUE(rec.ok() && rec->has_value()) << key;
    return rec.ok() && rec->has_value() ? (*rec)->state : RecordState::kInProgress;
  }

  std::unique_ptr<Store> inner_;
  OutageStore store_;
};

// A client that lost its connections refuses requests for up to a second while it
// reconnects. An outcome given up within that time is left to a takeover that runs
// the handler a second time; so the guard keeps trying while its claim is held.
TEST_F(OutcomeRetryTest, CompleteOutlastsAHalfSecondOutage) {
  Buffer buffer(&store_);
  ClaimGuard g = Acquire(buffer, "k");
  store_.DownFor(500ms);
  StatusOr<WriteResult> w = g.Complete("r");
  ASSERT_TRUE(w.ok()) << w.status();
  EXPECT_EQ(*w, WriteResult::kOk);
  EXPECT_EQ(State("k"), RecordState::kCompleted);
  EXPECT_GT(store_.completes.load(), 3);
  EXPECT_FALSE(g.active());
}

TEST_F(OutcomeRetryTest, CompleteWithAckOutlastsAHalfSecondOutage) {
  store_.fuse = true;
  Buffer buffer(&store_);
  ClaimGuard g = Acquire(buffer, "k");
  store_.DownFor(500ms);
  const BrokerAck ack{"test", "here", "stream", "group", "1-0"};
  StatusOr<AckedWrite> w = g.CompleteWithAck("r", ack);
  ASSERT_TRUE(w.ok()) << w.status();
  EXPECT_EQ(w->write, WriteResult::kOk);
  EXPECT_TRUE(w->acked);
  EXPECT_EQ(store_.acks.load(), 1);
  EXPECT_EQ(State("k"), RecordState::kCompleted);
}

// Without a fusable ack, CompleteWithAck is a plain Complete: the same retries.
TEST_F(OutcomeRetryTest, CompleteWithAckUnfusedOutlastsAHalfSecondOutage) {
  Buffer buffer(&store_);
  ClaimGuard g = Acquire(buffer, "k");
  store_.DownFor(500ms);
  StatusOr<AckedWrite> w = g.CompleteWithAck("r", BrokerAck{});
  ASSERT_TRUE(w.ok()) << w.status();
  EXPECT_EQ(w->write, WriteResult::kOk);
  EXPECT_FALSE(w->acked);
  EXPECT_EQ(State("k"), RecordState::kCompleted);
}

// A release dropped leaves the key BUSY for the rest of its lease: the same retries.
TEST_F(OutcomeRetryTest, ReleaseOutlastsAHalfSecondOutage) {
  Buffer buffer(&store_);
  ClaimGuard g = Acquire(buffer, "k");
  store_.DownFor(500ms);
  StatusOr<WriteResult> w = g.Release();
  ASSERT_TRUE(w.ok()) << w.status();
  EXPECT_EQ(*w, WriteResult::kOk);
  EXPECT_EQ(State("k"), RecordState::kReleased);
}

TEST_F(OutcomeRetryTest, ProcessOnceOutlastsAHalfSecondOutage) {
  Buffer buffer(&store_);
  Processed p = buffer.ProcessOnce("k", "", [&](ClaimGuard&) {
    store_.DownFor(500ms);
    return HandlerResult::Done("r");
  });
  EXPECT_EQ(p.action, BrokerAction::kAck) << p.reason;
  EXPECT_EQ(State("k"), RecordState::kCompleted);
}

// Past the lease deadline another owner may take over at any moment: the retries
// stop there (the store's own fence would refuse a late write of a key taken over,
// but one given up at the deadline is the policy the guard can state). The lease is
// 1.2 s, well inside the 2 s bound, so it is the deadline that stops them.
void ExpectRetriesStopAtTheLeaseDeadline(
    OutageStore& store, const std::function<Status(ClaimGuard&)>& write) {
  BufferOptions o;
  o.lease = 1200ms;
  Buffer buffer(&store, o);
  StatusOr<ClaimGuard> g = buffer.Claim("k");
  ASSERT_TRUE(g.ok() && g->acquired()) << g.status();
  store.DownFor(1h);  // heartbeats fail too: the deadline does not move
  const Steady::time_point deadline = g->lease_deadline();
  const Steady::time_point start = Steady::now();
  EXPECT_EQ(write(*g).code(), StatusCode::kUnavailable);
  const Steady::time_point end = Steady::now();
  EXPECT_FALSE(g->active());
  std::vector<Steady::time_point> writes = store.Writes();
  ASSERT_FALSE(writes.empty());
  EXPECT_GE(writes.size(), 4u) << "tried beyond complete_tries while the claim was held";
  // A try is decided before the deadline; the margin is for a thread preempted
  // between that check and the store call.
  EXPECT_LT(writes.back(), deadline + 100ms);
  // It gave up because of the deadline, not the 2 s bound.
  EXPECT_LT(end, deadline + 400ms);
  EXPECT_LT(end - start, 1900ms);
}

TEST_F(OutcomeRetryTest, CompleteRetriesStopAtTheLeaseDeadline) {
  ExpectRetriesStopAtTheLeaseDeadline(store_, [](ClaimGuard& g) { return g.Complete("r").status(); });
  store_.Up();
  EXPECT_EQ(State("k"), RecordState::kInProgress);
}

TEST_F(OutcomeRetryTest, ReleaseRetriesStopAtTheLeaseDeadline) {
  ExpectRetriesStopAtTheLeaseDeadline(store_, [](ClaimGuard& g) { return g.Release().status(); });
  store_.Up();
  EXPECT_EQ(State("k"), RecordState::kInProgress);
}

// However long the lease, the retries end within the bound.
TEST_F(OutcomeRetryTest, RetriesEndWithinTheBound) {
  Buffer buffer(&store_);  // lease 30 s
  ClaimGuard g = Acquire(buffer, "k");
  store_.DownFor(1h);
  const Steady::time_point start = Steady::now();
  StatusOr<WriteResult> w = g.Complete("r");
  const auto took = Steady::now() - start;
  EXPECT_EQ(w.status().code(), StatusCode::kUnavailable);
  EXPECT_GE(took, 1500ms);
  EXPECT_LT(took, 2600ms);
}

// An error that is not Unavailable / DeadlineExceeded would answer the same again:
// tried once.
TEST_F(OutcomeRetryTest, NonRetryableErrorIsTriedOnce) {
  store_.fuse = true;
  Buffer buffer(&store_);
  ClaimGuard a = Acquire(buffer, "a");
  ClaimGuard b = Acquire(buffer, "b");
  ClaimGuard c = Acquire(buffer, "c");
  store_.refuse = StatusCode::kAborted;
  EXPECT_EQ(a.Complete("r").status().code(), StatusCode::kAborted);
  EXPECT_EQ(store_.completes.load(), 1);
  const BrokerAck ack{"test", "here", "stream", "group", "1-0"};
  EXPECT_EQ(b.CompleteWithAck("r", ack).status().code(), StatusCode::kAborted);
  EXPECT_EQ(store_.completes_with_ack.load(), 1);
  EXPECT_EQ(c.Release().status().code(), StatusCode::kAborted);
  EXPECT_EQ(store_.releases.load(), 1);
}

TEST_F(OutcomeRetryTest, BatchCompleteOutlastsAHalfSecondOutage) {
  Buffer buffer(&store_);
  std::vector<PendingOutcome> pending;
  for (const char* key : {"a", "b", "c"}) {
    auto r = buffer.ProcessOnceDeferred(key, "", [](ClaimGuard&) { return HandlerResult::Done(); });
    ASSERT_TRUE(std::holds_alternative<PendingOutcome>(r)) << key;
    pending.push_back(std::move(std::get<PendingOutcome>(r)));
  }
  store_.DownFor(500ms);
  std::vector<Processed> ps = buffer.CompleteBatch(pending);
  for (const Processed& p : ps) EXPECT_EQ(p.action, BrokerAction::kAck) << p.reason;
  for (const char* key : {"a", "b", "c"}) EXPECT_EQ(State(key), RecordState::kCompleted) << key;
}


// ---- A: a guard dropped without an outcome gives its claim up with one try ----

// Giving up a claim (the guard destroyed or assigned over without an outcome) is
// not an outcome anyone waits for: one try, so that a drain during an outage does
// not spend complete_retry_time (or a lease) per dropped claim. A release that
// fails only means the lease runs out and the message comes back later.
TEST_F(OutcomeRetryTest, DroppedGuardReleasesWithOneTry) {
  Buffer buffer(&store_);
  {
    ClaimGuard g = Acquire(buffer, "k");
    store_.DownFor(1h);
    const Steady::time_point start = Steady::now();
    { ClaimGuard gone = std::move(g); }
    EXPECT_LT(Steady::now() - start, 500ms);
  }
  EXPECT_EQ(store_.releases.load(), 1);
  store_.Up();
  ClaimGuard a = Acquire(buffer, "a");
  ClaimGuard b = Acquire(buffer, "b");
  store_.DownFor(1h);
  const Steady::time_point start = Steady::now();
  a = std::move(b);  // gives up the claim of "a"
  EXPECT_LT(Steady::now() - start, 500ms);
  EXPECT_EQ(store_.releases.load(), 2);
  store_.Up();
  EXPECT_EQ(State("a"), RecordState::kInProgress) << "the failed release is left to the lease";
}

// A dropped guard whose one release gets through does release the key.
TEST_F(OutcomeRetryTest, DroppedGuardReleasesWhenTheStoreIsUp) {
  Buffer buffer(&store_);
  { ClaimGuard g = Acquire(buffer, "k"); }
  EXPECT_EQ(State("k"), RecordState::kReleased);
}

// ---- B: a circuit breaker for outcome writes ----------------------------------

TEST(OutcomeRetryPolicy, AnOpenBreakerLeavesOnlyCompleteTries) {
  OutcomeRetry open(3, 2s, kT0, /*breaker_open=*/true);
  EXPECT_TRUE(open.Next(1, kForever, kT0).has_value());
  EXPECT_TRUE(open.Next(2, kForever, kT0 + 20ms).has_value());
  EXPECT_FALSE(open.Next(3, kForever, kT0 + 60ms).has_value()) << "no extended window";
  OutcomeRetry closed(3, 2s, kT0, /*breaker_open=*/false);
  EXPECT_TRUE(closed.Next(3, kForever, kT0 + 60ms).has_value());
  // Whether a give-up opens the breaker: only past complete_tries and the window,
  // never because of the lease deadline.
  EXPECT_TRUE(closed.GaveUpOnTime(3, kForever, kT0 + 2s));
  EXPECT_FALSE(closed.GaveUpOnTime(3, kT0 + 100ms, kT0 + 100ms)) << "the lease ended it";
  EXPECT_FALSE(closed.GaveUpOnTime(1, kForever, kT0 + 2s)) << "within complete_tries";
  EXPECT_TRUE(open.GaveUpOnTime(3, kForever, kT0 + 60ms));
}

// Once a write has given up after its window, later ones get complete_tries tries
// only, until a store write succeeds again.
TEST_F(OutcomeRetryTest, AGivenUpWriteOpensTheBreakerASuccessClosesIt) {
  BufferOptions o;
  o.complete_retry_time = 600ms;
  Buffer buffer(&store_, o);
  ClaimGuard a = Acquire(buffer, "a");
  ClaimGuard b = Acquire(buffer, "b");
  ClaimGuard c = Acquire(buffer, "c");
  ClaimGuard d = Acquire(buffer, "d");
  store_.DownFor(1h);
  Steady::time_point start = Steady::now();
  EXPECT_EQ(a.Complete("r").status().code(), StatusCode::kUnavailable);
  EXPECT_GE(Steady::now() - start, 500ms) << "the first write has its window";
  const int before = store_.completes.load();
  start = Steady::now();
  EXPECT_EQ(b.Complete("r").status().code(), StatusCode::kUnavailable);
  EXPECT_LT(Steady::now() - start, 450ms) << "the breaker is open: complete_tries only";
  EXPECT_EQ(store_.completes.load() - before, o.complete_tries);
  store_.Up();
  EXPECT_EQ(c.Complete("r").value(), WriteResult::kOk);  // closes the breaker
  store_.DownFor(300ms);  // a short outage, longer than the 3 tries' backoffs (60 ms)
  EXPECT_EQ(d.Complete("r").value(), WriteResult::kOk) << "the window is back";
}

// A heartbeat's extend that the store answers closes the breaker too: a worker that
// only holds claims (a drain, long handlers) gets its outcome writes' window back
// as soon as the store is reachable again, not only after a claim or write.
TEST_F(OutcomeRetryTest, AnAnsweredHeartbeatClosesTheBreaker) {
  BufferOptions o;
  o.complete_retry_time = 600ms;
  o.heartbeat_interval = 50ms;
  Buffer buffer(&store_, o);
  ClaimGuard a = Acquire(buffer, "a");
  ClaimGuard held = Acquire(buffer, "held");  // kept: the heartbeat extends it
  ClaimGuard d = Acquire(buffer, "d");
  store_.DownFor(1h);
  EXPECT_EQ(a.Complete("r").status().code(), StatusCode::kUnavailable);  // opens it
  store_.Up();
  const uint64_t beats = buffer.stats().heartbeats - buffer.stats().heartbeat_errors;
  const Steady::time_point until = Steady::now() + 5s;
  while (buffer.stats().heartbeats - buffer.stats().heartbeat_errors < beats + 2 &&
         Steady::now() < until) {
    std::this_thread::sleep_for(10ms);
  }
  ASSERT_GE(buffer.stats().heartbeats - buffer.stats().heartbeat_errors, beats + 2)
      << "the heartbeat extended nothing";
  store_.DownFor(300ms);  // longer than complete_tries' backoffs (60 ms)
  EXPECT_EQ(d.Complete("r").value(), WriteResult::kOk) << "the window is back";
  EXPECT_EQ(held.Complete("r").value(), WriteResult::kOk);
}

// The batch path shares the breaker: a drain does not wait a window per batch.
TEST_F(OutcomeRetryTest, BatchesAfterAGivenUpBatchGetOnlyCompleteTries) {
  BufferOptions o;
  o.complete_retry_time = 600ms;
  Buffer buffer(&store_, o);
  auto deferred = [&](const char* key) {
    auto r = buffer.ProcessOnceDeferred(key, "", [](ClaimGuard&) { return HandlerResult::Done(); });
    EXPECT_TRUE(std::holds_alternative<PendingOutcome>(r)) << key;
    return std::move(std::get<PendingOutcome>(r));
  };
  std::vector<PendingOutcome> first, second;
  first.push_back(deferred("a"));
  first.push_back(deferred("b"));
  second.push_back(deferred("c"));
  second.push_back(deferred("d"));
  store_.DownFor(1h);
  Steady::time_point start = Steady::now();
  for (const Processed& p : buffer.CompleteBatch(first)) EXPECT_EQ(p.action, BrokerAction::kRetry);
  EXPECT_GE(Steady::now() - start, 500ms);
  start = Steady::now();
  for (const Processed& p : buffer.CompleteBatch(second)) EXPECT_EQ(p.action, BrokerAction::kRetry);
  EXPECT_LT(Steady::now() - start, 450ms);
}

// ---- C: a retried write whose first try was applied --------------------------

// Applies the first outcome write (of each kind) and then answers DeadlineExceeded,
// as a reply lost after the store wrote; every later call goes through. Counts the
// reads of records.
class LostReplyStore : public StoreWrapper {
 public:
  using StoreWrapper::StoreWrapper;
  std::atomic<int> inspects{0};
  StatusOr<WriteResult> Complete(std::string_view key, Token token, Millis retention,
                                 CompletionStatus status, std::string_view result) override {
    StatusOr<WriteResult> w = StoreWrapper::Complete(key, token, retention, status, result);
    if (complete_lost_.exchange(false)) return Status(StatusCode::kDeadlineExceeded, "reply lost");
    return w;
  }
  StatusOr<std::vector<AckedWrite>> CompleteBatch(std::span<const CompleteRequest> reqs) override {
    auto w = StoreWrapper::CompleteBatch(reqs);
    if (batch_lost_.exchange(false)) return Status(StatusCode::kDeadlineExceeded, "reply lost");
    return w;
  }
  StatusOr<WriteResult> Release(std::string_view key, Token token, Millis retention) override {
    StatusOr<WriteResult> w = StoreWrapper::Release(key, token, retention);
    if (release_lost_.exchange(false)) return Status(StatusCode::kDeadlineExceeded, "reply lost");
    return w;
  }
  StatusOr<std::optional<Record>> Inspect(std::string_view key) override {
    ++inspects;
    return StoreWrapper::Inspect(key);
  }
  std::atomic<bool> complete_lost_{true}, batch_lost_{true}, release_lost_{true};
};

TEST(OutcomeRetryLostReply, CompleteRecordedByTheFirstTryAnswersOk) {
  auto inner = NewMemoryStore();
  LostReplyStore store(inner.get());
  Buffer buffer(&store);
  StatusOr<ClaimGuard> g = buffer.Claim("k");
  ASSERT_TRUE(g.ok() && g->acquired());
  StatusOr<WriteResult> w = g->Complete("r");
  ASSERT_TRUE(w.ok()) << w.status();
  EXPECT_EQ(*w, WriteResult::kOk);
  EXPECT_EQ(store.inspects.load(), 1);
}

TEST(OutcomeRetryLostReply, ReleaseRecordedByTheFirstTryAnswersOk) {
  auto inner = NewMemoryStore();
  LostReplyStore store(inner.get());
  Buffer buffer(&store);
  StatusOr<ClaimGuard> g = buffer.Claim("k");
  ASSERT_TRUE(g.ok() && g->acquired());
  StatusOr<WriteResult> w = g->Release();
  ASSERT_TRUE(w.ok()) << w.status();
  EXPECT_EQ(*w, WriteResult::kOk);
}

TEST(OutcomeRetryLostReply, ProcessOnceAcksAnOutcomeRecordedByTheFirstTry) {
  auto inner = NewMemoryStore();
  LostReplyStore store(inner.get());
  Buffer buffer(&store);
  Processed p = buffer.ProcessOnce("k", "", [](ClaimGuard&) { return HandlerResult::Done("r"); });
  EXPECT_EQ(p.action, BrokerAction::kAck) << p.reason;
  EXPECT_EQ(p.completion, WriteResult::kOk);
}

TEST(OutcomeRetryLostReply, BatchRecordedByTheFirstTryAnswersOkPerRequest) {
  auto inner = NewMemoryStore();
  LostReplyStore store(inner.get());
  Buffer buffer(&store);
  std::vector<PendingOutcome> pending;
  for (const char* key : {"a", "b", "c"}) {
    auto r = buffer.ProcessOnceDeferred(key, "", [](ClaimGuard&) { return HandlerResult::Done(); });
    ASSERT_TRUE(std::holds_alternative<PendingOutcome>(r)) << key;
    pending.push_back(std::move(std::get<PendingOutcome>(r)));
  }
  // "c" is taken over before the batch: its LOST is real and stays LOST.
  ASSERT_TRUE(inner->Forget("c", ForgetOptions{.force = true}).ok());
  ClaimRequest cr;
  cr.key = "c";
  cr.lease = Millis(30'000);
  cr.retention = Millis(60'000);
  ASSERT_TRUE(inner->Claim(cr).ok());
  std::vector<Processed> ps = buffer.CompleteBatch(pending);
  EXPECT_EQ(ps[0].action, BrokerAction::kAck) << ps[0].reason;
  EXPECT_EQ(ps[1].action, BrokerAction::kAck) << ps[1].reason;
  EXPECT_EQ(ps[2].action, BrokerAction::kRetry) << ps[2].reason;
  EXPECT_EQ(ps[2].completion, WriteResult::kLost);
}

// A first try that answers LOST is the answer: no record is read.
TEST(OutcomeRetryLostReply, AFirstTryLostIsNotChecked) {
  auto inner = NewMemoryStore();
  LostReplyStore store(inner.get());
  Buffer buffer(&store);
  StatusOr<ClaimGuard> g = buffer.Claim("k");
  ASSERT_TRUE(g.ok() && g->acquired());
  ASSERT_TRUE(inner->Forget("k", ForgetOptions{.force = true}).ok());
  store.complete_lost_ = false;  // the first try's reply gets through: LOST
  StatusOr<WriteResult> w = g->Complete("r");
  ASSERT_TRUE(w.ok()) << w.status();
  EXPECT_EQ(*w, WriteResult::kLost);
  EXPECT_EQ(store.inspects.load(), 0);
}

}  // namespace
}  // namespace dedup
