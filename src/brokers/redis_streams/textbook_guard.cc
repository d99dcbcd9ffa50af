// Copyright dedup authors. Licensed under the Apache License 2.0.

#include "brokers/redis_streams/textbook_guard.h"

#include <hiredis/hiredis.h>

namespace dedup::streams {

std::unique_ptr<StreamConn> TextbookGuard::Take() {
  std::lock_guard lock(mu_);
  if (pool_.empty()) return std::make_unique<StreamConn>(o_.conn);
  auto c = std::move(pool_.back());
  pool_.pop_back();
  return c;
}

void TextbookGuard::Give(std::unique_ptr<StreamConn> c) {
  std::lock_guard lock(mu_);
  pool_.push_back(std::move(c));
}

Processed TextbookGuard::Process(const StreamMessage& m,
                                 const std::function<HandlerResult()>& work) {
  Processed p;
  auto conn = Take();
  const std::string key = o_.prefix + m.key;
  const long long ttl_s = std::max<long long>(1, (o_.ttl.count() + 999) / 1000);
  auto r = conn->Run({"SET", key, "processing", "NX", "EX", std::to_string(ttl_s)});
  if (!r.ok() || IsError(r->get())) {
    p.status = r.ok() ? Status::Unavailable("SET NX: " + ReplyText(r->get())) : r.status();
    p.action = BrokerAction::kRetry;
    p.retry_after = o_.retry_delay;
    p.reason = "store error: " + p.status.ToString();
    Give(std::move(conn));
    return p;
  }
  if (r->get()->type == REDIS_REPLY_NIL) {
    // "Key exists" is taken to mean "done" (defect 4).
    p.claim.outcome = ClaimOutcome::kDuplicate;
    p.action = BrokerAction::kAck;
    Give(std::move(conn));
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
  } else {
    (void)conn->Run({"DEL", key});  // not owner-checked (defect 3)
    p.action = hr.kind == HandlerResult::Kind::kRetry ? BrokerAction::kRetry
                                                       : BrokerAction::kDeadLetter;
    p.retry_after = o_.retry_delay;
    p.reason = hr.result;
  }
  Give(std::move(conn));
  return p;
}

}  // namespace dedup::streams
