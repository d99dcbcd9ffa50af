// Copyright dedup authors. Licensed under the Apache License 2.0.
//
// Consumer::Stop() against the lifetime of the Consumer. Its callers (the
// SIGTERM handler of `dedup worker`, Worker::Stop) call Stop() on one thread
// while another returns from Run() and then destroys the Consumer
// (src/cli/worker_command.cc, Worker::RunConsumer): Stop() must be done with
// the Consumer once Run() can return, or it writes through a freed Consumer to
// a closed, maybe already reused, file descriptor.
//
// The window is a few instructions wide; to make it certain, this binary
// interposes write(2) (the library is linked statically into it): a write from
// a thread marked with t_hold_writes waits until Run() has returned (or 1 s).
// Everything else passes straight to the system call. Not built under TSan,
// which intercepts write(2) itself.

#include <gtest/gtest.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <thread>

#include "brokers/memory/memory_broker.h"
#include "dedup/buffer.h"
#include "dedup/consumer.h"
#include "dedup/store.h"

namespace {

thread_local bool t_hold_writes = false;
std::atomic<bool> g_run_returned{false};
std::atomic<int> g_held_writes{0};

}  // namespace

extern "C" ssize_t write(int fd, const void* buf, size_t n) {
  if (t_hold_writes) {
    g_held_writes.fetch_add(1);
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(1);
    while (!g_run_returned.load() && std::chrono::steady_clock::now() < until) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  }
  return syscall(SYS_write, fd, buf, n);
}

namespace dedup {
namespace {

using namespace std::chrono_literals;

TEST(ConsumerStop, RunDoesNotReturnWhileStopStillUsesTheConsumer) {
  MemoryBroker broker;
  broker.Publish("a", "p");
  std::unique_ptr<MemorySource> source = broker.Connect();
  auto store = OpenStore("memory:");
  ASSERT_TRUE(store.ok()) << store.status();
  Buffer buffer(store->get());
  ConsumerOptions o;
  o.concurrency = 1;
  o.fetch_wait = 20ms;
  std::atomic<int> ran{0};
  auto made = Consumer::Make(source.get(), &buffer, [&](const Delivery&, ClaimGuard&) {
    ++ran;
    return HandlerResult::Done();
  }, o);
  ASSERT_TRUE(made.ok()) << made.status();
  Consumer* c = made->get();

  std::atomic<bool> stop_returned{false};
  bool stop_inside_at_return = false;
  Status run_status;
  std::thread run([&] {
    run_status = c->Run();
    // Where a caller would destroy the Consumer.
    stop_inside_at_return = !stop_returned.load();
    g_run_returned.store(true);
  });
  for (auto until = std::chrono::steady_clock::now() + 10s;
       ran.load() == 0 && std::chrono::steady_clock::now() < until;) {
    std::this_thread::sleep_for(5ms);
  }
  ASSERT_EQ(ran.load(), 1);
  std::thread stopper([&] {
    t_hold_writes = true;
    c->Stop();
    t_hold_writes = false;
    stop_returned.store(true);
  });
  stopper.join();
  run.join();
  EXPECT_TRUE(run_status.ok()) << run_status;
  EXPECT_EQ(g_held_writes.load(), 1) << "Stop() wakes the drain with one write";
  EXPECT_FALSE(stop_inside_at_return)
      << "Run() returned while Stop() was still inside the Consumer (its eventfd write "
         "pending): a caller that destroys the Consumer once Run() returned makes Stop() "
         "read freed memory and write to a closed or reused fd";
}

}  // namespace
}  // namespace dedup
