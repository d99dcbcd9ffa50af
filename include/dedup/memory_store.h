// Copyright dedup authors. Licensed under the Apache License 2.0.
//
// The memory store keeps records in this process only: they are lost when the
// process exits. It is the reference the other stores are checked against, and the
// store for tests and for workers whose broker itself is process-local.
//
// Records live in independently locked shards, so that threads working on
// different keys rarely contend. Records past their retention are reclaimed a few
// at a time by the operations themselves (no background thread, no full sweep);
// until then they answer as absent. A shard past about 32 768 records asks the
// kernel for transparent huge pages (MADV_HUGEPAGE) for its table and records, so
// its RSS grows in steps of 2 MiB; with THP off nothing changes.

#ifndef DEDUP_MEMORY_STORE_H_
#define DEDUP_MEMORY_STORE_H_

#include <cstddef>
#include <memory>

#include "dedup/clock.h"
#include "dedup/store.h"

namespace dedup {

inline constexpr size_t kMaxMemoryShards = 65536;

struct MemoryStoreOptions {
  // Number of independently locked shards; rounded up to a power of two.
  // 0 counts as 1 and anything above kMaxMemoryShards as kMaxMemoryShards (this
  // factory cannot return an error; the URI memory:?shards=N refuses both).
  // Default: 64.
  size_t shards = 64;
  // At most this many expired records are reclaimed by each operation, from the
  // shard it touches. Default: 4.
  size_t reclaim_per_operation = 4;
  // Decides leases and retention. Not owned. Default: Clock::System().
  Clock* clock = nullptr;
};

std::unique_ptr<Store> NewMemoryStore(const MemoryStoreOptions& options = {});

}  // namespace dedup

#endif  // DEDUP_MEMORY_STORE_H_
