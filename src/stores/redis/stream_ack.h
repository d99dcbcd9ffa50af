// Copyright dedup authors. Licensed under the Apache License 2.0.
//
// Internal hook (not public API): complete and ack a Redis stream entry in one
// round trip, when the Buffer's store is a plain Redis store on the same server
// and database as the stream (docs/WORKER.md, docs/REDIS_PROTOCOL.md
// "complete_ack").
//
// The worker puts a StreamAck in scope around Buffer::ProcessOnce for one entry.
// While it is in scope, a Complete(key, ..., kOk, ...) of that same key by a store
// that implements StreamAckStore, on the same thread, runs complete_ack.lua:
// complete.lua and, only if the completion is OK, XACK stream group entry_id,
// atomically. Everything else (other keys, failed/exhausted completions, other
// stores, other threads) is untouched. `acked` tells the worker whether the XACK
// happened; when it did not, the worker acks (or not) as before.

#ifndef DEDUP_SRC_STORES_REDIS_STREAM_ACK_H_
#define DEDUP_SRC_STORES_REDIS_STREAM_ACK_H_

#include <string_view>

namespace dedup::internal {

struct StreamAck {
  std::string_view key;       // the dedup key whose completion carries the ack
  std::string_view stream;    // stream key
  std::string_view group;     // consumer group
  std::string_view entry_id;  // stream entry ID
  // Set by the store: the completion script ran and its XACK acked the entry.
  bool acked = false;
  // Set by the store: complete_ack.lua was sent (at least once).
  bool tried = false;
};

// Implemented by the Redis store (src/stores/redis/redis_store.cc).
class StreamAckStore {
 public:
  // True when a stream on `host`:`port`, logical database `db`, lives in the same
  // keyspace as this store's records (plain Redis, not a cluster).
  virtual bool CanAckStreamOn(std::string_view host, int port, int db) const = 0;

 protected:
  ~StreamAckStore() = default;
};

// Puts `ack` in scope for this thread (nullptr: nothing). Nests.
class ScopedStreamAck {
 public:
  explicit ScopedStreamAck(StreamAck* ack) : prev_(current_) { current_ = ack; }
  ~ScopedStreamAck() { current_ = prev_; }
  ScopedStreamAck(const ScopedStreamAck&) = delete;
  ScopedStreamAck& operator=(const ScopedStreamAck&) = delete;
  // The ack in scope for `key` on this thread, or nullptr.
  static StreamAck* For(std::string_view key) {
    return current_ != nullptr && current_->key == key ? current_ : nullptr;
  }

 private:
  static inline thread_local StreamAck* current_ = nullptr;
  StreamAck* prev_;
};

}  // namespace dedup::internal

#endif  // DEDUP_SRC_STORES_REDIS_STREAM_ACK_H_
