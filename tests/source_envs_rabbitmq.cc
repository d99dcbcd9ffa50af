// Copyright dedup authors. Licensed under the Apache License 2.0.
//
// The RabbitMQ env of the consumer conformance suite (tests/source_envs.h). It
// uses the node tests/with_rabbitmq.sh started (DEDUP_TEST_AMQP_URI and
// DEDUP_TEST_RABBITMQCTL); without them the env is not available. Each case gets
// a queue of its own. Outstanding() asks the node itself (rabbitmqctl
// list_queues: ready + unacked, over the queue and its retry queues), so it sees
// what a consumer holds unacked, not only what waits in the queue.

#ifdef DEDUP_WITH_RABBITMQ

#include <cstdio>
#include <cstdlib>
#include <sstream>

#include "brokers/rabbitmq/amqp_conn.h"
#include "brokers/rabbitmq/rabbitmq_source.h"
#include "dedup/record.h"
#include "source_envs.h"

namespace dedup::testing {
namespace {

using rabbitmq::AmqpConn;
using rabbitmq::Bytes;
using rabbitmq::kChannel;
using rabbitmq::Str;

class RabbitMqEnv final : public SourceEnv {
 public:
  std::string Name() const override { return "rabbitmq"; }

  Status Reset(const SourceEnvOptions&) override {
    const char* base = std::getenv("DEDUP_TEST_AMQP_URI");
    if (base == nullptr) return Status::Unavailable("DEDUP_TEST_AMQP_URI is not set");
    queue_ = "conformance-" + Token::Random().ToHex();
    auto o = rabbitmq::ParseRabbitMqUri(std::string(base) + "?queue=" + queue_ + "&prefetch=16");
    if (!o.ok()) return o.status();
    options_ = *o;
    publisher_ = std::make_unique<rabbitmq::RabbitMqPublisher>(options_);
    return publisher_->DeclareTopology();
  }

  StatusOr<std::unique_ptr<MessageSource>> OpenSource() override {
    return rabbitmq::OpenRabbitMqSource(options_);
  }

  Status Publish(std::string_view key, std::string_view payload) override {
    rabbitmq::AmqpMessage m;
    m.body = std::string(payload);
    m.message_id = std::string(key);
    DEDUP_RETURN_IF_ERROR(publisher_->Send("", queue_, m));
    return publisher_->WaitConfirms();
  }

  StatusOr<size_t> Outstanding() override {
    const char* ctl = std::getenv("DEDUP_TEST_RABBITMQCTL");
    if (ctl == nullptr) return Status::Unavailable("DEDUP_TEST_RABBITMQCTL is not set");
    const std::string cmd = std::string(ctl) + " -q list_queues name messages 2>/dev/null";
    FILE* p = popen(cmd.c_str(), "r");
    if (p == nullptr) return Status::Internal("cannot run rabbitmqctl");
    size_t total = 0;
    bool seen = false;
    char line[512];
    while (std::fgets(line, sizeof(line), p) != nullptr) {
      std::istringstream in(line);
      std::string name;
      size_t n = 0;
      if (!(in >> name >> n)) continue;
      if (name == queue_ || name.rfind(queue_ + ".retry.", 0) == 0) {
        total += n;
        seen |= name == queue_;
      }
    }
    const int rc = pclose(p);
    if (rc != 0 || !seen) return Status::Unavailable("rabbitmqctl list_queues failed");
    return total;
  }

  StatusOr<std::vector<std::string>> DeadLetterReasons() override {
    // basic.get every dead letter without acking, then close: they go back in order.
    AmqpConn conn(options_);
    DEDUP_RETURN_IF_ERROR(conn.Open());
    std::vector<std::string> out;
    const std::string dead = options_.DeadName();
    for (;;) {
      amqp_rpc_reply_t r = amqp_basic_get(conn.get(), kChannel, Bytes(dead), /*no_ack=*/0);
      if (r.reply_type != AMQP_RESPONSE_NORMAL) return conn.RpcStatus("basic.get " + dead);
      if (r.reply.id != AMQP_BASIC_GET_OK_METHOD) break;  // get-empty
      amqp_message_t msg;
      amqp_rpc_reply_t rr = amqp_read_message(conn.get(), kChannel, &msg, 0);
      if (rr.reply_type != AMQP_RESPONSE_NORMAL) return Status::Unavailable("reading a dead letter");
      std::string reason;
      const amqp_basic_properties_t& p = msg.properties;
      if ((p._flags & AMQP_BASIC_HEADERS_FLAG) != 0) {
        for (int i = 0; i < p.headers.num_entries; ++i) {
          const amqp_table_entry_t& e = p.headers.entries[i];
          if (Str(e.key) == "x-dedup-reason" && e.value.kind == AMQP_FIELD_KIND_UTF8) {
            reason = Str(e.value.value.bytes);
          }
        }
      }
      out.push_back(reason);
      amqp_destroy_message(&msg);
      amqp_maybe_release_buffers(conn.get());
    }
    return out;
  }

  void Crash(std::unique_ptr<MessageSource> source) override {
    // Closing its connection without settling: the broker requeues what it held.
    source.reset();
  }

 private:
  std::string queue_;
  rabbitmq::RabbitMqOptions options_;
  std::unique_ptr<rabbitmq::RabbitMqPublisher> publisher_;
};

}  // namespace

bool RabbitMqEnvAvailable() {
  return std::getenv("DEDUP_TEST_AMQP_URI") != nullptr &&
         std::getenv("DEDUP_TEST_RABBITMQCTL") != nullptr;
}
std::unique_ptr<SourceEnv> MakeRabbitMqEnv() { return std::make_unique<RabbitMqEnv>(); }

}  // namespace dedup::testing

#endif  // DEDUP_WITH_RABBITMQ
