// Copyright dedup authors. Licensed under the Apache License 2.0.
//
// FaultInjectionStore: a StoreWrapper that makes store-side faults happen on
// purpose, in the spirit of RocksDB's FaultInjectionTestEnv. Used by `dedup
// simulate` and by tests; wrap any Store with it and hand it to a Buffer.
//
//   KillOwner(token)    the claim's owner process is gone: from now on every
//                       extend / complete / release carrying the token fails with
//                       Aborted and changes nothing (a dead process writes
//                       nothing, and its heartbeat stops). The record stays
//                       IN_PROGRESS until its lease runs out, exactly what a
//                       crashed worker leaves behind.
//   AfterComplete(token, fn)  runs fn() right after a completion of the token
//                       answered OK, before the caller sees it (a crash between
//                       complete and the broker's ack).
//   SetUnavailable(on)  every call fails with Unavailable (a store outage).
//
// Thread-safe. Aborted (not Unavailable) for a killed owner, so that the Buffer
// does not retry the write.

#ifndef DEDUP_SRC_SIM_FAULT_INJECTION_STORE_H_
#define DEDUP_SRC_SIM_FAULT_INJECTION_STORE_H_

#include <atomic>
#include <functional>
#include <mutex>
#include <unordered_map>
#include <unordered_set>

#include "dedup/store.h"

namespace dedup {

class FaultInjectionStore : public StoreWrapper {
 public:
  using StoreWrapper::StoreWrapper;

  void KillOwner(Token t);
  void AfterComplete(Token t, std::function<void()> fn);
  void SetUnavailable(bool on) { unavailable_.store(on); }

  // Completions and releases refused so far (killed owners, outage).
  uint64_t refused_outcomes() const { return refused_outcomes_.load(); }

  StatusOr<ClaimResult> Claim(const ClaimRequest& req) override;
  StatusOr<std::vector<ClaimResult>> ClaimBatch(std::span<const ClaimRequest> reqs) override;
  StatusOr<WriteResult> Extend(std::string_view key, Token token, Millis lease) override;
  StatusOr<WriteResult> Complete(std::string_view key, Token token, Millis retention,
                                 CompletionStatus status, std::string_view result) override;
  StatusOr<AckedWrite> CompleteWithAck(std::string_view key, Token token, Millis retention,
                                       CompletionStatus status, std::string_view result,
                                       const BrokerAck& ack) override;
  // The wrapped store's CompleteBatch (the path production runs), with every
  // completion of the batch meeting the faults first: in an outage the batch
  // fails Unavailable; if any request carries a killed owner's token, the batch
  // fails whole with Aborted and nothing of it is written (the caller, Buffer,
  // then writes each alone, and only the dead owner's write is refused).
  // AfterComplete runs for each item recorded kOk.
  StatusOr<std::vector<AckedWrite>> CompleteBatch(std::span<const CompleteRequest> reqs) override;
  StatusOr<WriteResult> Release(std::string_view key, Token token, Millis retention) override;

 private:
  Status Refuse(Token t, bool outcome);
  void RunAfterComplete(Token t);

  std::mutex mu_;
  std::unordered_set<uint64_t> dead_;
  std::unordered_map<uint64_t, std::function<void()>> after_complete_;
  std::atomic<bool> any_{false};
  std::atomic<bool> unavailable_{false};
  std::atomic<uint64_t> refused_outcomes_{0};
};

}  // namespace dedup

#endif  // DEDUP_SRC_SIM_FAULT_INJECTION_STORE_H_
