// Copyright dedup authors. Licensed under the Apache License 2.0.
//
// The throughput contenders of the three built-in stores, each next to what a
// user writes by hand: std::unordered_map under one mutex (memory store), Get
// then Put on a plain RocksDB with bloom filters and the WAL on (RocksDB store),
// and the real `redis-benchmark` running the seed's SET task_id:__rand_int__
// processing NX EX 60 at the same connections and pipeline depth (Redis store).

#include <algorithm>
#include <mutex>
#include <unordered_map>

#include "bench/bench.h"
#include "bench/rocksdb_fixture.h"
#include "dedup/memory_store.h"

namespace dedup::bench {

using namespace std::chrono_literals;

Contender& ContenderGroup::Add(std::string store, std::string label, std::string op, int batch,
                               std::vector<std::string> baselines) {
  auto c = std::make_unique<Contender>();
  c->id = store + "/" + op + "/b" + std::to_string(batch);
  c->store = std::move(store);
  c->label = std::move(label);
  c->op = std::move(op);
  c->batch = batch;
  c->baselines = std::move(baselines);
  out_->push_back(std::move(c));
  return *out_->back();
}

void ContenderGroup::AddStoreOps(const std::string& name, const std::function<std::unique_ptr<Store>()>& open,
                                 const std::vector<std::string>& b1, const std::vector<std::string>& b16) {
  BufferOptions bo;
  bo.lease = 60s;
  bo.retention = 600s;
  for (const std::string op : {"claim", "claim+complete", kClaimCompleteLater, "process_once"}) {
    for (int batch : {1, 16}) {
      if ((op == "process_once" || op == kClaimCompleteLater) && batch != 1) continue;
      std::shared_ptr<Store> s = open();
      if (!s) return;
      Keep(s);
      Buffer* bp = nullptr;
      if (op == "process_once") {
        auto b = std::make_shared<Buffer>(s.get(), bo);
        bp = b.get();
        Keep(b);
      }
      std::string label = std::string("dedup ") + (op == "process_once" ? "ProcessOnce"
                                                   : op == kClaimCompleteLater
                                                       ? "claim, complete " +
                                                             std::to_string(kCompleteLaterDepth) +
                                                             " claims later"
                                                       : op);
      if (batch > 1) label += " (ClaimBatch " + std::to_string(batch) + ")";
      Contender& c = Add(name, label, op, batch, batch == 1 ? b1 : b16);
      c.make_step = StoreStep(s.get(), bp, op, batch);
    }
  }
}

namespace {
// The memory baseline: key -> state in one std::unordered_map under one mutex.
struct MapBaseline {
  std::mutex mu;
  std::unordered_map<std::string, int> map;
};
}  // namespace

void AddMemoryContenders(BenchContext&, ContenderGroup& g) {
  auto map = std::make_shared<MapBaseline>();
  Contender& b = g.Add("memory", "unordered_map + mutex", "baseline", 1, {});
  b.make_step = [map](int) -> Step {
    return [map](uint64_t k) {
      std::string key = TaskKey(k);
      std::lock_guard lock(map->mu);
      return map->map.try_emplace(std::move(key), 1).second;
    };
  };
  g.AddStoreOps("memory", [] { return NewMemoryStore(); }, {"memory/baseline/b1"}, {"memory/baseline/b1"});
}

void AddRocksDBContenders(BenchContext& ctx, ContenderGroup& g) {
#ifdef DEDUP_WITH_ROCKSDB
  if (ctx.options.no_rocksdb) return;
  std::string error;
  std::shared_ptr<RocksBaseline> rb = RocksBaseline::Open(&error);
  if (!rb) {
    ctx.Skip("rocksdb baseline: " + error);
  } else {
    g.Keep(rb);
    Contender& b = g.Add("rocksdb", "RocksDB Get, then Put if absent", "baseline", 1, {});
    b.make_step = [rb](int) -> Step { return [rb](uint64_t k) { return rb->Claim(TaskKey(k)); }; };
  }
  std::vector<std::string> vs = {"rocksdb/baseline/b1"};
  if (ctx.redis) vs.push_back("redis/baseline/b1");
  g.AddStoreOps(
      "rocksdb",
      [&]() -> std::unique_ptr<Store> {
        std::string e;
        std::shared_ptr<OwnRocks> r = OwnRocks::Open(&e);
        if (!r) {
          ctx.Skip("rocksdb store: " + e);
          return nullptr;
        }
        // The Store is borrowed from OwnRocks, which owns the directory.
        struct Borrowed : StoreWrapper {
          using StoreWrapper::StoreWrapper;
        };
        auto s = std::make_unique<Borrowed>(r->store.get());
        g.Keep(r);
        return s;
      },
      vs, vs);
#else
  if (g.threads() == ctx.plan.workers.front())
    ctx.Skip("rocksdb store: not compiled in (DEDUP_WITH_ROCKSDB=OFF)");
#endif
}

void AddRedisContenders(BenchContext& ctx, ContenderGroup& g) {
#ifdef DEDUP_WITH_REDIS
  if (!ctx.redis) return;
  const RedisTarget t = ctx.redis_target;
  const int threads = g.threads();
  // redis-benchmark takes a password only on its command line, which ps shows to
  // every user: not given one that was kept off the command line.
  if (t.password_off_command_line) {
    ctx.Skip("redis-benchmark baseline: the password came from password_file= or "
             "DEDUP_REDIS_PASSWORD, and redis-benchmark takes one only on its command line, "
             "which ps shows to every user");
  }
  for (int depth : {1, 16}) {
    if (t.password_off_command_line) break;
    Contender& b =
        g.Add("redis", "redis-benchmark SET NX EX (-P " + std::to_string(depth) + ")", "baseline", depth, {});
    b.external = [t, threads, depth](double seconds, double expected) {
      const double guess = std::isfinite(expected) ? expected : 20'000.0 * depth;
      const uint64_t n = static_cast<uint64_t>(std::clamp(guess * seconds, 1000.0 * depth, 50'000'000.0));
      return RunRedisBenchmark(t, threads, depth, n);
    };
  }
  const std::string uri = t.Uri("prefix=&pool=" + std::to_string(threads));
  g.AddStoreOps("redis",
                [&]() -> std::unique_ptr<Store> {
                  auto s = OpenStore(uri, QuietOpen());
                  if (!s.ok()) {
                    ctx.Skip("redis store: " + s.status().ToString());
                    return nullptr;
                  }
                  return std::move(s).value();
                },
                {"redis/baseline/b1"}, {"redis/baseline/b16"});
  // Depth 1 with spin=50: each caller polls its socket up to 50 us for the reply
  // before it sleeps in recv (docs/PERFORMANCE.md, "Depth 1: polling for the
  // reply"), next to the default row (spin=0), so that one run shows what it does.
  if (auto s = OpenStore(uri + "&spin=50", QuietOpen()); s.ok()) {
    std::shared_ptr<Store> store = std::move(s).value();
    g.Keep(store);
    Contender& c = g.Add("redis", "dedup claim (spin=50: reply spin)", "claim", 1, {"redis/baseline/b1"});
    c.id = "redis/claim/spin50";
    c.make_step = StoreStep(store.get(), nullptr, "claim", 1);
  }
  // Depth 16 with single claims: 16 threads per connection calling Claim(), whose
  // calls share round trips on the auto-pipelined connections, next to -P 16.
  if (auto s = OpenStore(uri, QuietOpen()); s.ok()) {
    std::shared_ptr<Store> store = std::move(s).value();
    g.Keep(store);
    Contender& c = g.Add("redis", "dedup claim (16 callers per connection)", "claim", 1, {"redis/baseline/b16"});
    c.id = "redis/claim/c16";
    c.callers = 16;
    c.make_step = StoreStep(store.get(), nullptr, "claim", 1);
  }
#else
  (void)ctx;
  (void)g;
#endif
}

}  // namespace dedup::bench
