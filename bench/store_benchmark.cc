// Copyright dedup authors. Licensed under the Apache License 2.0.
//
// Claim and claim+complete per store, on fresh keys (the common case: a message
// seen for the first time), at 1 and 2 threads, next to the simplest baseline a
// user might write for the memory case: std::unordered_map under one mutex.
//
//   build/bench/store_benchmark --benchmark_min_time=1
//
// Figures and the command that produced them are in docs/BENCHMARKS.md.

#include <benchmark/benchmark.h>

#include <atomic>
#include <cstdlib>
#include <filesystem>
#include <mutex>
#include <string>
#include <unordered_map>

#include "dedup/memory_store.h"
#include "dedup/store.h"
#ifdef DEDUP_WITH_ROCKSDB
#include "dedup/rocksdb_store.h"
#include "rocksdb/db.h"
#include "rocksdb/filter_policy.h"
#include "rocksdb/table.h"
#endif

namespace {

using namespace std::chrono_literals;

std::atomic<uint64_t> g_next_key{0};

std::string NextKey() {
  return "msg:" + std::to_string(g_next_key.fetch_add(1, std::memory_order_relaxed));
}

// One store per benchmark run, shared by its threads.
struct SharedStore {
  std::mutex mu;
  std::unique_ptr<dedup::Store> store;
  std::string dir;
  int users = 0;
};

SharedStore g_shared;

dedup::Store* Acquire(const std::string& kind) {
  std::lock_guard lock(g_shared.mu);
  if (g_shared.users++ == 0) {
    if (kind == "memory") {
      g_shared.store = dedup::NewMemoryStore();
    }
#ifdef DEDUP_WITH_ROCKSDB
    if (kind.starts_with("rocksdb")) {
      char tmpl[] = "/tmp/dedup-bench-XXXXXX";
      g_shared.dir = mkdtemp(tmpl);
      dedup::RocksDBStoreOptions o;
      o.path = g_shared.dir;
      o.sync = kind == "rocksdb_sync" ? dedup::SyncMode::kAlways : dedup::SyncMode::kNone;
      auto s = dedup::RocksDBStore::Open(o);
      if (!s.ok()) std::abort();
      g_shared.store = std::move(s).value();
    }
#endif
  }
  return g_shared.store.get();
}

void Release() {
  std::lock_guard lock(g_shared.mu);
  if (--g_shared.users == 0) {
    g_shared.store.reset();
    if (!g_shared.dir.empty()) std::filesystem::remove_all(g_shared.dir);
    g_shared.dir.clear();
  }
}

void Claim(benchmark::State& state, const std::string& kind, bool complete) {
  dedup::Store* store = Acquire(kind);
  dedup::ClaimRequest req;
  req.lease = 30s;
  req.retention = 24h;
  for (auto _ : state) {
    std::string key = NextKey();
    req.key = key;
    auto r = store->Claim(req);
    if (!r.ok() || !r->acquired()) state.SkipWithError("claim failed");
    if (complete) {
      auto c = store->Complete(key, r->token, 24h, dedup::CompletionStatus::kOk, "");
      if (!c.ok()) state.SkipWithError("complete failed");
    }
  }
  state.SetItemsProcessed(state.iterations());
  Release();
}

// The baseline: a map of key -> state under one mutex, keys built in the loop.
std::mutex g_map_mu;
std::unordered_map<std::string, int> g_map;

void BM_UnorderedMapMutex(benchmark::State& state) {
  for (auto _ : state) {
    std::string key = NextKey();
    std::lock_guard lock(g_map_mu);
    auto [it, inserted] = g_map.try_emplace(std::move(key), 1);
    benchmark::DoNotOptimize(inserted);
  }
  state.SetItemsProcessed(state.iterations());
  if (state.thread_index() == 0) {
    std::lock_guard lock(g_map_mu);
    g_map.clear();
  }
}

#ifdef DEDUP_WITH_ROCKSDB
// The claim a user would write by hand on RocksDB: Get, then Put if absent, bloom
// filters on, the WAL on and not synced (as the store's default).
struct NaiveRocks {
  std::mutex mu;
  rocksdb::DB* db = nullptr;
  std::string dir;
  int users = 0;
} g_naive;

void BM_RocksDBNaiveGetPut(benchmark::State& state) {
  {
    std::lock_guard lock(g_naive.mu);
    if (g_naive.users++ == 0) {
      char tmpl[] = "/tmp/dedup-bench-naive-XXXXXX";
      g_naive.dir = mkdtemp(tmpl);
      rocksdb::Options o;
      o.create_if_missing = true;
      rocksdb::BlockBasedTableOptions t;
      t.filter_policy.reset(rocksdb::NewBloomFilterPolicy(10));
      o.table_factory.reset(rocksdb::NewBlockBasedTableFactory(t));
      if (!rocksdb::DB::Open(o, g_naive.dir, &g_naive.db).ok()) std::abort();
    }
  }
  rocksdb::WriteOptions wo;
  std::string value;
  for (auto _ : state) {
    std::string key = NextKey();
    rocksdb::Status s = g_naive.db->Get(rocksdb::ReadOptions(), key, &value);
    if (s.IsNotFound()) s = g_naive.db->Put(wo, key, "processing:0123456789abcdef");
    if (!s.ok()) state.SkipWithError("rocksdb failed");
  }
  state.SetItemsProcessed(state.iterations());
  std::lock_guard lock(g_naive.mu);
  if (--g_naive.users == 0) {
    delete g_naive.db;
    g_naive.db = nullptr;
    std::filesystem::remove_all(g_naive.dir);
  }
}
#endif

void BM_MemoryClaim(benchmark::State& s) { Claim(s, "memory", false); }
void BM_MemoryClaimComplete(benchmark::State& s) { Claim(s, "memory", true); }
#ifdef DEDUP_WITH_ROCKSDB
void BM_RocksDBClaim(benchmark::State& s) { Claim(s, "rocksdb", false); }
void BM_RocksDBClaimComplete(benchmark::State& s) { Claim(s, "rocksdb", true); }
void BM_RocksDBSyncClaimComplete(benchmark::State& s) { Claim(s, "rocksdb_sync", true); }
#endif

}  // namespace

BENCHMARK(BM_UnorderedMapMutex)->Threads(1)->Threads(2)->UseRealTime();
BENCHMARK(BM_MemoryClaim)->Threads(1)->Threads(2)->UseRealTime();
BENCHMARK(BM_MemoryClaimComplete)->Threads(1)->Threads(2)->UseRealTime();
#ifdef DEDUP_WITH_ROCKSDB
BENCHMARK(BM_RocksDBNaiveGetPut)->Threads(1)->Threads(2)->UseRealTime();
BENCHMARK(BM_RocksDBClaim)->Threads(1)->Threads(2)->UseRealTime();
BENCHMARK(BM_RocksDBClaimComplete)->Threads(1)->Threads(2)->UseRealTime();
BENCHMARK(BM_RocksDBSyncClaimComplete)->Threads(1)->Threads(2)->Threads(8)->UseRealTime();
#endif

BENCHMARK_MAIN();
