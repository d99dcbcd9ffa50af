// Copyright dedup authors. Licensed under the Apache License 2.0.
//
// `dedup publish`: adds messages to a Redis stream, a RabbitMQ queue or a NATS
// JetStream stream, for tests and demos.
//
//   dedup publish --broker 'redis://127.0.0.1:6390?stream=jobs' --field id=42 --field amount=7
//   dedup publish --broker ... --count 20000 --id-prefix m- --duplicates 0.1
//   dedup publish --broker 'amqp://guest:guest@127.0.0.1:5672/?queue=jobs' --id-prefix m- ...
//   dedup publish --broker 'nats://127.0.0.1:4222?stream=JOBS' --id-prefix m- ...
//
// RabbitMQ: message n gets message_id <prefix><n> (or the header key=header:NAME
// names), its body is the --field list as NAME=VALUE lines (or "<prefix><n>"), and
// every message is persistent and confirmed by the broker (publisher confirms,
// up to 256 in flight). NATS: the key goes to Nats-Msg-Id (or the header
// key=header:NAME names), each publish waits for its PubAck, and repeats the
// stream dropped inside its duplicate window are counted.
//
// With --id-prefix every message gets id=<prefix><n>, n from --start; without it,
// --field id=VALUE is the key RabbitMQ and NATS carry (message_id, Nats-Msg-Id). With
// --duplicates F a fraction F of them is published a second time, a little later
// in the stream (as a broker redelivery or a producer retry would).

#ifdef DEDUP_WITH_REDIS_STREAMS

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdio>
#include <memory>
#include <random>

#include "brokers/redis_streams/stream_conn.h"
#ifdef DEDUP_WITH_RABBITMQ
#include "brokers/rabbitmq/rabbitmq_source.h"
#endif
#ifdef DEDUP_WITH_NATS
#include "brokers/nats/nats_source.h"
#endif
#include "cli/command.h"
#include "cli/common.h"
#include "core/printable.h"
#include "dedup/worker.h"

namespace dedup::cli {
namespace {

using Fields = std::vector<std::pair<std::string, std::string>>;

struct PublishFlags {
  std::string broker;
  std::vector<std::string> fields;
  uint64_t count = 1;
  std::string id_prefix;
  uint64_t start = 0;
  double duplicates = 0;
  uint64_t seed = 1;
  bool quiet = false;
  bool id_prefix_given = false;
};

// Distinct messages among those published: each n with --id-prefix; without
// it every message is the same (the same --field list, the same key).
uint64_t Distinct(const PublishFlags& f) { return f.id_prefix.empty() ? 1 : f.count; }

// 75 (try again later) only when later may work: the broker unreachable or slow,
// a Redis out of memory (OOM under maxmemory with noeviction: keys expire,
// consumers trim, an operator raises the limit), or a RabbitMQ nack (ABORTED: a
// queue at its length limit with reject-publish, which its consumers drain). A
// wrong password, a refused vhost or write permission, a message the broker
// refuses as it is (over NATS's max_payload or a stream's max_msg_size, over
// RabbitMQ's max_message_size) or a bad option is 2, as for the worker.
int ExitFor(const Status& s) {
  return s.retryable() || s.code() == StatusCode::kResourceExhausted ||
                 s.code() == StatusCode::kAborted
             ? kExitTempFail
             : kExitUsage;
}

// Every n once, and the duplicates again up to ~50 messages later.
std::vector<uint64_t> PublishOrder(const PublishFlags& f) {
  std::vector<uint64_t> order;
  std::mt19937_64 rng(f.seed);
  std::bernoulli_distribution dup(f.duplicates);
  std::vector<std::pair<uint64_t, uint64_t>> later;  // (publish after index, n)
  for (uint64_t i = 0; i < f.count; ++i) {
    const uint64_t n = f.start + i;
    order.push_back(n);
    if (f.duplicates > 0 && dup(rng)) later.emplace_back(i + 1 + rng() % 50, n);
    for (auto it = later.begin(); it != later.end();) {
      if (it->first <= i) {
        order.push_back(it->second);
        it = later.erase(it);
      } else {
        ++it;
      }
    }
  }
  for (const auto& [at, n] : later) order.push_back(n);
  return order;
}

// The key of message n on brokers that carry it beside the body (RabbitMQ's
// message_id or a header, NATS's Nats-Msg-Id or a header): <prefix><n> with
// --id-prefix, else the value of --field id=VALUE (the field a Redis stream's
// worker reads the key from), else none.
std::string MessageKey(const PublishFlags& f, const Fields& fields, uint64_t n) {
  if (!f.id_prefix.empty()) return f.id_prefix + std::to_string(n);
  for (const auto& [k, v] : fields) {
    if (k == "id") return v;
  }
  return "";
}

// The message body for brokers without fields: the --field list as NAME=VALUE
// lines, or the id when there are none.
std::string Body(const Fields& fields,
                 const std::string& id) {
  if (fields.empty()) return id;
  std::string b;
  for (const auto& [k, v] : fields) b += k + "=" + v + "\n";
  return b;
}

#ifdef DEDUP_WITH_RABBITMQ
int PublishAmqp(const PublishFlags& f, const Fields& fields) {
  auto o = rabbitmq::ParseRabbitMqUri(f.broker);
  if (!o.ok()) {
    std::fprintf(stderr, "dedup publish: --broker: %s\n", o.status().ToString().c_str());
    return kExitUsage;
  }
  rabbitmq::RabbitMqPublisher p(*o);
  Status st = p.DeclareTopology();
  const std::vector<uint64_t> order = PublishOrder(f);
  uint64_t confirmed = 0, sent = 0;
  for (size_t i = 0; st.ok() && i < order.size(); ++i) {
    const std::string id = MessageKey(f, fields, order[i]);
    rabbitmq::AmqpMessage m;
    m.body = Body(fields, id);
    if (o->key.kind == brokers::KeyKind::kHeader) {
      if (!id.empty()) m.headers.emplace_back(o->key.name, id);
    } else {
      m.message_id = id;
    }
    st = p.Send("", o->queue, m);
    if (st.ok()) ++sent;
    if (st.ok() && (sent % 256 == 0 || i + 1 == order.size())) {
      st = p.WaitConfirms();
      if (st.ok()) confirmed = sent;
    }
  }
  if (!st.ok()) {
    std::fprintf(stderr, "dedup publish: after %llu confirmed messages: %s\n",
                 static_cast<unsigned long long>(confirmed), st.ToString().c_str());
    return ExitFor(st);
  }
  if (!f.quiet) {
    std::printf("published %llu messages (%llu distinct) to %s, all confirmed\n",
                static_cast<unsigned long long>(confirmed), static_cast<unsigned long long>(Distinct(f)),
                o->Describe().c_str());
  }
  return kExitOk;
}
#endif

#ifdef DEDUP_WITH_NATS
int PublishNats(const PublishFlags& f, const Fields& fields) {
  auto o = nats::ParseNatsUri(f.broker, /*need_consumer=*/false);
  if (!o.ok()) {
    std::fprintf(stderr, "dedup publish: --broker: %s\n", o.status().ToString().c_str());
    return kExitUsage;
  }
  auto p = nats::NatsPublisher::Open(*o);
  if (!p.ok()) {
    std::fprintf(stderr, "dedup publish: %s\n", p.status().ToString().c_str());
    return ExitFor(p.status());
  }
  // As for a Redis stream: a stream this publish made is said, once.
  if (!f.quiet && (*p)->created_stream()) {
    std::fprintf(stderr, "dedup publish: stream '%s' did not exist; this publish created it\n",
                 internal::Printable(o->stream).c_str());
  }
  uint64_t stored = 0, dropped = 0;
  for (uint64_t n : PublishOrder(f)) {
    const std::string id = MessageKey(f, fields, n);
    bool duplicate = false;
    Status st = (*p)->Publish(id, Body(fields, id), &duplicate);
    if (!st.ok()) {
      std::fprintf(stderr, "dedup publish: after %llu messages: %s\n",
                   static_cast<unsigned long long>(stored + dropped), st.ToString().c_str());
      return ExitFor(st);
    }
    ++(duplicate ? dropped : stored);
  }
  if (!f.quiet) {
    std::printf("published %llu messages (%llu distinct) to %s: %llu stored, %llu dropped by the "
                "stream's duplicate window\n",
                static_cast<unsigned long long>(stored + dropped),
                static_cast<unsigned long long>(Distinct(f)), o->Describe().c_str(),
                static_cast<unsigned long long>(stored), static_cast<unsigned long long>(dropped));
  }
  return kExitOk;
}
#endif

int PublishRedis(const PublishFlags& f, const Fields& fields) {
  auto wo = WorkerOptionsFromUri(f.broker);
  if (!wo.ok()) {
    std::fprintf(stderr, "dedup publish: --broker: %s\n", wo.status().ToString().c_str());
    return kExitUsage;
  }
  const std::vector<uint64_t> order = PublishOrder(f);

  streams::ConnOptions co;
  co.host = wo->host;
  co.port = wo->port;
  co.user = wo->user;
  co.password = wo->password;
  co.has_password = wo->has_password;
  co.db = wo->db;
  co.timeout = wo->timeout;
  streams::StreamConn conn(co);
  // XADD makes a stream that does not exist: say so, since a mistyped stream=
  // would otherwise fill a stream no worker reads, without a word.
  bool created = false;
  if (auto t = conn.Run({"TYPE", wo->stream}); t.ok() && !streams::IsError(t->get())) {
    created = streams::ReplyText(t->get()) == "none";
  }
  uint64_t published = 0;
  for (uint64_t n : order) {
    std::vector<std::string> args = {"XADD", wo->stream, "*"};
    if (!f.id_prefix.empty()) {
      args.push_back("id");
      args.push_back(f.id_prefix + std::to_string(n));
    }
    for (const auto& [k, v] : fields) {
      args.push_back(k);
      args.push_back(v);
    }
    auto r = conn.Run(args);
    if (!r.ok() || streams::IsError(r->get())) {
      std::fprintf(stderr, "dedup publish: after %llu messages: %s\n",
                   static_cast<unsigned long long>(published),
                   r.ok() ? streams::ReplyText(r->get()).c_str() : r.status().ToString().c_str());
      // An error reply is classified as the Redis client layer does: WRONGTYPE (the
      // key is not a stream) is not a "later"; READONLY (a failover under way),
      // LOADING, BUSY, MASTERDOWN, TRYAGAIN, CLUSTERDOWN, OOM and maxclients are.
      return ExitFor(r.ok() ? redis::ErrorReplyStatus("", streams::ReplyText(r->get()))
                            : r.status());
    }
    if (order.size() == 1 && !f.quiet) std::printf("%s\n", streams::ReplyText(r->get()).c_str());
    ++published;
  }
  if (!f.quiet && order.size() > 1) {
    std::printf("published %llu messages (%llu distinct) to %s\n",
                static_cast<unsigned long long>(published),
                static_cast<unsigned long long>(Distinct(f)), wo->stream.c_str());
  }
  if (!f.quiet && created && published > 0) {
    std::fprintf(stderr, "dedup publish: stream '%s' did not exist; this publish created it\n",
                 internal::Printable(wo->stream).c_str());
  }
  return kExitOk;
}

struct PublishRow {
  std::string_view scheme;  // a row of the broker scheme table
  int (*publish)(const PublishFlags& f, const Fields& fields);
};

constexpr PublishRow kPublishers[] = {
    {"redis", &PublishRedis},
#ifdef DEDUP_WITH_RABBITMQ
    {"amqp", &PublishAmqp},
#endif
#ifdef DEDUP_WITH_NATS
    {"nats", &PublishNats},
#endif
};

int RunPublish(const PublishFlags& f) {
  Fields fields;
  for (const auto& kv : f.fields) {
    auto p = SplitField(kv);
    if (!p) {
      std::fprintf(stderr, "dedup publish: --field '%s' is not NAME=VALUE\n",
                   internal::PrintableCut(kv, 64).c_str());
      return kExitUsage;
    }
    // A name given twice (or "id" beside --id-prefix, which sets it) made a
    // Redis entry whose key and handler input disagreed: which value is meant?
    const bool taken = std::any_of(fields.begin(), fields.end(),
                                   [&](const auto& e) { return e.first == p->first; });
    if (taken || (p->first == "id" && !f.id_prefix.empty())) {
      std::fprintf(stderr, "dedup publish: --field '%s' is given twice%s\n",
                   internal::PrintableCut(p->first, 64).c_str(),
                   taken ? "" : " (--id-prefix sets the field id)");
      return kExitUsage;
    }
    fields.push_back(*p);
  }
  if (f.id_prefix_given && f.id_prefix.empty()) {
    std::fprintf(stderr, "dedup publish: --id-prefix is empty (message n would get id=<n>: "
                         "give a prefix, e.g. --id-prefix m-)\n");
    return kExitUsage;
  }
  if (fields.empty() && f.id_prefix.empty()) {
    std::fprintf(stderr, "dedup publish: give --field NAME=VALUE or --id-prefix\n");
    return kExitUsage;
  }
  // n runs from --start to --start + --count - 1: past 2^64 - 1 it wrapped to 0.
  if (f.start > UINT64_MAX - (f.count - 1)) {
    std::fprintf(stderr, "dedup publish: --start %llu with --count %llu runs past %llu\n",
                 static_cast<unsigned long long>(f.start),
                 static_cast<unsigned long long>(f.count),
                 static_cast<unsigned long long>(UINT64_MAX));
    return kExitUsage;
  }
  // A key longer than a store takes (1 to kMaxKeyBytes bytes) would be
  // dead-lettered by every worker: refused before anything is sent.
  const size_t longest = !f.id_prefix.empty()
                             ? f.id_prefix.size() + std::to_string(f.start + (f.count - 1)).size()
                             : MessageKey(f, fields, 0).size();
  if (longest > kMaxKeyBytes) {
    std::fprintf(stderr, "dedup publish: the message key would be %zu bytes; dedup keys are 1 to "
                         "%zu bytes (a worker would dead-letter it)\n",
                 longest, kMaxKeyBytes);
    return kExitUsage;
  }
  // The broker scheme table's check (src/brokers/open_source.cc), then this
  // command's publisher for the row.
  StatusOr<std::string_view> scheme = CheckSourceUri(f.broker, SourceUse::kPublish);
  if (!scheme.ok()) {
    std::fprintf(stderr, "dedup publish: --broker: %s\n", scheme.status().ToString().c_str());
    return kExitUsage;
  }
  for (const PublishRow& row : kPublishers) {
    if (row.scheme == *scheme) return row.publish(f, fields);
  }
  std::fprintf(stderr, "dedup publish: --broker: %s:// brokers cannot be published to\n",
               std::string(*scheme).c_str());
  return kExitUsage;
}

}  // namespace

void RegisterPublish(CLI::App& root, CommandContext& ctx) {
  auto f = std::make_shared<PublishFlags>();
  CLI::App* app = root.add_subcommand("publish", "Add messages to a Redis stream, RabbitMQ queue or NATS stream (tests, demos)");
  app->add_option("--broker", f->broker, "redis://HOST:PORT?stream=S, amqp://...?queue=Q or nats://...?stream=S")->required();
  app->add_option("--field", f->fields, "NAME=VALUE, repeatable: a field of every message");
  // Bounded: the publish order (duplicates placed among the originals) is built
  // before the first message; --count 10^12 aborted with bad_alloc after a minute,
  // having published nothing. More in batches: --start.
  app->add_option("--count", f->count, "Messages to publish, 1 to 100000000 (more: run again with --start)")
      ->check(CLI::Range(uint64_t{1}, uint64_t{100'000'000}))
      ->capture_default_str();
  CLI::Option* id_prefix =
      app->add_option("--id-prefix", f->id_prefix, "Give message n the field id=<prefix><n>");
  app->add_option("--start", f->start, "First n for --id-prefix")->capture_default_str();
  app->add_option("--duplicates", f->duplicates, "Fraction published a second time")
      ->check(CLI::Range(0.0, 1.0))
      ->capture_default_str();
  app->add_option("--seed", f->seed, "Seeds which messages are duplicated")
      ->capture_default_str();
  app->footer(
      "Exit codes: 0 published; 75 try again later (the broker unreachable, slow, or not\n"
      "  ready: loading, busy, a read-only replica, out of memory, a full queue); 2 bad\n"
      "  usage, a refused password, vhost or write, or any error a retry cannot fix.");
  app->add_flag("--quiet", f->quiet, "Print nothing on success");
  app->callback([f, id_prefix, &ctx] {
    f->id_prefix_given = id_prefix->count() > 0;
    ctx.exit_code = RunPublish(*f);
  });
}

}  // namespace dedup::cli

#endif  // DEDUP_WITH_REDIS_STREAMS
