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
//   * The circuit breaker (Buffer's, passed in as `breaker_open`): once a write
//     has been given up on a retryable error because its tries and its time were
//     spent (GaveUpOnTime), the Buffer opens it, and a write that starts while it
//     is open gets its complete_tries tries only, no complete_retry_time window;
//     the first call the store answers closes it (OutcomeBreaker below). So
//     while the store is down a drain pays the window once, not once per write.
//
// A write that failed after the store applied it (a reply lost to a timeout) is
// safe to send again: the record is no longer IN_PROGRESS under the token, so the
// store answers LOST. The Buffer then reads the record (only for a try after the
// first) and answers OK when it holds this very outcome under the claim's token,
// fence and attempt; otherwise LOST stands, which the Buffer never acks.

#ifndef DEDUP_SRC_CORE_OUTCOME_RETRY_H_
#define DEDUP_SRC_CORE_OUTCOME_RETRY_H_

#include <algorithm>
#include <atomic>
#include <chrono>
#include <optional>
#include <thread>

#include "dedup/buffer.h"
#include "dedup/status.h"

namespace dedup::internal {

// The Buffer's circuit breaker, as the policy above uses it: a view of the one
// flag the Buffer keeps (an atomic, so that ClaimGuards, the completer and the
// heartbeat thread may all touch it). Opened when an outcome write was given up
// because its tries and its time were spent; closed by any store call that was
// answered (an outcome write, a claim, a heartbeat's extend, whatever the answer
// said): the store is reachable again.
class OutcomeBreaker {
 public:
  explicit OutcomeBreaker(std::atomic<bool>& open) : open_(open) {}

  bool open() const { return open_.load(std::memory_order_relaxed); }
  // The store answered a call.
  void Answered() { open_.store(false, std::memory_order_relaxed); }
  // The end of one outcome write (or of a batch of them): `answered` when the
  // store answered any of it, `gave_up_on_time` as OutcomeRetry::Run says.
  void Settle(bool answered, bool gave_up_on_time) {
    if (answered) {
      Answered();
    } else if (gave_up_on_time) {
      open_.store(true, std::memory_order_relaxed);
    }
  }

 private:
  std::atomic<bool>& open_;
};

class OutcomeRetry {
 public:
  using Clock = std::chrono::steady_clock;
  static constexpr Millis kFirstBackoff{20};
  static constexpr Millis kMaxBackoff{250};

  // The time bound starts at `start`: the first try of the write. With
  // `breaker_open` there is none: min_tries tries only.
  OutcomeRetry(int min_tries, Millis retry_time, Clock::time_point start = Clock::now(),
               bool breaker_open = false)
      : min_tries_(std::max(1, min_tries)),
        give_up_at_(breaker_open ? start : start + retry_time) {}
  explicit OutcomeRetry(const BufferOptions& o, Clock::time_point start = Clock::now(),
                        bool breaker_open = false)
      : OutcomeRetry(o.complete_tries, o.complete_retry_time, start, breaker_open) {}

  // True when the try after `tries` failed ones may be sent at `at`, for claims
  // known to be held until `held_until`.
  bool MayTry(int tries, Clock::time_point held_until, Clock::time_point at) const {
    return at < held_until && (tries < min_tries_ || at < give_up_at_);
  }

  // After `tries` (>= 1) tries failed with a retryable error, at `now`: how long to
  // wait before the next one, or nullopt when the write is given up.
  std::optional<Millis> Next(int tries, Clock::time_point held_until,
                             Clock::time_point now) const {
    const Millis wait = Backoff(tries);
    if (!MayTry(tries, held_until, now + wait)) return std::nullopt;
    return wait;
  }

  // Whether a write refused a try after `tries` failed ones, planned for `at`,
  // was given up because its tries and its time were spent (what opens the
  // breaker), not because the claims' lease deadline came first.
  bool GaveUpOnTime(int tries, Clock::time_point held_until, Clock::time_point at) const {
    return tries >= min_tries_ && at >= give_up_at_ && at < held_until;
  }

  // Calls `write` (answering StatusOr<T>) until it answers anything but a
  // retryable error, or the policy gives up; returns the last answer.
  // `held_until()` is read before each try again, so that a deadline a heartbeat
  // moves on is followed. `*gave_up_on_time`, when given, says whether the last
  // answer is a retryable error given up as GaveUpOnTime says.
  template <class Write, class HeldUntil>
  auto Run(HeldUntil held_until, Write write, bool* gave_up_on_time = nullptr) const {
    bool on_time = false;
    auto r = write();
    for (int tries = 1; !r.ok() && r.status().retryable(); ++tries) {
      const Clock::time_point now = Clock::now();
      const Clock::time_point until = held_until();
      std::optional<Millis> wait = Next(tries, until, now);
      if (!wait) {
        on_time = GaveUpOnTime(tries, until, now + Backoff(tries));
        break;
      }
      std::this_thread::sleep_for(*wait);
      // A sleep on a loaded machine may end late: decide again on the time it ended.
      const Clock::time_point woke = Clock::now();
      if (!MayTry(tries, held_until(), woke)) {
        on_time = GaveUpOnTime(tries, held_until(), woke);
        break;
      }
      r = write();
    }
    if (gave_up_on_time != nullptr) *gave_up_on_time = on_time;
    return r;
  }

 private:
  // The wait after `tries` failed tries.
  static Millis Backoff(int tries) {
    return std::min(kFirstBackoff * (1 << std::clamp(tries - 1, 0, 5)), kMaxBackoff);
  }

  const int min_tries_;
  const Clock::time_point give_up_at_;
};

}  // namespace dedup::internal

#endif  // DEDUP_SRC_CORE_OUTCOME_RETRY_H_
