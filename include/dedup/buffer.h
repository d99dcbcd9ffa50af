// Copyright dedup authors. Licensed under the Apache License 2.0.
//
// Buffer is what a worker calls before doing the work of a message. It claims the
// message's key in a Store and hands back a ClaimGuard that
//   * extends the lease in the background every lease/3 while the work runs
//     (work may take longer than the lease without a second owner starting it),
//   * releases the claim if it is dropped without an outcome (the work threw, or
//     returned early), so a redelivery can run it again at once,
//   * records the outcome with Complete() before the broker is told to ack, so a
//     redelivery within the retention gets DUPLICATE and the cached result.
//
// ProcessOnce() does all of it in one call and says what to tell the broker, per
// the worker's table (README.md, "What is guaranteed, and what is not";
// docs/WORKER.md):
//
//   claim / handler                       action
//   ACQUIRED, handler done, complete OK   kAck
//   ACQUIRED, handler Retry or throws     kRetry (claim released first)
//   ACQUIRED, handler Fail                kDeadLetter (completed as failed first)
//   ACQUIRED, handler Done with a result  kDeadLetter (completed as failed, the
//     over kMaxResultBytes                reason naming the size: it would fail
//                                         again on every retry, after running
//                                         the handler again; a Fail reason that
//                                         long is recorded cut to fit)
//   DUPLICATE of ok work                  kAck (handler not run; cached result)
//   DUPLICATE of failed / exhausted work  kDeadLetter (again: the worker that
//                                         completed it may have died before its
//                                         dead-letter was written)
//   bad key (empty, > 1024 bytes)         kDeadLetter (never processed unguarded)
//   BUSY                                  kRetry after the lease left (never acked)
//   MISMATCH, EXHAUSTED                   kDeadLetter
//   store unavailable, or complete LOST   kRetry (fail closed: never acked)
//   record cannot be decoded (DataLoss)   kRetry; kDeadLetter with the store's
//                                         reason once this Buffer has had
//                                         corrupt_record_tries of them in a row
//                                         for the key (see BufferOptions)
//
// Guarantee and its limit: the handler runs at most once per key while its
// completion is retained, except when a worker dies (or loses its lease) after the
// handler's side effect and before Complete() returns, or the store stays
// unreachable for longer than the outcome is retried (complete_tries and
// complete_retry_time, never past the lease); then the next delivery runs
// the handler again with a higher fence. Pass the fence to the downstream system,
// or commit the effect in the same transaction as Complete(), for exactly-once
// effects.
//
// A claim given up without an outcome (a guard destroyed or assigned over while
// ACQUIRED: a drain handing back work never started, a lease run out before the
// handler started, a result the store refuses; a handler that gave its claim up
// itself with ReleaseOnce() or Abandon() and returns Retry, as a drain's stopped
// handler does) is released with ONE try, never
// retried: a release that fails only means the key stays BUSY until its lease
// runs out and the message comes back later (nothing runs twice because of it).
// An outcome someone asked for (Complete, CompleteWithAck, an explicit Release(),
// a handler's Retry) is retried as complete_tries says.
//
// When the caller passes the broker's ack (BrokerAck, broker_ack.h) and the store
// can fuse it with a completion (Store::CanCompleteWithAck), a kDone outcome is
// recorded and acked in one atomic step; Processed::acked_with_complete says so
// and the caller must not ack again.
//
// A Buffer is safe for concurrent use by many threads; it must outlive its guards.

#ifndef DEDUP_BUFFER_H_
#define DEDUP_BUFFER_H_

#include <atomic>
#include <chrono>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "dedup/record.h"
#include "dedup/status.h"
#include "dedup/store.h"

namespace dedup {

struct BufferOptions {
  // How long a claim is valid without a heartbeat. Default: 30 s.
  Millis lease{kDefaultLease};
  // How long a completed record answers DUPLICATE; also how long attempts and the
  // fence are kept after a release or a lease that ran out. Default: 24 h.
  Millis retention{kDefaultRetention};
  // Claims beyond this many attempts get EXHAUSTED. Default: 0 (unlimited).
  uint32_t max_attempts = 0;
  // ProcessOnce fingerprints the payload (SHA-256, first 16 bytes) so that the
  // same key with a different payload gets MISMATCH. Default: false.
  bool fingerprint_payloads = false;
  // Time between heartbeat extends. Default: 0 = lease / 3.
  Millis heartbeat_interval{0};
  // Delay suggested to the broker after a release or a store error. Default: 1 s.
  Millis retry_delay{1'000};
  // An outcome write (ClaimGuard::Complete, CompleteWithAck, Release, and
  // Buffer::CompleteBatch) that fails with a retryable error (Status::retryable)
  // is sent again with backoff (20 ms doubling, at most 250 ms apart): at least
  // complete_tries tries in all, and beyond that until complete_retry_time has
  // passed since the first try, but never after the claim's lease_deadline() (the
  // first try is always sent). Then the error is the answer: the outcome is given
  // up and the message left to be redelivered (fail closed). Any other error is
  // the answer at once. So the call blocks for about max(complete_retry_time,
  // the complete_tries backoffs) at most, plus the last try's own time (a client
  // timeout). (A guard destroyed without an outcome releases with one try, not
  // these.) Default: 3.
  int complete_tries = 3;
  // See complete_tries. 2 s outlasts a client that reconnects after a network
  // stall (it refuses requests for up to a second meanwhile); an outcome given up
  // sooner is left to a takeover that runs the handler a second time. 0: only
  // complete_tries tries. 0 to kMaxDuration. Default: 2 s.
  //
  // Circuit breaker: once an outcome write of this Buffer has been given up on a
  // retryable error because its complete_tries and complete_retry_time were
  // spent (not because of the lease), every later outcome write gets its
  // complete_tries tries only, with no complete_retry_time window, until the
  // store answers a call of this Buffer again (a claim, an outcome write, or a
  // heartbeat's extend, whatever it answered). So while the store stays
  // down, a drain pays complete_retry_time once, not once per batch.
  //
  // A try after the first that answers LOST may be the echo of an earlier try
  // that was applied but whose reply was lost: the record is then read (Inspect)
  // and the answer is OK when it holds this very outcome (COMPLETED with the same
  // status and result, or RELEASED) under the claim's token, fence and attempt.
  Millis complete_retry_time{2'000};
  // A claim the store answers DataLoss (the key's record cannot be decoded:
  // corrupt, written by something else, or by a newer format) is retried after
  // retry_delay, and the message dead-lettered with the store's reason at the
  // corrupt_record_tries-th such answer in a row for the key. The count is this
  // Buffer's own (every broker, whether or not it counts deliveries): it starts
  // again when a claim of the key is answered, and is kept for at most
  // kMaxCorruptKeys keys (when that many are being counted, a new one is
  // dead-lettered at its first answer). Several workers each count their own, so
  // a message is tried at most workers x corrupt_record_tries times. Transient
  // errors (Unavailable, DeadlineExceeded, ...) never count: they retry forever.
  // 1 to 1000. Default: 3.
  int corrupt_record_tries = 3;
};

// How many keys a Buffer counts DataLoss answers for at once (see
// BufferOptions::corrupt_record_tries).
inline constexpr size_t kMaxCorruptKeys = 4096;

// OK, or InvalidArgument naming the first bad field in flag spelling ("lease",
// "retention", "retry-delay", "heartbeat-interval", "complete-tries",
// "complete-retry-time", "corrupt-record-tries"): lease, retention and retry delay
// must be > 0 and at most kMaxDuration; the heartbeat 0 (= lease / 3) or at
// least 1 ms and shorter than the lease; complete_tries >= 1; complete_retry_time 0 to kMaxDuration;
// corrupt_record_tries 1 to 1000.
[[nodiscard]] Status ValidateBufferOptions(const BufferOptions& options);

// The first 16 bytes of SHA-256(payload).
std::string PayloadFingerprint(std::string_view payload);

enum class BrokerAction : uint8_t {
  kAck = 0,         // acknowledge: done, or a duplicate of done work
  kRetry = 1,       // do not ack: requeue / leave pending, deliver again after retry_after
  kDeadLetter = 2,  // move to the dead-letter queue with `reason`, then ack
};
std::string_view BrokerActionName(BrokerAction a);  // "ack", "retry", "dead_letter"

class Buffer;
namespace internal {
struct HeldClaim;
class OutcomeBreaker;
}  // namespace internal

// Owns one claim while the work runs. Movable, not copyable. Only an ACQUIRED
// claim holds anything; for the other outcomes the guard just carries the result.
class ClaimGuard {
 public:
  ClaimGuard() = default;
  ClaimGuard(ClaimGuard&&) noexcept;
  ClaimGuard& operator=(ClaimGuard&&) noexcept;
  // Releases an ACQUIRED claim that has no outcome yet, with one try (see the
  // guarantee above); so does a move-assignment over one.
  ~ClaimGuard();

  const ClaimResult& result() const { return result_; }
  ClaimOutcome outcome() const { return result_.outcome; }
  bool acquired() const { return result_.acquired(); }
  const std::string& key() const { return key_; }
  uint64_t fence() const { return result_.fence; }
  uint32_t attempt() const { return result_.attempt; }
  Token token() const { return result_.token; }

  // True once the claim can no longer be shown to be held: a heartbeat was
  // answered LOST (another owner has taken over; the outcome will not be
  // recorded), or no claim or extend has succeeded for a whole lease
  // (lease_deadline() has passed: another owner may take over at any moment).
  // Either way the work should stop. Once true, stays true.
  bool lost() const;
  // This host's steady-clock time until which the lease is known to be held: the
  // moment the last claim or extend that answered OK was sent, plus the lease. The
  // store starts a lease when the request arrives, so its deadline is never
  // earlier (clock drift aside). time_point::min() when nothing is held.
  std::chrono::steady_clock::time_point lease_deadline() const;
  // The lease this claim is extended by (BufferOptions::lease).
  Millis lease() const;
  // True while an ACQUIRED claim has no outcome recorded or given up yet.
  bool active() const { return held_ != nullptr; }

  // Records the outcome (COMPLETED, `status`, `result`). kOk or kLost; on kLost
  // the record was not changed. Ends the guard's ownership either way. On a
  // guard that holds nothing (not ACQUIRED, or already ended: a second Complete,
  // a Release after it) FailedPrecondition, and nothing is sent; so for
  // Release, CompleteWithAck and ReleaseOnce. A
  // retryable store error is tried again as BufferOptions::complete_tries says
  // (the same for CompleteWithAck and Release); a status returned is the last
  // try's, and the outcome may or may not be recorded.
  [[nodiscard]] StatusOr<WriteResult> Complete(std::string_view result = {},
                                               CompletionStatus status = CompletionStatus::kOk);
  // Complete(kOk) fused with the broker's ack, when the store can
  // (Store::CanCompleteWithAck); else a plain Complete() with acked = false.
  [[nodiscard]] StatusOr<AckedWrite> CompleteWithAck(std::string_view result,
                                                     const BrokerAck& ack);
  // Gives the claim back: the key is claimable again at once (if it never
  // reaches the store, at the end of the lease). Retried like Complete.
  [[nodiscard]] StatusOr<WriteResult> Release();
  // Gives the claim up without an outcome as the destructor does: ONE release
  // try, never retried, and answers it (a status when the store did not answer:
  // the key then stays BUSY until its lease runs out).
  StatusOr<WriteResult> ReleaseOnce();
  // Gives the claim up without a word to the store: no release is sent and the
  // heartbeat stops, so the store keeps the claim until its lease runs out, as a
  // crashed owner's (the next claim is then a takeover, attempt + 1). For a drain
  // whose time is gone while the store does not answer.
  void Abandon();

 private:
  friend class Buffer;
  void Finish();

  Buffer* buffer_ = nullptr;
  std::string key_;
  ClaimResult result_;
  std::shared_ptr<internal::HeldClaim> held_;
};

// What a handler reports to ProcessOnce.
struct HandlerResult {
  enum class Kind : uint8_t { kDone, kRetry, kFail };
  Kind kind = Kind::kDone;
  std::string result;  // kDone: bytes later duplicates get back; else the reason

  static HandlerResult Done(std::string result = {}) { return {Kind::kDone, std::move(result)}; }
  static HandlerResult Retry(std::string reason) { return {Kind::kRetry, std::move(reason)}; }
  static HandlerResult Fail(std::string reason) { return {Kind::kFail, std::move(reason)}; }
};

// What ProcessOnce did and what the broker should do with the message.
struct Processed {
  // Not OK: the store could not answer the claim or the outcome's write
  // (action kRetry; a record that cannot be decoded: kRetry, then kDeadLetter
  // at corrupt_record_tries), or the key is no key (InvalidArgument, empty or
  // over kMaxKeyBytes: kDeadLetter).
  Status status;
  ClaimResult claim;         // the store's answer to the claim (when status is OK)
  bool ran = false;          // the handler was called
  BrokerAction action = BrokerAction::kRetry;
  Millis retry_after{0};     // kRetry: deliver again no earlier than this
  std::string result;        // handler's result, or the cached one on DUPLICATE
  std::string reason;        // kRetry / kDeadLetter: why, in words
  WriteResult completion = WriteResult::kOk;  // when the handler ran: complete/release answer
  // kAck only: the store carried out the broker's ack with the completion
  // (CompleteWithAck); do not ack again.
  bool acked_with_complete = false;
};

// A handler's outcome whose write is still to be made (Buffer::
// ProcessClaimedDeferred): it holds the claim, which stays heartbeated until
// Buffer::CompleteBatch has written the outcome. Movable, not copyable. Dropped
// unwritten, it releases the claim (as a ClaimGuard does).
class PendingOutcome {
 public:
  PendingOutcome() = default;
  PendingOutcome(PendingOutcome&&) noexcept = default;
  PendingOutcome& operator=(PendingOutcome&&) noexcept = default;

  const std::string& key() const { return guard_.key(); }
  // False once CompleteBatch has written (or given up) the outcome.
  bool active() const { return guard_.active(); }

 private:
  friend class Buffer;
  ClaimGuard guard_;
  HandlerResult handler_result_;
  Processed processed_;          // what ProcessClaimed had decided before the write
  const BrokerAck* ack_ = nullptr;  // fused with a kOk completion where the store can
};

// One message of a batch claim.
struct ClaimItem {
  std::string_view key;
  std::string_view payload;  // fingerprinted when BufferOptions::fingerprint_payloads
};

class Buffer {
 public:
  using Handler = std::function<HandlerResult(ClaimGuard&)>;

  // `store` is not owned and must outlive the Buffer. InvalidArgument (naming the
  // option) when `options` fail ValidateBufferOptions, or when `store` is null.
  [[nodiscard]] static StatusOr<std::unique_ptr<Buffer>> Create(Store* store,
                                                                BufferOptions options = {});

  // As Create, for options known to be valid (the defaults, or checked with
  // ValidateBufferOptions): invalid ones, or a null store, abort the process
  // with the message Create would return.
  explicit Buffer(Store* store, BufferOptions options = {});
  ~Buffer();
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;

  // Claims `key`. An ACQUIRED guard is heartbeated until it completes, releases or
  // is destroyed. A non-OK status means the store could not decide: fail closed.
  [[nodiscard]] StatusOr<ClaimGuard> Claim(std::string_view key,
                                           std::string_view fingerprint = {});

  // Claims every item in one store call (Store::ClaimBatch: one round trip on
  // the server stores), answering each as Claim would, in order. An item with a
  // bad key gets its InvalidArgument alone; a store error is every item's status,
  // except DataLoss (one record cannot be decoded): then each item is claimed
  // alone, so that only the key whose record is corrupt gets it, and that key
  // is claimed alone while it is being counted (corrupt_record_tries). (The
  // server stores cannot say which item failed: an item the failed batch had
  // already acquired answers BUSY until its lease ends, once per corrupt key.)
  std::vector<StatusOr<ClaimGuard>> ClaimBatch(std::span<const ClaimItem> items);

  // Claims, runs `handler` only if ACQUIRED, records its outcome, and says what to
  // tell the broker (the table above). Never throws: an exception from the
  // handler is a kRetry. `ack`, when given, is fused with a kOk completion where
  // the store can (see above).
  Processed ProcessOnce(std::string_view key, std::string_view payload, const Handler& handler,
                        const BrokerAck* ack = nullptr);
  // The same, for a claim already made (Claim or ClaimBatch) of `key`.
  Processed ProcessClaimed(std::string_view key, StatusOr<ClaimGuard> claim,
                           const Handler& handler, const BrokerAck* ack = nullptr);

  // ProcessOnce / ProcessClaimed with the write of the outcome left for later: when the handler
  // ran and reported Done or Fail, nothing is written yet and a PendingOutcome is
  // returned (its claim still held and heartbeated); pass it, with others, to
  // CompleteBatch. Every other case (not ACQUIRED, a store error, bad key, handler
  // Retry: the claim is released here) is finished here and answers as
  // ProcessClaimed.
  std::variant<Processed, PendingOutcome> ProcessOnceDeferred(std::string_view key,
                                                              std::string_view payload,
                                                              const Handler& handler,
                                                              const BrokerAck* ack = nullptr);
  std::variant<Processed, PendingOutcome> ProcessClaimedDeferred(
      std::string_view key, StatusOr<ClaimGuard> claim, const Handler& handler,
      const BrokerAck* ack = nullptr);

  // Records the pending outcomes with one Store::CompleteBatch (each fused with
  // its broker ack where the store can; retried as a whole while the store is
  // unavailable, as complete_tries says, until the earliest lease deadline among
  // them) and answers, in order, exactly what
  // ProcessClaimed would have answered for each: the policy above decides, only
  // the write is batched. A claim whose heartbeat saw LOST is not written and
  // answers LOST (kRetry). Each PendingOutcome is inactive afterwards.
  std::vector<Processed> CompleteBatch(std::span<PendingOutcome> pending);

  const BufferOptions& options() const { return options_; }
  Store* store() const { return store_; }
  // The time between heartbeat extends: BufferOptions::heartbeat_interval, or
  // lease / 3, at least 1 ms.
  Millis heartbeat_interval() const;

  // Counters since the Buffer was made.
  struct Stats {
    uint64_t heartbeats = 0;       // extends sent
    uint64_t heartbeat_lost = 0;   // extends answered LOST
    uint64_t heartbeat_errors = 0; // extends that failed with a status
  };
  Stats stats() const;

 private:
  friend class ClaimGuard;
  class Heartbeat;
  class KeyNotes;
  // The action for a claim the store could not answer (`error` not OK).
  void OnClaimError(std::string_view key, const Status& error, Processed* p);
  ClaimRequest Request(std::string_view key, std::string_view fingerprint) const;
  // `sent`: when the claim was sent (the lease is known held until sent + lease).
  // `beat_later`: the claim goes there, for the caller to hand to the heartbeat
  // with the others of its batch; null: to the heartbeat now.
  ClaimGuard Guard(std::string_view key, ClaimResult result,
                   std::chrono::steady_clock::time_point sent,
                   std::vector<std::shared_ptr<internal::HeldClaim>>* beat_later = nullptr);
  // The outcome's write made at once (ProcessOnce, ProcessClaimed).
  Processed WriteNow(std::variant<Processed, PendingOutcome> r);
  // The broker action for a handler's outcome once its write answered `w`.
  void Resolve(Processed* p, const HandlerResult& hr, const StatusOr<WriteResult>& w,
               bool acked) const;

  Store* const store_;
  const BufferOptions options_;
  // The outcome writes' circuit breaker (see complete_retry_time): open while the
  // last outcome write was given up after its time and no store call has been
  // answered since. Declared before the heartbeat, whose thread closes it.
  std::atomic<bool> outcome_breaker_open_{false};
  internal::OutcomeBreaker breaker();
  std::unique_ptr<Heartbeat> heartbeat_;
  std::unique_ptr<KeyNotes> notes_;
};

}  // namespace dedup

#endif  // DEDUP_BUFFER_H_
