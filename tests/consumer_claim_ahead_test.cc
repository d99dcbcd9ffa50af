// Copyright dedup authors. Licensed under the Apache License 2.0.
//
// ConsumerOptions::prefetch: deliveries fetched ahead of the running ones wait
// in the queue "their keys already claimed when batch_claims" — also when every
// handler thread is busy. The claim stage is a handler thread's work; with none
// idle a fetched batch waited there unclaimed until one ended.
// (consumer_conformance_test ClaimsFetchedAheadStayHeldWhileTheyWait/rabbitmq
// failed so under load: the slow handler's message came alone in its fetch, the
// next ones in a batch of 10 that stayed in the stage: "nothing was claimed
// ahead of the slow handler".)
//
// The memory broker's delay makes the fetches certain: the slow message alone,
// then, once it runs, 8 more in one fetch.

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <string>
#include <thread>

#include "brokers/memory/memory_broker.h"
#include "dedup/buffer.h"
#include "dedup/consumer.h"
#include "dedup/store.h"

namespace dedup {
namespace {

using namespace std::chrono_literals;

TEST(ConsumerClaimAhead, ABatchFetchedWhileEveryHandlerIsBusyIsClaimedAhead) {
  MemoryBroker broker;
  broker.Publish("slow", "p");
  constexpr int kLate = 8;
  for (int i = 0; i < kLate; ++i) broker.Publish("late-" + std::to_string(i), "p", 300ms);
  std::unique_ptr<MemorySource> source = broker.Connect();
  auto store = OpenStore("memory:");
  ASSERT_TRUE(store.ok()) << store.status();
  Buffer buffer(store->get());
  ConsumerOptions o;
  o.concurrency = 1;
  o.prefetch = 16;
  o.fetch_wait = 20ms;
  std::atomic<bool> blocked{false}, open{false};
  auto made = Consumer::Make(source.get(), &buffer, [&](const Delivery& d, ClaimGuard&) {
    if (d.key() == "slow") {
      blocked = true;
      while (!open.load()) std::this_thread::sleep_for(5ms);
    }
    return HandlerResult::Done();
  }, o);
  ASSERT_TRUE(made.ok()) << made.status();
  Consumer* c = made->get();
  std::thread run([c] { (void)c->Run(); });
  const auto until = std::chrono::steady_clock::now() + 3s;
  int claimed = 0;
  while (std::chrono::steady_clock::now() < until && claimed == 0) {
    std::this_thread::sleep_for(20ms);
    for (int i = 0; i < kLate; ++i) {
      auto rec = (*store)->Inspect("late-" + std::to_string(i));
      if (rec.ok() && rec->has_value()) ++claimed;
    }
  }
  const bool slow_ran = blocked.load();
  const ConsumerMetrics m = c->metrics();
  open = true;
  c->Stop();
  run.join();
  ASSERT_TRUE(slow_ran) << "the slow handler did not start";
  EXPECT_GT(claimed, 0) << "3 s after the late batch became ready, none of its " << kLate
                        << " keys was claimed while the only handler was busy (claim batches: "
                        << m.claim_batches << ")";
}

}  // namespace
}  // namespace dedup
