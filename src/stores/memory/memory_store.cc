// Copyright dedup authors. Licensed under the Apache License 2.0.

#include "dedup/memory_store.h"

#include <bit>
#include <deque>
#include <memory>
#include <mutex>
#include <queue>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "core/key_hash.h"
#include "core/state_machine.h"
#include "stores/memory/memory_store_internal.h"

namespace dedup {
namespace {

using internal::DecideClaim;
using internal::DecideComplete;
using internal::DecideExtend;
using internal::DecideRelease;

using internal::KeyEq;
using internal::KeyHash;

// A record as the memory store keeps it: the fixed fields inline (48 bytes), the
// rarely present fingerprint and result behind one pointer. Small entries keep the
// table's rehashes and cache misses cheap.
struct Entry {
  struct Extra {
    std::string fingerprint;
    std::string result;
  };
  int64_t lease_deadline = 0;
  int64_t retention_deadline = 0;
  uint64_t token = 0;
  uint64_t fence = 0;
  uint32_t attempt = 0;
  RecordState state = RecordState::kInProgress;
  CompletionStatus status = CompletionStatus::kOk;
  std::unique_ptr<Extra> extra;  // null when both are empty

  bool ExpiredAt(int64_t now) const { return now >= retention_deadline; }

  void ToRecord(Record* r) const {
    r->state = state;
    r->token = Token{token};
    r->fence = fence;
    r->attempt = attempt;
    r->lease_deadline = lease_deadline;
    r->retention_deadline = retention_deadline;
    r->status = status;
    if (extra != nullptr) {
      r->fingerprint = extra->fingerprint;
      r->result = extra->result;
    } else {
      r->fingerprint.clear();
      r->result.clear();
    }
  }

  void FromRecord(Record&& r) {
    state = r.state;
    token = r.token.value;
    fence = r.fence;
    attempt = r.attempt;
    lease_deadline = r.lease_deadline;
    retention_deadline = r.retention_deadline;
    status = r.status;
    if (r.fingerprint.empty() && r.result.empty()) {
      extra.reset();
    } else {
      if (extra == nullptr) extra = std::make_unique<Extra>();
      extra->fingerprint = std::move(r.fingerprint);
      extra->result = std::move(r.result);
    }
  }
};

// Records of one shard, plus a min-heap of (retention deadline, key) that drives
// incremental reclamation. Each record is pushed once, when inserted; when its entry
// comes due and the record has since been given a later deadline, it is pushed
// again with that deadline. So the heap holds about one entry per live record.
struct alignas(64) Shard {
  std::mutex mu;
  absl::flat_hash_map<std::string, Entry, KeyHash, KeyEq> records;
  using Due = std::pair<int64_t, std::string>;
  // A deque, not a vector: no single large reallocation as the heap grows.
  std::priority_queue<Due, std::deque<Due>, std::greater<>> due;
};

class MemoryStore final : public Store {
 public:
  explicit MemoryStore(const MemoryStoreOptions& o)
      : clock_(o.clock != nullptr ? o.clock : Clock::System()),
        reclaim_per_op_(o.reclaim_per_operation),
        shards_(std::bit_ceil(o.shards == 0 ? size_t{1} : o.shards)) {}

  StatusOr<ClaimResult> Claim(const ClaimRequest& req) override {
    DEDUP_RETURN_IF_ERROR(ValidateClaim(req));
    return ClaimValidated(req);
  }

  StatusOr<std::vector<ClaimResult>> ClaimBatch(std::span<const ClaimRequest> reqs) override {
    for (size_t i = 0; i < reqs.size(); ++i) {
      Status s = ValidateClaim(reqs[i]);
      if (!s.ok()) return s.WithContext("batch request " + std::to_string(i));
    }
    std::vector<ClaimResult> out;
    out.reserve(reqs.size());
    for (const ClaimRequest& r : reqs) out.push_back(ClaimValidated(r));
    return out;
  }

  StatusOr<WriteResult> Extend(std::string_view key, Token token, Millis lease) override {
    DEDUP_RETURN_IF_ERROR(ValidateExtend(key, token, lease));
    return Update(key, [&](Record* r, int64_t now) { return DecideExtend(r, token, lease, now); });
  }

  StatusOr<WriteResult> Complete(std::string_view key, Token token, Millis retention,
                                 CompletionStatus status, std::string_view result) override {
    DEDUP_RETURN_IF_ERROR(ValidateComplete(key, token, retention, result));
    return Update(key, [&](Record* r, int64_t now) {
      return DecideComplete(r, token, retention, status, result, now);
    });
  }

  StatusOr<WriteResult> Release(std::string_view key, Token token, Millis retention) override {
    DEDUP_RETURN_IF_ERROR(ValidateRelease(key, token, retention));
    return Update(key, [&](Record* r, int64_t now) {
      return DecideRelease(r, token, retention, now);
    });
  }

  StatusOr<std::optional<Record>> Inspect(std::string_view key) override {
    DEDUP_RETURN_IF_ERROR(ValidateKey(key));
    Shard& s = ShardFor(key);
    std::lock_guard lock(s.mu);
    const int64_t now = clock_->NowMillis();
    auto it = s.records.find(key);
    if (it == s.records.end() || it->second.ExpiredAt(now)) return std::optional<Record>();
    Record r;
    it->second.ToRecord(&r);
    r.key.assign(key);
    return std::optional<Record>(std::move(r));
  }

  StatusOr<bool> Forget(std::string_view key) override {
    DEDUP_RETURN_IF_ERROR(ValidateKey(key));
    Shard& s = ShardFor(key);
    std::lock_guard lock(s.mu);
    auto it = s.records.find(key);
    if (it == s.records.end()) return false;
    const bool live = !it->second.ExpiredAt(clock_->NowMillis());
    s.records.erase(it);
    return live;
  }

  StatusOr<std::vector<Record>> Scan(std::string_view prefix, size_t limit) override {
    std::vector<Record> out;
    const int64_t now = clock_->NowMillis();
    for (Shard& s : shards_) {
      std::lock_guard lock(s.mu);
      for (const auto& [k, r] : s.records) {
        if (out.size() >= limit) return out;
        if (r.ExpiredAt(now) || !std::string_view(k).starts_with(prefix)) continue;
        out.emplace_back();
        r.ToRecord(&out.back());
        out.back().key = k;
      }
    }
    return out;
  }

  std::string Describe() const override { return "memory:"; }

  size_t PhysicalRecords() {
    size_t n = 0;
    for (Shard& s : shards_) {
      std::lock_guard lock(s.mu);
      n += s.records.size();
    }
    return n;
  }

 private:
  Shard& ShardFor(std::string_view key) {
    // The top bits pick the shard; the map inside uses the low ones.
    const uint64_t h = std::hash<std::string_view>{}(key) * 0x9E3779B97F4A7C15ull;
    return shards_[(h >> 40) & (shards_.size() - 1)];
  }

  // Drops up to reclaim_per_op_ records whose retention has passed. Called with
  // s.mu held.
  void Reclaim(Shard& s, int64_t now) {
    for (size_t n = 0; n < reclaim_per_op_ && !s.due.empty() && s.due.top().first <= now; ++n) {
      std::string key = std::move(const_cast<Shard::Due&>(s.due.top()).second);
      s.due.pop();
      auto it = s.records.find(key);
      if (it == s.records.end()) continue;  // forgotten meanwhile
      if (it->second.ExpiredAt(now)) {
        s.records.erase(it);
      } else {
        s.due.emplace(it->second.retention_deadline, std::move(key));
      }
    }
  }

  ClaimResult ClaimValidated(const ClaimRequest& req) {
    Shard& s = ShardFor(req.key);
    const Token fresh = Token::Random();
    std::lock_guard lock(s.mu);
    const int64_t now = clock_->NowMillis();
    Reclaim(s, now);
    auto it = s.records.find(req.key);
    thread_local Record cur, next;
    if (it != s.records.end()) it->second.ToRecord(&cur);
    bool write = false;
    ClaimResult res =
        DecideClaim(it == s.records.end() ? nullptr : &cur, req, now, fresh, &next, &write);
    if (write) {
      if (it != s.records.end()) {
        it->second.FromRecord(std::move(next));
      } else {
        const int64_t due = next.retention_deadline;
        s.records.try_emplace(req.key).first->second.FromRecord(std::move(next));
        s.due.emplace(due, std::string(req.key));
      }
    }
    return res;
  }

  template <typename Fn>
  WriteResult Update(std::string_view key, Fn&& decide) {
    Shard& s = ShardFor(key);
    std::lock_guard lock(s.mu);
    const int64_t now = clock_->NowMillis();
    Reclaim(s, now);
    auto it = s.records.find(key);
    if (it == s.records.end()) return WriteResult::kLost;
    thread_local Record rec;
    it->second.ToRecord(&rec);
    const WriteResult r = decide(&rec, now);
    if (r == WriteResult::kOk) it->second.FromRecord(std::move(rec));
    return r;
  }

  Clock* const clock_;
  const size_t reclaim_per_op_;
  std::vector<Shard> shards_;
};

}  // namespace

namespace internal {
size_t MemoryStorePhysicalRecords(Store* store) {
  auto* m = dynamic_cast<MemoryStore*>(store);
  return m == nullptr ? 0 : m->PhysicalRecords();
}
}  // namespace internal

std::unique_ptr<Store> NewMemoryStore(const MemoryStoreOptions& options) {
  return std::make_unique<MemoryStore>(options);
}

}  // namespace dedup
