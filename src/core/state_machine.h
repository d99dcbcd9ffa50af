// Copyright dedup authors. Licensed under the Apache License 2.0.
//
// The record transitions of SPEC.md as pure functions, shared by the embedded
// stores (memory, RocksDB). A store reads the current record, calls one of these
// under its per-key lock, and writes `next` when asked to. Server stores (Redis,
// PostgreSQL) implement the same table in their own language and are held to it by
// the conformance suite.

#ifndef DEDUP_SRC_CORE_STATE_MACHINE_H_
#define DEDUP_SRC_CORE_STATE_MACHINE_H_

#include <cstdint>
#include <string>
#include <string_view>

#include "dedup/record.h"
#include "dedup/store.h"

namespace dedup::internal {

// Decides a claim. `cur` is the stored record, or null when the key has none. A
// record past its retention counts as absent, but its fence is carried on so that
// fences never repeat while a trace is kept. When the claim changes the record,
// *next is the record to store and true is returned in *write. Record::key is
// neither read nor set: stores keep the key beside the record.
//
// A claim that would raise the fence past 2^64 - 1 or the attempt past 2^32 - 1
// (only a corrupt or hand-written record is that high) changes nothing: *write
// is false, and *at_limit says which and why, for the store's DataLoss error
// (nothing changed), as the Redis and PostgreSQL stores refuse their own limits;
// the result is then not an answer. *at_limit is empty otherwise.
ClaimResult DecideClaim(const Record* cur, const ClaimRequest& req, int64_t now,
                        Token fresh_token, Record* next, bool* write, std::string* at_limit);

// Owner-checked writes: kOk and *rec updated when `token` owns the IN_PROGRESS
// record (even if its lease has ended, as long as nobody has taken over), kLost and
// *rec untouched otherwise. `rec` null means no record.
WriteResult DecideExtend(Record* rec, Token token, Millis lease, int64_t now);
WriteResult DecideComplete(Record* rec, Token token, Millis retention,
                           CompletionStatus status, std::string_view result, int64_t now);
WriteResult DecideRelease(Record* rec, Token token, Millis retention, int64_t now);

// What Forget does with the stored record `cur` (null: none).
enum class ForgetAction : uint8_t {
  kNone,     // no record to forget (none, past its retention, or a fence floor): answer false
  kRemove,   // delete the record: answer true
  kRefuse,   // its lease is running and force is off: answer LeasedForgetError
  kFloor,    // forced on a running lease: store *floor in its place, answer true
};
// A fence floor is a RELEASED record with attempt 0 (no claim ever leaves one), no
// fingerprint, kept until the forgotten lease's end. Claims treat it as a released
// record (fence + 1, attempt 0 + 1 = 1), so no claim path knows about it; Inspect
// and Scan report it absent. Server stores write the same record in their own
// language.
bool IsFenceFloor(const Record& r);
ForgetAction DecideForget(const Record* cur, bool force, int64_t now, Record* floor);
// FailedPrecondition for a forget refused because the lease of `key` is running
// for `left` more, in the same words from every store.
Status LeasedForgetError(std::string_view key, Millis left);
// Whether `s` is the LeasedForgetError of a Forget of `key`: a refusal that ends
// by itself when the lease does (dedup forget exits 75 for it), unlike the other
// refusals. Its message must begin with that error's words for `key` exactly, so
// no other refusal that quotes the key or the store's prefix passes for it.
bool IsLeasedForgetError(const Status& s, std::string_view key);

}  // namespace dedup::internal

#endif  // DEDUP_SRC_CORE_STATE_MACHINE_H_
