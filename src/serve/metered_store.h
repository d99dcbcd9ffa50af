// Copyright dedup authors. Licensed under the Apache License 2.0.
//
// A StoreWrapper that times claims into a histogram (seconds): the latency of
// the store as the caller sees it, for the worker's and serve's /metrics.
// Everything else, capabilities included, is forwarded unchanged.

#ifndef DEDUP_SRC_SERVE_METERED_STORE_H_
#define DEDUP_SRC_SERVE_METERED_STORE_H_

#include <chrono>
#include <memory>

#include "dedup/store.h"
#include "serve/metrics.h"

namespace dedup::serve {

class MeteredStore : public StoreWrapper {
 public:
  // `claims` observes one value per Claim and one per ClaimBatch call.
  MeteredStore(Store* target, metrics::Histogram* claims)
      : StoreWrapper(target), claims_(claims) {}

  StatusOr<ClaimResult> Claim(const ClaimRequest& req) override {
    const auto t0 = std::chrono::steady_clock::now();
    auto r = target()->Claim(req);
    claims_->Observe(Since(t0));
    return r;
  }
  StatusOr<std::vector<ClaimResult>> ClaimBatch(std::span<const ClaimRequest> reqs) override {
    const auto t0 = std::chrono::steady_clock::now();
    auto r = target()->ClaimBatch(reqs);
    claims_->Observe(Since(t0));
    return r;
  }

 private:
  static double Since(std::chrono::steady_clock::time_point t0) {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }
  metrics::Histogram* claims_;
};

// A MeteredStore that owns the store it wraps.
class OwningMeteredStore : public MeteredStore {
 public:
  OwningMeteredStore(std::unique_ptr<Store> target, metrics::Histogram* claims)
      : MeteredStore(target.get(), claims), owned_(std::move(target)) {}

 private:
  std::unique_ptr<Store> owned_;
};

}  // namespace dedup::serve

#endif  // DEDUP_SRC_SERVE_METERED_STORE_H_
