// Copyright dedup authors. Licensed under the Apache License 2.0.
//
// Worker: the broker-neutral Consumer (consumer.h) over the Redis Streams
// source (src/brokers/redis_streams/streams_source.h), in one object, for
// programs that consume one stream. What it tells the stream follows the
// worker's table of what to do with each result (docs/WORKER.md), through
// Buffer::ProcessOnce:
//
//   ProcessOnce action   stream
//   kAck                 XACK (only after Complete() returned OK, or DUPLICATE of ok);
//                        when the Buffer's store can fuse the ack with the
//                        completion (a Redis store on the stream's server,
//                        database 0: Store::CanCompleteWithAck), the XACK runs
//                        inside the complete script, atomically and only if the
//                        completion is OK: one round trip for both
//   kRetry               no ack: the entry stays pending; this worker delivers it
//                        again no earlier than retry_after (XCLAIM of its own entry)
//   kDeadLetter          XADD <dead stream> with the original fields + reason +
//                        entry_id, then XACK
//
// Guarantees, and their limits:
//   * An entry is acked only once its key's outcome is recorded in the store (or
//     it was moved to the dead-letter stream). A worker killed at any moment loses
//     nothing: its pending entries are taken over by XAUTOCLAIM once idle for
//     `reclaim_min_idle` (>= the lease, so a live owner's heartbeat decides first),
//     or re-read by the same consumer name on restart.
//   * The handler of a key runs again only when a worker died (or lost its lease)
//     after the handler's effect and before Complete(); the rerun has a higher
//     fence (see buffer.h).
//   * The dedup key is the entry's `key_field` (default "id"), or the SHA-256 of
//     its fields; never the stream entry ID, which differs for every publish. An
//     entry without the field is dead-lettered, never processed unguarded.
//   * A dead-letter entry may be written twice if the worker dies between XADD
//     and XACK; it carries `entry_id` so readers can tell.
//
// A Worker's Run() is called from one thread; Stop() may be called from any
// thread or a signal handler.

#ifndef DEDUP_WORKER_H_
#define DEDUP_WORKER_H_

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "dedup/buffer.h"
#include "dedup/consumer.h"
#include "dedup/clock.h"
#include "dedup/status.h"

namespace dedup {

struct WorkerOptions {
  // Redis server of the stream. Default: 127.0.0.1:6379.
  std::string host = "127.0.0.1";
  int port = 6379;
  // AUTH password, when has_password. Default: none.
  std::string password;
  bool has_password = false;
  // ACL user for AUTH; empty = the default user. Default: "".
  std::string user;
  // Logical database of the stream (SELECT). Default: 0.
  int db = 0;
  // The stream and consumer group. Required. The group is created at the start
  // of the stream (XGROUP CREATE ... 0 MKSTREAM) if missing.
  std::string stream;
  std::string group;
  // This consumer's name in the group. Reuse it across restarts: a restarted
  // worker re-reads its own pending entries first. Default: "<hostname>-<pid>".
  std::string consumer;
  // The entry field that holds the message id. Default: "id".
  std::string key_field = "id";
  // Key = hex SHA-256 of the entry's field names and values instead. Default: false.
  bool key_from_content = false;
  // Put before every dedup key (a namespace). Default: "".
  std::string key_prefix;
  // Where dead letters go. Default: "<stream>:dead".
  std::string dead_stream;
  // Handlers run at once. Default: 4.
  int concurrency = 4;
  // XREADGROUP BLOCK: how long one read waits for new entries. Default: 1 s.
  Millis block{1'000};
  // Entries of any consumer pending for longer than this are taken over with
  // XAUTOCLAIM. Keep it above the lease. Default: 0 = lease + 5 s.
  Millis reclaim_min_idle{0};
  // How often to look for entries to take over. Default: 1 s.
  Millis reclaim_interval{1'000};
  // Bounds connecting and each command (plus `block` for reads). Default: 2 s.
  Millis timeout{2'000};
};

// "redis://[:password@]host:port?stream=S&group=G[&consumer=C&key=id|sha256|FIELD
//  &dead=S&prefix=P&block=T&reclaim=T]"; key=sha256 hashes the content,
// any other value names the key field. InvalidArgument names what is wrong.
[[nodiscard]] StatusOr<WorkerOptions> WorkerOptionsFromUri(std::string_view uri);

// One stream entry as the handler sees it.
struct StreamMessage {
  std::string id;  // stream entry ID, e.g. "1700000000000-0"
  std::vector<std::pair<std::string, std::string>> fields;
  std::string key;  // the dedup key (prefix + field or content hash)
  // The fields as one canonical byte string (what key=sha256 hashes and what
  // payload fingerprints are taken of).
  std::string CanonicalPayload() const;
};

// Counters since the worker started (consumer.h).
using WorkerMetrics = ConsumerMetrics;

class Worker {
 public:
  // What a guard answers for one message; the worker turns it into ack / leave
  // pending / dead-letter. Must be safe to call from `concurrency` threads.
  using Processor = std::function<Processed(const StreamMessage&)>;
  using Handler = std::function<HandlerResult(const StreamMessage&, ClaimGuard&)>;

  // Connects and creates the consumer group if missing. Unavailable when Redis
  // cannot be reached, InvalidArgument for bad options.
  [[nodiscard]] static StatusOr<std::unique_ptr<Worker>> Open(WorkerOptions options);
  ~Worker();
  Worker(const Worker&) = delete;
  Worker& operator=(const Worker&) = delete;

  // Runs every message through buffer->ProcessOnce(key, payload, handler) until
  // Stop(). `buffer` must outlive the call. reclaim_min_idle defaults from its lease.
  Status Run(Buffer* buffer, const Handler& handler);
  // Runs every message through `process` (any guard; e.g. the textbook one for
  // comparison) until Stop().
  Status RunWith(const Processor& process);

  // Stops reading; Run() returns once in-flight handlers finished. Entries read but
  // not started stay pending (redelivered later). Async-signal-safe; may be called
  // again, also while Run() returns (Run() destroys its Consumer only once no
  // Stop() is inside it: ConsumerStopper).
  void Stop() { stopper_.Stop(); }
  bool stopping() const { return stopper_.stopping(); }

  WorkerMetrics metrics() const;
  const WorkerOptions& options() const { return options_; }

 private:
  Worker() = default;
  Status RunConsumer(StatusOr<std::unique_ptr<Consumer>> consumer);
  ConsumerOptions ConsumerOptionsFor() const;
  static StreamMessage ToStreamMessage(const Delivery& d);

  WorkerOptions options_;
  std::unique_ptr<MessageSource> source_;
  ConsumerStopper stopper_;        // Stop()'s way to the running Consumer
  mutable std::mutex metrics_mu_;  // keeps the consumer alive while metrics() reads it
  Consumer* consumer_ = nullptr;   // the running one (metrics_mu_)
  WorkerMetrics last_metrics_;     // of the last Run, once it returned
};

}  // namespace dedup

#endif  // DEDUP_WORKER_H_
