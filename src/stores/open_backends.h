// Copyright dedup authors. Licensed under the Apache License 2.0.
//
// Each optional backend's URI entry point, called by OpenStore (core/open_store.cc)
// when the backend is compiled in.

#ifndef DEDUP_SRC_STORES_OPEN_BACKENDS_H_
#define DEDUP_SRC_STORES_OPEN_BACKENDS_H_

#include <memory>
#include <string_view>

#include "core/uri.h"
#include "dedup/store.h"

namespace dedup::internal {

#ifdef DEDUP_WITH_ROCKSDB
// rocksdb:PATH[?sync=none|always|interval[:MS]]
StatusOr<std::unique_ptr<Store>> OpenRocksDBFromUri(const Uri& uri, const OpenOptions& options);
#endif
#ifdef DEDUP_WITH_REDIS
StatusOr<std::unique_ptr<Store>> OpenRedisFromUri(const Uri& uri, const OpenOptions& options);
#endif
#ifdef DEDUP_WITH_POSTGRES
StatusOr<std::unique_ptr<Store>> OpenPostgresFromUri(const Uri& uri, std::string_view raw,
                                                     const OpenOptions& options);
#endif

}  // namespace dedup::internal

#endif  // DEDUP_SRC_STORES_OPEN_BACKENDS_H_
