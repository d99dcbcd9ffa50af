// Copyright dedup authors. Licensed under the Apache License 2.0.
//
// The textbook guard of SPEC.md, implemented as written, for comparison runs only
// (`dedup simulate --pattern textbook`, `dedup worker --pattern textbook`):
// before the work,
//   SET <prefix><key> processing NX EX <ttl>
// key set -> run the work; success -> ack (nothing written); failure -> DEL the
// key (whoever owns it) and retry / dead-letter; key existed -> treat as done and
// ack. It has the five defects listed in SPEC.md; dedup's Buffer does not.
// One guard, over any TextbookKeys: an in-process map (the simulation) or Redis
// (src/sim/redis_textbook_keys.h).

#ifndef DEDUP_SRC_SIM_TEXTBOOK_GUARD_H_
#define DEDUP_SRC_SIM_TEXTBOOK_GUARD_H_

#include <cstdint>
#include <functional>
#include <mutex>
#include <string>
#include <string_view>
#include <unordered_map>

#include "dedup/buffer.h"
#include "dedup/clock.h"

namespace dedup {

// Where the textbook guard's keys live.
class TextbookKeys {
 public:
  virtual ~TextbookKeys() = default;
  // SET key processing NX EX ttl: true when set. *expired_before: a key was there
  // but its TTL had run out (false when the backend cannot tell).
  [[nodiscard]] virtual StatusOr<bool> SetNx(const std::string& key, Millis ttl,
                                             bool* expired_before) = 0;
  // DEL key, whoever set it.
  [[nodiscard]] virtual Status Del(const std::string& key) = 0;
};

// The keys in a map of this process, read with a clock (default: the system's).
class InProcessTextbookKeys final : public TextbookKeys {
 public:
  explicit InProcessTextbookKeys(Clock* clock = nullptr)
      : clock_(clock != nullptr ? clock : Clock::System()) {}
  StatusOr<bool> SetNx(const std::string& key, Millis ttl, bool* expired_before) override;
  Status Del(const std::string& key) override;

 private:
  Clock* const clock_;
  std::mutex mu_;
  std::unordered_map<std::string, int64_t> keys_;  // key -> expiry (ms)
};

struct TextbookOptions {
  Millis ttl{60'000};               // the one TTL. Default: 60 s
  std::string prefix = "task_id:";  // Default: "task_id:"
  Millis retry_delay{1'000};        // after a failure. Default: 1 s
};

class TextbookGuard {
 public:
  // `keys` is not owned and must outlive the guard.
  TextbookGuard(TextbookKeys* keys, TextbookOptions o) : keys_(keys), o_(std::move(o)) {}
  // Thread-safe. `work` runs only when the SET NX succeeded. `takeover`, when
  // given, says whether the key had been set before and its TTL had run out.
  Processed Process(std::string_view key, const std::function<HandlerResult()>& work,
                    bool* takeover = nullptr);

 private:
  TextbookKeys* const keys_;
  const TextbookOptions o_;
};

}  // namespace dedup

#endif  // DEDUP_SRC_SIM_TEXTBOOK_GUARD_H_
