// Copyright dedup authors. Licensed under the Apache License 2.0.

#include "brokers/rabbitmq/rabbitmq_source.h"

#include "brokers/dead_letter.h"

#include <poll.h>
#include <sys/time.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdio>
#include <map>
#include <condition_variable>
#include <mutex>
#include <thread>
#include <set>

#include "brokers/rabbitmq/amqp_conn.h"
#include "brokers/key_spec.h"
#include "core/duration.h"
#include "core/printable.h"
#include "core/secret.h"
#include "core/sha256.h"
#include "core/uri.h"

namespace dedup::rabbitmq {
namespace {

// A header value as text; false for kinds that have none (tables, arrays, void).
bool FieldText(const amqp_field_value_t& v, std::string* out) {
  switch (v.kind) {
    case AMQP_FIELD_KIND_UTF8:
    case AMQP_FIELD_KIND_BYTES:
      *out = Str(v.value.bytes);
      return true;
    case AMQP_FIELD_KIND_BOOLEAN: *out = v.value.boolean ? "true" : "false"; return true;
    case AMQP_FIELD_KIND_I8: *out = std::to_string(v.value.i8); return true;
    case AMQP_FIELD_KIND_U8: *out = std::to_string(v.value.u8); return true;
    case AMQP_FIELD_KIND_I16: *out = std::to_string(v.value.i16); return true;
    case AMQP_FIELD_KIND_U16: *out = std::to_string(v.value.u16); return true;
    case AMQP_FIELD_KIND_I32: *out = std::to_string(v.value.i32); return true;
    case AMQP_FIELD_KIND_U32: *out = std::to_string(v.value.u32); return true;
    case AMQP_FIELD_KIND_I64: *out = std::to_string(v.value.i64); return true;
    case AMQP_FIELD_KIND_U64: *out = std::to_string(v.value.u64); return true;
    case AMQP_FIELD_KIND_TIMESTAMP: *out = std::to_string(v.value.u64); return true;
    default: return false;
  }
}

timeval ToTimeval(Millis d) {
  timeval tv{};
  tv.tv_sec = d.count() / 1000;
  tv.tv_usec = (d.count() % 1000) * 1000;
  return tv;
}

// AMQP names are short strings (at most 255 bytes), and the source derives
// <queue>.retry.<ms> from the queue: a queue too long for that failed every
// retry (requeued at once: a storm), not the start. The dead-letter target must
// not be the queue or one of its retry queues: dead letters would come back.
// How long a delivery whose copy failed is held before it is requeued.
constexpr Millis kRequeueAfterFailedCopy{1'000};

constexpr size_t kMaxAmqpName = 255;
constexpr std::string_view kRetryInfix = ".retry.";
constexpr size_t kMaxRetrySuffix = kRetryInfix.size() + 13;  // ms up to 10 years

Status CheckNames(const RabbitMqOptions& o) {
  DEDUP_RETURN_IF_ERROR(brokers::CheckKeyPrefix(
      o.key_prefix, o.key.kind == brokers::KeyKind::kContentSha256, "amqp"));
  DEDUP_RETURN_IF_ERROR(internal::RefuseControlBytes(o.queue, "amqp queue="));
  DEDUP_RETURN_IF_ERROR(internal::RefuseControlBytes(o.dead, "amqp dead="));
  DEDUP_RETURN_IF_ERROR(internal::RefuseControlBytes(o.vhost, "amqp vhost "));
  if (o.queue.size() > kMaxAmqpName - kMaxRetrySuffix) {
    return Status::InvalidArgument("amqp queue= is " + std::to_string(o.queue.size()) +
                                   " bytes; at most " +
                                   std::to_string(kMaxAmqpName - kMaxRetrySuffix) +
                                   " (AMQP names have 255, and <queue>.retry.<ms> must fit)");
  }
  const std::string dead = o.DeadName();
  if (dead.size() > kMaxAmqpName) {
    return Status::InvalidArgument("amqp dead= is " + std::to_string(dead.size()) +
                                   " bytes; AMQP names have at most 255");
  }
  if (dead == o.queue || dead.starts_with(o.queue + std::string(kRetryInfix))) {
    return Status::InvalidArgument("amqp dead='" + internal::Printable(dead) +
                                   "' is the queue itself or one of its retry queues: every "
                                   "dead letter would be delivered again; name another");
  }
  return Status::Ok();
}

// An AMQP heartbeat is a short, in seconds (tune-ok): a longer one would be sent
// cut to its low 16 bits.
constexpr Millis kMaxHeartbeat{65'535'000};

Status CheckHeartbeat(Millis h) {
  if (h.count() < 0 || h > kMaxHeartbeat) {
    return Status::InvalidArgument("amqp heartbeat must be 0 to 65535s (an AMQP short, in seconds), got " +
                                   internal::FormatDuration(h));
  }
  return Status::Ok();
}

}  // namespace

std::string RabbitMqOptions::Describe() const {
  // The vhost as named: "/" (the default) or "v1", not "host:5672v1".
  return "rabbitmq " + host + ":" + std::to_string(port) + " vhost=" + vhost + " queue=" + queue +
         " prefetch=" + std::to_string(prefetch);
}

StatusOr<RabbitMqOptions> ParseRabbitMqUri(std::string_view text) {
  auto parsed = internal::ParseUri(text);
  if (!parsed.ok()) return parsed.status();
  const internal::Uri& u = *parsed;
  if (u.scheme != "amqp") {
    return Status::InvalidArgument("broker URI '" + u.Redacted() + "': not amqp://");
  }
  if (!u.has_authority) {
    // Not echoed: "amqp:PASSWORD" is a USER:PASSWORD given where a URI belongs;
    // what follows the ':' is no host.
    return Status::InvalidArgument("amqp: no '//' after 'amqp:' (expected "
                                   "amqp://USER:PW@HOST:5672/VHOST?queue=Q)");
  }
  DEDUP_RETURN_IF_ERROR(
      u.CheckParams({"queue", "prefetch", "key", "prefix", "dead", "heartbeat", "timeout",
                     internal::kPasswordFileParam}));
  RabbitMqOptions o;
  if (u.hosts.find(',') != std::string::npos) {
    return Status::InvalidArgument("broker URI '" + u.Redacted() + "': one host only");
  }
  if (!u.hosts.empty()) {
    // The one host grammar (core/uri.h): ports 1 to 65535, IPv6 in brackets, and
    // "amqp://user:pass" (no "@host") does not echo the password as a port.
    auto hp = internal::ParseHostPort(u.hosts, "amqp");
    if (!hp.ok()) return hp.status();
    o.host = hp->host;
    if (hp->port != 0) o.port = hp->port;
  }
  // Inline or password_file= (core/secret.h). No user-info at all: guest:guest,
  // rabbitmq-c's and RabbitMQ's default. A user without a password is refused:
  // the AMQP URI spec leaves an absent password to the client's default, and
  // rabbitmq-c's is the guest user's "guest", which no other user has; it is a
  // password forgotten, or one written where the user goes. Not echoed, for that
  // reason. An empty password is written "USER:@".
  auto cred = internal::ResolveUriCredentials(u, {});
  if (!cred.ok()) return cred.status();
  if (!cred->user.empty() && !cred->has_password) {
    return Status::InvalidArgument(
        "amqp URI names a user without a password: write USER:PASSWORD@HOST, USER@HOST "
        "with password_file=F, or USER:@HOST for an empty one (guest:guest is the default "
        "only when no user is named)");
  }
  if (!cred->user.empty()) o.user = cred->user;
  if (cred->has_password) o.password = cred->password;
  // "/" or "" is the default vhost "/"; "/name" is vhost "name" ("/%2F" is "/").
  if (u.path.size() > 1) o.vhost = u.path.substr(1);
  o.queue = u.Param("queue").value_or("");
  if (o.queue.empty()) {
    return Status::InvalidArgument("broker URI '" + u.Redacted() + "' needs queue=NAME");
  }
  if (auto p = u.Param("prefetch")) {
    auto n = internal::ParseCount(*p, "amqp prefetch");
    if (!n.ok()) return n.status();
    if (*n < 1 || *n > 65535) {
      return Status::InvalidArgument("amqp prefetch must be 1..65535, got " + *p);
    }
    o.prefetch = static_cast<int>(*n);
  }
  if (auto k = u.Param("key")) {
    // The one key= grammar (brokers/key_spec.h): the message_id property, a header
    // or the body's hash.
    auto spec = brokers::ParseKeySpec(*k, {.broker = "amqp", .properties = {"message_id"},
                                           .headers = true});
    if (!spec.ok()) return spec.status();
    o.key = *spec;
  }
  o.key_prefix = u.Param("prefix").value_or("");
  o.dead = u.Param("dead").value_or("");
  DEDUP_RETURN_IF_ERROR(CheckNames(o));
  if (auto h = u.Param("heartbeat")) {
    auto ms = internal::ParseDurationMillis(*h, "amqp heartbeat");
    if (!ms.ok()) return ms.status();
    o.heartbeat = Millis(*ms);
    DEDUP_RETURN_IF_ERROR(CheckHeartbeat(o.heartbeat));
  }
  if (auto t = u.Param("timeout")) {
    auto ms = internal::ParseDurationMillis(*t, "amqp timeout");
    if (!ms.ok()) return ms.status();
    if (*ms <= 0) return Status::InvalidArgument("amqp timeout must be positive");
    o.timeout = Millis(*ms);
  }
  return o;
}

Millis RetryStep(Millis after) {
  static constexpr std::array<long long, 12> kSteps = {
      100, 250, 500, 1'000, 2'000, 5'000, 10'000, 30'000, 60'000, 300'000, 900'000, 3'600'000};
  for (long long s : kSteps) {
    if (after.count() <= s) return Millis(s);
  }
  // Beyond an hour: whole minutes, rounded up.
  return Millis((after.count() + 59'999) / 60'000 * 60'000);
}

// ---- publisher ---------------------------------------------------------------

class RabbitMqPublisher::Impl {
 public:
  explicit Impl(RabbitMqOptions o) : o_(std::move(o)), conn_(o_) {}

  Status Connect() {
    if (conn_.open()) return Status::Ok();
    retry_queues_.clear();
    next_seq_ = 1;
    acked_ = 0;
    failed_.clear();
    nacked_ = false;
    DEDUP_RETURN_IF_ERROR(conn_.Open());
    amqp_confirm_select_t req{};
    amqp_simple_rpc_decoded(conn_.get(), kChannel, AMQP_CONFIRM_SELECT_METHOD,
                            AMQP_CONFIRM_SELECT_OK_METHOD, &req);
    return conn_.RpcStatus("confirm.select");
  }

  // What exists is used as it is: an operator's queue (quorum, a length limit,
  // its own dead-lettering) or exchange would refuse a redeclare without its
  // arguments (PRECONDITION_FAILED), so each is looked up first (passive) and
  // only declared, durable and without arguments, when it is missing.
  Status DeclareTopology() {
    DEDUP_RETURN_IF_ERROR(DeclareQueueIfMissing(o_.queue));
    const std::string dead = o_.DeadName();
    DEDUP_RETURN_IF_ERROR(DeclareExchangeIfMissing(dead));
    DEDUP_RETURN_IF_ERROR(DeclareQueueIfMissing(dead));
    amqp_queue_bind(conn_.get(), kChannel, Bytes(dead), Bytes(dead), amqp_empty_bytes,
                    amqp_empty_table);
    return conn_.RpcStatus("queue.bind " + dead);
  }

  Status DeclareQueueIfMissing(const std::string& name) {
    DEDUP_RETURN_IF_ERROR(Connect());
    amqp_queue_declare(conn_.get(), kChannel, Bytes(name), /*passive=*/1, 1, 0, 0, amqp_empty_table);
    Status found = conn_.RpcStatus("queue.declare " + name);
    if (found.code() != StatusCode::kNotFound) return found;
    DEDUP_RETURN_IF_ERROR(Connect());  // a failed passive declare closed the channel: reopen it
    amqp_queue_declare(conn_.get(), kChannel, Bytes(name), 0, 1, 0, 0, amqp_empty_table);
    return conn_.RpcStatus("queue.declare " + name);
  }

  Status DeclareExchangeIfMissing(const std::string& name) {
    DEDUP_RETURN_IF_ERROR(Connect());
    amqp_exchange_declare(conn_.get(), kChannel, Bytes(name), amqp_cstring_bytes("fanout"),
                          /*passive=*/1, 1, 0, 0, amqp_empty_table);
    Status found = conn_.RpcStatus("exchange.declare " + name);
    if (found.code() != StatusCode::kNotFound) return found;
    DEDUP_RETURN_IF_ERROR(Connect());
    amqp_exchange_declare(conn_.get(), kChannel, Bytes(name), amqp_cstring_bytes("fanout"), 0, 1, 0,
                          0, amqp_empty_table);
    return conn_.RpcStatus("exchange.declare " + name);
  }

  void ForgetDeclared() { retry_queues_.clear(); }
  void KeepAlive() { conn_.KeepAlive(); }

  Status DeclareRetryQueue(Millis step, std::string* name) {
    DEDUP_RETURN_IF_ERROR(Connect());
    *name = o_.queue + ".retry." + std::to_string(step.count());
    if (retry_queues_.count(*name) != 0) return Status::Ok();
    TableBuilder args;
    args.AddInt("x-message-ttl", step.count());
    args.AddString("x-dead-letter-exchange", "");
    args.AddString("x-dead-letter-routing-key", o_.queue);
    amqp_queue_declare(conn_.get(), kChannel, Bytes(*name), 0, 1, 0, 0, args.Table());
    DEDUP_RETURN_IF_ERROR(conn_.RpcStatus("queue.declare " + *name));
    retry_queues_.insert(*name);
    return Status::Ok();
  }

  Status Send(std::string_view exchange, std::string_view routing_key, const AmqpMessage& m) {
    // AMQP short strings hold 255 bytes: a longer message_id or header name made
    // rabbitmq-c's "invalid AMQP data", read as "try again later" every time.
    if (m.message_id.size() > 255) {
      return Status::InvalidArgument(
          "amqp: message_id is " + std::to_string(m.message_id.size()) +
          " bytes; AMQP carries at most 255 there (a short string): use a shorter key, or "
          "key=header:NAME, whose value may be longer");
    }
    for (const auto& [k, v] : m.headers) {
      if (k.size() > 255) {
        return Status::InvalidArgument("amqp: a header name of " + std::to_string(k.size()) +
                                       " bytes; AMQP takes at most 255");
      }
    }
    DEDUP_RETURN_IF_ERROR(Connect());
    const CopyProperties copy(m, o_.user);
    const amqp_basic_properties_t props = copy.get();
    const int rc = amqp_basic_publish(conn_.get(), kChannel, Bytes(exchange), Bytes(routing_key),
                                      /*mandatory=*/1, /*immediate=*/0, &props, Bytes(m.body));
    if (rc != AMQP_STATUS_OK) return conn_.LibraryError(rc, "basic.publish");
    ++next_seq_;
    return Status::Ok();
  }

  Status WaitConfirms() {
    const uint64_t want = next_seq_ - 1;
    const auto deadline = std::chrono::steady_clock::now() + o_.timeout;
    while (acked_ < want) {
      if (!conn_.open()) return Status::Unavailable(conn_.Name() + ": connection lost before confirms");
      const auto left = std::chrono::duration_cast<Millis>(deadline - std::chrono::steady_clock::now());
      if (left.count() <= 0) {
        conn_.Drop();  // unknown fate: the caller must not count them as sent
        return Status::DeadlineExceeded(conn_.Name() + ": no publisher confirm within the timeout");
      }
      timeval tv = ToTimeval(left);
      amqp_frame_t frame;
      amqp_maybe_release_buffers(conn_.get());
      const int rc = amqp_simple_wait_frame_noblock(conn_.get(), &frame, &tv);
      if (rc == AMQP_STATUS_TIMEOUT) continue;
      if (rc != AMQP_STATUS_OK) return conn_.LibraryError(rc, "waiting for publisher confirms");
      if (frame.frame_type != AMQP_FRAME_METHOD) continue;
      switch (frame.payload.method.id) {
        case AMQP_BASIC_ACK_METHOD: {
          auto* a = static_cast<amqp_basic_ack_t*>(frame.payload.method.decoded);
          acked_ = std::max<uint64_t>(acked_, a->delivery_tag);
          break;
        }
        case AMQP_BASIC_NACK_METHOD: {
          auto* n = static_cast<amqp_basic_nack_t*>(frame.payload.method.decoded);
          acked_ = std::max<uint64_t>(acked_, n->delivery_tag);
          nacked_ = true;
          break;
        }
        case AMQP_BASIC_RETURN_METHOD: {
          auto* r = static_cast<amqp_basic_return_t*>(frame.payload.method.decoded);
          failed_ = "unroutable (" + Str(r->reply_text) + ")";
          amqp_message_t msg;
          amqp_rpc_reply_t rr = amqp_read_message(conn_.get(), kChannel, &msg, 0);
          if (rr.reply_type != AMQP_RESPONSE_NORMAL) {
            conn_.Drop();
            return Status::Unavailable(conn_.Name() + ": reading a returned message failed");
          }
          amqp_destroy_message(&msg);
          break;
        }
        case AMQP_CHANNEL_CLOSE_METHOD:
        case AMQP_CONNECTION_CLOSE_METHOD: {
          // 404: the exchange published to does not exist (deleted meanwhile).
          // The channel's unconfirmed messages have an unknown fate; the next
          // Connect opens the channel again, with confirms counted from 1.
          // 403: the user may not write there; no later fixes that (dedup
          // publish exits 2 on it, as on a refused password).
          // 406 PRECONDITION_FAILED: the broker refuses the message as it is
          // (over the node's max_message_size: "message size N is larger than
          // configured max size M"), and will every time: no retry helps
          // (InvalidArgument: dedup publish exits 2; a dead-letter or retry copy
          // is not sent again as for an unroutable one).
          Status closed = conn_.ServerClosed(frame.payload.method, "publish");
          if (closed.code() == StatusCode::kNotFound ||
              closed.code() == StatusCode::kPermissionDenied) {
            return closed;
          }
          if (closed.code() == StatusCode::kFailedPrecondition) {
            return Status::InvalidArgument(closed.message() +
                                           " (the broker refuses this message as it is: no "
                                           "retry changes that)");
          }
          return Status::Unavailable(conn_.Name() + ": the server closed the publishing channel: " +
                                     closed.message());
        }
        default:
          break;
      }
    }
    // A nack is not "not taken": a message routed to several queues and
    // refused by one (a length limit with reject-publish) is still in the others
    // (rabbitmq.com/maxlength.html). Aborted, never resent; FailedPrecondition
    // only for a return (unroutable: routed to no queue at all).
    if (nacked_) {
      nacked_ = false;
      failed_.clear();
      return Status(StatusCode::kAborted,
                    conn_.Name() + ": publish: the broker refused (nack) a published message; "
                                   "a queue it routes to is full or failed (others may hold it)");
    }
    if (!failed_.empty()) {
      std::string f = std::move(failed_);
      failed_.clear();
      return Status::FailedPrecondition(conn_.Name() + ": publish: " + f);
    }
    return Status::Ok();
  }

 private:
  RabbitMqOptions o_;
  AmqpConn conn_;
  std::set<std::string> retry_queues_;
  uint64_t next_seq_ = 1;
  uint64_t acked_ = 0;
  std::string failed_;   // a return (unroutable) since the last WaitConfirms
  bool nacked_ = false;  // a nack since the last WaitConfirms
};

RabbitMqPublisher::RabbitMqPublisher(RabbitMqOptions o) : impl_(std::make_unique<Impl>(std::move(o))) {}
RabbitMqPublisher::~RabbitMqPublisher() = default;
Status RabbitMqPublisher::DeclareTopology() { return impl_->DeclareTopology(); }
Status RabbitMqPublisher::DeclareRetryQueue(Millis step, std::string* name) {
  return impl_->DeclareRetryQueue(step, name);
}
Status RabbitMqPublisher::Send(std::string_view exchange, std::string_view routing_key,
                               const AmqpMessage& m) {
  return impl_->Send(exchange, routing_key, m);
}
Status RabbitMqPublisher::WaitConfirms() { return impl_->WaitConfirms(); }
void RabbitMqPublisher::ForgetDeclared() { impl_->ForgetDeclared(); }
void RabbitMqPublisher::KeepAlive() { impl_->KeepAlive(); }

// ---- source ------------------------------------------------------------------

namespace {

// State shared by the source and its deliveries (which may be settled from any
// thread, and after a reconnect).
struct Shared {
  explicit Shared(const RabbitMqOptions& o) : o(o), conn(o), publisher(o) {}
  RabbitMqOptions o;
  std::mutex conn_mu;  // guards conn and generation
  AmqpConn conn;       // the consuming connection
  uint64_t generation = 0;  // bumped at every (re)connect
  int64_t unsettled = 0;    // deliveries handed out and not settled yet
  bool fetching = false;    // a Fetch is under way (it unlocks while it polls)
  std::chrono::steady_clock::time_point last_fetch = std::chrono::steady_clock::now();
  std::mutex pub_mu;   // guards publisher
  RabbitMqPublisher publisher;

  // Deliveries whose copy failed, given back (nack, requeue) once `due`: at
  // once, a copy that failed would fail again, in a loop as fast as the network.
  // Still unsettled until then (the idle release waits for them). Guarded by
  // conn_mu; the source's watcher thread gives them back.
  struct Held {
    uint64_t gen, tag;
    std::chrono::steady_clock::time_point due;
  };
  std::vector<Held> held;

  void HoldThenRequeue(uint64_t gen, uint64_t tag, Millis delay) {
    std::lock_guard<std::mutex> lock(conn_mu);
    held.push_back({gen, tag, std::chrono::steady_clock::now() + delay});
  }
  // With conn_mu held: nacks (requeue) what is due.
  void RequeueDueLocked() {
    const auto now = std::chrono::steady_clock::now();
    for (size_t i = 0; i < held.size();) {
      if (held[i].due > now) {
        ++i;
        continue;
      }
      (void)SettleLocked(held[i].gen, held[i].tag, false, true);
      held[i] = held.back();
      held.pop_back();
    }
  }

  // basic.ack / basic.nack of `tag` if the connection it came from still lives.
  Status Settle(uint64_t gen, uint64_t tag, bool ack, bool requeue) {
    std::lock_guard<std::mutex> lock(conn_mu);
    return SettleLocked(gen, tag, ack, requeue);
  }
  Status SettleLocked(uint64_t gen, uint64_t tag, bool ack, bool requeue) {
    --unsettled;
    if (gen != generation || !conn.open()) {
      return Status::Unavailable(conn.Name() +
                                 ": the connection this delivery came on is gone; the broker "
                                 "delivers it again");
    }
    const int rc = ack ? amqp_basic_ack(conn.get(), kChannel, tag, 0)
                       : amqp_basic_nack(conn.get(), kChannel, tag, 0, requeue ? 1 : 0);
    if (rc != AMQP_STATUS_OK) return conn.LibraryError(rc, ack ? "basic.ack" : "basic.nack");
    return Status::Ok();
  }
};

// A copy's properties go in one content-header frame (frame_max 131072, which
// both sides use), less that frame's and the header's own bytes and a margin.
constexpr size_t kMaxCopyProperties = 131072 - 1024;

class RabbitMqDelivery final : public Delivery {
 public:
  RabbitMqDelivery(std::shared_ptr<Shared> s, uint64_t gen, uint64_t tag, std::string message_id)
      : s_(std::move(s)), gen_(gen), tag_(tag), message_id_(std::move(message_id)) {}

  void Fill(std::string key, std::string key_error, std::string payload, uint32_t count,
            std::vector<std::pair<std::string, std::string>> attrs,
            std::shared_ptr<const OwnedProperties> properties) {
    properties_ = std::move(properties);
    key_ = std::move(key);
    key_error_ = std::move(key_error);
    payload_ = std::move(payload);
    id_ = std::to_string(gen_) + ":" + std::to_string(tag_);
    delivery_count_ = count;
    attributes_ = std::move(attrs);
  }

  // A delivery dropped unsettled by the source itself (its connection broke).
  void Forget() { forgotten_ = true; }
  ~RabbitMqDelivery() override {
    if (!settled_ && !forgotten_) {  // dropped without a settle: no longer outstanding here
      std::lock_guard<std::mutex> lock(s_->conn_mu);
      --s_->unsettled;
    }
  }

  Status Ack() override {
    settled_ = true;
    return s_->Settle(gen_, tag_, true, false);
  }

  Status Retry(Millis after) override {
    settled_ = true;
    if (after.count() <= 0) return s_->Settle(gen_, tag_, false, /*requeue=*/true);
    Status sent = Copy([&](RabbitMqPublisher& p, AmqpMessage& m, bool /*again*/) {
      std::string q;
      DEDUP_RETURN_IF_ERROR(p.DeclareRetryQueue(RetryStep(after), &q));
      return p.Send("", q, m);
    });
    if (!sent.ok()) return Requeue(sent);
    return s_->Settle(gen_, tag_, true, false);
  }

  Status DeadLetter(std::string_view reason) override {
    settled_ = true;
    Status sent = Copy([&](RabbitMqPublisher& p, AmqpMessage& m, bool again) {
      if (again) DEDUP_RETURN_IF_ERROR(p.DeclareTopology());
      if (!again) {
        m.headers.emplace_back("x-dedup-reason", brokers::HeaderReason(reason));
        m.headers.emplace_back("x-dedup-queue", s_->o.queue);
        if (CopyProperties(m, s_->o.user).EncodedSize() > kMaxCopyProperties) {
          // The original's headers and the reason do not fit one frame:
          // rabbitmq-c refused the copy on every delivery, so the message was
          // never dead-lettered nor settled, back once a second for ever
          // (brokers17). The copy goes without the original's headers.
          const amqp_basic_properties_t& o = properties_->get();
          const int original = (o._flags & AMQP_BASIC_HEADERS_FLAG) != 0 ? o.headers.num_entries : 0;
          m.drop_original_headers = true;
          m.headers.emplace_back("x-dedup-headers-dropped",
                                 std::to_string(original) +
                                     " headers: the copy with them was over one 128 KiB frame");
        }
      }
      return p.Send(s_->o.DeadName(), "", m);
    });
    if (!sent.ok()) return Requeue(sent);
    return s_->Settle(gen_, tag_, true, false);
  }

 private:
  // Publishes a confirmed copy of this message (same body and properties, as
  // AmqpMessage::original says).
  // When the broker says for sure that it did not take the copy (unroutable: the
  // queue was deleted; NOT_FOUND: the exchange was; never on a nack, a timeout or
  // a lost connection, which leave it unknown), its target is declared
  // again and the copy sent once more: otherwise every delivery of the message
  // would fail the same way and be requeued at once, a storm. `send(p, m, again)`.
  template <typename F>
  Status Copy(F&& send) {
    AmqpMessage m;
    m.body = payload_;
    m.message_id = message_id_;
    m.original = properties_;
    std::lock_guard<std::mutex> lock(s_->pub_mu);
    Status st = send(s_->publisher, m, false);
    if (st.ok()) st = s_->publisher.WaitConfirms();
    if (st.code() == StatusCode::kFailedPrecondition || st.code() == StatusCode::kNotFound) {
      s_->publisher.ForgetDeclared();
      st = send(s_->publisher, m, true);
      if (st.ok()) st = s_->publisher.WaitConfirms();
    }
    return st;
  }

  // The copy could not be made: give the message back (nack, requeue) a little
  // later rather than hold it unacked until the connection closes, and not at
  // once: it would come straight back and fail the same way, in a loop.
  Status Requeue(const Status& why) {
    s_->HoldThenRequeue(gen_, tag_, kRequeueAfterFailedCopy);
    return why;
  }

  std::shared_ptr<Shared> s_;
  uint64_t gen_;
  uint64_t tag_;
  std::string message_id_;
  std::shared_ptr<const OwnedProperties> properties_;  // for copies
  bool settled_ = false;
  bool forgotten_ = false;
};

class RabbitMqSource final : public MessageSource {
 public:
  explicit RabbitMqSource(const RabbitMqOptions& o)
      : s_(std::make_shared<Shared>(o)), idle_watch_([this] { WatchIdle(); }) {}
  // Closes the consuming connection even while deliveries (which share its state)
  // live on: the broker requeues what was not settled, and settling them later
  // answers Unavailable.
  ~RabbitMqSource() override {
    {
      std::lock_guard<std::mutex> lock(idle_mu_);
      closing_ = true;
    }
    idle_cv_.notify_all();
    idle_watch_.join();
    std::lock_guard<std::mutex> lock(s_->conn_mu);
    s_->conn.Close();
    ++s_->generation;
  }

  Status Setup() {
    std::lock_guard<std::mutex> lock(s_->pub_mu);
    return s_->publisher.DeclareTopology();
  }

  StatusOr<std::vector<std::unique_ptr<Delivery>>> Fetch(size_t max, Millis wait) override {
    std::vector<std::unique_ptr<Delivery>> out;
    const auto deadline = std::chrono::steady_clock::now() + wait;
    std::unique_lock<std::mutex> lock(s_->conn_mu);
    s_->last_fetch = std::chrono::steady_clock::now();
    s_->fetching = true;
    struct Done {
      Shared* s;
      ~Done() {  // runs with conn_mu held (declared after `lock`)
        s->fetching = false;
        s->last_fetch = std::chrono::steady_clock::now();
      }
    } done{s_.get()};
    if (!s_->conn.open()) DEDUP_RETURN_IF_ERROR(ConnectLocked());
    while (out.size() < max) {
      amqp_connection_state_t c = s_->conn.get();
      const bool buffered = amqp_data_in_buffer(c) || amqp_frames_enqueued(c);
      if (!buffered) {
        // Nothing read yet: wait for the socket without the lock, so that other
        // threads can ack meanwhile. Once a batch has begun, return it.
        if (!out.empty()) break;
        const auto left = std::chrono::duration_cast<Millis>(deadline - std::chrono::steady_clock::now());
        if (left.count() <= 0) break;
        pollfd p{amqp_get_sockfd(c), POLLIN, 0};
        const uint64_t gen = s_->generation;
        lock.unlock();
        const int pr = poll(&p, 1, static_cast<int>(std::min<long long>(left.count(), 100)));
        lock.lock();
        if (gen != s_->generation || !s_->conn.open()) {
          return Status::Unavailable(s_->conn.Name() + ": connection lost");
        }
        if (pr <= 0) continue;  // timeout (heartbeats are sent by the read below)
      }
      amqp_maybe_release_buffers(c);
      amqp_envelope_t env;
      timeval tv{0, 20'000};
      amqp_rpc_reply_t r = amqp_consume_message(c, &env, &tv, 0);
      if (r.reply_type == AMQP_RESPONSE_NORMAL) {
        out.push_back(Make(env));
        amqp_destroy_envelope(&env);
        continue;
      }
      if (r.reply_type == AMQP_RESPONSE_LIBRARY_EXCEPTION && r.library_error == AMQP_STATUS_TIMEOUT) {
        continue;
      }
      if (r.reply_type == AMQP_RESPONSE_LIBRARY_EXCEPTION &&
          r.library_error == AMQP_STATUS_UNEXPECTED_STATE) {
        amqp_frame_t frame;
        const int rc = amqp_simple_wait_frame(c, &frame);
        if (rc != AMQP_STATUS_OK) return Broken(s_->conn.LibraryError(rc, "reading a frame"), &out);
        if (frame.frame_type == AMQP_FRAME_METHOD &&
            (frame.payload.method.id == AMQP_BASIC_ACK_METHOD)) {
          continue;
        }
        // channel.close, connection.close (answered with their close-ok), basic.cancel
        // (queue deleted) ...: the next Fetch opens the channel (or connection) again.
        if (frame.frame_type == AMQP_FRAME_METHOD &&
            (frame.payload.method.id == AMQP_CHANNEL_CLOSE_METHOD ||
             frame.payload.method.id == AMQP_CONNECTION_CLOSE_METHOD)) {
          Status closed = s_->conn.ServerClosed(frame.payload.method, "consume " + s_->o.queue);
          return Broken(Status::Unavailable(closed.message()), &out);
        }
        s_->conn.Close();
        if (frame.frame_type == AMQP_FRAME_METHOD &&
            frame.payload.method.id == AMQP_BASIC_CANCEL_METHOD) {
          // The queue was deleted (or its node went away): the next Fetch
          // consumes again, declaring the queue first if it is missing.
          return Broken(Status::Unavailable(s_->conn.Name() + ": the broker cancelled the consumer of queue '" +
                                            internal::Printable(s_->o.queue) +
                                            "' (was it deleted?)"),
                        &out);
        }
        return Broken(Status::Unavailable(s_->conn.Name() + ": the server closed the consumer (method " +
                                          std::to_string(frame.payload.method.id) + ")"),
                      &out);
      }
      s_->conn.Drop();
      return Broken(Status::Unavailable(s_->conn.Name() + ": connection lost while consuming"), &out);
    }
    return out;
  }

  // basic.ack needs no round trip: one lock each, and each delivery's own
  // answer (one of a connection that is gone fails alone).
  std::vector<Status> AckBatch(std::span<Delivery* const> deliveries) override {
    std::vector<Status> out;
    out.reserve(deliveries.size());
    for (Delivery* d : deliveries) out.push_back(d->Ack());
    return out;
  }

  std::string Describe() const override { return s_->o.Describe(); }

 private:
  // Also sends the heartbeats of both connections (AmqpConn::KeepAlive): the
  // consuming one may go without a Fetch for as long as handlers run (the
  // Consumer fetches nothing while its window is full), the publishing one
  // between copies; silent past the heartbeat timeout, the broker closed them.
  //
  // The broker pushes up to `prefetch` messages to a consumer whether or not it
  // fetches. A source nobody fetches from any more (its Consumer stopped, the
  // process lingers) would sit on them, so that no other worker got them until
  // this one exited. When nothing it handed out is unsettled and no Fetch came
  // for kIdleRelease, it closes its connection — the broker requeues what it
  // pushed — and the next Fetch reconnects.
  static constexpr Millis kIdleRelease{1'000};
  void WatchIdle() {
    std::unique_lock<std::mutex> lk(idle_mu_);
    while (!closing_) {
      idle_cv_.wait_for(lk, Millis(200));
      if (closing_) break;
      {
        std::lock_guard<std::mutex> lock(s_->conn_mu);
        s_->RequeueDueLocked();
        if (s_->conn.get() != nullptr && s_->unsettled <= 0 && !s_->fetching &&
            std::chrono::steady_clock::now() - s_->last_fetch > kIdleRelease) {
          s_->conn.Close();
          ++s_->generation;
        }
        // Both connections beat even when nothing else is done on them (a
        // Fetch polls the socket without the lock: a frame may be sent).
        s_->conn.KeepAlive();
      }
      // A copy in progress beats by itself: never waited for.
      std::unique_lock<std::mutex> pub(s_->pub_mu, std::try_to_lock);
      if (pub.owns_lock()) s_->publisher.KeepAlive();
    }
  }

  // A queue deleted under the running source (the broker cancelled its
  // consumer) or while it was away is declared again as at start (Setup), so
  // that consuming resumes instead of failing NOT_FOUND until someone else
  // declares it. Lock order: conn_mu, then pub_mu; never the reverse.
  Status ConnectLocked() {
    Status s = ConsumeLocked();
    if (s.code() != StatusCode::kNotFound) return s;
    {
      std::lock_guard<std::mutex> pub(s_->pub_mu);
      DEDUP_RETURN_IF_ERROR(s_->publisher.DeclareTopology());
    }
    return ConsumeLocked();
  }

  Status ConsumeLocked() {
    DEDUP_RETURN_IF_ERROR(s_->conn.Open());
    ++s_->generation;
    amqp_connection_state_t c = s_->conn.get();
    amqp_basic_qos(c, kChannel, 0, static_cast<uint16_t>(s_->o.prefetch), 0);
    DEDUP_RETURN_IF_ERROR(s_->conn.RpcStatus("basic.qos"));
    amqp_basic_consume(c, kChannel, Bytes(s_->o.queue), amqp_empty_bytes, 0, /*no_ack=*/0, 0,
                       amqp_empty_table);
    return s_->conn.RpcStatus("basic.consume " + s_->o.queue);
  }

  // Deliveries already read on a connection that just broke can no longer be
  // acked: drop them (the broker requeues them) and report the failure.
  Status Broken(Status s, std::vector<std::unique_ptr<Delivery>>* out) {
    s_->unsettled -= static_cast<int64_t>(out->size());
    for (auto& d : *out) static_cast<RabbitMqDelivery*>(d.get())->Forget();
    out->clear();
    return s;
  }

  std::unique_ptr<Delivery> Make(const amqp_envelope_t& env) {
    const amqp_basic_properties_t& p = env.message.properties;
    std::string message_id;
    if ((p._flags & AMQP_BASIC_MESSAGE_ID_FLAG) != 0) message_id = Str(p.message_id);
    std::vector<std::pair<std::string, std::string>> attrs;
    if (!message_id.empty()) attrs.emplace_back("message_id", message_id);
    uint32_t count = 0;
    if ((p._flags & AMQP_BASIC_HEADERS_FLAG) != 0) {
      for (int i = 0; i < p.headers.num_entries; ++i) {
        const amqp_table_entry_t& e = p.headers.entries[i];
        std::string v;
        if (!FieldText(e.value, &v)) continue;
        std::string k = Str(e.key);
        if (k == "x-delivery-count") count = static_cast<uint32_t>(std::strtoul(v.c_str(), nullptr, 10)) + 1;
        attrs.emplace_back(std::move(k), std::move(v));
      }
    }
    // A quorum queue counts earlier deliveries in x-delivery-count (absent on
    // the first: 0, "not said"). The redelivered flag cannot tell a first
    // delivery: a copy back from a retry queue is a new message to the broker.
    std::string body = Str(env.message.body);
    std::string key, key_error;
    switch (s_->o.key.kind) {
      case brokers::KeyKind::kHeader: {
        auto it = std::find_if(attrs.begin(), attrs.end(),
                               [&](const auto& kv) { return kv.first == s_->o.key.name; });
        const auto copies = std::count_if(attrs.begin(), attrs.end(), [&](const auto& kv) {
          return kv.first == s_->o.key.name;
        });
        if (it == attrs.end() || it->second.empty()) {
          key_error = "message has no header '" + s_->o.key.name + "'";
        } else if (copies > 1) {
          // A table with the name twice (the AMQP wire allows it): which is the key?
          key_error = "message has " + std::to_string(copies) + " headers '" + s_->o.key.name +
                      "': a key is one value";
        } else {
          key = s_->o.key_prefix + it->second;
        }
        break;
      }
      case brokers::KeyKind::kContentSha256:
        key = s_->o.key_prefix + internal::HexSha256(body);
        break;
      default:  // the message_id property, the only one AMQP's grammar names
        if (message_id.empty()) key_error = "message has no message_id property";
        else key = s_->o.key_prefix + message_id;
        break;
    }
    ++s_->unsettled;
    auto d = std::make_unique<RabbitMqDelivery>(s_, s_->generation, env.delivery_tag, message_id);
    d->Fill(std::move(key), std::move(key_error), std::move(body), count, std::move(attrs),
            std::make_shared<const OwnedProperties>(p));
    return d;
  }

  std::shared_ptr<Shared> s_;
  std::mutex idle_mu_;
  std::condition_variable idle_cv_;
  bool closing_ = false;
  std::thread idle_watch_;
};

}  // namespace

StatusOr<std::unique_ptr<MessageSource>> OpenRabbitMqSource(const RabbitMqOptions& o) {
  if (o.queue.empty()) return Status::InvalidArgument("rabbitmq source: queue is empty");
  DEDUP_RETURN_IF_ERROR(CheckNames(o));
  DEDUP_RETURN_IF_ERROR(CheckHeartbeat(o.heartbeat));
  if (o.prefetch < 1 || o.prefetch > 65535) {
    return Status::InvalidArgument("rabbitmq source: prefetch must be 1..65535");
  }
  auto src = std::make_unique<RabbitMqSource>(o);
  DEDUP_RETURN_IF_ERROR(src->Setup());
  return std::unique_ptr<MessageSource>(std::move(src));
}

StatusOr<std::unique_ptr<MessageSource>> OpenRabbitMqSource(std::string_view uri,
                                                            const SourceOptions& /*options*/) {
  auto o = ParseRabbitMqUri(uri);
  if (!o.ok()) return o.status();
  return OpenRabbitMqSource(*o);
}

}  // namespace dedup::rabbitmq
