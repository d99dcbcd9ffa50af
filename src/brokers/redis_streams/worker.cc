// Copyright dedup authors. Licensed under the Apache License 2.0.
//
// dedup::Worker: the Redis Streams source and the Consumer in one object
// (include/dedup/worker.h). The dispatching, the held set, the drain and the
// metrics are the Consumer's (src/consumer/consumer.cc); the stream commands are
// the source's (streams_source.cc).

#include <algorithm>

#include "brokers/key_spec.h"
#include "brokers/redis_streams/streams_source.h"
#include "core/uri.h"
#include "redis/options.h"
#include "dedup/worker.h"

namespace dedup {

namespace {

// Appends a length-prefixed string, so that field boundaries cannot be forged.
void AppendFramed(std::string* out, std::string_view s) {
  *out += std::to_string(s.size());
  out->push_back(':');
  out->append(s);
}

}  // namespace

std::string StreamMessage::CanonicalPayload() const {
  std::string out;
  for (const auto& [k, v] : fields) {
    AppendFramed(&out, k);
    AppendFramed(&out, v);
  }
  return out;
}

StatusOr<WorkerOptions> WorkerOptionsFromUri(std::string_view text) {
  // The one Redis URI parser (src/redis/options.h): IPv6, /db, user and password.
  auto parsed = redis::ParseRedisUri(
      text, {"stream", "group", "consumer", "key", "dead", "prefix", "block", "reclaim"},
      redis::Connections::kSingle);
  if (!parsed.ok()) return parsed.status();
  const internal::Uri& u = parsed->uri;
  const redis::ConnectionOptions& c = parsed->connection;
  if (c.cluster) {
    return Status::InvalidArgument("broker URI '" + c.Describe() +
                                   "': a stream lives on one server; use redis://");
  }
  WorkerOptions o;
  o.host = c.endpoints.front().host;
  o.port = c.endpoints.front().port;
  o.user = c.user;
  o.password = c.password;
  o.has_password = c.has_password;
  o.db = c.db;
  o.timeout = c.timeout;
  o.stream = u.Param("stream").value_or("");
  if (o.stream.empty()) {
    return Status::InvalidArgument("broker URI '" + c.Describe() + "' needs stream=NAME");
  }
  o.group = u.Param("group").value_or("");
  o.consumer = u.Param("consumer").value_or("");
  if (auto k = u.Param("key")) {
    // The one key= grammar (brokers/key_spec.h): a field (key=id as ever, or
    // key=field:NAME) or the hash of the entry's fields.
    auto spec = brokers::ParseKeySpec(
        *k, {.broker = "redis streams", .properties = {}, .fields = true, .bare_word_is_field = true});
    if (!spec.ok()) return spec.status();
    o.key_from_content = spec->kind == brokers::KeyKind::kContentSha256;
    if (spec->kind == brokers::KeyKind::kField) o.key_field = spec->name;
  }
  o.dead_stream = u.Param("dead").value_or("");
  o.key_prefix = u.Param("prefix").value_or("");
  DEDUP_RETURN_IF_ERROR(
      brokers::CheckKeyPrefix(o.key_prefix, o.key_from_content, "redis streams URI"));
  if (auto b = u.Param("block")) {
    auto ms = internal::ParseDurationMillis(*b, "broker block");
    if (!ms.ok()) return ms.status();
    o.block = Millis(std::max(1LL, *ms));
  }
  if (auto r = u.Param("reclaim")) {
    auto ms = internal::ParseDurationMillis(*r, "broker reclaim");
    if (!ms.ok()) return ms.status();
    o.reclaim_min_idle = Millis(*ms);
  }
  return o;
}

StatusOr<std::unique_ptr<Worker>> Worker::Open(WorkerOptions o) {
  if (o.concurrency < 1 || o.concurrency > 4096) {
    return Status::InvalidArgument("worker: concurrency must be 1 to 4096, got " +
                                   std::to_string(o.concurrency));
  }
  // The group is created (and the options checked) now; Run opens the source
  // again when reclaim_min_idle follows the Buffer's lease.
  auto source = OpenRedisStreamsSource(o, Millis(30'000));
  if (!source.ok()) return source.status();
  std::unique_ptr<Worker> w(new Worker());
  w->source_ = std::move(source).value();
  if (o.consumer.empty()) {
    // The name the source chose, kept for the next open.
    const std::string d = w->source_->Describe();
    o.consumer = d.substr(d.rfind("consumer=") + 9);
  }
  if (o.dead_stream.empty()) o.dead_stream = o.stream + ":dead";
  w->options_ = std::move(o);
  return w;
}

Status Worker::RunConsumer(StatusOr<std::unique_ptr<Consumer>> consumer) {
  if (!consumer.ok()) return consumer.status();
  Consumer* c = consumer->get();
  {
    std::lock_guard lock(metrics_mu_);
    consumer_ = c;
  }
  stopper_.Attach(c);  // stopped at once if Stop() came first
  Status s = c->Run();
  stopper_.Detach();  // a Stop() still inside c is waited for
  std::lock_guard lock(metrics_mu_);
  last_metrics_ = c->metrics();
  consumer_ = nullptr;
  return s;
}

ConsumerOptions Worker::ConsumerOptionsFor() const {
  ConsumerOptions co;
  co.concurrency = options_.concurrency;
  co.log_name = "dedup worker " + options_.consumer;
  return co;
}

Status Worker::RunWith(const Processor& process) {
  Processor p = process;
  return RunConsumer(Consumer::MakeWith(
      source_.get(),
      [p](const Delivery& d) { return p(ToStreamMessage(d)); }, ConsumerOptionsFor()));
}

Status Worker::Run(Buffer* buffer, const Handler& handler) {
  if (options_.reclaim_min_idle.count() <= 0) {
    auto source = OpenRedisStreamsSource(options_, buffer->options().lease);
    if (!source.ok()) return source.status();
    source_ = std::move(source).value();
  }
  Handler h = handler;
  return RunConsumer(Consumer::Make(
      source_.get(), buffer,
      [h](const Delivery& d, ClaimGuard& g) { return h(ToStreamMessage(d), g); },
      ConsumerOptionsFor()));
}

StreamMessage Worker::ToStreamMessage(const Delivery& d) {
  StreamMessage m;
  m.id = d.id();
  m.fields = d.attributes();
  m.key = d.key();
  return m;
}

Worker::~Worker() = default;

WorkerMetrics Worker::metrics() const {
  std::lock_guard lock(metrics_mu_);
  if (consumer_ != nullptr) return consumer_->metrics();
  return last_metrics_;
}

}  // namespace dedup
