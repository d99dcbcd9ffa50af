// Copyright dedup authors. Licensed under the Apache License 2.0.

#ifndef DEDUP_SRC_STORES_MEMORY_MEMORY_STORE_INTERNAL_H_
#define DEDUP_SRC_STORES_MEMORY_MEMORY_STORE_INTERNAL_H_

#include <cstddef>

#include "dedup/store.h"

namespace dedup::internal {

// Records physically held by a store made by NewMemoryStore, expired or not (for
// tests of reclamation). Returns 0 for any other store.
size_t MemoryStorePhysicalRecords(Store* store);

}  // namespace dedup::internal

#endif  // DEDUP_SRC_STORES_MEMORY_MEMORY_STORE_INTERNAL_H_
