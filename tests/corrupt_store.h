// Copyright dedup authors. Licensed under the Apache License 2.0.
//
// A store wrapper for the policy tests of corrupt records (issue 13, item 5):
// chosen keys have a record that cannot be decoded, answered DataLoss the way the
// Redis, RocksDB and PostgreSQL stores answer one (nothing changed); other keys
// fail their next N claims with a transient code (Unavailable, DeadlineExceeded).
// A batch claim that includes a corrupt key fails as a whole, as the server
// stores' ClaimBatch does (one status for the batch).

#ifndef DEDUP_TESTS_CORRUPT_STORE_H_
#define DEDUP_TESTS_CORRUPT_STORE_H_

#include <atomic>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "dedup/store.h"

namespace dedup::testing {

class CorruptRecordStore : public StoreWrapper {
 public:
  using StoreWrapper::StoreWrapper;

  void Corrupt(const std::string& key) {
    std::lock_guard lock(mu_);
    corrupt_.insert(key);
  }
  void Mend(const std::string& key) {
    std::lock_guard lock(mu_);
    corrupt_.erase(key);
  }
  // The next `n` claims of `key` fail with `code` (a transient store error).
  void FailNext(const std::string& key, int n, StatusCode code) {
    std::lock_guard lock(mu_);
    failing_[key] = {n, code};
  }
  // Claims of `key` that reached this store (alone or in a batch).
  int claims(const std::string& key) const {
    std::lock_guard lock(mu_);
    auto it = claims_.find(key);
    return it == claims_.end() ? 0 : it->second;
  }

  StatusOr<ClaimResult> Claim(const ClaimRequest& req) override {
    if (Status s = Check(req.key); !s.ok()) return s;
    return StoreWrapper::Claim(req);
  }
  StatusOr<std::vector<ClaimResult>> ClaimBatch(std::span<const ClaimRequest> reqs) override {
    for (const ClaimRequest& req : reqs) {
      if (Status s = Check(req.key); !s.ok()) {
        ++failed_batches;
        return s;
      }
    }
    return StoreWrapper::ClaimBatch(reqs);
  }
  // Batch claims that failed as a whole.
  std::atomic<int> failed_batches{0};

 private:
  Status Check(std::string_view key) {
    std::lock_guard lock(mu_);
    const std::string k(key);
    ++claims_[k];
    if (corrupt_.contains(k)) {
      return Status::DataLoss("test store: the record of key '" + k +
                              "' cannot be decoded (not dedup format 1 or 2); nothing was changed");
    }
    auto it = failing_.find(k);
    if (it != failing_.end() && it->second.first > 0) {
      --it->second.first;
      return Status(it->second.second, "test store: claim of '" + k + "' timed out");
    }
    return Status::Ok();
  }

  mutable std::mutex mu_;
  std::set<std::string> corrupt_;
  std::map<std::string, std::pair<int, StatusCode>> failing_;
  std::map<std::string, int> claims_;
};

}  // namespace dedup::testing

#endif  // DEDUP_TESTS_CORRUPT_STORE_H_
