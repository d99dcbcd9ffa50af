// Copyright dedup authors. Licensed under the Apache License 2.0.
//
// The words of the contract (store.h, README.md "What is guaranteed") as types: a record's state, the claim token and fence, and
// the expected outcomes of each operation. Outcomes are values, never errors.

#ifndef DEDUP_RECORD_H_
#define DEDUP_RECORD_H_

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <ostream>
#include <string>
#include <string_view>

#include "dedup/clock.h"

namespace dedup {

// Proof of ownership of one claim: 64 random bits, never 0. Every write after a
// claim (extend, complete, release) carries it; a stale token gets LOST.
struct Token {
  uint64_t value = 0;
  bool valid() const { return value != 0; }
  friend bool operator==(Token a, Token b) { return a.value == b.value; }
  // 16 lower-case hex digits, the form used on the wire and in the CLI.
  std::string ToHex() const;
  // The same digits written at `out` (room for kHexDigits), without a string.
  static constexpr size_t kHexDigits = 16;
  std::string_view WriteHex(char* out) const;
  // The inverse of ToHex: exactly 16 lower-case hex digits, not all 0; anything
  // else (upper case, fewer digits, a 0x prefix) is nullopt.
  static std::optional<Token> FromHex(std::string_view hex);
  // A fresh token from a per-thread generator seeded by std::random_device.
  static Token Random();
};

enum class RecordState : uint8_t {
  kInProgress = 1,  // claimed; the owner's lease may or may not have ended
  kCompleted = 2,   // complete() was called; claims get DUPLICATE until retention ends
  kReleased = 3,    // release() was called; claimable at once, fence and attempts kept
};

// How a completed record ended. Later claims get it back with DUPLICATE.
enum class CompletionStatus : uint8_t {
  kOk = 0,         // the work succeeded
  kFailed = 1,     // permanent failure; the message was dead-lettered
  kExhausted = 2,  // max_attempts was reached; the message was dead-lettered
};

std::string_view RecordStateName(RecordState s);          // "in_progress", ...
std::string_view CompletionStatusName(CompletionStatus s);  // "ok", "failed", "exhausted"
std::optional<CompletionStatus> ParseCompletionStatus(std::string_view name);

// Everything a store keeps per key. Times are the store clock's milliseconds since
// the Unix epoch.
struct Record {
  std::string key;
  RecordState state = RecordState::kInProgress;
  Token token;             // owner of the current or last claim
  uint64_t fence = 0;      // strictly increases with every successful claim
  uint32_t attempt = 0;    // 1 for the first claim, +1 for each later one
  int64_t lease_deadline = 0;      // IN_PROGRESS: the owner's lease ends here
  int64_t retention_deadline = 0;  // the store may forget the record from here on
  std::string fingerprint;         // empty = none recorded
  CompletionStatus status = CompletionStatus::kOk;  // COMPLETED only
  std::string result;                               // COMPLETED only

  // The record as ABSENT would see it at `now`: true when it no longer answers
  // claims (retention over). Lease expiry does not make a record absent.
  bool ExpiredAt(int64_t now) const { return now >= retention_deadline; }
  bool LeaseValidAt(int64_t now) const {
    return state == RecordState::kInProgress && now < lease_deadline;
  }
  friend bool operator==(const Record&, const Record&) = default;
};

std::ostream& operator<<(std::ostream& os, const Record& r);

enum class ClaimOutcome : uint8_t {
  kAcquired = 0,   // the caller owns the key: run the work
  kBusy = 1,       // another owner holds a valid lease: do not ack, retry after lease_left
  kDuplicate = 2,  // completed within retention: ack, result available
  kMismatch = 3,   // same key, different payload fingerprint: dead-letter; record unchanged
  kExhausted = 4,  // this claim would exceed max_attempts: dead-letter; record now COMPLETED/exhausted
};

std::string_view ClaimOutcomeName(ClaimOutcome o);  // "ACQUIRED", "BUSY", ...

// The answer to a claim. Which fields mean something depends on `outcome`:
//   kAcquired   token, fence, attempt
//   kBusy       fence, attempt (of the current owner), lease_left
//   kDuplicate  fence, attempt, status, result
//   kMismatch   fence
//   kExhausted  fence, attempt (the attempts made)
struct ClaimResult {
  ClaimOutcome outcome = ClaimOutcome::kBusy;
  Token token;
  uint64_t fence = 0;
  uint32_t attempt = 0;
  Millis lease_left{0};
  CompletionStatus status = CompletionStatus::kOk;
  std::string result;

  bool acquired() const { return outcome == ClaimOutcome::kAcquired; }
  friend bool operator==(const ClaimResult&, const ClaimResult&) = default;
};

std::ostream& operator<<(std::ostream& os, const ClaimResult& r);

// The answer to extend, complete and release.
enum class WriteResult : uint8_t {
  kOk = 0,    // the token owned the key; the write took effect
  kLost = 1,  // the token no longer owns the key; nothing was changed
};

std::string_view WriteResultName(WriteResult r);  // "OK", "LOST"

}  // namespace dedup

#endif  // DEDUP_RECORD_H_
