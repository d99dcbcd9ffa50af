// Copyright dedup authors. Licensed under the Apache License 2.0.

#include "sim/textbook_guard.h"

namespace dedup {

StatusOr<bool> InProcessTextbookKeys::SetNx(const std::string& key, Millis ttl,
                                            bool* expired_before) {
  const int64_t now = clock_->NowMillis();
  std::lock_guard lock(mu_);
  auto [it, inserted] = keys_.try_emplace(key, now + ttl.count());
  *expired_before = false;
  if (inserted) return true;
  if (it->second > now) return false;
  *expired_before = true;
  it->second = now + ttl.count();
  return true;
}

Status InProcessTextbookKeys::Del(const std::string& key) {
  std::lock_guard lock(mu_);
  keys_.erase(key);
  return Status::Ok();
}

Processed TextbookGuard::Process(std::string_view key, const std::function<HandlerResult()>& work,
                                 bool* takeover) {
  Processed p;
  const std::string k = o_.prefix + std::string(key);
  bool expired_before = false;
  StatusOr<bool> set = keys_->SetNx(k, o_.ttl, &expired_before);
  if (takeover != nullptr) *takeover = expired_before;
  if (!set.ok()) {
    p.status = set.status();
    p.action = BrokerAction::kRetry;
    p.retry_after = o_.retry_delay;
    p.reason = "store error: " + p.status.ToString();
    return p;
  }
  if (!*set) {
    // "Key exists" is taken to mean "done" (defect 4).
    p.claim.outcome = ClaimOutcome::kDuplicate;
    p.action = BrokerAction::kAck;
    return p;
  }
  p.claim.outcome = ClaimOutcome::kAcquired;
  p.claim.attempt = 1;
  p.ran = true;
  HandlerResult hr;
  try {
    hr = work();
  } catch (...) {
    hr = HandlerResult::Retry("handler threw");
  }
  if (hr.kind == HandlerResult::Kind::kDone) {
    p.action = BrokerAction::kAck;  // success writes nothing (defect 5)
    return p;
  }
  (void)keys_->Del(k);  // not owner-checked (defect 3)
  p.action = hr.kind == HandlerResult::Kind::kRetry ? BrokerAction::kRetry
                                                     : BrokerAction::kDeadLetter;
  p.retry_after = o_.retry_delay;
  p.reason = hr.result;
  return p;
}

}  // namespace dedup
