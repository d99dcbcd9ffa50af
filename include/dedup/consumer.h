// Copyright dedup authors. Licensed under the Apache License 2.0.
//
// The consumer seam: every broker plugs into dedup through a MessageSource that
// fetches batches of Deliveries, and one broker-neutral Consumer runs them through
// a Buffer. Data flows one way, with no side channel:
//
//   broker ──> MessageSource ──> Consumer ──> Buffer ──> Store
//
// A *delivery* is one receipt of a message from a broker; a *message* may be
// delivered many times; its *key* identifies the work (never the broker's
// delivery id, which differs for every publish or redelivery).
//
// What the Consumer tells the broker follows SPEC.md, "What a worker does with
// each result", through Buffer::ProcessOnce's BrokerAction:
//
//   kAck         Delivery::Ack() — only after the outcome is recorded (or the claim
//                was DUPLICATE of recorded work); never for BUSY or a store error
//   kRetry       Delivery::Retry(after) — the broker delivers it again no earlier
//                than `after` (stays pending / NAK with delay / retry queue)
//   kDeadLetter  Delivery::DeadLetter(reason) — moved aside with the reason, then
//                acked so the broker stops delivering it
//
// A delivery whose message has no key (key_error() not empty) is dead-lettered
// with that reason; it is never processed unguarded.
//
// Guarantees a MessageSource must give (checked by tests/consumer_conformance_test):
//   * A delivery not acked (retried, dead-lettered later, or abandoned by a
//     crashed worker) is delivered again, to this or another worker.
//   * Ack/Retry/DeadLetter are called at most once per Delivery, from any thread.
//   * Fetch is called from one thread at a time.

#ifndef DEDUP_CONSUMER_H_
#define DEDUP_CONSUMER_H_

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "dedup/clock.h"
#include "dedup/status.h"

namespace dedup {

// Where a store may carry out a broker's acknowledgement in the same atomic step
// as a completion (for example a Redis stream entry acked by the completion's
// script on the same server). Sources describe their ack; stores that can do it
// say so through Store::CanCompleteWithAck (store.h). Both sides compare
// `server` (a canonical "host:port/db" or similar) and `kind`.
struct BrokerAck {
  std::string_view kind;      // e.g. "redis-stream"
  std::string_view server;    // canonical server identity, e.g. "127.0.0.1:6379/0"
  std::string_view target;    // e.g. the stream key
  std::string_view group;     // e.g. the consumer group
  std::string_view id;        // e.g. the entry id
};

// One receipt of a message. Made by a MessageSource; owned by the Consumer.
class Delivery {
 public:
  virtual ~Delivery() = default;

  // The dedup key (any namespace prefix included). Empty when the message has no
  // key; key_error() then says why.
  const std::string& key() const { return key_; }
  const std::string& key_error() const { return key_error_; }
  // The bytes the handler receives and payload fingerprints are taken of.
  const std::string& payload() const { return payload_; }
  // The broker's id of this delivery (stream entry id, delivery tag, sequence).
  const std::string& id() const { return id_; }
  // How many times the broker has delivered this message, counting this one;
  // 0 when the broker does not say.
  uint32_t delivery_count() const { return delivery_count_; }
  // Named values the broker carries with the message (stream fields, AMQP headers,
  // NATS headers), for handlers that want them.
  const std::vector<std::pair<std::string, std::string>>& attributes() const {
    return attributes_;
  }

  // Settles the delivery. Exactly one of them is called, once.
  [[nodiscard]] virtual Status Ack() = 0;
  [[nodiscard]] virtual Status Retry(Millis after) = 0;
  [[nodiscard]] virtual Status DeadLetter(std::string_view reason) = 0;

  // Tells the broker the message is still being worked on (JetStream's +WPI), so
  // it does not redeliver while the lease is being extended. Default: nothing.
  [[nodiscard]] virtual Status InProgress() { return Status::Ok(); }

  // The ack a store may fuse with the completion, or nullptr when this broker's
  // ack cannot be done by a store. After a fused completion answered OK, the
  // Consumer calls MarkAcked() instead of Ack().
  virtual const BrokerAck* fused_ack() const { return nullptr; }
  virtual void MarkAcked() {}

 protected:
  std::string key_;
  std::string key_error_;
  std::string payload_;
  std::string id_;
  uint32_t delivery_count_ = 0;
  std::vector<std::pair<std::string, std::string>> attributes_;
};

// A broker's side of the seam: fetches batches of deliveries.
class MessageSource {
 public:
  virtual ~MessageSource() = default;

  // Up to `max` deliveries, waiting at most `wait` for the first one; an empty
  // batch when none came. Unavailable when the broker cannot be reached (the
  // Consumer backs off and calls again; the source reconnects).
  [[nodiscard]] virtual StatusOr<std::vector<std::unique_ptr<Delivery>>> Fetch(size_t max,
                                                                              Millis wait) = 0;

  // Settles several deliveries that all get Ack(), in as few round trips as the
  // broker allows. Default: Ack() each.
  [[nodiscard]] virtual Status AckBatch(std::span<Delivery* const> deliveries) {
    Status first;
    for (Delivery* d : deliveries) {
      Status s = d->Ack();
      if (!s.ok() && first.ok()) first = std::move(s);
    }
    return first;
  }

  // "redis-streams 127.0.0.1:6379 stream=jobs group=billing" (never a password).
  virtual std::string Describe() const = 0;
};

}  // namespace dedup

#endif  // DEDUP_CONSUMER_H_
