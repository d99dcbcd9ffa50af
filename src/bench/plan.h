// Copyright dedup authors. Licensed under the Apache License 2.0.
//
// What a `dedup bench` run measures: the options a command sets, and the plan
// (worker counts, rounds, record counts) that --quick / default / --full pick.

#ifndef DEDUP_BENCH_PLAN_H_
#define DEDUP_BENCH_PLAN_H_

#include <cstdint>
#include <string>
#include <vector>

namespace dedup::bench {

struct BenchOptions {
  bool quick = false, full = false;
  bool no_redis = false, no_rocksdb = false, no_worker = false;
  std::string redis_uri;  // empty: start a redis-server of our own
  std::vector<int> workers;
  int rounds = 0;      // 0: the plan's
  double round_s = 0;  // 0: the plan's
  // Run only these phases (names from registry.cc); empty: all.
  std::vector<std::string> only;
  std::string command_line;  // as the reader should see it (no password)
};

struct Plan {
  std::vector<int> workers;
  int rounds;
  double round_s;
  std::vector<uint64_t> memory_records;  // memory + rocksdb
  std::vector<uint64_t> redis_memory_records;
  std::vector<uint64_t> retained_levels;
  double retained_window_s;
  int retained_windows;
  uint64_t worker_messages;
  int worker_rounds;
  std::string mode;
};

Plan MakePlan(const BenchOptions& o);

}  // namespace dedup::bench

#endif  // DEDUP_BENCH_PLAN_H_
