// Copyright dedup authors. Licensed under the Apache License 2.0.
//
// The stores the conformance suite runs against. Embedded stores get a simulated
// clock, so "time passes" is instant; server stores (Redis, PostgreSQL) decide time
// on the server, so time passes by really sleeping. Tests therefore only ever say
// `env.Sleep(d)` and use durations that are safe either way: leases that must
// still be valid are long (minutes), leases that must have ended are short and
// followed by a Sleep well past them.
//
// Server stores are included when the test script that started the server sets:
//   DEDUP_TEST_REDIS_URI          e.g. redis://127.0.0.1:6390
//   DEDUP_TEST_REDIS_CLUSTER_URI  e.g. redis+cluster://127.0.0.1:7000
//   DEDUP_TEST_POSTGRES_URI       e.g. postgres://dedup@127.0.0.1:5490/dedup

#ifndef DEDUP_TESTS_STORE_ENVS_H_
#define DEDUP_TESTS_STORE_ENVS_H_

#include <memory>
#include <string>
#include <vector>

#include "dedup/clock.h"
#include "dedup/store.h"

namespace dedup::testing {

class StoreEnv {
 public:
  virtual ~StoreEnv() = default;
  // "memory", "rocksdb", "redis", "redis_cluster", "postgres": a gtest-safe name.
  virtual std::string Name() const = 0;
  // A store with no records in it (a fresh directory, or a fresh key prefix).
  virtual std::unique_ptr<Store> Open() = 0;
  // Lets `d` of the store's clock pass.
  virtual void Sleep(Millis d) = 0;
  // The store's clock, when it is one this process can read (embedded stores).
  virtual Clock* clock() { return nullptr; }
};

// Every store this build and this environment can test, made fresh.
std::vector<std::string> AvailableStoreNames();
std::unique_ptr<StoreEnv> MakeStoreEnv(const std::string& name);

// A new empty directory under $TMPDIR (or /tmp), removed by the caller.
std::string MakeTempDir(const std::string& tag);
void RemoveDir(const std::string& path);

}  // namespace dedup::testing

#endif  // DEDUP_TESTS_STORE_ENVS_H_
