// Copyright dedup authors. Licensed under the Apache License 2.0.
//
// Memory per retained record: process RSS growth (memory store), SST bytes after
// a full compaction (RocksDB store), INFO used_memory growth (Redis store), each
// next to the hand-written baseline's.

#include <malloc.h>

#include <thread>
#include <unordered_map>

#include "bench/bench.h"
#include "bench/rocksdb_fixture.h"
#include "dedup/memory_store.h"

namespace dedup::bench {

using namespace std::chrono_literals;

void RunMemoryPerRecord(BenchContext& ctx) {
  auto fill_store = [](Store* s, uint64_t n, uint64_t first, bool complete) -> uint64_t {
    uint64_t errors = 0;
    std::vector<std::string> keys(1000);
    std::vector<ClaimRequest> reqs(1000);
    for (uint64_t at = 0; at < n && !StopRequested(); at += 1000) {
      const size_t m = static_cast<size_t>(std::min<uint64_t>(1000, n - at));
      for (size_t i = 0; i < m; ++i) {
        keys[i] = TaskKey(first + at + i);
        reqs[i] = BenchClaim(keys[i]);
      }
      auto r = s->ClaimBatch(std::span(reqs.data(), m));
      if (!r.ok()) {
        errors += m;
        continue;
      }
      if (!complete) continue;
      for (size_t i = 0; i < m; ++i) {
        auto c = s->Complete(keys[i], (*r)[i].token, 600s, CompletionStatus::kOk, "");
        if (!c.ok()) ++errors;
      }
    }
    return errors;
  };
  for (uint64_t n : ctx.plan.memory_records) {
    if (ctx.Stop()) return;
    ctx.Say("memory per record: memory store, " + Rate(static_cast<double>(n)) + " records");
    {
      malloc_trim(0);
      const long before = RssBytes();
      auto s = NewMemoryStore();
      const uint64_t e = fill_store(s.get(), n, NextKeyBlock(), true);
      const long after = RssBytes();
      malloc_trim(0);
      const long before_b = RssBytes();
      {
        std::unordered_map<std::string, int> m;
        const uint64_t base = NextKeyBlock();
        for (uint64_t i = 0; i < n; ++i) m.try_emplace(TaskKey(base + i), 1);
        const long after_b = RssBytes();
        ctx.results.memory.push_back(
            {{"store", "memory"},
             {"records", n},
             {"measure", "process RSS growth"},
             {"bytes_per_record", static_cast<double>(after - before) / static_cast<double>(n)},
             {"baseline", "unordered_map<string,int>"},
             {"baseline_bytes_per_record", static_cast<double>(after_b - before_b) / static_cast<double>(n)},
             {"errors", e}});
      }
      s.reset();
      malloc_trim(0);
    }
#ifdef DEDUP_WITH_ROCKSDB
    if (!ctx.options.no_rocksdb && !ctx.Stop()) {
      ctx.Say("memory per record: rocksdb store, " + Rate(static_cast<double>(n)) + " records");
      std::string error;
      auto r = OwnRocks::Open(&error);
      auto b = RocksBaseline::Open(&error);
      if (r && b) {
        const uint64_t e = fill_store(r->store.get(), n, NextKeyBlock(), true);
        (void)r->store->CompactNow();
        const uint64_t base = NextKeyBlock();
        for (uint64_t i = 0; i < n; ++i) b->Claim(TaskKey(base + i));
        (void)b->db->Flush(rocksdb::FlushOptions());
        (void)b->db->CompactRange(rocksdb::CompactRangeOptions(), nullptr, nullptr);
        ctx.results.memory.push_back(
            {{"store", "rocksdb"},
             {"records", n},
             {"measure", "SST bytes on disk after flush + full compaction"},
             {"bytes_per_record", static_cast<double>(DirBytes(r->dir, ".sst")) / static_cast<double>(n)},
             {"dir_bytes", DirBytes(r->dir)},
             {"baseline", "RocksDB Get+Put, value 42 bytes"},
             {"baseline_bytes_per_record",
              static_cast<double>(DirBytes(b->dir, ".sst")) / static_cast<double>(n)},
             {"errors", e}});
      } else {
        ctx.Skip("rocksdb memory per record: " + error);
      }
    }
#endif
  }
#ifdef DEDUP_WITH_REDIS
  if (!ctx.redis) return;
  if (!ctx.redis_target.own) {
    ctx.Skip(
        "redis memory per record: only on a server this command starts (it writes up to 1M keys "
        "and FLUSHALLs)");
    return;
  }
  for (uint64_t n : ctx.plan.redis_memory_records) {
    if (ctx.Stop()) return;
    ctx.Say("memory per record: redis store, " + Rate(static_cast<double>(n)) + " records");
    RedisConn c(ctx.redis_target);
    c.Command({"FLUSHALL"});
    const long long before = c.InfoField("memory", "used_memory");
    auto s = OpenStore(ctx.redis_target.Uri("prefix=&pool=4"), QuietOpen());
    if (!s.ok()) {
      ctx.Skip("redis memory per record: " + s.status().ToString());
      return;
    }
    // Four threads fill; each ClaimBatch is one pipeline.
    std::atomic<uint64_t> errors{0};
    const uint64_t base = NextKeyBlock();
    std::vector<std::thread> ts;
    for (int t = 0; t < 4; ++t) {
      ts.emplace_back([&, t] {
        const uint64_t per = n / 4 + (static_cast<uint64_t>(t) < n % 4 ? 1 : 0);
        uint64_t first = base + static_cast<uint64_t>(t) * 25'000'000ULL;
        errors += [&] {
          // fill_store with 64-deep pipelines.
          uint64_t e = 0;
          std::vector<std::string> keys(64);
          std::vector<ClaimRequest> reqs(64);
          for (uint64_t at = 0; at < per && !StopRequested(); at += 64) {
            const size_t m = static_cast<size_t>(std::min<uint64_t>(64, per - at));
            for (size_t i = 0; i < m; ++i) {
              keys[i] = TaskKey(first + at + i);
              reqs[i] = BenchClaim(keys[i]);
            }
            auto r = (*s)->ClaimBatch(std::span(reqs.data(), m));
            if (!r.ok()) {
              e += m;
              continue;
            }
            for (size_t i = 0; i < m; ++i) {
              auto w = (*s)->Complete(keys[i], (*r)[i].token, 600s, CompletionStatus::kOk, "");
              if (!w.ok()) ++e;
            }
          }
          return e;
        }();
      });
    }
    for (auto& t : ts) t.join();
    const long long after = c.InfoField("memory", "used_memory");
    c.Command({"FLUSHALL"});
    const long long before_b = c.InfoField("memory", "used_memory");
    const uint64_t bbase = NextKeyBlock();
    uint64_t berr = 0;
    for (uint64_t at = 0; at < n; at += 1000) {
      std::vector<std::vector<std::string>> cmds;
      for (uint64_t i = at; i < std::min<uint64_t>(n, at + 1000); ++i) {
        cmds.push_back({"SET", TaskKey(bbase + i), "processing", "NX", "EX", "600"});
      }
      berr += c.Pipeline(cmds);
    }
    const long long after_b = c.InfoField("memory", "used_memory");
    c.Command({"FLUSHALL"});
    ctx.results.memory.push_back(
        {{"store", "redis"},
         {"records", n},
         {"measure", "INFO memory used_memory growth"},
         {"bytes_per_record", static_cast<double>(after - before) / static_cast<double>(n)},
         {"baseline", "SET task_id:<id> processing NX EX 600"},
         {"baseline_bytes_per_record", static_cast<double>(after_b - before_b) / static_cast<double>(n)},
         {"errors", errors.load() + berr}});
  }
#endif
}

}  // namespace dedup::bench
