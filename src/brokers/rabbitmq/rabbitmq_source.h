// Copyright dedup authors. Licensed under the Apache License 2.0.
//
// RabbitMQ as a MessageSource (consumer.h), on rabbitmq-c (librabbitmq).
//
//   amqp://user:password@host:5672/vhost?queue=jobs&prefetch=32&key=message_id
//
// Parameters:
//   queue=NAME       the queue to consume (declared durable when it does not exist;
//                    at most 235 bytes, so that <queue>.retry.<ms> fits AMQP's 255)
//   prefetch=N       unacked deliveries the broker hands this consumer at once
//                    (basic.qos). Default: 32.
//   key=message_id   the dedup key is the message_id property (default)
//   key=header:NAME  ... the value of header NAME
//   key=sha256       ... the hex SHA-256 of the body
//                    (the key= grammar every source shares: brokers/key_spec.h)
//   prefix=P         prepended to every key (a namespace)
//   dead=NAME        the dead-letter exchange and queue. Default: <queue>.dead
//                    (not the queue itself nor one of its retry queues)
//   heartbeat=DUR    AMQP heartbeat (0: none; at most 65535s, an AMQP short).
//                    Default: 30s. Sent every half interval on both connections
//                    (consuming, publishing copies) by the source's own thread,
//                    also while nothing is fetched or copied
//
// How the consumer seam maps onto AMQP:
//   Ack()            basic.ack of the delivery tag (after the outcome is recorded)
//   Retry(after)     a copy goes to <queue>.retry.<ms>, a durable queue whose
//                    x-message-ttl dead-letters it back to <queue> after <ms> (the
//                    delay rounded up to one of a few fixed steps, so it is never
//                    early), published with a confirm; then the original is acked.
//                    One queue per step instead of a per-message expiration on
//                    one retry queue: RabbitMQ only expires messages at the head
//                    of a queue, so a long delay would hold back every shorter one
//                    behind it. The main queue is never blocked: the message leaves
//                    it at once.
//   DeadLetter(why)  a copy with header x-dedup-reason=<why> goes to the fanout
//                    exchange <dead> (bound to queue <dead>), confirmed; then ack.
//   connection lost  deliveries of the old connection can no longer be settled
//                    (their settle answers Unavailable); the broker requeues them
//                    when it sees the connection close, and Fetch reconnects.
//
// A crash between the confirmed copy and the ack leaves both: a duplicate
// delivery, which the buffer answers as such. Header values are carried as
// strings on copies.

#ifndef DEDUP_SRC_BROKERS_RABBITMQ_RABBITMQ_SOURCE_H_
#define DEDUP_SRC_BROKERS_RABBITMQ_RABBITMQ_SOURCE_H_

#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "brokers/key_spec.h"
#include "dedup/clock.h"
#include "dedup/consumer.h"
#include "dedup/status.h"

namespace dedup::rabbitmq {

struct RabbitMqOptions {
  std::string host = "127.0.0.1";
  int port = 5672;
  // guest:guest when the URI names no user; a user needs a password (inline,
  // possibly empty, or password_file=), else ParseRabbitMqUri refuses the URI.
  std::string user = "guest";
  std::string password = "guest";
  std::string vhost = "/";
  // The queue to consume. Required.
  std::string queue;
  // basic.qos prefetch count. Default: 32.
  int prefetch = 32;
  // Where the key is (brokers/key_spec.h): message_id (default), header:NAME or sha256.
  brokers::KeySpec key{brokers::KeyKind::kProperty, "message_id"};
  std::string key_prefix;
  // Dead-letter exchange and queue. Default: "" = <queue>.dead.
  std::string dead;
  // AMQP heartbeat. Default: 30 s.
  Millis heartbeat{30'000};
  // Timeout of connects and RPCs (declare, confirm). Default: 5 s.
  Millis timeout{5'000};

  std::string DeadName() const { return dead.empty() ? queue + ".dead" : dead; }
  // "amqp 127.0.0.1:5680/ queue=jobs" (never the password).
  std::string Describe() const;
};

// InvalidArgument naming the problem when `uri` is not a valid amqp:// URI.
// `need_queue`: the consumer needs queue=; `dedup publish` too.
StatusOr<RabbitMqOptions> ParseRabbitMqUri(std::string_view uri);

// The delay a retry actually waits: the smallest step >= after (never early).
Millis RetryStep(Millis after);

class OwnedProperties;  // amqp_conn.h

// A message to publish.
struct AmqpMessage {
  std::string body;
  std::string message_id;  // empty: none
  std::vector<std::pair<std::string, std::string>> headers;
  // Set on a copy of a delivered message (retry, dead letter): the original's
  // basic properties are sent as they came (content type, correlation id,
  // reply-to, priority, timestamp, headers of every type ...), except that the
  // copy is persistent, has no expiration (as RabbitMQ's own dead-lettering
  // does: it does not expire again on its way), keeps user_id only when it is
  // the publishing connection's own user (the broker refuses any other), and
  // its headers leave off the original's x-delivery-count (a quorum queue's
  // count: the copy is a new message), x-death, x-first-death-* and
  // x-last-death-* (the broker's dead-letter history, which it reads for
  // cycles), x-dedup-* (the copy gets its own) and
  // CC / BCC (routing keys the original was sent to already);
  // `headers` are added as strings, replacing an original header of the same
  // name.
  std::shared_ptr<const OwnedProperties> original;
  // The original's headers are left off (they do not fit one frame).
  bool drop_original_headers = false;
};

// Publishes with publisher confirms, on a connection of its own. Not
// thread-safe: one caller at a time.
class RabbitMqPublisher {
 public:
  explicit RabbitMqPublisher(RabbitMqOptions o);
  ~RabbitMqPublisher();
  RabbitMqPublisher(const RabbitMqPublisher&) = delete;
  RabbitMqPublisher& operator=(const RabbitMqPublisher&) = delete;

  // Declares the queue the options name (durable), and its dead-letter exchange
  // and queue.
  [[nodiscard]] Status DeclareTopology();
  // Declares <queue>.retry.<step ms> (once per connection).
  [[nodiscard]] Status DeclareRetryQueue(Millis step, std::string* name);
  // Sends one persistent, mandatory message; its confirm is awaited by
  // WaitConfirms. Unavailable when the connection is gone (the next call reconnects).
  [[nodiscard]] Status Send(std::string_view exchange, std::string_view routing_key,
                            const AmqpMessage& m);
  // Waits until the broker confirmed everything sent; an error when any was
  // nacked (Aborted: it may still be in some queues), returned (FailedPrecondition:
  // unroutable, in no queue), refused as it is (InvalidArgument: a 406
  // PRECONDITION_FAILED channel close, e.g. a body over the node's
  // max_message_size), or the connection failed.
  [[nodiscard]] Status WaitConfirms();
  // Forgets which retry queues were declared: the next DeclareRetryQueue
  // declares again (one was deleted under this publisher).
  void ForgetDeclared();
  // A heartbeat when one is due (AmqpConn::KeepAlive): a publisher kept open
  // between rare publishes calls it every few hundred milliseconds.
  void KeepAlive();

 private:
  class Impl;
  std::unique_ptr<Impl> impl_;
};

// The source. Fetch from one thread; settle from any.
StatusOr<std::unique_ptr<MessageSource>> OpenRabbitMqSource(const RabbitMqOptions& o);
// From an amqp:// URI (the broker scheme table's row; `options` is not needed).
StatusOr<std::unique_ptr<MessageSource>> OpenRabbitMqSource(std::string_view uri,
                                                            const SourceOptions& options = {});

}  // namespace dedup::rabbitmq

#endif  // DEDUP_SRC_BROKERS_RABBITMQ_RABBITMQ_SOURCE_H_
