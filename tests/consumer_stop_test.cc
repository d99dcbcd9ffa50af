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
// waits until Run() has returned, the Consumer is being destroyed (its
// semaphore's sem_destroy, also interposed), or 1 s. A sem_destroy of the
// semaphore of a held post records that the Consumer went while a Stop() was
// inside it, and waits (5 s at most) until that Stop() has returned, so that the
// test fails instead of writing to freed memory. Every call passes on to the C
// library's. Not in the sanitizer trees' test lists (TSan intercepts sem_post).

#include <dirent.h>
#include <dlfcn.h>
#include <fcntl.h>
#include <pthread.h>
#include <sched.h>
#include <gtest/gtest.h>
#include <semaphore.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <functional>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "brokers/memory/memory_broker.h"
#include "dedup/buffer.h"
#include "dedup/consumer.h"
#include "dedup/store.h"
#ifdef DEDUP_TEST_WORKER_STOP
#include "dedup/worker.h"
#include "redis/client.h"
#endif

namespace {

thread_local bool t_hold_posts = false;
std::atomic<bool> g_run_returned{false};
std::atomic<int> g_held_posts{0};
std::atomic<sem_t*> g_held_sem{nullptr};            // the semaphore of the post held now
std::atomic<bool> g_destroyed_while_held{false};    // its sem_destroy came meanwhile
std::atomic<bool> g_stop_returned{false};           // the held Stop() has returned

// Sleeps in 1 ms steps until done() or at_most has passed.
template <typename Done>
void WaitUntil(Done done, std::chrono::milliseconds at_most) {
  const auto until = std::chrono::steady_clock::now() + at_most;
  while (!done() && std::chrono::steady_clock::now() < until) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

}  // namespace

// A post from a thread marked with t_hold_until_let_go waits (sleeping) until
// g_let_go, or 5 s (DetachLetsALowerPriorityStopFinish).
thread_local bool t_hold_until_let_go = false;
std::atomic<bool> g_let_go{false};

extern "C" int sem_post(sem_t* sem) {
  using Post = int (*)(sem_t*);
  static const Post real = reinterpret_cast<Post>(dlsym(RTLD_NEXT, "sem_post"));
  if (t_hold_until_let_go) {
    g_held_posts.fetch_add(1);
    WaitUntil([] { return g_let_go.load(); }, std::chrono::seconds(5));
  }
  if (t_hold_posts) {
    g_held_posts.fetch_add(1);
    g_held_sem.store(sem);
    WaitUntil([] { return g_run_returned.load() || g_destroyed_while_held.load(); },
              std::chrono::seconds(1));
    g_held_sem.store(nullptr);
  }
  return real(sem);
}

extern "C" int sem_destroy(sem_t* sem) {
  using Destroy = int (*)(sem_t*);
  static const Destroy real = reinterpret_cast<Destroy>(dlsym(RTLD_NEXT, "sem_destroy"));
  if (sem != nullptr && g_held_sem.load() == sem) {
    g_destroyed_while_held.store(true);
    WaitUntil([] { return g_stop_returned.load(); }, std::chrono::seconds(5));
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
  WaitUntil([&] { return ran.load() != 0; }, 10s);
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

// Runs `f` on a thread of SCHED_FIFO `priority` bound to `cpu`; false (and the
// thread not started) when this process may not use SCHED_FIFO.
bool StartFifo(std::thread* t, int cpu, int priority, std::function<void()> f) {
  std::atomic<int> ready{0};  // 1: running as asked, -1: could not
  *t = std::thread([&ready, cpu, priority, f = std::move(f)] {
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(cpu, &set);
    sched_param sp{};
    sp.sched_priority = priority;
    if (pthread_setaffinity_np(pthread_self(), sizeof(set), &set) != 0 ||
        pthread_setschedparam(pthread_self(), SCHED_FIFO, &sp) != 0) {
      ready = -1;
      return;
    }
    ready = 1;
    f();
  });
  while (ready.load() == 0) std::this_thread::sleep_for(1ms);
  if (ready.load() < 0) {
    t->join();
    return false;
  }
  return true;
}

// ConsumerStopper::Detach() waits for a Stop() that is inside the Consumer.
// When the thread in that Stop() has a lower real-time priority on the same
// CPU (a SIGTERM handler on a SCHED_FIFO worker's thread, Detach() on a higher
// one), a wait that only yields the CPU never lets it run: sched_yield() gives
// the CPU to threads of the same priority only. Here the Stop()'s wake-up (its
// sem_post) is held until Detach() has begun waiting, then let go; Detach()
// must return once that Stop() can finish.
TEST(ConsumerStop, DetachLetsALowerPriorityStopFinish) {
  cpu_set_t mine;
  CPU_ZERO(&mine);
  ASSERT_EQ(sched_getaffinity(0, sizeof(mine), &mine), 0);
  std::vector<int> cpus;
  for (int i = 0; i < CPU_SETSIZE; ++i) {
    if (CPU_ISSET(i, &mine)) cpus.push_back(i);
  }
  if (cpus.size() < 2) GTEST_SKIP() << "needs 2 CPUs (one for the watcher)";
  MemoryBroker broker;
  std::unique_ptr<MemorySource> source = broker.Connect();
  auto store = OpenStore("memory:");
  ASSERT_TRUE(store.ok()) << store.status();
  Buffer buffer(store->get());
  auto made = Consumer::Make(source.get(), &buffer,
                             [](const Delivery&, ClaimGuard&) { return HandlerResult::Done(); });
  ASSERT_TRUE(made.ok()) << made.status();
  ConsumerStopper stopper;
  stopper.Attach(made->get());
  g_held_posts = 0;
  g_let_go = false;
  // This thread watches from another CPU.
  cpu_set_t other;
  CPU_ZERO(&other);
  CPU_SET(cpus[1], &other);
  ASSERT_EQ(pthread_setaffinity_np(pthread_self(), sizeof(other), &other), 0);

  std::thread low, high;
  if (!StartFifo(&low, cpus[0], 1, [&] {
        t_hold_until_let_go = true;
        stopper.Stop();
        t_hold_until_let_go = false;
      })) {
    ASSERT_EQ(sched_setaffinity(0, sizeof(mine), &mine), 0);
    GTEST_SKIP() << "SCHED_FIFO not permitted here";
  }
  WaitUntil([] { return g_held_posts.load() == 1; }, 5s);
  ASSERT_EQ(g_held_posts.load(), 1) << "the Stop() did not reach the Consumer";
  std::atomic<bool> detached{false};
  ASSERT_TRUE(StartFifo(&high, cpus[0], 2, [&] {
    stopper.Detach();
    detached = true;
  }));
  std::this_thread::sleep_for(50ms);  // Detach() waits on the CPU it shares with Stop()
  g_let_go = true;                    // the Stop() may finish, given the CPU
  WaitUntil([&] { return detached.load(); }, 3s);
  const bool in_time = detached.load();
  if (!in_time) {
    // Let the Stop() run so that both threads end: Detach()'s thread to SCHED_OTHER.
    sched_param sp{};
    sp.sched_priority = 0;
    pthread_setschedparam(high.native_handle(), SCHED_OTHER, &sp);
  }
  high.join();
  low.join();
  ASSERT_EQ(sched_setaffinity(0, sizeof(mine), &mine), 0);
  EXPECT_TRUE(in_time) << "Detach() did not return within 3 s of the Stop() it waits for "
                          "being able to finish: it kept the CPU from that lower-priority Stop()";
}

#ifdef DEDUP_TEST_WORKER_STOP
// A redis-server on 127.0.0.1:kWorkerStopPort (docs/PORTS.md) in a temporary
// directory; SIGKILLed with this process (parent-death signal), else stopped by PID.
constexpr int kWorkerStopPort = 6515;

class RedisChild {
 public:
  RedisChild() {
    char tmpl[] = "/tmp/dedup_worker_stop.XXXXXX";
    if (mkdtemp(tmpl) == nullptr) return;
    dir_ = tmpl;
    const pid_t parent = getpid();
    pid_ = fork();
    if (pid_ == 0) {
      prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (getppid() != parent) _exit(1);
      const int null = open("/dev/null", O_WRONLY);
      dup2(null, 1);
      dup2(null, 2);
      const std::string port = std::to_string(kWorkerStopPort);
      execlp("redis-server", "redis-server", "--port", port.c_str(), "--bind", "127.0.0.1",
             "--dir", dir_.c_str(), "--save", "", "--appendonly", "no", static_cast<char*>(nullptr));
      _exit(127);
    }
    for (auto until = std::chrono::steady_clock::now() + 5s;
         std::chrono::steady_clock::now() < until; std::this_thread::sleep_for(20ms)) {
      if (Command({"PING"}) == "PONG") {
        up_ = true;
        return;
      }
    }
  }
  ~RedisChild() {
    if (pid_ > 0) {
      kill(pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
    }
    if (!dir_.empty()) std::filesystem::remove_all(dir_);
  }
  bool up() const { return up_; }

  // One command on a connection of its own (the project's Redis client), its
  // reply as text ("" on failure, and for replies that are not text).
  static std::string Command(std::vector<std::string> args) {
    redis::ConnectionOptions o;
    o.endpoints = {{"127.0.0.1", kWorkerStopPort}};
    o.timeout = 1s;
    auto c = redis::Connection::Open(o.endpoints.front(), o);
    if (!c.ok()) return "";
    const redis::Command cmd{std::move(args)};
    const redis::Command* cmds[] = {&cmd};
    std::vector<redis::Reply> replies;
    if (!(*c)->Pipeline(cmds, &replies, "test").ok() || replies.empty()) return "";
    return std::string(redis::ReplyText(replies.front().get()));
  }

 private:
  std::string dir_;
  pid_t pid_ = -1;
  bool up_ = false;
};

// Worker::Stop() may be called twice from any thread (a second SIGTERM): the
// second call finds the Consumer still there (the first one's drain waits for a
// handler), and Run() must not destroy the Consumer while that call is still
// inside it. Here the second Stop()'s wake-up is held (sem_post, above) while the
// handler, seeing it held, returns, so that Run() ends under it.
TEST(WorkerStop, ASecondStopDoesNotOutliveTheConsumer) {
  RedisChild redis;
  if (!redis.up()) GTEST_SKIP() << "no redis-server on 127.0.0.1:" << kWorkerStopPort;
  ASSERT_NE(RedisChild::Command({"XADD", "jobs", "*", "id", "k1"}), "");
  g_run_returned = false;
  g_held_posts = 0;
  WorkerOptions wo;
  wo.port = kWorkerStopPort;
  wo.stream = "jobs";
  wo.group = "g";
  wo.consumer = "w";
  wo.concurrency = 1;
  wo.block = 20ms;
  auto w = Worker::Open(wo);
  ASSERT_TRUE(w.ok()) << w.status();
  Worker* worker = w->get();
  auto store = OpenStore("memory:");
  ASSERT_TRUE(store.ok()) << store.status();
  Buffer buffer(store->get());

  std::atomic<int> ran{0};
  Status run_status;
  std::thread run([&] {
    run_status = worker->Run(&buffer, [&](const StreamMessage&, ClaimGuard&) {
      ++ran;
      // Ends once the second Stop() is inside the Consumer (its post held).
      WaitUntil([] { return g_held_posts.load() != 0; }, 5s);
      return HandlerResult::Done();
    });
    g_run_returned.store(true);  // the Consumer is gone
  });
  WaitUntil([&] { return ran.load() != 0; }, 10s);
  ASSERT_EQ(ran.load(), 1);
  worker->Stop();  // the first: the drain waits for the handler
  std::thread stopper([&] {
    t_hold_posts = true;
    worker->Stop();  // the second
    t_hold_posts = false;
    g_stop_returned.store(true);
  });
  stopper.join();
  run.join();
  EXPECT_TRUE(run_status.ok()) << run_status;
  EXPECT_EQ(g_held_posts.load(), 1) << "the second Stop() reached the Consumer";
  EXPECT_FALSE(g_destroyed_while_held.load())
      << "Worker::Run() destroyed the Consumer while a second Worker::Stop() was still "
         "inside its Stop() (which then writes to the freed Consumer)";
}
#endif  // DEDUP_TEST_WORKER_STOP
}  // namespace
}  // namespace dedup
