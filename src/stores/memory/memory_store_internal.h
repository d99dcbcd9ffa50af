// Copyright dedup authors. Licensed under the Apache License 2.0.

#ifndef DEDUP_SRC_STORES_MEMORY_MEMORY_STORE_INTERNAL_H_
#define DEDUP_SRC_STORES_MEMORY_MEMORY_STORE_INTERNAL_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "dedup/store.h"

namespace dedup::internal {

// Records physically held by a store made by NewMemoryStore, expired or not (for
// tests of reclamation). Returns 0 for any other store.
size_t MemoryStorePhysicalRecords(Store* store);

// What the index tables of a store made by NewMemoryStore did as they grew, over
// all its shards (for tests and `dedup bench`). All zero for any other store.
struct MemoryStoreIndexStats {
  size_t doublings = 0;  // index tables doubled (each shard's first table not counted)
  // The most index entries one operation wrote or moved for a doubling (making
  // the new table's entries empty, moving the old ones into it).
  size_t most_growth_work = 0;
  size_t filling = 0;  // shards making their next table empty now
  size_t moving = 0;   // shards moving entries from their old table now
};
MemoryStoreIndexStats MemoryStoreIndex(Store* store);

// For tests: "" when every shard's index holds each live record exactly once,
// where a lookup of its key finds it (also in the middle of a doubling), and
// nothing else; else what is wrong. "not a memory store" for any other store.
std::string MemoryStoreCheckIndex(Store* store);

// For tests: the hash a store made by NewMemoryStore gives `key` (its low 32
// bits pick the key's home in a shard's index, the top bits its shard), so that
// a test can make keys whose probe runs collide, wrap round a table's end or
// straddle a move's start.
uint64_t MemoryStoreKeyHash(std::string_view key);

}  // namespace dedup::internal

#endif  // DEDUP_SRC_STORES_MEMORY_MEMORY_STORE_INTERNAL_H_
