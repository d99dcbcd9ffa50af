// Copyright dedup authors. Licensed under the Apache License 2.0.
//
// A contender of the throughput matrix: one way to handle a message (a dedup
// operation on a store, or what a user writes by hand), run by N threads in
// short interleaved rounds. See registry.cc for who adds contenders.

#ifndef DEDUP_BENCH_CONTENDER_H_
#define DEDUP_BENCH_CONTENDER_H_

#include <atomic>
#include <cmath>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "bench/util.h"
#include "dedup/buffer.h"
#include "dedup/store.h"

namespace dedup::bench {

// One thread's work: `step(first_key_number)` handles `batch` messages and says
// whether all went as expected.
using Step = std::function<bool(uint64_t)>;

struct RoundResult {
  double rate = NAN;  // messages per second
  uint64_t messages = 0;
  uint64_t errors = 0;
  // RunRound: the wait, after the calls, for the work they left behind (counted in rate).
  double tail_s = 0;
  // Filled by external contenders (redis-benchmark), which keep their own latency.
  double p50_us = NAN, p99_us = NAN;
};

struct Contender {
  std::string id;     // "memory/claim/b1": unique within a worker count
  std::string store;  // memory | rocksdb | redis | ...
  std::string label;  // what a reader sees
  std::string op;     // claim | claim+complete | process_once | baseline
  int batch = 1;
  // Threads per worker: N workers run N x callers threads (on N connections for
  // the Redis store, so that `callers` calls share each connection).
  int callers = 1;
  std::vector<std::string> baselines;  // ids of the contenders it is compared with
  // In-process contenders: a Step per thread, made at the start of each round.
  std::function<Step(int thread)> make_step;
  // External contenders run a round themselves.
  std::function<RoundResult(double seconds, double expected_rate)> external;

  // Results.
  std::vector<double> rates;
  std::vector<double> tails;  // RunRound's tail_s of each round (in-process contenders)
  std::vector<double> ext_p50, ext_p99;
  Hist hist;
  uint64_t errors = 0, messages = 0;
};

// Runs `c` on `threads` x c.callers threads for `seconds`; merges latencies into c.hist.
RoundResult RunInProcess(Contender& c, int threads, double seconds);

// A round of the throughput matrix: RunInProcess, then AwaitQuiet, whose wait is
// counted in the round's time (rate = messages / (seconds + tail_s)). The work a
// round leaves to background threads (a store's writer catching up, a RocksDB
// flush, the claim log's materializer) is that contender's: it ran beside the
// next contender's round before, and slowed it (docs/PERFORMANCE.md, "Merged:
// the A/B": claims of two threads left ~140 ms of materializer and writer work
// after their 200 ms round, which claim+complete's round paid for).
RoundResult RunRound(Contender& c, int threads, double seconds);

// The claim request every store contender makes: lease 60 s, retention 600 s.
ClaimRequest BenchClaim(std::string_view key);

// The op whose claims are completed only after kCompleteLaterDepth more claims
// of the same thread (batch 1): a handler that runs for a while.
inline constexpr char kClaimCompleteLater[] = "claim+complete_later";
inline constexpr size_t kCompleteLaterDepth = 1000;

// Steps of the dedup operations ("claim", "claim+complete", kClaimCompleteLater,
// "process_once") on `store` (and `buffer` for process_once), `batch` keys per step.
std::function<Step(int)> StoreStep(Store* store, Buffer* buffer, const std::string& op, int batch);

// Counts the store calls the Buffer makes: on the Redis store each is one round
// trip (one EVALSHA, or one pipeline for ClaimBatch).
class CountingStore : public StoreWrapper {
 public:
  using StoreWrapper::StoreWrapper;
  StatusOr<ClaimResult> Claim(const ClaimRequest& req) override;
  StatusOr<std::vector<ClaimResult>> ClaimBatch(std::span<const ClaimRequest> reqs) override;
  StatusOr<WriteResult> Extend(std::string_view key, Token token, Millis lease) override;
  StatusOr<WriteResult> Complete(std::string_view key, Token token, Millis retention, CompletionStatus status,
                                 std::string_view result) override;
  StatusOr<WriteResult> Release(std::string_view key, Token token, Millis retention) override;
  std::atomic<uint64_t> calls{0};
};

}  // namespace dedup::bench

#endif  // DEDUP_BENCH_CONTENDER_H_
