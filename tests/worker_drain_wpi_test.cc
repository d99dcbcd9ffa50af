// Copyright dedup authors. Licensed under the Apache License 2.0.
//
// No JetStream +WPI for a message after this worker settled it (docs/WORKER.md,
// "Stopping"). The Consumer sends Delivery::InProgress() every heartbeat for what
// it holds, also while it drains, and may do so just after another thread
// settled a delivery (consumer.h: "after the settlement it must do no harm"): a
// +WPI after a -NAK would restart the redelivery timer of a message this worker
// gave up, delaying the next worker. Against a real nats-server (tests/
// with_nats.sh, 4230 in docs/PORTS.md): a plain NATS subscriber on
// $JS.ACK.<stream>.> sees every ack the worker sends, in the server's order.

#include <gtest/gtest.h>
#include <nats/nats.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "brokers/nats/nats_source.h"
#include "dedup/buffer.h"
#include "dedup/consumer.h"
#include "dedup/store.h"

namespace dedup::nats {
namespace {

using namespace std::chrono_literals;

std::string BaseUri() {
  const char* u = std::getenv("DEDUP_TEST_NATS_URI");
  return u != nullptr ? u : "";
}

// Every ack body sent for the stream's messages, per ack subject (one per
// delivery), in the order the server received them.
class AckWire {
 public:
  explicit AckWire(const std::string& stream) {
    EXPECT_EQ(natsConnection_ConnectTo(&nc_, BaseUri().c_str()), NATS_OK);
    const std::string subject = "$JS.ACK." + stream + ".>";
    EXPECT_EQ(natsConnection_Subscribe(&sub_, nc_, subject.c_str(), &AckWire::OnMsg, this),
              NATS_OK);
    EXPECT_EQ(natsConnection_Flush(nc_), NATS_OK);  // subscribed before anything is acked
  }
  ~AckWire() {
    natsSubscription_Destroy(sub_);
    natsConnection_Destroy(nc_);
  }
  AckWire(const AckWire&) = delete;
  AckWire& operator=(const AckWire&) = delete;

  // What came after a delivery's settlement (-NAK, +ACK, +TERM) on its subject.
  std::vector<std::string> AfterSettlement() {
    std::lock_guard lock(mu_);
    std::vector<std::string> late;
    for (const auto& [subject, bodies] : seen_) {
      bool settled = false;
      for (const std::string& b : bodies) {
        if (settled) late.push_back(b + " after settlement on " + subject);
        if (b.rfind("+WPI", 0) != 0) settled = true;
      }
    }
    return late;
  }
  int Count(const std::string& prefix) {
    std::lock_guard lock(mu_);
    int n = 0;
    for (const auto& [subject, bodies] : seen_) {
      for (const std::string& b : bodies) n += b.rfind(prefix, 0) == 0 ? 1 : 0;
    }
    return n;
  }
  // Waits until the acks sent so far have reached this subscriber: a round trip
  // of the sender's connection came first, so one of ours now is enough.
  void Settle() {
    std::this_thread::sleep_for(200ms);
    EXPECT_EQ(natsConnection_Flush(nc_), NATS_OK);
  }

 private:
  static void OnMsg(natsConnection*, natsSubscription*, natsMsg* m, void* self) {
    auto* w = static_cast<AckWire*>(self);
    std::string body(natsMsg_GetData(m) != nullptr ? natsMsg_GetData(m) : "",
                     static_cast<size_t>(natsMsg_GetDataLength(m)));
    {
      std::lock_guard lock(w->mu_);
      w->seen_[natsMsg_GetSubject(m)].push_back(std::move(body));
    }
    natsMsg_Destroy(m);
  }

  natsConnection* nc_ = nullptr;
  natsSubscription* sub_ = nullptr;
  std::mutex mu_;
  std::map<std::string, std::vector<std::string>> seen_;
};

class DrainProgressTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_FALSE(BaseUri().empty()) << "run me through tests/with_nats.sh";
    stream_ = std::string("W") + ::testing::UnitTest::GetInstance()->current_test_info()->name();
  }
  std::string Uri() const {
    return BaseUri() + "?stream=" + stream_ + "&consumer=c&subject=" + stream_ +
           ".in&ack_wait=30s";
  }
  void Publish(int n) {
    auto o = ParseNatsUri(Uri(), false);
    ASSERT_TRUE(o.ok()) << o.status();
    auto p = NatsPublisher::Open(*o);
    ASSERT_TRUE(p.ok()) << p.status();
    for (int i = 0; i < n; ++i) {
      bool dup = false;
      ASSERT_TRUE((*p)->Publish("k" + std::to_string(i), "p", &dup).ok());
    }
  }
  std::string stream_;
};

// The source's side: InProgress() after Ack, Retry(0) or Retry(delay) sends nothing.
TEST_F(DrainProgressTest, InProgressAfterASettlementSendsNothing) {
  auto source = OpenNatsSource(Uri());
  ASSERT_TRUE(source.ok()) << source.status();
  Publish(3);
  AckWire wire(stream_);
  std::vector<std::unique_ptr<Delivery>> got;
  for (int i = 0; i < 50 && got.size() < 3; ++i) {
    auto b = (*source)->Fetch(3 - got.size(), 200ms);
    ASSERT_TRUE(b.ok()) << b.status();
    for (auto& d : *b) got.push_back(std::move(d));
  }
  ASSERT_EQ(got.size(), 3u);
  for (auto& d : got) ASSERT_TRUE(d->InProgress().ok());  // before: sent
  ASSERT_TRUE(got[0]->Retry(0ms).ok());
  ASSERT_TRUE(got[1]->Ack().ok());
  ASSERT_TRUE(got[2]->Retry(5s).ok());
  for (int round = 0; round < 3; ++round) {
    for (auto& d : got) EXPECT_TRUE(d->InProgress().ok());
  }
  wire.Settle();
  EXPECT_EQ(wire.Count("+WPI"), 3);
  EXPECT_EQ(wire.Count("-NAK"), 2);
  EXPECT_EQ(wire.Count("+ACK"), 1);
  for (const std::string& late : wire.AfterSettlement()) ADD_FAILURE() << late;
}

// The Consumer's side, while it drains: 32 deliveries fetched ahead are handed
// back (-NAK) on the hand-back thread while the drain's progress thread sends
// +WPI every 50 ms for what is held, and the running handler is stopped at the
// drain timeout and handed back too.
TEST_F(DrainProgressTest, TheDrainSendsNoProgressForWhatItHandedBack) {
  auto source = OpenNatsSource(Uri());
  ASSERT_TRUE(source.ok()) << source.status();
  auto store = OpenStore("memory:");
  ASSERT_TRUE(store.ok()) << store.status();
  BufferOptions bo;
  bo.lease = 150ms;  // heartbeat (and +WPI) every 50 ms
  Buffer buffer(store->get(), bo);
  const int ahead = 32;
  Publish(ahead + 1);
  AckWire wire(stream_);
  ConsumerOptions o;
  o.concurrency = 1;
  o.prefetch = ahead;
  o.fetch_wait = 50ms;
  o.drain_timeout = 500ms;
  std::atomic<bool> started{false};
  auto c = Consumer::Make(source->get(), &buffer, [&](const Delivery& d, ClaimGuard&) {
    started = true;
    while (!d.stop_requested()) std::this_thread::sleep_for(5ms);
    return HandlerResult::Retry("stopped by the drain");
  }, o);
  ASSERT_TRUE(c.ok()) << c.status();
  std::thread run([&] { EXPECT_TRUE((*c)->Run().ok()); });
  for (int i = 0; i < 500 && !started.load(); ++i) std::this_thread::sleep_for(10ms);
  ASSERT_TRUE(started.load());
  std::this_thread::sleep_for(300ms);  // the window fills; some +WPI go out
  (*c)->Stop();
  run.join();
  wire.Settle();
  EXPECT_EQ(wire.Count("-NAK"), ahead + 1) << "every delivery handed back once";
  EXPECT_GT(wire.Count("+WPI"), ahead) << "progress was sent while they were held";
  for (const std::string& late : wire.AfterSettlement()) ADD_FAILURE() << late;
}

}  // namespace
}  // namespace dedup::nats
