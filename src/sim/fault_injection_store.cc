// Copyright dedup authors. Licensed under the Apache License 2.0.

#include "sim/fault_injection_store.h"

namespace dedup {

void FaultInjectionStore::KillOwner(Token t) {
  std::lock_guard lock(mu_);
  dead_.insert(t.value);
  any_.store(true, std::memory_order_release);
}

void FaultInjectionStore::AfterComplete(Token t, std::function<void()> fn) {
  std::lock_guard lock(mu_);
  after_complete_[t.value] = std::move(fn);
  any_.store(true, std::memory_order_release);
}

Status FaultInjectionStore::Refuse(Token t, bool outcome) {
  Status s;
  if (unavailable_.load()) {
    s = Status::Unavailable("simulated store outage");
  } else if (t.valid() && any_.load(std::memory_order_acquire)) {
    std::lock_guard lock(mu_);
    if (dead_.contains(t.value)) {
      s = Status(StatusCode::kAborted, "simulated crash: the owner's process is gone");
    }
  }
  if (!s.ok() && outcome) refused_outcomes_.fetch_add(1);
  return s;
}

void FaultInjectionStore::RunAfterComplete(Token t) {
  if (!any_.load(std::memory_order_acquire)) return;
  std::function<void()> fn;
  {
    std::lock_guard lock(mu_);
    auto it = after_complete_.find(t.value);
    if (it == after_complete_.end()) return;
    fn = std::move(it->second);
    after_complete_.erase(it);
  }
  fn();
}

StatusOr<ClaimResult> FaultInjectionStore::Claim(const ClaimRequest& req) {
  DEDUP_RETURN_IF_ERROR(Refuse(Token{}, false));
  return StoreWrapper::Claim(req);
}

StatusOr<std::vector<ClaimResult>> FaultInjectionStore::ClaimBatch(
    std::span<const ClaimRequest> reqs) {
  DEDUP_RETURN_IF_ERROR(Refuse(Token{}, false));
  return StoreWrapper::ClaimBatch(reqs);
}

StatusOr<WriteResult> FaultInjectionStore::Extend(std::string_view key, Token token,
                                                  Millis lease) {
  DEDUP_RETURN_IF_ERROR(Refuse(token, false));
  return StoreWrapper::Extend(key, token, lease);
}

StatusOr<WriteResult> FaultInjectionStore::Complete(std::string_view key, Token token,
                                                    Millis retention, CompletionStatus status,
                                                    std::string_view result) {
  DEDUP_RETURN_IF_ERROR(Refuse(token, true));
  StatusOr<WriteResult> r = StoreWrapper::Complete(key, token, retention, status, result);
  if (r.ok() && *r == WriteResult::kOk) RunAfterComplete(token);
  return r;
}

StatusOr<AckedWrite> FaultInjectionStore::CompleteWithAck(std::string_view key, Token token,
                                                          Millis retention,
                                                          CompletionStatus status,
                                                          std::string_view result,
                                                          const BrokerAck& ack) {
  DEDUP_RETURN_IF_ERROR(Refuse(token, true));
  StatusOr<AckedWrite> r =
      StoreWrapper::CompleteWithAck(key, token, retention, status, result, ack);
  if (r.ok() && r->write == WriteResult::kOk) RunAfterComplete(token);
  return r;
}

StatusOr<std::vector<AckedWrite>> FaultInjectionStore::CompleteBatch(
    std::span<const CompleteRequest> reqs) {
  // Not counted in refused_outcomes(): the caller writes each alone next, and the
  // dead owner's single write is the one counted.
  for (const CompleteRequest& q : reqs) {
    if (Status s = Refuse(q.token, false); !s.ok()) {
      if (s.code() == StatusCode::kAborted) {
        return Status(StatusCode::kAborted, s.message() + " (a completion of this batch)");
      }
      return s;
    }
  }
  StatusOr<std::vector<AckedWrite>> r = StoreWrapper::CompleteBatch(reqs);
  if (r.ok()) {
    for (size_t i = 0; i < reqs.size() && i < r->size(); ++i) {
      if ((*r)[i].write == WriteResult::kOk) RunAfterComplete(reqs[i].token);
    }
  }
  return r;
}

StatusOr<WriteResult> FaultInjectionStore::Release(std::string_view key, Token token,
                                                   Millis retention) {
  DEDUP_RETURN_IF_ERROR(Refuse(token, true));
  return StoreWrapper::Release(key, token, retention);
}

}  // namespace dedup
