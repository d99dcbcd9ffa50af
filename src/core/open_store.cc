// Copyright dedup authors. Licensed under the Apache License 2.0.
//
// The store scheme table: OpenStore(uri) picks the backend by the URI's scheme,
// and each backend parses its own part. A new store is one folder under
// src/stores/ plus one row here (and its entry point in stores/open_backends.h).

#include <string>

#include "core/uri.h"
#include "dedup/memory_store.h"
#include "dedup/store.h"
#include "stores/open_backends.h"

namespace dedup {
namespace {

StatusOr<std::unique_ptr<Store>> OpenMemory(const internal::Uri& u, std::string_view,
                                            const OpenOptions& o) {
  if (u.has_authority || !u.path.empty()) {
    // Not echoed: in "memory:PASSWORD" (USER:PASSWORD of a user named memory)
    // the "path" is a password.
    return Status::InvalidArgument("memory: URI takes no host or path (give memory: or "
                                   "memory:?PARAMS)");
  }
  DEDUP_RETURN_IF_ERROR(u.CheckParams({"shards"}));
  MemoryStoreOptions mo;
  mo.clock = o.clock;
  if (auto shards = u.Param("shards")) {
    auto n = internal::ParseCount(*shards, "memory: shards");
    if (!n.ok()) return n.status();
    if (*n < 1 || *n > static_cast<long long>(kMaxMemoryShards)) {
      return Status::InvalidArgument("memory: shards must be 1 to " + std::to_string(kMaxMemoryShards) +
                                     ", got " + *shards);
    }
    mo.shards = static_cast<size_t>(*n);
  }
  return NewMemoryStore(mo);
}

#ifdef DEDUP_WITH_ROCKSDB
StatusOr<std::unique_ptr<Store>> OpenRocksDB(const internal::Uri& u, std::string_view,
                                             const OpenOptions& o) {
  return internal::OpenRocksDBFromUri(u, o);
}
#endif
#ifdef DEDUP_WITH_REDIS
StatusOr<std::unique_ptr<Store>> OpenRedis(const internal::Uri& u, std::string_view,
                                           const OpenOptions& o) {
  return internal::OpenRedisFromUri(u, o);
}
#endif

struct StoreRow {
  std::string_view scheme;
  // How "this build knows: ..." shows it; empty: not listed (an alias, or a
  // scheme refused by name).
  std::string_view shown;
  StatusOr<std::unique_ptr<Store>> (*open)(const internal::Uri& uri, std::string_view raw,
                                           const OpenOptions& options);
};

constexpr StoreRow kStores[] = {
    {"memory", "memory:", &OpenMemory},
#ifdef DEDUP_WITH_ROCKSDB
    {"rocksdb", "rocksdb:PATH", &OpenRocksDB},
#endif
#ifdef DEDUP_WITH_REDIS
    {"redis", "redis://HOST:PORT", &OpenRedis},
    {"redis+cluster", "redis+cluster://HOST:PORT,...", &OpenRedis},
    {"rediss", "", &OpenRedis},  // refused by name (TLS not yet)
    {"rediss+cluster", "", &OpenRedis},
#endif
#ifdef DEDUP_WITH_POSTGRES
    {"postgres", "postgres://...", &internal::OpenPostgresFromUri},
    {"postgresql", "", &internal::OpenPostgresFromUri},
#endif
};

std::string KnownSchemes() {
  std::string s;
  for (const StoreRow& row : kStores) {
    if (!row.shown.empty()) s += (s.empty() ? "" : ", ") + std::string(row.shown);
  }
  return s;
}

}  // namespace

StatusOr<std::unique_ptr<Store>> OpenStore(std::string_view uri, const OpenOptions& options) {
  // The scheme first: a value whose scheme no row knows is not parsed, and what
  // follows its ':' is never echoed ("u:PASSWORD" given where a URI belongs).
  if (std::optional<std::string_view> scheme = internal::UriScheme(uri)) {
    const StoreRow* found = nullptr;
    for (const StoreRow& row : kStores) {
      if (row.scheme == *scheme) found = &row;
    }
    if (found == nullptr) {
      return Status::InvalidArgument("unknown store scheme " + internal::SchemeForMessage(*scheme) +
                                     " (this build knows: " + KnownSchemes() + ")");
    }
    auto parsed = internal::ParseUri(uri);
    if (!parsed.ok()) return parsed.status();
    return found->open(*parsed, uri, options);
  }
  // No scheme: ParseUri names that (without echoing the value).
  auto parsed = internal::ParseUri(uri);
  if (!parsed.ok()) return parsed.status();
  return Status::InvalidArgument("store URI has no scheme (this build knows: " + KnownSchemes() +
                                 ")");
}

}  // namespace dedup
