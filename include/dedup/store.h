// Copyright dedup authors. Licensed under the Apache License 2.0.
//
// Store is where claims live: one abstract interface, opened from a URI, that every
// backend (memory, RocksDB, Redis, PostgreSQL) implements and one conformance suite
// checks (tests/store_conformance_test.cc). The contract, in short (README.md,
// "What is guaranteed, and what is not", and docs/DESIGN.md say it in full):
//
//   * Every operation is atomic per key and linearizable per store.
//   * Per key, at any instant of the store's clock, at most one token holds a valid
//     lease. An IN_PROGRESS record whose lease has ended is claimable: the next
//     claim takes over with a new token, fence + 1 and attempt + 1, and the old
//     token's later extend / complete / release returns LOST and changes nothing.
//   * Once Complete() returns kOk, every claim of the key gets DUPLICATE for at
//     least `retention` of the store's clock, for as long as the store keeps its
//     data (see each backend's header for what survives a crash).
//   * The fence of a key strictly increases with every successful claim and is
//     never reused while any trace of the key is kept. A forced Forget of a leased
//     key keeps such a trace (a fence floor) until the forgotten lease ends, so
//     no later claim gets a fence its running owner may still hand on.
//   * Deadlines are decided by the store's clock, never the caller's.
//
// Records are kept after their lease: an IN_PROGRESS record is kept for its lease
// plus the retention given at claim time (so that attempts are counted across
// worker crashes), a RELEASED or COMPLETED record for the retention given to
// release or complete. After that the store may forget the key; a later claim then
// starts again at attempt 1.
//
// A Store is safe for concurrent access from multiple threads without any external
// synchronization. Expected outcomes (BUSY, DUPLICATE, LOST ...) are values; a
// Status that is not OK means the operation could not be decided, and nothing about
// the record may be assumed (retry it: every operation is safe to retry).

#ifndef DEDUP_STORE_H_
#define DEDUP_STORE_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "dedup/broker_ack.h"
#include "dedup/clock.h"
#include "dedup/record.h"
#include "dedup/status.h"

namespace dedup {

// Limits every store enforces with InvalidArgument, before anything is written.
inline constexpr size_t kMaxKeyBytes = 1024;             // keys are 1 to 1024 bytes
inline constexpr size_t kMaxFingerprintBytes = 64;       // e.g. a SHA-256 digest
inline constexpr size_t kMaxResultBytes = 1024 * 1024;   // cached outcome bytes
inline constexpr Millis kMaxDuration{Millis(3650LL * 24 * 3600 * 1000)};  // 10 years

// The defaults of every lease and retention in dedup (requests, BufferOptions, CLI
// flags), written here once.
inline constexpr Millis kDefaultLease{30'000};                 // 30 s
inline constexpr Millis kDefaultRetention{24LL * 3600 * 1000};  // 24 h

struct ClaimRequest {
  std::string_view key;          // 1 to kMaxKeyBytes arbitrary bytes
  Millis lease{kDefaultLease};   // > 0: how long the claim is valid without extend
  Millis retention{kDefaultRetention};  // > 0: how long to keep the record once the lease
                                 // ends, and the COMPLETED/exhausted record when
                                 // this claim is EXHAUSTED
  std::string_view fingerprint;  // optional payload fingerprint; empty = none
  uint32_t max_attempts = 0;     // 0 = unlimited
};

// How Forget treats a key whose lease is still running.
struct ForgetOptions {
  // Forget it anyway: the running owner loses its claim (its writes answer LOST)
  // and a second run may start beside it, with a higher fence. Default: false, the
  // forget is refused with FailedPrecondition.
  bool force = false;
};

// A record a store holds under `key` but cannot decode, and why ("record is not
// dedup format 1 or 2 (first byte 120, 12 bytes)", "state 9 is not a state").
struct UndecodableRecord {
  std::string key;
  std::string why;
  friend bool operator==(const UndecodableRecord&, const UndecodableRecord&) = default;
};

// How Store::Scan reads.
struct ScanOptions {
  // Read each record's result (up to 1 MiB each). False: every Record's result
  // is left empty, and the store reads keys and metadata only: a listing that
  // never shows results (dedup serve's) then costs kilobytes, not gigabytes.
  bool with_results = true;
};

// What Store::Scan lists: live records (their key set) and undecodable ones.
struct ScanResult {
  std::vector<Record> records;
  // The size in bytes of each record's result, in the order of `records` (with
  // ScanOptions::with_results false the results are left empty, their sizes not).
  std::vector<uint64_t> result_bytes;
  std::vector<UndecodableRecord> undecodable;
  size_t size() const { return records.size() + undecodable.size(); }
  // The size of records[i]'s result: result_bytes[i], or, from a Store that
  // fills no sizes, the result it read.
  uint64_t ResultBytes(size_t i) const {
    return i < result_bytes.size() ? result_bytes[i] : records[i].result.size();
  }
};

// The answer to a completion fused with a broker's ack.
struct AckedWrite {
  WriteResult write = WriteResult::kLost;  // as Complete() answers
  bool acked = false;  // the broker's ack was carried out (only ever with kOk)
};

// One completion of a batch (Store::CompleteBatch): the arguments of Complete(),
// and optionally the broker's ack to fuse with it as CompleteWithAck() does.
struct CompleteRequest {
  std::string_view key;
  Token token;
  Millis retention{kDefaultRetention};
  CompletionStatus status = CompletionStatus::kOk;
  std::string_view result;
  // Carried out with a kOk completion, in the same atomic step, when the store
  // CanCompleteWithAck(*ack); otherwise ignored (acked = false). Null: none.
  const BrokerAck* ack = nullptr;
};

class Store {
 public:
  Store() = default;
  Store(const Store&) = delete;
  Store& operator=(const Store&) = delete;
  virtual ~Store() = default;

  // ACQUIRED / BUSY / DUPLICATE / MISMATCH / EXHAUSTED, see record.h.
  [[nodiscard]] virtual StatusOr<ClaimResult> Claim(const ClaimRequest& req) = 0;

  // Claims many keys in one call, answering each as Claim would, in order (a key
  // repeated in the batch is BUSY the second time). Every request is validated
  // before anything is written: one bad request fails the whole batch unchanged.
  // A batch that fails (a status) leaves none of its claims held: those it made
  // before the failure are released before it returns (best effort: a claim that
  // cannot be released, its server unreachable or its reply lost, stays
  // IN_PROGRESS until its lease ends, as a crashed owner's would, and is then
  // taken over). The Redis store also gives back the attempt each such claim
  // counted (unclaim.lua), and the PostgreSQL store's batch is one transaction,
  // rolled back, so that one bad key or one stalled node in a batch uses up no
  // attempt of the others; the default loop releases them, which keeps it (as
  // does the memory store, whose batch fails only on a record at its fence's or
  // attempt's limit). The default runs Claim in a loop; stores override it to
  // save round trips.
  [[nodiscard]] virtual StatusOr<std::vector<ClaimResult>> ClaimBatch(
      std::span<const ClaimRequest> reqs);

  // Moves the lease deadline of the token's claim to now + lease.
  [[nodiscard]] virtual StatusOr<WriteResult> Extend(std::string_view key, Token token,
                                                     Millis lease) = 0;

  // Records the outcome: DUPLICATE for `retention` from now, with `result` handed
  // to every later claim. result is at most kMaxResultBytes.
  [[nodiscard]] virtual StatusOr<WriteResult> Complete(std::string_view key, Token token,
                                                       Millis retention,
                                                       CompletionStatus status,
                                                       std::string_view result) = 0;

  // Capability: completion fused with a broker's acknowledgement. True when this
  // store can carry out `ack` in the same atomic step as a completion (e.g. a
  // Redis store whose server holds the Redis stream). Default: false.
  virtual bool CanCompleteWithAck(const BrokerAck& ack) const {
    (void)ack;
    return false;
  }
  // Complete(), and only if it answers kOk, the broker's ack, atomically. `acked`
  // false with kOk means the completion is recorded but the ack acked nothing
  // (e.g. the entry was no longer pending): the caller acks the usual way. Only
  // called when CanCompleteWithAck(ack); default: Unimplemented.
  [[nodiscard]] virtual StatusOr<AckedWrite> CompleteWithAck(std::string_view key, Token token,
                                                             Millis retention,
                                                             CompletionStatus status,
                                                             std::string_view result,
                                                             const BrokerAck& ack);

  // Completes many claims in one call, answering each as Complete() would, in
  // order (with a fusable ack, as CompleteWithAck() would; else acked = false):
  // a key repeated in the batch answers LOST the second time, its record being
  // no longer IN_PROGRESS. Every request is validated before anything is written:
  // one bad request fails the whole batch unchanged (InvalidArgument naming its
  // index). Each item is as durable when this returns as Complete() makes it.
  // Any other non-OK status means nothing may be assumed about any item (each
  // may or may not be recorded; retrying the batch is safe: an item recorded
  // the first time then answers LOST). An empty batch answers an empty vector.
  // The default runs Complete / CompleteWithAck in a loop (correct for every
  // store); stores override it to save round trips and writes.
  [[nodiscard]] virtual StatusOr<std::vector<AckedWrite>> CompleteBatch(
      std::span<const CompleteRequest> reqs);

  // Gives the claim up: the key is claimable at once; fence and attempts are kept
  // for `retention` from now.
  [[nodiscard]] virtual StatusOr<WriteResult> Release(std::string_view key, Token token,
                                                      Millis retention) = 0;

  // Admin: the record of one key as stored, or nullopt when none is kept (a record
  // past its retention is reported as absent even if not yet reclaimed).
  [[nodiscard]] virtual StatusOr<std::optional<Record>> Inspect(std::string_view key) = 0;

  // Admin: removes the record of one key. Returns whether a record was there (a
  // record past its retention, or a fence floor, counts as none).
  //   * A record whose lease is still running (IN_PROGRESS, lease not over: its
  //     owner may be at work) is refused with FailedPrecondition naming the key and
  //     the lease time left, and nothing changes, unless options.force.
  //   * Any other record (COMPLETED, RELEASED, IN_PROGRESS with its lease over, or
  //     one that cannot be decoded) is removed; the key's fence may start again
  //     from 1, as no owner is running that could hold an older one. A key that
  //     holds no record at all but something else (a Redis key of another type:
  //     under a shared prefix, a broker's stream) is removed only with
  //     options.force, else refused with FailedPrecondition naming it.
  //   * A forced forget of a leased record leaves a fence floor in its place
  //     until that lease would have ended: the key reads absent (Inspect, Scan),
  //     its next claim is ACQUIRED at attempt 1 with a fence greater than the
  //     forgotten owner's, and that owner's extend / complete / release answer
  //     LOST. Forget never removes a fence floor; it ends by itself.
  //   * An error promises nothing about the record, as for every operation: it
  //     may be removed (now, or when a store that logged the forget reopens);
  //     retry the forget.
  [[nodiscard]] virtual StatusOr<bool> Forget(std::string_view key,
                                              const ForgetOptions& options) = 0;
  [[nodiscard]] StatusOr<bool> Forget(std::string_view key) {
    return Forget(key, ForgetOptions{});
  }

  // Admin: up to `limit` entries whose key starts with `prefix`, in no promised
  // order: the live records, and the records that cannot be decoded (written
  // by hand, cut short, of another type), each with its key and why. One such
  // record never fails the scan: the others are listed, and it is named so that
  // an operator can look at it and Forget it (claims of its key answer DataLoss
  // and change nothing). A key no call can name (empty, or over kMaxKeyBytes:
  // written under the store's prefix by other means) is not listed: no claim
  // meets it, and no Forget could remove it. A non-OK status is a failure to read
  // the store.
  [[nodiscard]] virtual StatusOr<ScanResult> Scan(std::string_view prefix, size_t limit,
                                                   const ScanOptions& options) = 0;
  [[nodiscard]] StatusOr<ScanResult> Scan(std::string_view prefix, size_t limit) {
    return Scan(prefix, limit, ScanOptions{});
  }

  // Capability: told that its caller is stopping (a Consumer whose drain
  // deadline has passed, ConsumerOptions::drain_timeout), a store that waits on a
  // server waits no longer than `grace` for any answer (or, the PostgreSQL store,
  // for a free connection of its pool) from then on: a call
  // already waiting gets `grace` from this call, a later one `grace` from its
  // start (connecting included). A call that got no answer in time fails with
  // Aborted saying it was given up, and is never tried again by the store: its
  // effect is unknown, as after any failure (a claim may have been made, held by
  // a token nobody has: its key answers BUSY until the lease ends, then is taken
  // over; a completion may or may not be recorded: the caller acks nothing for
  // it). A server that answers in time is not affected. Not undone; the shortest
  // grace asked for applies. Any thread, any number of times; never blocks.
  // Default: nothing (memory and RocksDB wait on no server); the Redis and
  // PostgreSQL stores implement it.
  virtual void StopWaiting(Millis grace) { (void)grace; }

  // "memory:", "rocksdb:/var/lib/dedup", "redis://127.0.0.1:6379" (no password).
  virtual std::string Describe() const = 0;
};

// Forwards every call to another store. Derive from it to wrap a store with fault
// injection, metrics or logging and override only what you need. The batch calls
// (ClaimBatch, CompleteBatch) forward to the target's batch call, not to this
// wrapper's single ones: a wrapper that must see every completion overrides
// CompleteBatch too (Store::CompleteBatch loops over the wrapper's own Complete).
class StoreWrapper : public Store {
 public:
  explicit StoreWrapper(Store* target) : target_(target) {}
  Store* target() const { return target_; }

  StatusOr<ClaimResult> Claim(const ClaimRequest& req) override { return target_->Claim(req); }
  StatusOr<std::vector<ClaimResult>> ClaimBatch(std::span<const ClaimRequest> reqs) override {
    return target_->ClaimBatch(reqs);
  }
  StatusOr<WriteResult> Extend(std::string_view key, Token token, Millis lease) override {
    return target_->Extend(key, token, lease);
  }
  StatusOr<WriteResult> Complete(std::string_view key, Token token, Millis retention,
                                 CompletionStatus status, std::string_view result) override {
    return target_->Complete(key, token, retention, status, result);
  }
  bool CanCompleteWithAck(const BrokerAck& ack) const override {
    return target_->CanCompleteWithAck(ack);
  }
  StatusOr<AckedWrite> CompleteWithAck(std::string_view key, Token token, Millis retention,
                                       CompletionStatus status, std::string_view result,
                                       const BrokerAck& ack) override {
    return target_->CompleteWithAck(key, token, retention, status, result, ack);
  }
  StatusOr<std::vector<AckedWrite>> CompleteBatch(
      std::span<const CompleteRequest> reqs) override {
    return target_->CompleteBatch(reqs);
  }
  StatusOr<WriteResult> Release(std::string_view key, Token token, Millis retention) override {
    return target_->Release(key, token, retention);
  }
  StatusOr<std::optional<Record>> Inspect(std::string_view key) override {
    return target_->Inspect(key);
  }
  using Store::Forget;
  StatusOr<bool> Forget(std::string_view key, const ForgetOptions& options) override {
    return target_->Forget(key, options);
  }
  using Store::Scan;
  StatusOr<ScanResult> Scan(std::string_view prefix, size_t limit,
                            const ScanOptions& options) override {
    return target_->Scan(prefix, limit, options);
  }
  void StopWaiting(Millis grace) override { target_->StopWaiting(grace); }
  std::string Describe() const override { return target_->Describe(); }

 private:
  Store* target_;
};

// Argument checks shared by every store, so that every backend rejects the same
// input with the same words. Each returns InvalidArgument naming the problem.
Status ValidateKey(std::string_view key);
Status ValidateClaim(const ClaimRequest& req);
// True exactly when ValidateClaim(req) is OK, inline and without building a
// Status (ValidateClaim's out-of-line checks were ~140 of a memory-store claim's
// ~1,100 instructions): a hot path calls ValidateClaim only when this is false,
// for the error. memory_store_test ClaimChecksItsArgumentsAsValidateClaim holds
// the two to the same answers.
inline bool ClaimRequestValid(const ClaimRequest& req) {
  return !req.key.empty() && req.key.size() <= kMaxKeyBytes && req.lease.count() > 0 &&
         req.lease <= kMaxDuration && req.retention.count() > 0 && req.retention <= kMaxDuration &&
         req.fingerprint.size() <= kMaxFingerprintBytes;
}
// Every request of a batch, before anything is written: the first bad one's
// error, with "batch request I" (its index) in front.
Status ValidateClaimBatch(std::span<const ClaimRequest> reqs);
// For a ClaimBatch that fails after some of its claims were made: releases,
// best effort, each of made[i] that acquired reqs[i] (made may be shorter than
// reqs, or hold default results for the requests not reached).
void ReleaseAcquired(Store& store, std::span<const ClaimRequest> reqs,
                     std::span<const ClaimResult> made);
Status ValidateCompleteBatch(std::span<const CompleteRequest> reqs);
Status ValidateLease(Millis lease);
Status ValidateRetention(Millis retention);
Status ValidateToken(Token token);
Status ValidateResult(std::string_view result);
// kOk, kFailed or kExhausted: a value cast from outside the enum's range is
// refused before any store writes it (RocksDB wrote one it then could not
// decode: the key stayed DataLoss until forgotten).
Status ValidateStatus(CompletionStatus status);
// The whole argument check of each owner-checked write, in the order above.
Status ValidateExtend(std::string_view key, Token token, Millis lease);
Status ValidateComplete(std::string_view key, Token token, Millis retention,
                        CompletionStatus status, std::string_view result);
Status ValidateRelease(std::string_view key, Token token, Millis retention);

// One CompleteRequest with the single calls: Store::CompleteWithAck when the
// request carries an ack the store can fuse with a kOk completion, else
// Store::Complete (acked = false). What the default Store::CompleteBatch does per
// request, and what Buffer does for a completion written alone.
StatusOr<AckedWrite> CompleteOne(Store& store, const CompleteRequest& req);

struct OpenOptions {
  // The clock of embedded stores (memory, RocksDB). Not owned; must outlive the
  // store. Default: Clock::System(). Ignored by server stores, which use the
  // server's clock.
  Clock* clock = nullptr;
  // Embedded stores: a missing store is NotFound instead of being created (admin
  // tools such as inspect and forget, where a mistyped path must not create one).
  // PostgreSQL: so is a missing table (nor is its schema made).
  bool must_exist = false;
  // Embedded stores: open for reading only (nothing written, works on a read-only
  // copy); writes answer FailedPrecondition. Implies must_exist. PostgreSQL: a
  // read-only server (a hot standby) is accepted, which is refused otherwise,
  // and the store runs no expiry.
  bool read_only = false;
  // Called once per open, with each warning about a server setting that can make
  // dedup process a message twice (Redis: an evicting maxmemory-policy, no AOF), or
  // a note that the settings could not be checked. Null: each is written to
  // stderr after "dedup: " (a library user who set nothing still hears of a
  // Redis that can lose claims). To drop them, give a function that does nothing.
  std::function<void(const std::string&)> on_warning;
};

// Opens a store from a URI:
//   memory:                          a process-local store (lost on exit)
//   rocksdb:PATH[?sync=always|interval:MS|none][&recovery=strict|salvage]
//                                    the embedded durable store
//   redis://[USER:PASSWORD@]HOST:PORT[/DB][?prefix=..&timeout=..&pool=..]
//   redis+cluster://HOST:PORT,HOST:PORT,...[?...]
//                                    Redis 7+, one server or a cluster
//   postgres://USER[:PASSWORD]@HOST:PORT/DB[?schema=..&table=..&...]
// (every parameter: README.md, "The command line", and docs/REDIS.md,
// docs/POSTGRES.md). Backends compiled out or URIs that cannot be parsed give
// InvalidArgument naming the part that is wrong; a scheme named but not
// supported (rediss://: TLS) Unimplemented; a server that cannot be reached
// Unavailable, a wrong password Unauthenticated.
[[nodiscard]] StatusOr<std::unique_ptr<Store>> OpenStore(std::string_view uri,
                                                         const OpenOptions& options = {});

}  // namespace dedup

#endif  // DEDUP_STORE_H_
