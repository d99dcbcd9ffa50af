// Copyright dedup authors. Licensed under the Apache License 2.0.

#include "dedup/clock.h"

namespace dedup {
namespace {

class SystemClock final : public Clock {
 public:
  int64_t NowMillis() const override {
    return std::chrono::duration_cast<std::chrono::milliseconds>(
               std::chrono::system_clock::now().time_since_epoch())
        .count();
  }
};

}  // namespace

Clock* Clock::System() {
  static SystemClock clock;
  return &clock;
}

}  // namespace dedup
