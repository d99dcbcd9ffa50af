// Copyright dedup authors. Licensed under the Apache License 2.0.
//
// The clock a store uses to decide leases and retention. Deadlines are always
// decided by the store's clock, never by the calling worker's: the embedded stores
// read the host clock through this interface, Redis and PostgreSQL use their
// server's time. Tests inject a SimulatedClock and move time instead of sleeping.

#ifndef DEDUP_CLOCK_H_
#define DEDUP_CLOCK_H_

#include <atomic>
#include <chrono>
#include <cstdint>

namespace dedup {

// Milliseconds since the Unix epoch, as the store's clock reads them.
using Millis = std::chrono::milliseconds;

class Clock {
 public:
  virtual ~Clock() = default;
  // Wall-clock time in milliseconds since the Unix epoch. Must be safe to call
  // from many threads at once.
  virtual int64_t NowMillis() const = 0;

  // The process-wide system clock (std::chrono::system_clock). Never null.
  static Clock* System();
};

// A clock that moves only when told to. Thread-safe.
class SimulatedClock final : public Clock {
 public:
  explicit SimulatedClock(int64_t start_millis = 1'700'000'000'000) : now_(start_millis) {}
  int64_t NowMillis() const override { return now_.load(std::memory_order_acquire); }
  void Advance(Millis d) { now_.fetch_add(d.count(), std::memory_order_acq_rel); }
  void Set(int64_t millis) { now_.store(millis, std::memory_order_release); }

 private:
  std::atomic<int64_t> now_;
};

}  // namespace dedup

#endif  // DEDUP_CLOCK_H_
