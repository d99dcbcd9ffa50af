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
// interposes sem_post(3) (the library is linked statically into it), with which
// Stop() wakes the drain thread: a post from a thread marked with t_hold_posts
// waits until Run() has returned (or 1 s). Every post passes on to the C
// library's. Not in the sanitizer trees' test lists (TSan intercepts sem_post).

#include <dirent.h>
#include <dlfcn.h>
#include <gtest/gtest.h>
#include <semaphore.h>
#include <sys/resource.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "brokers/memory/memory_broker.h"
#include "dedup/buffer.h"
#include "dedup/consumer.h"
#include "dedup/store.h"

namespace {

thread_local bool t_hold_posts = false;
std::atomic<bool> g_run_returned{false};
std::atomic<int> g_held_posts{0};

}  // namespace

extern "C" int sem_post(sem_t* sem) {
  using Post = int (*)(sem_t*);
  static const Post real = reinterpret_cast<Post>(dlsym(RTLD_NEXT, "sem_post"));
  if (t_hold_posts) {
    g_held_posts.fetch_add(1);
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(1);
    while (!g_run_returned.load() && std::chrono::steady_clock::now() < until) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  }
  return real(sem);
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
    t_hold_posts = true;
    c->Stop();
    t_hold_posts = false;
    stop_returned.store(true);
  });
  stopper.join();
  run.join();
  EXPECT_TRUE(run_status.ok()) << run_status;
  EXPECT_EQ(g_held_posts.load(), 1) << "Stop() wakes the drain with one sem_post";
  EXPECT_FALSE(stop_inside_at_return)
      << "Run() returned while Stop() was still inside the Consumer (its wake-up "
         "pending): a caller that destroys the Consumer once Run() returned makes Stop() "
         "read freed memory and write to a closed or reused fd";
}


// The RLIMIT_NOFILE soft limit that leaves exactly `room` descriptor numbers
// free below it (a new descriptor takes the lowest free number below the limit).
rlim_t LimitLeaving(int room) {
  std::set<int> open;
  if (DIR* d = opendir("/proc/self/fd")) {
    while (dirent* e = readdir(d)) {
      if (e->d_name[0] != '.') open.insert(std::stoi(e->d_name));
    }
    closedir(d);
  }
  int fd = 0;
  for (int free = 0;; ++fd) {
    if (open.count(fd) == 0 && ++free == room) break;
  }
  return static_cast<rlim_t>(fd + 1);
}

// `dedup simulate --workers 1024` makes 1024 Consumers at once (src/sim), and
// 1024 is the usual soft limit of open files: a Consumer must not hold a file
// descriptor of its own. With one eventfd each (550caf2), under `ulimit -n 1024`:
// "dedup simulate: INTERNAL: consumer: eventfd: Too many open files".
TEST(ConsumerStop, AConsumerHoldsNoFileDescriptor) {
  MemoryBroker broker;
  std::unique_ptr<MemorySource> source = broker.Connect();
  auto store = OpenStore("memory:");
  ASSERT_TRUE(store.ok()) << store.status();
  Buffer buffer(store->get());
  auto handler = [](const Delivery&, ClaimGuard&) { return HandlerResult::Done(); };
  rlimit old{};
  ASSERT_EQ(getrlimit(RLIMIT_NOFILE, &old), 0);
  rlimit low = old;
  low.rlim_cur = LimitLeaving(16);  // room for 16 more open files
  ASSERT_LE(low.rlim_cur, old.rlim_max);
  ASSERT_EQ(setrlimit(RLIMIT_NOFILE, &low), 0);
  std::vector<std::unique_ptr<Consumer>> consumers;
  std::string failed;
  for (int i = 0; i < 200 && failed.empty(); ++i) {
    auto c = Consumer::Make(source.get(), &buffer, handler);
    if (c.ok()) {
      consumers.push_back(std::move(c).value());
    } else {
      failed = "consumer " + std::to_string(i) + ": " + c.status().ToString();
    }
  }
  ASSERT_EQ(setrlimit(RLIMIT_NOFILE, &old), 0);
  EXPECT_EQ(failed, "") << "200 Consumers with room for 16 more open files";
  EXPECT_EQ(consumers.size(), 200u);
}
}  // namespace
}  // namespace dedup
