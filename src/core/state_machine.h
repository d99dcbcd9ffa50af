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
#include <string_view>

#include "dedup/record.h"
#include "dedup/store.h"

namespace dedup::internal {

// Decides a claim. `cur` is the stored record, or null when the key has none. A
// record past its retention counts as absent, but its fence is carried on so that
// fences never repeat while a trace is kept. When the claim changes the record,
// *next is the record to store and true is returned in *write. Record::key is
// neither read nor set: stores keep the key beside the record.
ClaimResult DecideClaim(const Record* cur, const ClaimRequest& req, int64_t now,
                        Token fresh_token, Record* next, bool* write);

// Owner-checked writes: kOk and *rec updated when `token` owns the IN_PROGRESS
// record (even if its lease has ended, as long as nobody has taken over), kLost and
// *rec untouched otherwise. `rec` null means no record.
WriteResult DecideExtend(Record* rec, Token token, Millis lease, int64_t now);
WriteResult DecideComplete(Record* rec, Token token, Millis retention,
                           CompletionStatus status, std::string_view result, int64_t now);
WriteResult DecideRelease(Record* rec, Token token, Millis retention, int64_t now);

}  // namespace dedup::internal

#endif  // DEDUP_SRC_CORE_STATE_MACHINE_H_
