// Copyright dedup authors. Licensed under the Apache License 2.0.
//
// The brokers the consumer conformance suite (tests/consumer_conformance_test.cc)
// runs against, behind one interface, the way tests/store_envs.h does for stores.
// A new broker joins the suite with one SourceEnv subclass and one line in
// AvailableSourceNames() / MakeSourceEnv(); the cases do not change.
//
// Brokers run in real time (a redelivery timer is a broker's own), so the cases
// sleep; they keep every timer short (hundreds of milliseconds) and wait for
// conditions with a deadline instead of fixed sleeps.
//
// Which brokers are included:
//   memory          always (src/brokers/memory)
//   redis_streams   when redis-server is on PATH: the env starts its own server on
//                   the first free port in 6450-6459 (docs/PORTS.md), stopped by
//                   PID at exit and killed with the test process (PDEATHSIG);
//                   or the server DEDUP_TEST_STREAMS_REDIS ("host:port") names.

#ifndef DEDUP_TESTS_SOURCE_ENVS_H_
#define DEDUP_TESTS_SOURCE_ENVS_H_

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "dedup/clock.h"
#include "dedup/consumer.h"
#include "dedup/status.h"

namespace dedup::testing {

struct SourceEnvOptions {
  // A delivery fetched by a consumer that crashed (or never settled it) is
  // handed out again after about this long: the visibility timeout, XAUTOCLAIM's
  // min-idle, AMQP's channel close, JetStream's AckWait. Default: 400 ms.
  Millis redelivery_after{400};
};

class SourceEnv {
 public:
  virtual ~SourceEnv() = default;

  // "memory", "redis_streams", "rabbitmq", "nats": a gtest-safe name.
  virtual std::string Name() const = 0;

  // A fresh, empty queue (stream, queue, subject) for one test case; every later
  // call refers to it. Called once per env, before anything else.
  virtual Status Reset(const SourceEnvOptions& options) = 0;

  // A new consumer on the queue, as one worker process would open it. Every
  // source of one env shares the queue (a consumer group, competing consumers).
  virtual StatusOr<std::unique_ptr<MessageSource>> OpenSource() = 0;

  // Publishes one message whose dedup key is `key` (carried where this broker's
  // source reads keys: stream field "id", a header ...) with `payload`. An empty
  // `key` publishes a message without any key.
  virtual Status Publish(std::string_view key, std::string_view payload) = 0;

  // Messages neither acked nor dead-lettered: still queued, or delivered and not
  // settled (pending / unacked / in flight).
  virtual StatusOr<size_t> Outstanding() = 0;

  // The reasons of the messages dead-lettered so far, in order.
  virtual StatusOr<std::vector<std::string>> DeadLetterReasons() = 0;

  // A worker crash: `source` goes away without settling anything it fetched (its
  // connection is dropped; no ack, no nack). The broker hands those deliveries
  // out again after about redelivery_after.
  virtual void Crash(std::unique_ptr<MessageSource> source) = 0;
};

// Every broker this build and this machine can test.
std::vector<std::string> AvailableSourceNames();
std::unique_ptr<SourceEnv> MakeSourceEnv(const std::string& name);

}  // namespace dedup::testing

#endif  // DEDUP_TESTS_SOURCE_ENVS_H_
