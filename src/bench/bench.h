// Copyright dedup authors. Licensed under the Apache License 2.0.
//
// `dedup bench` as a library: bench::Run(options) measures and returns Results;
// the command (src/cli/bench_command.cc) only parses flags and prints them with
// the renderers of render.h.
//
// Adding to the bench, in a file of your own under src/bench/:
//   - contenders of the throughput matrix (a store and its hand-written
//     baseline, interleaved round by round with everything else): write
//     `void AddXContenders(BenchContext&, ContenderGroup&)` and add one line to
//     kContenderSources in registry.cc;
//   - a phase of its own (its own table, JSON and goals): write
//     `void RunX(BenchContext&)` that fills ctx.results (a Section, goals via
//     Results::AddGoal) and add one line to kPhases in registry.cc. A phase that
//     must not share a heap with the others can run in a child process
//     (RunPhaseInChild).

#ifndef DEDUP_BENCH_BENCH_H_
#define DEDUP_BENCH_BENCH_H_

#include <algorithm>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "bench/plan.h"
#include "bench/redis_fixture.h"
#include "bench/results.h"

namespace dedup::bench {

// What a phase gets: the options, the plan, the results to fill, a Redis (when
// redis is true), and a progress line.
struct BenchContext {
  const BenchOptions& options;
  const Plan& plan;
  Results& results;
  std::function<void(const std::string&)> progress;
  bool redis = false;
  RedisTarget redis_target;

  void Say(const std::string& what) const {
    if (progress) progress(what);
  }
  // Once each: a reason met by every worker count is listed once.
  void Skip(const std::string& what) const {
    if (std::find(results.skipped.begin(), results.skipped.end(), what) == results.skipped.end()) {
      results.skipped.push_back(what);
    }
  }
  bool Stop() const { return StopRequested(); }
};

// The contenders of one worker count. Whatever they need (stores, buffers,
// fixtures) is kept alive with Keep() until the worker count is done.
class ContenderGroup {
 public:
  ContenderGroup(int threads, std::vector<std::unique_ptr<Contender>>* out) : threads_(threads), out_(out) {}
  int threads() const { return threads_; }
  Contender& Add(std::string store, std::string label, std::string op, int batch,
                 std::vector<std::string> baselines);
  // The dedup operations (claim, claim+complete at batch 1 and 16, process_once)
  // on stores made by `open` (one per contender; nullptr: leave out).
  void AddStoreOps(const std::string& store, const std::function<std::unique_ptr<Store>()>& open,
                   const std::vector<std::string>& baselines_b1,
                   const std::vector<std::string>& baselines_b16);
  void Keep(std::shared_ptr<void> thing) { keep_.push_back(std::move(thing)); }
  // Drops what Keep() holds, the last kept first (a Buffer before its Store).
  void Release() {
    while (!keep_.empty()) keep_.pop_back();
  }

 private:
  int threads_;
  std::vector<std::unique_ptr<Contender>>* out_;
  std::vector<std::shared_ptr<void>> keep_;
};

using ContenderSource = void (*)(BenchContext&, ContenderGroup&);
using PhaseFn = void (*)(BenchContext&);

struct PhaseEntry {
  const char* name;
  PhaseFn run;
  PhaseFn goals;  // adds its goals; may be nullptr
};

// registry.cc: the tables, in order.
const std::vector<std::pair<const char*, ContenderSource>>& ContenderSources();
const std::vector<PhaseEntry>& Phases();  // run order, and the order of their goals

// Measures everything the options ask for. `progress` gets one-line updates.
Results Run(const BenchOptions& options, std::function<void(const std::string&)> progress);

// The built-in phases and contender sources (one file each).
void AddMemoryContenders(BenchContext&, ContenderGroup&);
void AddRocksDBContenders(BenchContext&, ContenderGroup&);
void AddRedisContenders(BenchContext&, ContenderGroup&);
void RunMemoryPerRecord(BenchContext&);
void RunThroughput(BenchContext&);
void ThroughputGoals(BenchContext&);
void RunRetained(BenchContext&);
void RetainedGoals(BenchContext&);
void RunMemoryStall(BenchContext&);
void MemoryStallGoals(BenchContext&);
void RunPostgres(BenchContext&);  // postgres_phase.cc
// The Consumer's worker rows (consumer_bench.cc).
void RunConsumerRows(BenchContext&);
void ConsumerRowsGoals(BenchContext&);
void RunBrokerConsumers(BenchContext&);  // broker_consumers.cc
// The --exec spawn row (exec_spawn.cc).
void RunExecSpawn(BenchContext&);
void ExecSpawnGoals(BenchContext&);
// Its plot, bench_brokers.png in `dir`, from its section's data; what could not
// be drawn.
std::vector<std::string> PlotBrokerConsumers(const json& data, const std::string& dir,
                                             const std::string& mode);
void RunHttp(BenchContext&);             // http_phase.cc, only with DEDUP_BENCH_HTTP (dedup serve)
void HttpGoals(BenchContext&);

}  // namespace dedup::bench

#endif  // DEDUP_BENCH_BENCH_H_
