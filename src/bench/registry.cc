// Copyright dedup authors. Licensed under the Apache License 2.0.
//
// Who takes part in `dedup bench`: one line per contender source and per phase.
// Add yours here (see bench.h).

#include "bench/bench.h"

namespace dedup::bench {

const std::vector<std::pair<const char*, ContenderSource>>& ContenderSources() {
  static const std::vector<std::pair<const char*, ContenderSource>> kContenderSources = {
      {"memory", &AddMemoryContenders},
      {"rocksdb", &AddRocksDBContenders},
      {"redis", &AddRedisContenders},
  };
  return kContenderSources;
}

const std::vector<PhaseEntry>& Phases() {
  // Run in this order; their goals are listed in this order too.
  static const std::vector<PhaseEntry> kPhases = {
      // Memory first: RSS growth is cleanest before the heap has been used.
      {"memory_per_record", &RunMemoryPerRecord, nullptr},
      {"throughput", &RunThroughput, &ThroughputGoals},
      {"consumer", &RunConsumerRows, &ConsumerRowsGoals},
      {"broker_consumers", &RunBrokerConsumers, nullptr},  // needs DEDUP_BENCH_AMQP_URI / _NATS_URI
      {"exec_spawn", &RunExecSpawn, &ExecSpawnGoals},
      {"retained", &RunRetained, &RetainedGoals},
      // In a process of its own: its heap history is its own.
      {"memory_stall", &RunMemoryStall, &MemoryStallGoals},
      {"postgres", &RunPostgres, nullptr},  // needs DEDUP_BENCH_POSTGRES_URI
#ifdef DEDUP_BENCH_HTTP
      {"http", &RunHttp, &HttpGoals},  // http_phase.cc, built with `dedup serve`
#endif
  };
  return kPhases;
}

}  // namespace dedup::bench
