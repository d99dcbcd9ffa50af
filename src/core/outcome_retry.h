// Copyright dedup authors. Licensed under the Apache License 2.0.
//
// OutcomeRetry: the one policy by which a Buffer sends an outcome write again —
// ClaimGuard::Complete, CompleteWithAck and Release, and Buffer::CompleteBatch (the
// batch call and its one-at-a-time fallback) — so that a caller of the guard gets
// what the Consumer gets.
//
//   * An error that is not retryable (Status::retryable() is false) is the answer:
//     the write is never sent again.
//   * A retryable one (Unavailable, DeadlineExceeded) is sent again after 20 ms,
//     40 ms, 80 ms, 160 ms, then every 250 ms: at least BufferOptions::complete_tries
//     tries in all, and beyond that until BufferOptions::complete_retry_time has
//     passed since the first try. (A client that lost its connections refuses
//     requests for up to a second while it reconnects; an outcome given up sooner
//     is left to a takeover that runs the handler a second time.)
//   * No try after the first is sent once the lease deadline of the claims
//     concerned, as their guards know it (ClaimGuard::lease_deadline: last OK
//     claim or extend sent + lease), has passed, nor planned to start at it:
//     from then on another owner may take over at any moment. The first try is
//     always sent; the store decides it by the token (a write of a key taken
//     over answers LOST and changes nothing).
//
// A write that failed after the store applied it (a reply lost to a timeout) is
// safe to send again: the record is no longer IN_PROGRESS under the token, so the
// store answers LOST, which the Buffer never acks; the next delivery sees
// DUPLICATE.

#ifndef DEDUP_SRC_CORE_OUTCOME_RETRY_H_
#define DEDUP_SRC_CORE_OUTCOME_RETRY_H_

#include <algorithm>
#include <chrono>
#include <optional>
#include <thread>

#include "dedup/buffer.h"
#include "dedup/status.h"

namespace dedup::internal {

class OutcomeRetry {
 public:
  using Clock = std::chrono::steady_clock;
  static constexpr Millis kFirstBackoff{20};
  static constexpr Millis kMaxBackoff{250};

  // The time bound starts at `start`: the first try of the write.
  OutcomeRetry(int min_tries, Millis retry_time, Clock::time_point start = Clock::now())
      : min_tries_(std::max(1, min_tries)), give_up_at_(start + retry_time) {}
  explicit OutcomeRetry(const BufferOptions& o, Clock::time_point start = Clock::now())
      : OutcomeRetry(o.complete_tries, o.complete_retry_time, start) {}

  // True when the try after `tries` failed ones may be sent at `at`, for claims
  // known to be held until `held_until`.
  bool MayTry(int tries, Clock::time_point held_until, Clock::time_point at) const {
    return at < held_until && (tries < min_tries_ || at < give_up_at_);
  }

  // After `tries` (>= 1) tries failed with a retryable error, at `now`: how long to
  // wait before the next one, or nullopt when the write is given up.
  std::optional<Millis> Next(int tries, Clock::time_point held_until,
                             Clock::time_point now) const {
    const Millis wait = std::min(kFirstBackoff * (1 << std::clamp(tries - 1, 0, 5)), kMaxBackoff);
    if (!MayTry(tries, held_until, now + wait)) return std::nullopt;
    return wait;
  }

  // Calls `write` (answering StatusOr<T>) until it answers anything but a
  // retryable error, or the policy gives up; returns the last answer.
  // `held_until()` is read before each try again, so that a deadline a heartbeat
  // moves on is followed.
  template <class Write, class HeldUntil>
  auto Run(HeldUntil held_until, Write write) const {
    auto r = write();
    for (int tries = 1; !r.ok() && r.status().retryable(); ++tries) {
      std::optional<Millis> wait = Next(tries, held_until(), Clock::now());
      if (!wait) break;
      std::this_thread::sleep_for(*wait);
      // A sleep on a loaded machine may end late: decide again on the time it ended.
      if (!MayTry(tries, held_until(), Clock::now())) break;
      r = write();
    }
    return r;
  }

 private:
  const int min_tries_;
  const Clock::time_point give_up_at_;
};

}  // namespace dedup::internal

#endif  // DEDUP_SRC_CORE_OUTCOME_RETRY_H_
