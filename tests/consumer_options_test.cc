// Copyright dedup authors. Licensed under the Apache License 2.0.
//
// ConsumerOptions are checked when the Consumer is made (Consumer::Make), each
// out-of-range value refused naming the option, never read as another value.

#include <gtest/gtest.h>

#include <chrono>
#include <climits>
#include <functional>
#include <memory>
#include <string>

#include "brokers/memory/memory_broker.h"
#include "dedup/buffer.h"
#include "dedup/consumer.h"
#include "dedup/store.h"

namespace dedup {
namespace {

using namespace std::chrono_literals;

Status MakeWith(const std::function<void(ConsumerOptions*)>& set) {
  MemoryBroker broker;
  std::unique_ptr<MemorySource> source = broker.Connect();
  auto store = OpenStore("memory:");
  EXPECT_TRUE(store.ok()) << store.status();
  Buffer buffer(store->get());
  ConsumerOptions o;
  set(&o);
  auto made = Consumer::Make(
      source.get(), &buffer, [](const Delivery&, ClaimGuard&) { return HandlerResult::Done(); }, o);
  return made.status();
}

TEST(ConsumerOptions, OutOfRangeValuesAreRefusedByMakeNamingTheOption) {
  struct Case {
    std::function<void(ConsumerOptions*)> set;
    std::string words;
  };
  const Case cases[] = {
      {[](ConsumerOptions* o) { o->concurrency = 0; }, "concurrency"},
      {[](ConsumerOptions* o) { o->concurrency = -3; }, "concurrency"},
      // -1 is the one negative prefetch (= concurrency); -2 and below were taken
      // as -1 without a word.
      {[](ConsumerOptions* o) { o->prefetch = -2; }, "prefetch must be -1 (= concurrency) or 0 to 65536, got -2"},
      {[](ConsumerOptions* o) { o->prefetch = INT_MIN; }, "prefetch"},
      {[](ConsumerOptions* o) { o->prefetch = 65537; }, "prefetch"},
      {[](ConsumerOptions* o) { o->max_ack_delay = -1ms; }, "max ack delay"},
      {[](ConsumerOptions* o) { o->max_ack_delay = 1001ms; }, "max ack delay"},
  };
  for (const Case& c : cases) {
    const Status s = MakeWith(c.set);
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << c.words << ": " << s;
    EXPECT_NE(s.message().find(c.words), std::string::npos) << s;
  }
  for (int prefetch : {-1, 0, 1, 65536}) {
    const Status s = MakeWith([prefetch](ConsumerOptions* o) { o->prefetch = prefetch; });
    EXPECT_TRUE(s.ok()) << "prefetch " << prefetch << ": " << s;
  }
}

}  // namespace
}  // namespace dedup
