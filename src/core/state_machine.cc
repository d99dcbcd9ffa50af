// Copyright dedup authors. Licensed under the Apache License 2.0.

#include "core/state_machine.h"

#include <string>

#include "core/duration.h"
#include "core/printable.h"

namespace dedup::internal {
namespace {

bool Owns(const Record* rec, Token token, int64_t now) {
  return rec != nullptr && !rec->ExpiredAt(now) && rec->state == RecordState::kInProgress &&
         rec->token == token;
}

void StartLease(Record* r, Token token, const ClaimRequest& req, int64_t now) {
  r->state = RecordState::kInProgress;
  r->token = token;
  r->lease_deadline = now + req.lease.count();
  r->retention_deadline = r->lease_deadline + req.retention.count();
  r->status = CompletionStatus::kOk;
  r->result.clear();
  if (r->fingerprint.empty() && !req.fingerprint.empty()) r->fingerprint.assign(req.fingerprint);
}

}  // namespace

ClaimResult DecideClaim(const Record* cur, const ClaimRequest& req, int64_t now,
                        Token fresh_token, Record* next, bool* write, std::string* at_limit) {
  ClaimResult res;
  *write = false;
  at_limit->clear();
  // Not an answer (the store fails the claim): BUSY, so that nothing would run.
  auto refuse = [&](std::string what) {
    *at_limit = std::move(what);
    res.outcome = ClaimOutcome::kBusy;
    return res;
  };
  constexpr uint64_t kMaxFence = ~uint64_t{0};
  constexpr uint32_t kMaxAttempt = ~uint32_t{0};
  constexpr const char* kFenceLimit = " cannot be raised (the largest fence is 2^64 - 1)";
  if (cur == nullptr || cur->ExpiredAt(now)) {
    if (cur != nullptr && cur->fence == kMaxFence) {
      return refuse("fence " + std::to_string(cur->fence) + kFenceLimit);
    }
    // No record, or its retention is over: the key is ABSENT (again), but the
    // fence goes on. StartLease sets every field of *next but these (and the
    // key, which is not ours): no whole Record is built and moved in.
    next->fence = cur == nullptr ? 1 : cur->fence + 1;
    next->attempt = 1;
    next->fingerprint.clear();
    StartLease(next, fresh_token, req, now);
    *write = true;
    res.outcome = ClaimOutcome::kAcquired;
    res.token = fresh_token;
    res.fence = next->fence;
    res.attempt = 1;
    return res;
  }

  res.fence = cur->fence;
  res.attempt = cur->attempt;
  if (!req.fingerprint.empty() && !cur->fingerprint.empty() &&
      req.fingerprint != cur->fingerprint) {
    res.outcome = ClaimOutcome::kMismatch;
    return res;
  }
  if (cur->state == RecordState::kCompleted) {
    res.outcome = ClaimOutcome::kDuplicate;
    res.status = cur->status;
    res.result = cur->result;
    return res;
  }
  if (cur->LeaseValidAt(now)) {
    res.outcome = ClaimOutcome::kBusy;
    res.lease_left = Millis(cur->lease_deadline - now);
    return res;
  }
  // RELEASED, or IN_PROGRESS with its lease over: a new attempt, if one is left.
  *next = *cur;
  if (req.max_attempts != 0 && cur->attempt >= req.max_attempts) {
    next->state = RecordState::kCompleted;
    next->status = CompletionStatus::kExhausted;
    next->result.clear();
    next->lease_deadline = now;
    next->retention_deadline = now + req.retention.count();
    *write = true;
    res.outcome = ClaimOutcome::kExhausted;
    return res;
  }
  if (cur->fence == kMaxFence) {
    return refuse("fence " + std::to_string(cur->fence) + kFenceLimit);
  }
  if (cur->attempt == kMaxAttempt) {
    return refuse("attempt " + std::to_string(cur->attempt) +
                  " cannot be raised (the largest attempt is 2^32 - 1)");
  }
  next->fence = cur->fence + 1;
  next->attempt = cur->attempt + 1;
  StartLease(next, fresh_token, req, now);
  *write = true;
  res.outcome = ClaimOutcome::kAcquired;
  res.token = fresh_token;
  res.fence = next->fence;
  res.attempt = next->attempt;
  return res;
}

WriteResult DecideExtend(Record* rec, Token token, Millis lease, int64_t now) {
  if (!Owns(rec, token, now)) return WriteResult::kLost;
  const int64_t keep_after_lease = rec->retention_deadline - rec->lease_deadline;
  rec->lease_deadline = now + lease.count();
  rec->retention_deadline = rec->lease_deadline + keep_after_lease;
  return WriteResult::kOk;
}

WriteResult DecideComplete(Record* rec, Token token, Millis retention,
                           CompletionStatus status, std::string_view result, int64_t now) {
  if (!Owns(rec, token, now)) return WriteResult::kLost;
  rec->state = RecordState::kCompleted;
  rec->status = status;
  rec->result.assign(result);
  rec->lease_deadline = now;
  rec->retention_deadline = now + retention.count();
  return WriteResult::kOk;
}

WriteResult DecideRelease(Record* rec, Token token, Millis retention, int64_t now) {
  if (!Owns(rec, token, now)) return WriteResult::kLost;
  rec->state = RecordState::kReleased;
  rec->lease_deadline = now;
  rec->retention_deadline = now + retention.count();
  return WriteResult::kOk;
}

bool IsFenceFloor(const Record& r) {
  return r.state == RecordState::kReleased && r.attempt == 0;
}

ForgetAction DecideForget(const Record* cur, bool force, int64_t now, Record* floor) {
  if (cur == nullptr || cur->ExpiredAt(now) || IsFenceFloor(*cur)) return ForgetAction::kNone;
  if (!cur->LeaseValidAt(now)) return ForgetAction::kRemove;
  if (!force) return ForgetAction::kRefuse;
  // The running owner's fence stays the key's floor for as long as the owner may
  // still hand it on: until its lease ends (its extend answers LOST from now on).
  *floor = *cur;
  floor->state = RecordState::kReleased;
  floor->attempt = 0;
  floor->lease_deadline = now;
  floor->retention_deadline = cur->lease_deadline;
  floor->fingerprint.clear();
  floor->status = CompletionStatus::kOk;
  floor->result.clear();
  return ForgetAction::kFloor;
}

// What LeasedForgetError writes after the key, and IsLeasedForgetError looks for.
constexpr std::string_view kLeaseRunning = "\": its lease is still running (";

bool IsLeasedForgetError(const Status& s, std::string_view key) {
  return s.code() == StatusCode::kFailedPrecondition &&
         s.message().starts_with("forget \"" + Printable(key) + std::string(kLeaseRunning));
}

Status LeasedForgetError(std::string_view key, Millis left) {
  return Status::FailedPrecondition(
      "forget \"" + Printable(key) + std::string(kLeaseRunning) + FormatDuration(left) +
      " left), so a worker may be processing it; forgetting it now lets a second run start "
      "beside it. Wait for the lease to end, or force it (dedup forget --force, "
      "DELETE ?force=true): the next claim then gets a higher fence and the running "
      "owner's writes answer LOST");
}

}  // namespace dedup::internal
