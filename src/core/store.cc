// Copyright dedup authors. Licensed under the Apache License 2.0.

#include "dedup/store.h"

#include <string>

namespace dedup {
namespace {

std::string Ms(Millis d) { return std::to_string(d.count()) + " ms"; }

}  // namespace

Status ValidateKey(std::string_view key) {
  if (key.empty()) return Status::InvalidArgument("key is empty (keys are 1 to 1024 bytes)");
  if (key.size() > kMaxKeyBytes) {
    return Status::InvalidArgument("key is " + std::to_string(key.size()) +
                                   " bytes, more than the limit of 1024");
  }
  return Status::Ok();
}

Status ValidateLease(Millis lease) {
  if (lease.count() <= 0) {
    return Status::InvalidArgument("lease must be positive, got " + Ms(lease));
  }
  if (lease > kMaxDuration) return Status::InvalidArgument("lease " + Ms(lease) + " exceeds 10 years");
  return Status::Ok();
}

Status ValidateRetention(Millis retention) {
  if (retention.count() <= 0) {
    return Status::InvalidArgument("retention must be positive, got " + Ms(retention));
  }
  if (retention > kMaxDuration) {
    return Status::InvalidArgument("retention " + Ms(retention) + " exceeds 10 years");
  }
  return Status::Ok();
}

Status ValidateToken(Token token) {
  if (!token.valid()) return Status::InvalidArgument("token is 0 (not a token from a claim)");
  return Status::Ok();
}

Status ValidateResult(std::string_view result) {
  if (result.size() > kMaxResultBytes) {
    return Status::InvalidArgument("result is " + std::to_string(result.size()) +
                                   " bytes, more than the limit of " +
                                   std::to_string(kMaxResultBytes));
  }
  return Status::Ok();
}

Status ValidateStatus(CompletionStatus status) {
  switch (status) {
    case CompletionStatus::kOk:
    case CompletionStatus::kFailed:
    case CompletionStatus::kExhausted:
      return Status::Ok();
  }
  return Status::InvalidArgument("completion status " + std::to_string(static_cast<int>(status)) +
                                 " is not one of ok (0), failed (1), exhausted (2)");
}

Status ValidateClaim(const ClaimRequest& req) {
  DEDUP_RETURN_IF_ERROR(ValidateKey(req.key));
  DEDUP_RETURN_IF_ERROR(ValidateLease(req.lease));
  DEDUP_RETURN_IF_ERROR(ValidateRetention(req.retention));
  if (req.fingerprint.size() > kMaxFingerprintBytes) {
    return Status::InvalidArgument("fingerprint is " + std::to_string(req.fingerprint.size()) +
                                   " bytes, more than the limit of 64");
  }
  return Status::Ok();
}

Status ValidateClaimBatch(std::span<const ClaimRequest> reqs) {
  for (size_t i = 0; i < reqs.size(); ++i) {
    Status s = ValidateClaim(reqs[i]);
    if (!s.ok()) return s.WithContext("batch request " + std::to_string(i));
  }
  return Status::Ok();
}

Status ValidateCompleteBatch(std::span<const CompleteRequest> reqs) {
  for (size_t i = 0; i < reqs.size(); ++i) {
    const CompleteRequest& r = reqs[i];
    Status s = ValidateComplete(r.key, r.token, r.retention, r.status, r.result);
    if (!s.ok()) return s.WithContext("batch request " + std::to_string(i));
  }
  return Status::Ok();
}

Status ValidateExtend(std::string_view key, Token token, Millis lease) {
  DEDUP_RETURN_IF_ERROR(ValidateKey(key));
  DEDUP_RETURN_IF_ERROR(ValidateToken(token));
  return ValidateLease(lease);
}

Status ValidateComplete(std::string_view key, Token token, Millis retention,
                        CompletionStatus status, std::string_view result) {
  DEDUP_RETURN_IF_ERROR(ValidateKey(key));
  DEDUP_RETURN_IF_ERROR(ValidateToken(token));
  DEDUP_RETURN_IF_ERROR(ValidateRetention(retention));
  DEDUP_RETURN_IF_ERROR(ValidateStatus(status));
  return ValidateResult(result);
}

Status ValidateRelease(std::string_view key, Token token, Millis retention) {
  DEDUP_RETURN_IF_ERROR(ValidateKey(key));
  DEDUP_RETURN_IF_ERROR(ValidateToken(token));
  return ValidateRetention(retention);
}

void ReleaseAcquired(Store& store, std::span<const ClaimRequest> reqs,
                     std::span<const ClaimResult> made) {
  for (size_t i = 0; i < made.size() && i < reqs.size(); ++i) {
    if (made[i].acquired()) (void)store.Release(reqs[i].key, made[i].token, reqs[i].retention);
  }
}

StatusOr<std::vector<ClaimResult>> Store::ClaimBatch(std::span<const ClaimRequest> reqs) {
  DEDUP_RETURN_IF_ERROR(ValidateClaimBatch(reqs));
  std::vector<ClaimResult> out;
  out.reserve(reqs.size());
  for (const ClaimRequest& r : reqs) {
    StatusOr<ClaimResult> res = Claim(r);
    if (!res.ok()) {
      // Nobody will hold the claims made so far: released, best effort (store.h).
      ReleaseAcquired(*this, reqs, out);
      return res.status();
    }
    out.push_back(std::move(res).value());
  }
  return out;
}

StatusOr<AckedWrite> Store::CompleteWithAck(std::string_view, Token, Millis, CompletionStatus,
                                            std::string_view, const BrokerAck& ack) {
  return Status::Unimplemented(Describe() + " cannot complete with a " + std::string(ack.kind) +
                               " ack (CanCompleteWithAck is false)");
}

StatusOr<std::vector<AckedWrite>> Store::CompleteBatch(std::span<const CompleteRequest> reqs) {
  DEDUP_RETURN_IF_ERROR(ValidateCompleteBatch(reqs));
  std::vector<AckedWrite> out;
  out.reserve(reqs.size());
  for (const CompleteRequest& r : reqs) {
    StatusOr<AckedWrite> a = CompleteOne(*this, r);
    if (!a.ok()) return a.status();
    out.push_back(*a);
  }
  return out;
}

StatusOr<AckedWrite> CompleteOne(Store& store, const CompleteRequest& r) {
  if (r.ack != nullptr && r.status == CompletionStatus::kOk && store.CanCompleteWithAck(*r.ack)) {
    return store.CompleteWithAck(r.key, r.token, r.retention, r.status, r.result, *r.ack);
  }
  StatusOr<WriteResult> w = store.Complete(r.key, r.token, r.retention, r.status, r.result);
  if (!w.ok()) return w.status();
  return AckedWrite{*w, false};
}

}  // namespace dedup
