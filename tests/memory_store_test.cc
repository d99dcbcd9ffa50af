// Copyright dedup authors. Licensed under the Apache License 2.0.
//
// What the memory store does beyond the conformance suite: incremental reclaim.

#include "dedup/memory_store.h"

#include <gtest/gtest.h>

#include "stores/memory/memory_store_internal.h"

namespace dedup {
namespace {

using namespace std::chrono_literals;

TEST(MemoryStore, ExpiredRecordsAreReclaimedByLaterOperations) {
  SimulatedClock clock;
  MemoryStoreOptions o;
  o.clock = &clock;
  o.shards = 1;
  o.reclaim_per_operation = 4;
  auto store = NewMemoryStore(o);
  for (int i = 0; i < 100; ++i) {
    ClaimRequest r;
    std::string key = "old:" + std::to_string(i);
    r.key = key;
    r.lease = 1s;
    r.retention = 1s;
    auto c = store->Claim(r);
    ASSERT_TRUE(c.ok());
    ASSERT_TRUE(store->Complete(key, c->token, 1s, CompletionStatus::kOk, "").ok());
  }
  EXPECT_EQ(internal::MemoryStorePhysicalRecords(store.get()), 100u);
  clock.Advance(10s);
  // Each operation reclaims at most 4: 10 claims leave 100 - 40 expired records.
  for (int i = 0; i < 10; ++i) {
    ClaimRequest r;
    std::string key = "new:" + std::to_string(i);
    r.key = key;
    ASSERT_TRUE(store->Claim(r).ok());
  }
  EXPECT_EQ(internal::MemoryStorePhysicalRecords(store.get()), 60u + 10u);
  for (int i = 10; i < 30; ++i) {
    ClaimRequest r;
    std::string key = "new:" + std::to_string(i);
    r.key = key;
    ASSERT_TRUE(store->Claim(r).ok());
  }
  auto all = store->Scan("", 1000);
  ASSERT_TRUE(all.ok());
  EXPECT_EQ(all->size(), 30u);
  EXPECT_EQ(internal::MemoryStorePhysicalRecords(store.get()), 30u) << "all expired reclaimed";
  // Forget returns false for a reclaimed (or expired) record.
  auto f = store->Forget("old:0");
  ASSERT_TRUE(f.ok());
  EXPECT_FALSE(*f);
}

TEST(MemoryStore, ShardCountIsRoundedUp) {
  MemoryStoreOptions o;
  o.shards = 5;
  auto store = NewMemoryStore(o);
  ClaimRequest r;
  r.key = "x";
  EXPECT_TRUE(store->Claim(r).ok());
}

}  // namespace
}  // namespace dedup
