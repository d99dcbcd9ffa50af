// Copyright dedup authors. Licensed under the Apache License 2.0.
//
// A round of `dedup bench`'s throughput matrix (bench::RunRound) lasts until the
// work it left to background threads is done: the next contender's round never
// runs beside it, and the wait counts in the round's rate. Before, claims of the
// RocksDB store (claim log) left ~140 ms of materializer and writer work after
// their 200 ms round, which the next contender, claim+complete, paid for
// (docs/PERFORMANCE.md, "Merged: the A/B").

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <thread>

#include "bench/contender.h"

namespace dedup::bench {
namespace {

using namespace std::chrono_literals;

// Background work that every call adds to, as a store's writer: a thread that
// sleeps while there is nothing to do and runs (state R) until `until`, which
// each call moves to 150 ms after itself.
class Leftover {
 public:
  Leftover() : thread_([this] { Loop(); }) {}
  ~Leftover() {
    {
      std::lock_guard l(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }
  void Add() {
    {
      std::lock_guard l(mu_);
      until_ = Clk::now() + 150ms;
    }
    cv_.notify_all();
  }
  // Whether the work added so far is not done yet.
  bool Pending() {
    std::lock_guard l(mu_);
    return Clk::now() < until_;
  }

 private:
  void Loop() {
    std::unique_lock l(mu_);
    while (!stop_) {
      cv_.wait(l, [this] { return stop_ || Clk::now() < until_; });
      while (!stop_ && Clk::now() < until_) {
        l.unlock();
        volatile int spin = 0;
        for (int i = 0; i < 10'000; ++i) spin = spin + i;  // busy, not optimized away
        l.lock();
      }
    }
  }

  std::mutex mu_;
  std::condition_variable cv_;
  Clk::time_point until_{};
  bool stop_ = false;
  std::thread thread_;
};

TEST(BenchRound, TheNextRoundDoesNotRunBesideTheWorkTheLastOneLeft) {
  Leftover leftover;
  Contender leaves;
  leaves.id = "test/leaves_work/b1";
  leaves.make_step = [&](int) -> Step {
    return [&](uint64_t) {
      leftover.Add();
      return true;
    };
  };
  std::atomic<uint64_t> beside{0}, calls{0};
  Contender next;
  next.id = "test/next/b1";
  next.make_step = [&](int) -> Step {
    return [&](uint64_t) {
      calls.fetch_add(1, std::memory_order_relaxed);
      if (leftover.Pending()) beside.fetch_add(1, std::memory_order_relaxed);
      return true;
    };
  };
  constexpr double kRound = 0.05;
  for (int round = 0; round < 3; ++round) {
    const RoundResult a = RunRound(leaves, 2, kRound);
    const RoundResult b = RunRound(next, 2, kRound);
    // The leftover's 150 ms after the last call are the first contender's.
    EXPECT_GE(a.tail_s, 0.1) << "round " << round;
    EXPECT_LE(a.rate, static_cast<double>(a.messages) / (kRound + 0.1)) << "round " << round;
    // Nothing left behind: quiet found, not the wait's bound (1 s) reached.
    EXPECT_LT(b.tail_s, 1.0) << "round " << round;
  }
  EXPECT_GT(calls.load(), 0u);
  EXPECT_EQ(beside.load(), 0u) << "calls of the next contender made while the first one's "
                                  "leftover work was still running";
}

}  // namespace
}  // namespace dedup::bench
