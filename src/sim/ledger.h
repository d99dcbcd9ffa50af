// Copyright dedup authors. Licensed under the Apache License 2.0.
//
// The simulation's ledger of side effects, kept apart from the store so that the
// store cannot hide what happened, and its tally per message.

#ifndef DEDUP_SRC_SIM_LEDGER_H_
#define DEDUP_SRC_SIM_LEDGER_H_

#include <algorithm>
#include <cstdint>
#include <mutex>
#include <vector>

#include "sim/simulation.h"

namespace dedup::sim {

// Where the side effects go: apart from the store, so that the store cannot hide
// what happened. One entry per application: (key, fence, attempt).
class Ledger {
 public:
  struct Effect {
    uint64_t key_id;
    uint64_t fence;    // 0 for the textbook guard, which has none
    uint32_t attempt;  // dedup: the claim's attempt; textbook: the delivery number
  };
  struct PerKey {
    uint32_t applied = 0;
    uint32_t excused = 0;  // applications that followed a crash between effect and complete
    bool last_crashed = false;  // the latest application's worker crashed before complete
    bool dead_lettered = false;
    uint32_t last_released_attempt = 0;
    uint64_t last_fence = 0;
  };

  explicit Ledger(uint64_t keys) : keys_(keys) { effects_.reserve(keys + keys / 8); }

  // `crash_follows`: the simulation will crash this worker before complete.
  void Apply(uint64_t key_id, uint64_t fence, uint32_t attempt, bool crash_follows) {
    std::lock_guard lock(mu_);
    PerKey& k = keys_[key_id];
    if (k.applied > 0 && k.last_crashed) ++k.excused;
    if (fence != 0 && k.applied > 0 && fence <= k.last_fence) ++stale_fence_;
    ++k.applied;
    k.last_crashed = crash_follows;
    k.last_fence = std::max(k.last_fence, fence);
    effects_.push_back({key_id, fence, attempt});
  }
  void MarkDeadLettered(uint64_t key_id) {
    std::lock_guard lock(mu_);
    keys_[key_id].dead_lettered = true;
  }
  void MarkReleased(uint64_t key_id, uint32_t attempt) {
    std::lock_guard lock(mu_);
    keys_[key_id].last_released_attempt = attempt;
  }
  // True when `attempt` follows an attempt that neither we released nor is the
  // first: the previous owner's lease ran out (it crashed, or lost the lease).
  bool IsTakeover(uint64_t key_id, uint32_t attempt) {
    if (attempt <= 1) return false;
    std::lock_guard lock(mu_);
    return keys_[key_id].last_released_attempt != attempt - 1;
  }

  void Tally(const std::vector<bool>& open_keys, SimulateReport& r) const {
    std::lock_guard lock(mu_);
    for (size_t i = 0; i < keys_.size(); ++i) {
      const PerKey& k = keys_[i];
      if (k.applied == 0) {
        if (k.dead_lettered) {
          ++r.not_applied_dead_lettered;
        } else if (open_keys[i]) {
          ++r.not_applied_unfinished;
        } else {
          ++r.lost;
        }
      } else if (k.applied == 1) {
        ++r.exactly_once;
      } else if (k.applied - 1 == k.excused) {
        ++r.reapplied_after_crash;
      } else {
        ++r.applied_twice_otherwise;
      }
    }
  }
  uint64_t stale_fence() const {
    std::lock_guard lock(mu_);
    return stale_fence_;
  }

 private:
  mutable std::mutex mu_;
  std::vector<PerKey> keys_;
  std::vector<Effect> effects_;
  uint64_t stale_fence_ = 0;
};

}  // namespace dedup::sim

#endif  // DEDUP_SRC_SIM_LEDGER_H_
