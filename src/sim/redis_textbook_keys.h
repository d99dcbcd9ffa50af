// Copyright dedup authors. Licensed under the Apache License 2.0.
//
// The textbook guard's keys (textbook_guard.h) in Redis, for `dedup
// worker --pattern textbook`: SET key processing NX EX ttl, and DEL. Thread-safe
// (a small pool of connections).

#ifndef DEDUP_SRC_SIM_REDIS_TEXTBOOK_KEYS_H_
#define DEDUP_SRC_SIM_REDIS_TEXTBOOK_KEYS_H_

#include <memory>
#include <mutex>
#include <vector>

#include "brokers/redis_streams/stream_conn.h"
#include "sim/textbook_guard.h"

namespace dedup::streams {

class RedisTextbookKeys final : public TextbookKeys {
 public:
  explicit RedisTextbookKeys(ConnOptions conn) : conn_(std::move(conn)) {}
  // EX has whole seconds: the TTL is rounded up. Redis cannot tell an expired key
  // from an absent one: *expired_before is always false.
  StatusOr<bool> SetNx(const std::string& key, Millis ttl, bool* expired_before) override;
  Status Del(const std::string& key) override;

 private:
  StatusOr<ReplyPtr> Run(const std::vector<std::string>& args);
  ConnOptions conn_;
  std::mutex mu_;
  std::vector<std::unique_ptr<StreamConn>> pool_;
};

}  // namespace dedup::streams

#endif  // DEDUP_SRC_SIM_REDIS_TEXTBOOK_KEYS_H_
