// Copyright dedup authors. Licensed under the Apache License 2.0.
//
// The RabbitMQ env of the consumer conformance suite (tests/source_envs.h). It
// uses the node tests/with_rabbitmq.sh started (DEDUP_TEST_AMQP_URI and
// DEDUP_TEST_RABBITMQ_EVAL); without them the env is not available. Each case gets
// a queue of its own. Outstanding() asks the node itself (its queues' message
// counts: ready + unacked, over the queue and its retry queues, evaluated on the
// node through DEDUP_TEST_RABBITMQ_EVAL in milliseconds), so it sees what a
// consumer holds unacked, not only what waits in the queue.

#ifdef DEDUP_WITH_RABBITMQ

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <thread>

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
    // The node's own count (ready + unacked) of the queue and its retry queues.
    // One reading walks the queues one after another, so a message that moves
    // between them meanwhile (a retry copy published before its original's ack
    // lands, a copy dead-lettered back from its retry queue) can be counted twice
    // or not at all; a message moves once at a time, so two readings in a row
    // that agree are the state the broker holds.
    auto last = CountOnce();
    for (int i = 0; i < 50 && last.ok(); ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
      auto now = CountOnce();
      if (!now.ok() || *now == *last) return now;
      last = now;
    }
    return last.ok() ? Status::Unavailable("the count of " + queue_ + " never settled") : last;
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
  // One reading, evaluated on the node through erl_call: rabbitmqctl would answer
  // the same but boots an Erlang VM per call (0.4-1.5 s), longer than the BUSY
  // case's 800 ms window.
  StatusOr<size_t> CountOnce() {
    const char* eval = std::getenv("DEDUP_TEST_RABBITMQ_EVAL");
    if (eval == nullptr) return Status::Unavailable("DEDUP_TEST_RABBITMQ_EVAL is not set");
    const std::string expr =
        "Q = <<\"" + queue_ + "\">>, P = <<\"" + queue_ + ".retry.\">>, "
        "L = [{N, M} || [{name, {resource, _, queue, N}}, {messages, M}] <- "
        "rabbit_amqqueue:info_all(<<\"" + options_.vhost + "\">>, [name, messages]), "
        "N =:= Q orelse string:prefix(N, P) =/= nomatch], "
        "case lists:keymember(Q, 1, L) of false -> no_queue; "
        "true -> case lists:all(fun({_, M}) -> is_integer(M) end, L) of "
        "true -> lists:sum([M || {_, M} <- L]); false -> not_ready end end.";
    const std::string cmd = std::string(eval) + " '" + expr + "' 2>&1";
    std::string out;
    int rc = 0;
    // A queue whose process is starting (a retry queue just declared, a queue
    // taking back what a closed connection held) has no count yet: asked again.
    for (int attempt = 0; attempt < 200; ++attempt) {
      FILE* p = popen(cmd.c_str(), "r");
      if (p == nullptr) return Status::Internal("cannot run " + std::string(eval));
      out.clear();
      char buf[512];
      while (std::fgets(buf, sizeof(buf), p) != nullptr) out += buf;
      rc = pclose(p);
      if (rc != 0 || out.find("not_ready") == std::string::npos) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    size_t total = 0;
    if (rc != 0 || std::sscanf(out.c_str(), "{ok, %zu}", &total) != 1) {
      return Status::Unavailable("counting the messages of " + queue_ + " on the node: " + out);
    }
    return total;
  }

  std::string queue_;
  rabbitmq::RabbitMqOptions options_;
  std::unique_ptr<rabbitmq::RabbitMqPublisher> publisher_;
};

}  // namespace

bool RabbitMqEnvAvailable() {
  return std::getenv("DEDUP_TEST_AMQP_URI") != nullptr &&
         std::getenv("DEDUP_TEST_RABBITMQ_EVAL") != nullptr;
}
std::unique_ptr<SourceEnv> MakeRabbitMqEnv() { return std::make_unique<RabbitMqEnv>(); }

}  // namespace dedup::testing

#endif  // DEDUP_WITH_RABBITMQ
