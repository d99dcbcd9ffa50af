// Copyright dedup authors. Licensed under the Apache License 2.0.
//
// The baseline of the `dedup worker --exec` spawn figure (docs/PERFORMANCE.md,
// scripts/bench_exec_spawn.sh): a plain loop that starts the same command once
// per message with posix_spawn and waits for it, on CONCURRENCY threads, and
// prints the wall time. No stdin, no capture, no supervision, no broker.
// With --supervised the same loop runs each command through HandlerSupervisor
// (src/consumer/handler_process.h) with a small JSON stdin, as the worker does,
// but without broker or store: the supervision's own cost.
//
//   spawn_loop [--supervised] COUNT CONCURRENCY COMMAND [ARGS...]

#include <spawn.h>
#include <sys/wait.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <thread>
#include <string>
#include <vector>

#include "consumer/handler_process.h"

extern char** environ;

int main(int argc, char** argv) {
  const bool supervised = argc > 1 && std::string(argv[1]) == "--supervised";
  if (supervised) --argc, ++argv;
  if (argc < 4) {
    std::fprintf(stderr, "usage: spawn_loop [--supervised] COUNT CONCURRENCY COMMAND [ARGS...]\n");
    return 2;
  }
  const long count = std::atol(argv[1]);
  const int concurrency = std::atoi(argv[2]);
  if (count <= 0 || concurrency <= 0) {
    std::fprintf(stderr, "spawn_loop: COUNT and CONCURRENCY must be positive\n");
    return 2;
  }
  char** cmd = argv + 3;
  std::unique_ptr<dedup::HandlerSupervisor> sup;
  dedup::HandlerCommand hc;
  if (supervised) {
    auto s = dedup::HandlerSupervisor::Start();
    if (!s.ok()) {
      std::fprintf(stderr, "spawn_loop: %s\n", s.status().ToString().c_str());
      return 1;
    }
    sup = std::move(s).value();
    for (char** a = cmd; *a != nullptr; ++a) hc.argv.emplace_back(*a);
    hc.stdin_data = R"({"id":"m1","payload":"x"})";
  }
  std::atomic<long> next{0}, failed{0};
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<std::thread> threads;
  for (int t = 0; t < concurrency; ++t) {
    threads.emplace_back([&] {
      while (next.fetch_add(1) < count) {
        if (sup) {
          auto r = sup->Run(hc);
          if (!r.ok() || r->how != dedup::HandlerExit::How::kExited || r->code != 0) ++failed;
          continue;
        }
        pid_t pid;
        if (posix_spawn(&pid, cmd[0], nullptr, nullptr, cmd, environ) != 0) {
          ++failed;
          continue;
        }
        int status = 0;
        waitpid(pid, &status, 0);
        if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) ++failed;
      }
    });
  }
  for (auto& t : threads) t.join();
  const double s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("%ld spawns in %.3f s: %.0f/s (%ld failed)\n", count, s, count / s, failed.load());
  return failed.load() == 0 ? 0 : 1;
}
