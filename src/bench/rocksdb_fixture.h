// Copyright dedup authors. Licensed under the Apache License 2.0.
//
// RocksDB for the bench: the hand-written baseline (Get, then Put if absent) and
// a RocksDB store of our own in a temporary directory.

#ifndef DEDUP_BENCH_ROCKSDB_FIXTURE_H_
#define DEDUP_BENCH_ROCKSDB_FIXTURE_H_

#ifdef DEDUP_WITH_ROCKSDB
#include <rocksdb/db.h>
#include <rocksdb/filter_policy.h>
#include <rocksdb/table.h>

#include <filesystem>
#include <memory>
#include <string>

#include "bench/util.h"
#include "dedup/rocksdb_store.h"

namespace dedup::bench {

// The RocksDB baseline: the claim a user writes by hand. Get; if absent, Put.
// Bloom filters on, WAL on and not synced (as the store's default), own directory.
// Not even atomic across threads (no lock): the most generous baseline.
struct RocksBaseline {
  std::string dir;
  std::unique_ptr<rocksdb::DB> db;
  rocksdb::WriteOptions wo;
  static std::unique_ptr<RocksBaseline> Open(std::string* error) {
    auto b = std::make_unique<RocksBaseline>();
    b->dir = MakeTempDir("rocksdb-baseline");
    rocksdb::Options o;
    o.create_if_missing = true;
    rocksdb::BlockBasedTableOptions t;
    t.filter_policy.reset(rocksdb::NewBloomFilterPolicy(10));
    t.whole_key_filtering = true;
    o.table_factory.reset(rocksdb::NewBlockBasedTableFactory(t));
    o.memtable_prefix_bloom_size_ratio = 0.05;
    o.memtable_whole_key_filtering = true;
    rocksdb::DB* db = nullptr;
    rocksdb::Status s = rocksdb::DB::Open(o, b->dir, &db);
    if (!s.ok()) {
      *error = "baseline rocksdb: " + s.ToString();
      return nullptr;
    }
    b->db.reset(db);
    b->wo.sync = false;
    b->wo.disableWAL = false;
    return b;
  }
  bool Claim(const std::string& key) {
    std::string v;
    rocksdb::Status s = db->Get(rocksdb::ReadOptions(), key, &v);
    if (s.ok()) return false;  // exists: someone else's
    if (!s.IsNotFound()) return false;
    // state, token, deadline: about what a hand-written record holds.
    return db->Put(wo, key, "processing:0123456789abcdef:1700000000000").ok();
  }
  ~RocksBaseline() {
    db.reset();
    std::error_code ec;
    if (!dir.empty()) std::filesystem::remove_all(dir, ec);
  }
};

struct OwnRocks {
  std::string dir;
  std::unique_ptr<RocksDBStore> store;
  static std::unique_ptr<OwnRocks> Open(std::string* error) {
    auto r = std::make_unique<OwnRocks>();
    r->dir = MakeTempDir("rocksdb");
    RocksDBStoreOptions o;
    o.path = r->dir;
    o.sync = SyncMode::kNone;  // WAL on, not synced: the store's default
    auto s = RocksDBStore::Open(o);
    if (!s.ok()) {
      *error = s.status().ToString();
      return nullptr;
    }
    r->store = std::move(s).value();
    return r;
  }
  ~OwnRocks() {
    store.reset();
    std::error_code ec;
    if (!dir.empty()) std::filesystem::remove_all(dir, ec);
  }
};

}  // namespace dedup::bench
#endif  // DEDUP_WITH_ROCKSDB

#endif  // DEDUP_BENCH_ROCKSDB_FIXTURE_H_
