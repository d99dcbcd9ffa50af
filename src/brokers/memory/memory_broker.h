// Copyright dedup authors. Licensed under the Apache License 2.0.
//
// An in-process at-least-once broker, and the MessageSource that consumes it: the
// second source of the consumer seam (after Redis Streams), used by `dedup
// simulate` and the consumer conformance suite. It behaves like a queue with a
// visibility timeout (SQS, Pub/Sub, JetStream's AckWait):
//
//   * A published message becomes ready after its delay. A Fetch hands it out:
//     it is in flight until acked, dead-lettered or retried; a message in flight
//     for longer than the visibility timeout is delivered again (to any source).
//   * Ack is per message, like Redis Streams' XACK: an ack through an earlier
//     delivery of the message still removes it.
//   * Retry(after) makes the message ready again `after` from now, unless it was
//     delivered again meanwhile (the visibility timeout fired) or finished.
//   * DeadLetter(reason) finishes the message and keeps the reason.
//   * MemorySource::Crash() stands for the death of the consumer's process: every
//     delivery it handed out and that is not settled yet is abandoned (its Ack /
//     Retry / DeadLetter answer Unavailable and change nothing), so the broker
//     delivers those messages again after the visibility timeout. The source
//     stays usable, as a restarted process would be.
//
// Nothing spins: Fetch waits on a condition variable until a message is ready,
// the next timer is due, or its wait ends. Thread-safe. The broker must outlive
// its sources and their deliveries.

#ifndef DEDUP_SRC_BROKERS_MEMORY_MEMORY_BROKER_H_
#define DEDUP_SRC_BROKERS_MEMORY_MEMORY_BROKER_H_

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "dedup/clock.h"
#include "dedup/consumer.h"

namespace dedup {

struct MemoryBrokerOptions {
  // A delivery not settled within this is delivered again. Default: 30 s.
  Millis visibility_timeout{30'000};
};

class MemorySource;

class MemoryBroker {
 public:
  explicit MemoryBroker(MemoryBrokerOptions options = {});
  ~MemoryBroker();
  MemoryBroker(const MemoryBroker&) = delete;
  MemoryBroker& operator=(const MemoryBroker&) = delete;

  // Publishes a message that becomes ready after `delay`; returns its number
  // (0, 1, 2 ... in publish order). A message with an empty `key` has no key:
  // its deliveries carry `key_error` (default "message has no key").
  uint64_t Publish(std::string key, std::string payload, Millis delay = Millis(0),
                   std::string key_error = {});

  // A new consumer connection.
  std::unique_ptr<MemorySource> Connect(std::string name = "memory");

  // Wakes every Fetch and makes later ones return empty at once.
  void Stop();

  struct Counts {
    uint64_t published = 0;
    uint64_t open = 0;          // neither acked nor dead-lettered
    uint64_t in_flight = 0;     // handed out, not settled
    uint64_t acked = 0;
    uint64_t dead = 0;
    uint64_t deliveries = 0;    // hand-outs, redeliveries included
    uint64_t redeliveries = 0;  // visibility timeouts that fired
  };
  Counts counts() const;

  // Blocks until every message is acked or dead-lettered, or `deadline`; true
  // when all are.
  bool WaitAllFinished(std::chrono::steady_clock::time_point deadline) const;

  // Per message (by number): true while neither acked nor dead-lettered.
  std::vector<bool> OpenMessages() const;
  // Dead-lettered messages and their reasons, in the order they were dead-lettered.
  std::vector<std::pair<uint64_t, std::string>> DeadLetters() const;

  struct Shared;  // the state deliveries and sources share

 private:
  std::shared_ptr<Shared> shared_;
};

class MemorySource final : public MessageSource {
 public:
  ~MemorySource() override;
  StatusOr<std::vector<std::unique_ptr<Delivery>>> Fetch(size_t max, Millis wait) override;
  std::string Describe() const override;

  // The consumer's process dies: see the top of this file.
  void Crash();

 private:
  friend class MemoryBroker;
  MemorySource(std::shared_ptr<MemoryBroker::Shared> shared, std::string name);
  std::shared_ptr<MemoryBroker::Shared> shared_;
  std::string name_;
  uint64_t source_id_;
};

}  // namespace dedup

#endif  // DEDUP_SRC_BROKERS_MEMORY_MEMORY_BROKER_H_
