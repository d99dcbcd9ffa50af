// Copyright dedup authors. Licensed under the Apache License 2.0.
//
// The broker scheme table: OpenSource(uri) picks the MessageSource by the URI's
// scheme. A new broker is one folder under src/brokers/ plus one row here.

#include <cctype>
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
  StatusOr<std::unique_ptr<MessageSource>> (*open)(std::string_view uri, const SourceOptions&);
};

constexpr SchemeRow kSources[] = {
#ifdef DEDUP_WITH_REDIS_STREAMS
    {"redis", &OpenRedisStreams},
#endif
#ifdef DEDUP_WITH_RABBITMQ
    {"amqp", &rabbitmq::OpenRabbitMqSource},
#endif
#ifdef DEDUP_WITH_NATS
    {"nats", &nats::OpenNatsSource},
#endif
    {"", nullptr},  // end (keeps the table non-empty when no broker is compiled in)
};

// Letters, digits, '+', '-', '.' before the first ':' (ParseUri's rule).
bool StartsWithScheme(std::string_view uri) {
  const size_t colon = uri.find(':');
  if (colon == std::string_view::npos || colon == 0) return false;
  for (char c : uri.substr(0, colon)) {
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '+' || c == '-' || c == '.')) {
      return false;
    }
  }
  return true;
}

}  // namespace

StatusOr<std::unique_ptr<MessageSource>> OpenSource(std::string_view uri,
                                                    const SourceOptions& options) {
  std::string known;
  for (const SchemeRow& row : kSources) {
    if (row.open != nullptr) known += (known.empty() ? "" : ", ") + std::string(row.scheme) + "://";
  }
  // ParseUri's own answer to this speaks of store URIs. Not echoed: without a
  // scheme nothing tells a password from a host.
  if (!StartsWithScheme(uri)) {
    return Status::InvalidArgument("broker URI has no scheme (this build knows: " +
                                   (known.empty() ? std::string("none") : known) +
                                   "; e.g. redis://HOST:6379?stream=jobs)");
  }
  StatusOr<internal::Uri> parsed = internal::ParseUri(uri);
  if (!parsed.ok()) return parsed.status();
  for (const SchemeRow& row : kSources) {
    if (row.open != nullptr && row.scheme == parsed->scheme) return row.open(uri, options);
  }
  return Status::InvalidArgument("broker URI '" + parsed->Redacted() + "': scheme '" +
                                 parsed->scheme + "' is not a broker this build knows (" +
                                 (known.empty() ? std::string("none") : known) + ")");
}

}  // namespace dedup
