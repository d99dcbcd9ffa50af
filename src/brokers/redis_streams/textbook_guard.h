// Copyright dedup authors. Licensed under the Apache License 2.0.
//
// The textbook guard of SPEC.md, implemented as written, for comparison runs only
// (`dedup worker --pattern textbook`): before the work,
//   SET <prefix><key> processing NX EX <ttl>
// key set -> run the work; success -> ack (nothing written); failure -> DEL the
// key (whoever owns it) and leave the message pending; key existed -> treat as done
// and ack. It has the five defects listed in SPEC.md; dedup's Buffer does not.

#ifndef DEDUP_SRC_BROKERS_REDIS_STREAMS_TEXTBOOK_GUARD_H_
#define DEDUP_SRC_BROKERS_REDIS_STREAMS_TEXTBOOK_GUARD_H_

#include <functional>
#include <memory>
#include <mutex>
#include <vector>

#include "brokers/redis_streams/stream_conn.h"
#include "dedup/buffer.h"
#include "dedup/worker.h"

namespace dedup::streams {

struct TextbookOptions {
  ConnOptions conn;                    // the Redis that keeps the keys
  Millis ttl{60'000};                  // the one TTL. Default: 60 s
  std::string prefix = "task_id:";     // Default: "task_id:"
  Millis retry_delay{1'000};           // after a failure. Default: 1 s
};

class TextbookGuard {
 public:
  explicit TextbookGuard(TextbookOptions o) : o_(std::move(o)) {}
  // Thread-safe. `work` runs only when the SET NX succeeded.
  Processed Process(const StreamMessage& m, const std::function<HandlerResult()>& work);

 private:
  std::unique_ptr<StreamConn> Take();
  void Give(std::unique_ptr<StreamConn> c);

  TextbookOptions o_;
  std::mutex mu_;
  std::vector<std::unique_ptr<StreamConn>> pool_;
};

}  // namespace dedup::streams

#endif  // DEDUP_SRC_BROKERS_REDIS_STREAMS_TEXTBOOK_GUARD_H_
