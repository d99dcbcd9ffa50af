// Copyright dedup authors. Licensed under the Apache License 2.0.
//
// The broker scheme table: OpenSource(uri) picks the MessageSource by the URI's
// scheme, CheckSourceUri(uri) the same row's parse-only check. A new broker is
// one folder under src/brokers/ plus one row here.

#include <optional>
#include <string>
#include <string_view>

#include "core/uri.h"
#include "dedup/consumer.h"
#ifdef DEDUP_WITH_REDIS_STREAMS
#include "brokers/redis_streams/streams_source.h"
#include "dedup/worker.h"
#endif
#ifdef DEDUP_WITH_RABBITMQ
#include "brokers/rabbitmq/rabbitmq_source.h"
#endif
#ifdef DEDUP_WITH_NATS
#include "brokers/nats/nats_source.h"
#endif

namespace dedup {
namespace {

#ifdef DEDUP_WITH_REDIS_STREAMS
StatusOr<std::unique_ptr<MessageSource>> OpenRedisStreams(std::string_view uri,
                                                          const SourceOptions& o) {
  StatusOr<WorkerOptions> wo = WorkerOptionsFromUri(uri);
  if (!wo.ok()) return wo.status();
  if (wo->group.empty()) wo->group = "dedup";
  return OpenRedisStreamsSource(*std::move(wo), o.lease);
}
#endif

struct SchemeRow {
  std::string_view scheme;
  // Parse-only: the URI and every option checked, nothing connected.
  Status (*check)(std::string_view uri, SourceUse use);
  StatusOr<std::unique_ptr<MessageSource>> (*open)(std::string_view uri, const SourceOptions&);
  bool listed = true;  // named among the schemes this build knows
};

#ifdef DEDUP_WITH_REDIS_STREAMS
Status CheckRedisStreams(std::string_view uri, SourceUse) {
  return WorkerOptionsFromUri(uri).status();
}
#endif
#ifdef DEDUP_WITH_RABBITMQ
Status CheckRabbitMq(std::string_view uri, SourceUse) {
  return rabbitmq::ParseRabbitMqUri(uri).status();
}
#endif
#ifdef DEDUP_WITH_NATS
Status CheckNats(std::string_view uri, SourceUse use) {
  return nats::ParseNatsUri(uri, /*need_consumer=*/use == SourceUse::kConsume).status();
}
#endif

constexpr SchemeRow kSources[] = {
#ifdef DEDUP_WITH_REDIS_STREAMS
    {"redis", &CheckRedisStreams, &OpenRedisStreams},
    // Refused by name by WorkerOptionsFromUri: a stream lives on one server.
    {"redis+cluster", &CheckRedisStreams, &OpenRedisStreams, /*listed=*/false},
#endif
#ifdef DEDUP_WITH_RABBITMQ
    {"amqp", &CheckRabbitMq, &rabbitmq::OpenRabbitMqSource},
#endif
#ifdef DEDUP_WITH_NATS
    {"nats", &CheckNats, &nats::OpenNatsSource},
#endif
    {"", nullptr, nullptr, false},  // end (keeps the table non-empty when no broker is compiled in)
};

std::string KnownSchemes() {
  std::string known;
  for (const SchemeRow& row : kSources) {
    if (row.open != nullptr && row.listed) {
      known += (known.empty() ? "" : ", ") + std::string(row.scheme) + "://";
    }
  }
  return known.empty() ? std::string("none") : known;
}

// The row of `uri`'s scheme, or InvalidArgument naming why there is none.
StatusOr<const SchemeRow*> FindRow(std::string_view uri) {
  // ParseUri's own answer to this speaks of store URIs. Not echoed: without a
  // scheme nothing tells a password from a host.
  const std::optional<std::string_view> scheme = internal::UriScheme(uri);
  if (!scheme) {
    return Status::InvalidArgument("broker URI has no scheme (not a broker URI this build "
                                   "knows: " + KnownSchemes() +
                                   "; e.g. redis://HOST:6379?stream=jobs)");
  }
  for (const SchemeRow& row : kSources) {
    if (row.open != nullptr && row.scheme == *scheme) return &row;
  }
  // Nothing after the ':' is shown: "u:PASSWORD" given where a URI belongs.
  return Status::InvalidArgument("broker URI scheme " + internal::SchemeForMessage(*scheme) +
                                 " is not a broker URI this build knows (" + KnownSchemes() +
                                 ")");
}

}  // namespace

StatusOr<std::string_view> CheckSourceUri(std::string_view uri, SourceUse use) {
  StatusOr<const SchemeRow*> row = FindRow(uri);
  if (!row.ok()) return row.status();
  DEDUP_RETURN_IF_ERROR((*row)->check(uri, use));
  return (*row)->scheme;
}

StatusOr<std::unique_ptr<MessageSource>> OpenSource(std::string_view uri,
                                                    const SourceOptions& options) {
  StatusOr<const SchemeRow*> row = FindRow(uri);
  if (!row.ok()) return row.status();
  return (*row)->open(uri, options);
}

}  // namespace dedup
