// Copyright dedup authors. Licensed under the Apache License 2.0.
//
// The simulation's fault schedule: which fault the Nth delivery of a published
// message meets, decided by a hash of (seed, message, delivery number) alone, so
// that the same seed gives the same schedule whatever the thread timing, and the
// textbook pattern meets exactly the faults dedup met.

#ifndef DEDUP_SRC_SIM_FAULT_SCHEDULE_H_
#define DEDUP_SRC_SIM_FAULT_SCHEDULE_H_

#include <cstdint>
#include <utility>

#include "sim/simulation.h"

namespace dedup::sim {

inline uint64_t SplitMix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

// A uniform number in [0, 1) decided only by its inputs.
inline double Uniform(uint64_t seed, uint64_t a, uint64_t b) {
  uint64_t h = SplitMix64(seed ^ SplitMix64(a ^ SplitMix64(b + 0x51ed27)));
  return static_cast<double>(h >> 11) * 0x1.0p-53;
}

enum class Fault : uint8_t {
  kNone,
  kCrashBeforeWork,
  kCrashAfterEffect,
  kCrashAfterComplete,
  kTransient,
  kSlow,
};

class FaultSchedule {
 public:
  explicit FaultSchedule(const SimulateOptions& o) : o_(o) {}

  // The fault of the `number`th delivery (1-based) of published message `msg`.
  Fault For(uint64_t msg, uint32_t number) const {
    double u = Uniform(o_.seed, msg, number);
    const std::pair<double, Fault> table[] = {
        {o_.crash_before_work, Fault::kCrashBeforeWork},
        {o_.crash_after_effect, Fault::kCrashAfterEffect},
        {o_.crash_after_complete, Fault::kCrashAfterComplete},
        {o_.transient_failure, Fault::kTransient},
        {o_.slow_handler, Fault::kSlow},
    };
    for (const auto& [p, f] : table) {
      if (u < p) return f;
      u -= p;
    }
    return Fault::kNone;
  }

  // A poison message's handler fails permanently on every delivery.
  bool Poison(uint64_t key_id) const {
    return Uniform(o_.seed ^ 0x706f69736f6eULL, key_id, 0) < o_.poison;
  }

 private:
  const SimulateOptions& o_;
};

}  // namespace dedup::sim

#endif  // DEDUP_SRC_SIM_FAULT_SCHEDULE_H_
