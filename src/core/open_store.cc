// Copyright dedup authors. Licensed under the Apache License 2.0.
//
// The one factory behind every store URI. Each backend parses its own part.

#include <string>

#include "core/uri.h"
#include "dedup/memory_store.h"
#include "dedup/store.h"
#include "stores/open_backends.h"

namespace dedup {
namespace {

StatusOr<std::unique_ptr<Store>> OpenMemory(const internal::Uri& u, const OpenOptions& o) {
  if (u.has_authority || !u.path.empty()) {
    return Status::InvalidArgument("memory: URI takes no host or path, got '" + u.Redacted() +
                                   "'");
  }
  DEDUP_RETURN_IF_ERROR(u.CheckParams({"shards"}));
  MemoryStoreOptions mo;
  mo.clock = o.clock;
  if (auto shards = u.Param("shards")) {
    auto n = internal::ParseCount(*shards, "memory: shards");
    if (!n.ok()) return n.status();
    if (*n < 1 || *n > 65536) {
      return Status::InvalidArgument("memory: shards must be 1 to 65536, got " + *shards);
    }
    mo.shards = static_cast<size_t>(*n);
  }
  return NewMemoryStore(mo);
}

std::string KnownSchemes() {
  std::string s = "memory:";
#ifdef DEDUP_WITH_ROCKSDB
  s += ", rocksdb:PATH";
#endif
#ifdef DEDUP_WITH_REDIS
  s += ", redis://HOST:PORT, redis+cluster://HOST:PORT,...";
#endif
#ifdef DEDUP_WITH_POSTGRES
  s += ", postgres://...";
#endif
  return s;
}

}  // namespace

StatusOr<std::unique_ptr<Store>> OpenStore(std::string_view uri, const OpenOptions& options) {
  auto parsed = internal::ParseUri(uri);
  if (!parsed.ok()) return parsed.status();
  const internal::Uri& u = *parsed;
  if (u.scheme == "memory") return OpenMemory(u, options);
#ifdef DEDUP_WITH_ROCKSDB
  if (u.scheme == "rocksdb") return internal::OpenRocksDBFromUri(u, options);
#endif
#ifdef DEDUP_WITH_REDIS
  if (u.scheme == "redis" || u.scheme == "redis+cluster" || u.scheme == "rediss" ||
      u.scheme == "rediss+cluster") {  // rediss: refused by name (TLS not yet)
    return internal::OpenRedisFromUri(u, options);
  }
#endif
#ifdef DEDUP_WITH_POSTGRES
  if (u.scheme == "postgres" || u.scheme == "postgresql") {
    return internal::OpenPostgresFromUri(u, uri, options);
  }
#endif
  return Status::InvalidArgument("unknown store scheme '" + u.scheme + "' in '" + u.Redacted() +
                                 "' (this build knows: " + KnownSchemes() + ")");
}

}  // namespace dedup
