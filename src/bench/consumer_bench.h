// Copyright dedup authors. Licensed under the Apache License 2.0.
//
// The worker rows of `dedup bench`: the Consumer on a Redis stream with a no-op
// in-process handler, with dedup (a Buffer on the Redis store of the stream's own
// server, where completion and XACK fuse; a Buffer on a RocksDB store) against
// the same Consumer acking without any guard. Contenders run interleaved in
// rounds on fresh streams; the ratio to the baseline is taken per round and the
// median reported. Store round trips are counted by a StoreWrapper (which keeps
// the fused path: Store capabilities are forwarded), server commands by INFO.

#ifndef DEDUP_SRC_BENCH_CONSUMER_BENCH_H_
#define DEDUP_SRC_BENCH_CONSUMER_BENCH_H_

#include <cstdint>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>

namespace dedup::bench {

struct ConsumerBenchOptions {
  // The Redis server of the stream (and of the Redis store). Required.
  std::string host = "127.0.0.1";
  int port = 0;
  std::string user, password;
  // Messages per round and contender. Default: 20000.
  uint64_t messages = 20'000;
  // Rounds (each runs every contender once). Default: 3.
  int rounds = 3;
  // Consumer concurrency. Default: 8.
  int concurrency = 8;
  // Directory for the RocksDB store's files (a fresh subdirectory is made and
  // removed). Empty: no RocksDB row.
  std::string scratch_dir;
  std::function<void(const std::string&)> progress;
  std::function<bool()> stop;
};

// The rows as JSON: {"concurrency", "messages_per_round", "rows": [{"id",
// "label", "msgs_per_s", "ratio", "dedup_cost", "commands_per_msg",
// "store_round_trips_per_msg", "rounds", "errors"}], plus the keys the goals read:
// "redis_dedup_cost", "rocksdb_dedup_cost", "store_round_trips_per_msg"}.
nlohmann::json RunConsumerBench(const ConsumerBenchOptions& options);

// The rows as a Markdown section.
std::string ConsumerBenchMarkdown(const nlohmann::json& result);

}  // namespace dedup::bench

#endif  // DEDUP_SRC_BENCH_CONSUMER_BENCH_H_
