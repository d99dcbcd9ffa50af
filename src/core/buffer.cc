// Copyright dedup authors. Licensed under the Apache License 2.0.

#include "dedup/buffer.h"

#include <openssl/evp.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <thread>
#include <unordered_map>
#include <variant>
#include <vector>

#include "core/outcome_retry.h"
#include "core/printable.h"

namespace dedup {

namespace internal {

// The state a guard shares with the heartbeat thread, so that moving a guard does
// not disturb the heartbeat.
struct HeldClaim {
  std::string key;
  Token token;
  Millis lease{0};
  std::atomic<bool> lost{false};
  std::atomic<bool> finished{false};
  // Steady-clock nanoseconds until which the lease is known to be held (send time
  // of the last claim or extend answered OK, plus the lease), and whether a
  // reader saw that time pass (then it is never moved again: lost() stays true).
  std::atomic<int64_t> valid_until{0};
  mutable std::atomic<bool> expired{false};
  std::chrono::steady_clock::time_point next_beat;
};

}  // namespace internal

using internal::HeldClaim;

namespace {
int64_t SteadyNanos() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// One outcome write run under OutcomeRetry with the Buffer's circuit breaker as
// its input: opened when the write is given up after its time, closed when it
// succeeds.
template <class HeldUntil, class Write>
auto RunOutcomeWrite(const BufferOptions& o, internal::OutcomeBreaker breaker,
                     HeldUntil held_until, Write write) {
  const internal::OutcomeRetry retry(o, std::chrono::steady_clock::now(), breaker.open());
  bool gave_up_on_time = false;
  auto r = retry.Run(held_until, write, &gave_up_on_time);
  breaker.Settle(r.ok(), gave_up_on_time);
  return r;
}

// A try after the first answered LOST: it may be an earlier try of the same write
// that the store applied but whose reply was lost. True when the record shows
// that write: state `want` (COMPLETED with `status` and `result`, or RELEASED)
// under the claim's token, fence and attempt. Every store keeps the token, fence
// and attempt of the last claim in the record after complete and release
// (state_machine.cc; the Redis scripts and the Postgres statements alike), so no
// one else's write can match; a record that cannot be read leaves LOST.
bool RecordShowsOwnWrite(Store& store, std::string_view key, const ClaimResult& claim,
                         RecordState want, CompletionStatus status = CompletionStatus::kOk,
                         std::string_view result = {}) {
  StatusOr<std::optional<Record>> rec = store.Inspect(key);
  if (!rec.ok() || !rec->has_value()) return false;
  const Record& r = **rec;
  if (r.state != want || r.token != claim.token || r.fence != claim.fence ||
      r.attempt != claim.attempt) {
    return false;  // (a fence floor, RELEASED with attempt 0, never matches)
  }
  return want != RecordState::kCompleted || (r.status == status && r.result == result);
}

WriteResult WriteOf(WriteResult w) { return w; }
WriteResult WriteOf(const AckedWrite& w) { return w.write; }
// Recorded by an earlier try: whether that try acked is unknown, so the caller
// acks (a second ack of a delivery is harmless).
WriteResult Recovered(WriteResult) { return WriteResult::kOk; }
AckedWrite Recovered(const AckedWrite&) { return AckedWrite{WriteResult::kOk, false}; }

// `write` for RunOutcomeWrite, answering OK instead of a LOST on a try after the
// first when `shows_own_write()` (RecordShowsOwnWrite) finds that an earlier try
// of it was applied.
template <class Write, class ShowsOwnWrite>
auto EchoChecked(Write write, ShowsOwnWrite shows_own_write) {
  return [write, shows_own_write, tries = 0]() mutable {
    auto w = write();
    if (++tries > 1 && w.ok() && WriteOf(*w) == WriteResult::kLost && shows_own_write()) {
      return decltype(w)(Recovered(*w));
    }
    return w;
  };
}
// An outcome no record can hold would fail the same way on every delivery, and
// a release for a retry would run the handler, side effect and all, each time:
// a Done result over kMaxResultBytes becomes a Fail saying so, and a Fail reason
// that long is kept cut to fit (as PostgresStore::RunInTransaction does).
void FitInARecord(HandlerResult* hr) {
  if (hr->result.size() <= kMaxResultBytes) return;
  if (hr->kind == HandlerResult::Kind::kDone) {
    *hr = HandlerResult::Fail("the handler's result is " + std::to_string(hr->result.size()) +
                              " bytes, more than the " + std::to_string(kMaxResultBytes) +
                              " a record holds: recorded as failed");
  } else if (hr->kind == HandlerResult::Kind::kFail) {
    hr->result = internal::CutReasonToFitARecord(hr->result, kMaxResultBytes);
  }
}
}  // namespace

std::string PayloadFingerprint(std::string_view payload) {
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  EVP_Digest(payload.data(), payload.size(), digest, &len, EVP_sha256(), nullptr);
  return std::string(reinterpret_cast<const char*>(digest), 16);
}

std::string_view BrokerActionName(BrokerAction a) {
  switch (a) {
    case BrokerAction::kAck: return "ack";
    case BrokerAction::kRetry: return "retry";
    case BrokerAction::kDeadLetter: return "dead_letter";
  }
  return "unknown";
}

// One thread per Buffer extends every held claim each heartbeat interval. It
// sleeps until the earliest beat is due, and without a deadline while no claim is held.
class Buffer::Heartbeat {
 public:
  Heartbeat(Store* store, Millis interval, internal::OutcomeBreaker breaker)
      : store_(store), interval_(interval), breaker_(breaker) {}

  ~Heartbeat() {
    {
      std::lock_guard lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    if (thread_.joinable()) thread_.join();
  }

  void Add(std::shared_ptr<HeldClaim> held) { AddMany(std::span(&held, 1)); }

  // The claims of a batch under one lock (a lock each was a wait each for the
  // handler threads that claim and finish at the same time).
  void AddMany(std::span<std::shared_ptr<HeldClaim>> helds) {
    if (helds.empty()) return;
    const auto next = std::chrono::steady_clock::now() + interval_;
    for (auto& held : helds) held->next_beat = next;
    std::lock_guard lock(mu_);
    if (!thread_.joinable()) thread_ = std::thread([this] { Run(); });
    const bool was_idle = claims_.empty();
    // Finished claims are dropped at the next beat, which may be a lease/3 away:
    // at tens of thousands of claims a second that would keep hundreds of
    // thousands of them (each with its key) alive. Sweeping whenever the list
    // doubles since the last sweep keeps it within about twice the claims held,
    // at an amortized O(1) per claim.
    if (claims_.size() >= sweep_at_) {
      std::erase_if(claims_, [](const auto& h) { return h->finished.load(); });
      sweep_at_ = std::max<size_t>(2 * claims_.size(), kMinSweep);
    }
    for (auto& held : helds) claims_.push_back(std::move(held));
    // A new claim's beat is never earlier than the ones already scheduled, so the
    // thread needs waking only when it sleeps with nothing to do.
    if (was_idle) cv_.notify_one();
  }

  Buffer::Stats stats() const {
    return {beats_.load(), lost_.load(), errors_.load()};
  }

 private:
  void Run() {
    std::unique_lock lock(mu_);
    while (!stop_) {
      auto now = std::chrono::steady_clock::now();
      auto next = now + interval_;
      std::vector<std::shared_ptr<HeldClaim>> due;
      std::erase_if(claims_, [](const auto& h) { return h->finished.load(); });
      sweep_at_ = std::max<size_t>(2 * claims_.size(), kMinSweep);
      for (auto& h : claims_) {
        if (h->next_beat <= now) {
          due.push_back(h);
          h->next_beat = now + interval_;
        }
        next = std::min(next, h->next_beat);
      }
      if (!due.empty()) {
        lock.unlock();
        for (auto& h : due) Beat(*h);
        lock.lock();
        continue;
      }
      if (claims_.empty()) {
        cv_.wait(lock, [this] { return stop_ || !claims_.empty(); });
      } else {
        cv_.wait_until(lock, next, [this] { return stop_; });
      }
    }
  }

  void Beat(HeldClaim& h) {
    if (h.finished.load()) return;
    beats_.fetch_add(1, std::memory_order_relaxed);
    const int64_t sent = SteadyNanos();
    StatusOr<WriteResult> r = store_->Extend(h.key, h.token, h.lease);
    if (!r.ok()) {
      // The store is unreachable: try again next beat. If it stays away past the
      // lease, another worker may take over and Complete will answer LOST.
      errors_.fetch_add(1, std::memory_order_relaxed);
      return;
    }
    // The store answered: outcome writes get their full retry window again.
    breaker_.Answered();
    if (*r == WriteResult::kLost && !h.finished.load()) {
      lost_.fetch_add(1, std::memory_order_relaxed);
      h.lost.store(true);
      h.finished.store(true);  // nothing more to extend
    } else if (*r == WriteResult::kOk && !h.expired.load()) {
      const int64_t until = sent + std::chrono::nanoseconds(h.lease).count();
      int64_t cur = h.valid_until.load();
      while (cur < until && !h.valid_until.compare_exchange_weak(cur, until)) {
      }
    }
  }

  Store* const store_;
  const Millis interval_;
  internal::OutcomeBreaker breaker_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  std::vector<std::shared_ptr<HeldClaim>> claims_;
  static constexpr size_t kMinSweep = 1024;
  size_t sweep_at_ = kMinSweep;  // Add() sweeps finished claims at this size
  std::thread thread_;
  std::atomic<uint64_t> beats_{0}, lost_{0}, errors_{0};
};

// Per key, what this Buffer saw of its earlier claims: how many DataLoss answers
// came in a row (the policy of BufferOptions::corrupt_record_tries; up to
// kMaxCorruptKeys keys), and why an attempt it ran was given up, with that
// attempt's number (a retry; up to kMaxFailedKeys keys), for the dead letter of
// a later EXHAUSTED answer whose last attempt it was (kept only when
// max_attempts is set: EXHAUSTED comes of nothing else). Off the hot path: a claim
// or an outcome takes the lock only while some key is being counted, or some
// failure remembered; notes of keys settled elsewhere go after stale_after.
class Buffer::KeyNotes {
 public:
  explicit KeyNotes(Millis stale_after) : stale_after_(stale_after) {}

  // Counts one more DataLoss answer for `key` and returns the count, or 0 when
  // kMaxCorruptKeys other keys are being counted (and none of them went stale).
  uint32_t AddCorrupt(std::string_view key) {
    std::lock_guard lock(mu_);
    Sweep(/*full=*/corrupt_keys_.load(std::memory_order_relaxed) >= kMaxCorruptKeys);
    auto it = notes_.find(key);
    if ((it == notes_.end() || it->second.corrupt == 0) &&
        corrupt_keys_.load(std::memory_order_relaxed) >= kMaxCorruptKeys) {
      return 0;
    }
    Note& n = Get(it, key);
    if (n.corrupt++ == 0) corrupt_keys_.fetch_add(1, std::memory_order_relaxed);
    return n.corrupt;
  }

  // Whether `key` is being counted (its record could not be read last time).
  bool CorruptCounted(std::string_view key) {
    if (corrupt_keys_.load(std::memory_order_relaxed) == 0) return false;
    std::lock_guard lock(mu_);
    auto it = notes_.find(key);
    return it != notes_.end() && it->second.corrupt > 0;
  }

  // The key's claim was answered (or it was dead-lettered): its count starts again.
  void ClaimAnswered(std::string_view key) {
    if (corrupt_keys_.load(std::memory_order_relaxed) == 0) return;
    std::lock_guard lock(mu_);
    auto it = notes_.find(key);
    if (it == notes_.end() || it->second.corrupt == 0) return;
    it->second.corrupt = 0;
    corrupt_keys_.fetch_sub(1, std::memory_order_relaxed);
    if (it->second.failure.empty()) Erase(it);
  }

  // Attempt `attempt` of `key`, run here, was given up for `why` (kept cut).
  void SetFailure(std::string_view key, uint32_t attempt, std::string_view why) {
    if (why.empty()) why = "no reason given";
    std::lock_guard lock(mu_);
    Sweep(/*full=*/failed_keys_ >= kMaxFailedKeys);
    auto it = notes_.find(key);
    if ((it == notes_.end() || it->second.failure.empty()) && failed_keys_ >= kMaxFailedKeys) {
      return;
    }
    Note& n = Get(it, key);
    if (n.failure.empty()) ++failed_keys_;
    n.failure = internal::CutAtCharacter(why, kMaxFailureBytes);
    n.attempt = attempt;
  }

  // Why attempt `attempt` of `key` was given up, when this Buffer ran it and
  // its outcome was not recorded since; else "". Forgotten either way.
  std::string TakeFailure(std::string_view key, uint32_t attempt) {
    if (size_.load(std::memory_order_relaxed) == 0) return {};
    std::lock_guard lock(mu_);
    auto it = notes_.find(key);
    if (it == notes_.end() || it->second.failure.empty()) return {};
    std::string why;
    if (it->second.attempt == attempt) why = std::move(it->second.failure);
    it->second.failure.clear();
    --failed_keys_;
    if (it->second.corrupt == 0) Erase(it);
    return why;
  }

  // The key's outcome was recorded: nothing of it is kept.
  void Done(std::string_view key) {
    if (size_.load(std::memory_order_relaxed) == 0) return;
    std::lock_guard lock(mu_);
    auto it = notes_.find(key);
    if (it != notes_.end()) Erase(it);
    Sweep(/*full=*/false);
  }

 private:
  static constexpr size_t kMaxFailedKeys = 4096;
  static constexpr size_t kMaxFailureBytes = 512;
  struct Note {
    uint32_t corrupt = 0;
    uint32_t attempt = 0;  // of the failure
    std::string failure;   // empty: none remembered
    std::chrono::steady_clock::time_point last;
  };
  // Found by string_view: a lookup allocates nothing.
  struct Hash {
    using is_transparent = void;
    size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
  };
  using Map = std::unordered_map<std::string, Note, Hash, std::equal_to<>>;

  Note& Get(Map::iterator it, std::string_view key) {
    if (it == notes_.end()) {
      it = notes_.emplace(std::string(key), Note{}).first;
      size_.store(notes_.size(), std::memory_order_relaxed);
    }
    it->second.last = std::chrono::steady_clock::now();
    return it->second;
  }
  void Erase(Map::iterator it) {
    if (it->second.corrupt > 0) corrupt_keys_.fetch_sub(1, std::memory_order_relaxed);
    if (!it->second.failure.empty()) --failed_keys_;
    notes_.erase(it);
    size_.store(notes_.size(), std::memory_order_relaxed);
  }
  // Drops the notes not touched for stale_after: their keys were settled
  // elsewhere (another worker dead-lettered or completed them, a record was
  // mended). A walk of every note, so at most once a second when `full` (a
  // bound is reached), else once every stale_after / 4.
  void Sweep(bool full) {
    const auto now = std::chrono::steady_clock::now();
    if (now - last_sweep_ < (full ? std::chrono::steady_clock::duration(std::chrono::seconds(1))
                                  : std::chrono::steady_clock::duration(stale_after_ / 4))) {
      return;
    }
    last_sweep_ = now;
    for (auto it = notes_.begin(); it != notes_.end();) {
      auto next = std::next(it);
      if (now - it->second.last > stale_after_) Erase(it);
      it = next;
    }
  }

  const Millis stale_after_;
  std::mutex mu_;
  Map notes_;
  std::chrono::steady_clock::time_point last_sweep_{};
  std::atomic<size_t> size_{0};          // notes_.size()
  std::atomic<size_t> corrupt_keys_{0};  // notes with corrupt > 0
  size_t failed_keys_ = 0;               // notes with a failure
};

// ---- ClaimGuard ------------------------------------------------------------

ClaimGuard::ClaimGuard(ClaimGuard&& o) noexcept
    : buffer_(o.buffer_), key_(std::move(o.key_)), result_(std::move(o.result_)),
      held_(std::move(o.held_)) {}

ClaimGuard& ClaimGuard::operator=(ClaimGuard&& o) noexcept {
  if (this != &o) {
    if (held_ != nullptr) (void)ReleaseOnce();
    buffer_ = o.buffer_;
    key_ = std::move(o.key_);
    result_ = std::move(o.result_);
    held_ = std::move(o.held_);
  }
  return *this;
}

ClaimGuard::~ClaimGuard() {
  if (held_ != nullptr) (void)ReleaseOnce();
}

bool ClaimGuard::lost() const {
  if (held_ == nullptr) return false;
  if (held_->lost.load() || held_->expired.load()) return true;
  if (SteadyNanos() < held_->valid_until.load()) return false;
  held_->expired.store(true);
  return true;
}

std::chrono::steady_clock::time_point ClaimGuard::lease_deadline() const {
  if (held_ == nullptr) return std::chrono::steady_clock::time_point::min();
  return std::chrono::steady_clock::time_point(std::chrono::nanoseconds(held_->valid_until.load()));
}

Millis ClaimGuard::lease() const { return buffer_ != nullptr ? buffer_->options_.lease : Millis(0); }

void ClaimGuard::Finish() {
  if (held_ != nullptr) {
    held_->finished.store(true);
    held_.reset();
  }
}

StatusOr<WriteResult> ClaimGuard::Complete(std::string_view result, CompletionStatus status) {
  if (held_ == nullptr) {
    return Status::FailedPrecondition("complete on a claim of '" + key_ +
                                      "' that is not held (not acquired, or already ended)");
  }
  if (held_->lost.load()) {
    Finish();
    return WriteResult::kLost;
  }
  DEDUP_RETURN_IF_ERROR(ValidateResult(result));
  const BufferOptions& o = buffer_->options_;
  StatusOr<WriteResult> r = RunOutcomeWrite(
      o, buffer_->breaker(), [this] { return lease_deadline(); },
      EchoChecked(
          [&] { return buffer_->store_->Complete(key_, result_.token, o.retention, status, result); },
          [&] {
            return RecordShowsOwnWrite(*buffer_->store_, key_, result_, RecordState::kCompleted,
                                       status, result);
          }));
  // Ends ownership whatever the answer: on a lasting error the lease will run out
  // and the message be redelivered, which is the fail-closed outcome.
  Finish();
  return r;
}

StatusOr<AckedWrite> ClaimGuard::CompleteWithAck(std::string_view result, const BrokerAck& ack) {
  if (held_ == nullptr || !buffer_->store_->CanCompleteWithAck(ack)) {
    StatusOr<WriteResult> w = Complete(result, CompletionStatus::kOk);
    if (!w.ok()) return w.status();
    return AckedWrite{*w, false};
  }
  if (held_->lost.load()) {
    Finish();
    return AckedWrite{WriteResult::kLost, false};
  }
  DEDUP_RETURN_IF_ERROR(ValidateResult(result));
  const BufferOptions& o = buffer_->options_;
  StatusOr<AckedWrite> r = RunOutcomeWrite(
      o, buffer_->breaker(), [this] { return lease_deadline(); },
      EchoChecked(
          [&] {
            return buffer_->store_->CompleteWithAck(key_, result_.token, o.retention,
                                                    CompletionStatus::kOk, result, ack);
          },
          [&] {
            return RecordShowsOwnWrite(*buffer_->store_, key_, result_, RecordState::kCompleted,
                                       CompletionStatus::kOk, result);
          }));
  Finish();
  return r;
}

StatusOr<WriteResult> ClaimGuard::Release() {
  if (held_ == nullptr) {
    return Status::FailedPrecondition("release on a claim of '" + key_ +
                                      "' that is not held (not acquired, or already ended)");
  }
  if (held_->lost.load()) {
    Finish();
    return WriteResult::kLost;
  }
  const BufferOptions& o = buffer_->options_;
  StatusOr<WriteResult> r = RunOutcomeWrite(
      o, buffer_->breaker(), [this] { return lease_deadline(); },
      EchoChecked([&] { return buffer_->store_->Release(key_, result_.token, o.retention); },
                  [&] {
                    return RecordShowsOwnWrite(*buffer_->store_, key_, result_,
                                               RecordState::kReleased);
                  }));
  Finish();
  return r;
}

void ClaimGuard::Abandon() { Finish(); }

StatusOr<WriteResult> ClaimGuard::ReleaseOnce() {
  if (held_ == nullptr) return WriteResult::kLost;
  if (held_->lost.load()) {
    Finish();
    return WriteResult::kLost;
  }
  StatusOr<WriteResult> r =
      buffer_->store_->Release(key_, result_.token, buffer_->options_.retention);
  if (r.ok()) buffer_->breaker().Answered();
  Finish();
  return r;
}

// ---- Buffer ----------------------------------------------------------------

Status ValidateBufferOptions(const BufferOptions& o) {
  const auto positive = [](std::string_view name, Millis d) {
    if (d.count() <= 0) {
      return Status::InvalidArgument(std::string(name) + " must be longer than 0, got " +
                                     std::to_string(d.count()) + "ms");
    }
    if (d > kMaxDuration) {
      return Status::InvalidArgument(std::string(name) + " must be at most 10 years, got " +
                                     std::to_string(d.count()) + "ms");
    }
    return Status::Ok();
  };
  DEDUP_RETURN_IF_ERROR(positive("lease", o.lease));
  DEDUP_RETURN_IF_ERROR(positive("retention", o.retention));
  DEDUP_RETURN_IF_ERROR(positive("retry-delay", o.retry_delay));
  if (o.heartbeat_interval.count() < 0 || o.heartbeat_interval >= o.lease) {
    return Status::InvalidArgument(
        "heartbeat-interval must be 0 (= lease / 3) or shorter than the lease (" +
        std::to_string(o.lease.count()) + "ms), got " +
        std::to_string(o.heartbeat_interval.count()) + "ms");
  }
  if (o.complete_tries < 1) {
    return Status::InvalidArgument("complete-tries must be at least 1, got " +
                                   std::to_string(o.complete_tries));
  }
  if (o.complete_retry_time.count() < 0 || o.complete_retry_time > kMaxDuration) {
    return Status::InvalidArgument("complete-retry-time must be 0 to 10 years, got " +
                                   std::to_string(o.complete_retry_time.count()) + "ms");
  }
  if (o.corrupt_record_tries < 1 || o.corrupt_record_tries > 1000) {
    return Status::InvalidArgument("corrupt-record-tries must be 1 to 1000, got " +
                                   std::to_string(o.corrupt_record_tries));
  }
  return Status::Ok();
}

StatusOr<std::unique_ptr<Buffer>> Buffer::Create(Store* store, BufferOptions options) {
  if (store == nullptr) return Status::InvalidArgument("buffer: no store given");
  DEDUP_RETURN_IF_ERROR(ValidateBufferOptions(options));
  return std::make_unique<Buffer>(store, options);
}

Millis Buffer::heartbeat_interval() const {
  return options_.heartbeat_interval.count() > 0 ? options_.heartbeat_interval
                                                 : std::max(Millis(1), options_.lease / 3);
}

namespace {
// `store`, once it and `options` are known good; else the process stops naming
// the problem. A Buffer made of bad options (a lease of 0) answered every
// message "retry" for ever; Buffer::Create returns the same as a status.
Store* CheckedStore(Store* store, const BufferOptions& options) {
  Status s = store == nullptr ? Status::InvalidArgument("buffer: no store given")
                              : ValidateBufferOptions(options);
  if (!s.ok()) {
    std::fprintf(stderr, "dedup: Buffer constructed with %s (Buffer::Create returns this as a "
                         "status)\n", s.ToString().c_str());
    std::abort();
  }
  return store;
}
}  // namespace

Buffer::Buffer(Store* store, BufferOptions options)
    : store_(CheckedStore(store, options)), options_(options),
      heartbeat_(std::make_unique<Heartbeat>(store, heartbeat_interval(), breaker())),
      // A counted key not seen for this long was settled elsewhere; its next
      // delivery comes within a retry delay or a lease (a reclaim) otherwise.
      notes_(std::make_unique<KeyNotes>(
          std::max(Millis(600'000), 4 * (options.retry_delay + options.lease)))) {}

Buffer::~Buffer() = default;

internal::OutcomeBreaker Buffer::breaker() {
  return internal::OutcomeBreaker(outcome_breaker_open_);
}

Buffer::Stats Buffer::stats() const { return heartbeat_->stats(); }

ClaimRequest Buffer::Request(std::string_view key, std::string_view fingerprint) const {
  ClaimRequest req;
  req.key = key;
  req.lease = options_.lease;
  req.retention = options_.retention;
  req.fingerprint = fingerprint;
  req.max_attempts = options_.max_attempts;
  return req;
}

ClaimGuard Buffer::Guard(std::string_view key, ClaimResult result,
                         std::chrono::steady_clock::time_point sent,
                         std::vector<std::shared_ptr<HeldClaim>>* beat_later) {
  ClaimGuard g;
  g.buffer_ = this;
  g.key_.assign(key);
  g.result_ = std::move(result);
  if (g.result_.acquired()) {
    auto held = std::make_shared<HeldClaim>();
    held->key.assign(key);
    held->token = g.result_.token;
    held->lease = options_.lease;
    held->valid_until.store(
        std::chrono::duration_cast<std::chrono::nanoseconds>(sent.time_since_epoch() +
                                                             options_.lease)
            .count());
    g.held_ = held;
    if (beat_later != nullptr) {
      beat_later->push_back(std::move(held));
    } else {
      heartbeat_->Add(std::move(held));
    }
  }
  return g;
}

StatusOr<ClaimGuard> Buffer::Claim(std::string_view key, std::string_view fingerprint) {
  const auto sent = std::chrono::steady_clock::now();
  StatusOr<ClaimResult> r = store_->Claim(Request(key, fingerprint));
  if (!r.ok()) return r.status();
  breaker().Answered();
  return Guard(key, std::move(r).value(), sent);
}

std::vector<StatusOr<ClaimGuard>> Buffer::ClaimBatch(std::span<const ClaimItem> items) {
  std::vector<StatusOr<ClaimGuard>> out;
  out.reserve(items.size());
  for (size_t i = 0; i < items.size(); ++i) out.emplace_back(Status::Internal("not claimed"));
  std::vector<std::string> fingerprints;
  std::vector<ClaimRequest> reqs;
  std::vector<size_t> where;  // reqs[j] answers items[where[j]]
  fingerprints.reserve(items.size());
  reqs.reserve(items.size());
  for (size_t i = 0; i < items.size(); ++i) {
    if (Status s = ValidateKey(items[i].key); !s.ok()) {
      out[i] = std::move(s);
      continue;
    }
    if (notes_->CorruptCounted(items[i].key)) {
      // Its record could not be read last time: claimed alone, so that it
      // does not fail the batch of the others again.
      out[i] = Claim(items[i].key, options_.fingerprint_payloads
                                       ? PayloadFingerprint(items[i].payload)
                                       : std::string());
      continue;
    }
    fingerprints.push_back(options_.fingerprint_payloads ? PayloadFingerprint(items[i].payload)
                                                         : std::string());
    where.push_back(i);
  }
  for (size_t j = 0; j < where.size(); ++j) {
    reqs.push_back(Request(items[where[j]].key, fingerprints[j]));
  }
  if (reqs.empty()) return out;
  const auto sent = std::chrono::steady_clock::now();
  StatusOr<std::vector<ClaimResult>> r =
      reqs.size() == 1 ? [&]() -> StatusOr<std::vector<ClaimResult>> {
        StatusOr<ClaimResult> one = store_->Claim(reqs[0]);
        if (!one.ok()) return one.status();
        return std::vector<ClaimResult>{std::move(one).value()};
      }()
                       : store_->ClaimBatch(reqs);
  if (!r.ok() && r.status().code() == StatusCode::kDataLoss && reqs.size() > 1) {
    // One record of the batch cannot be decoded, and the store cannot say
    // which: claim each alone, so that the error lands on its own key only.
    for (size_t j = 0; j < where.size(); ++j) {
      out[where[j]] = Claim(reqs[j].key, reqs[j].fingerprint);
    }
    return out;
  }
  if (r.ok()) breaker().Answered();
  std::vector<std::shared_ptr<HeldClaim>> held;
  held.reserve(where.size());
  for (size_t j = 0; j < where.size(); ++j) {
    if (!r.ok()) {
      out[where[j]] = r.status();
    } else {
      out[where[j]] = Guard(items[where[j]].key, std::move((*r)[j]), sent, &held);
    }
  }
  heartbeat_->AddMany(held);
  return out;
}

void Buffer::OnClaimError(std::string_view key, const Status& error, Processed* p) {
  p->status = error;
  p->action = BrokerAction::kRetry;
  p->retry_after = options_.retry_delay;
  if (error.code() != StatusCode::kDataLoss) {
    // Unavailable, DeadlineExceeded, ...: the store could not decide. Fail
    // closed and try again, however long it takes.
    p->reason = "store error on claim: " + error.ToString();
    return;
  }
  // The key's record cannot be decoded: no claim can be made while it is there,
  // and the handler must not run unguarded. Retry a few times (a newer worker
  // may read it; an operator may mend or forget it), then move the message
  // aside with the reason instead of leaving it pending forever.
  const uint32_t n = notes_->AddCorrupt(key);
  const uint32_t limit = static_cast<uint32_t>(options_.corrupt_record_tries);
  if (n == 0 || n >= limit) {
    notes_->ClaimAnswered(key);
    p->action = BrokerAction::kDeadLetter;
    p->retry_after = Millis(0);
    p->reason = "corrupt record: " + error.message() + " (" +
                (n == 0 ? std::string("dead-lettered at the first try: too many corrupt keys at once")
                        : "unreadable on " + std::to_string(n) + " tries") +
                ")";
    return;
  }
  p->reason = "corrupt record (try " + std::to_string(n) + " of " + std::to_string(limit) +
              "): " + error.message();
}

Processed Buffer::ProcessOnce(std::string_view key, std::string_view payload,
                              const Handler& handler, const BrokerAck* ack) {
  return WriteNow(ProcessOnceDeferred(key, payload, handler, ack));
}

Processed Buffer::ProcessClaimed(std::string_view key, StatusOr<ClaimGuard> c,
                                 const Handler& handler, const BrokerAck* ack) {
  return WriteNow(ProcessClaimedDeferred(key, std::move(c), handler, ack));
}

Processed Buffer::WriteNow(std::variant<Processed, PendingOutcome> r) {
  if (Processed* p = std::get_if<Processed>(&r)) return std::move(*p);
  return std::move(CompleteBatch(std::span<PendingOutcome>(&std::get<PendingOutcome>(r), 1))[0]);
}

std::variant<Processed, PendingOutcome> Buffer::ProcessOnceDeferred(std::string_view key,
                                                                   std::string_view payload,
                                                                   const Handler& handler,
                                                                   const BrokerAck* ack) {
  if (Status s = ValidateKey(key); !s.ok()) {
    return ProcessClaimedDeferred(key, std::move(s), handler, ack);
  }
  std::string fingerprint;
  if (options_.fingerprint_payloads) fingerprint = PayloadFingerprint(payload);
  return ProcessClaimedDeferred(key, Claim(key, fingerprint), handler, ack);
}

std::variant<Processed, PendingOutcome> Buffer::ProcessClaimedDeferred(
    std::string_view key, StatusOr<ClaimGuard> c, const Handler& handler, const BrokerAck* ack) {
  Processed p;
  if (Status s = ValidateKey(key); !s.ok()) {
    // A message that cannot be keyed is never processed unguarded.
    p.status = std::move(s);
    p.action = BrokerAction::kDeadLetter;
    p.reason = "bad key: " + p.status.message();
    return p;
  }
  if (!c.ok()) {
    OnClaimError(key, c.status(), &p);
    return p;
  }
  notes_->ClaimAnswered(key);
  ClaimGuard& g = *c;
  p.claim = g.result();
  switch (g.outcome()) {
    case ClaimOutcome::kDuplicate:
      notes_->Done(key);
      p.result = g.result().result;
      if (g.result().status == CompletionStatus::kOk) {
        p.action = BrokerAction::kAck;
      } else {
        // The worker that recorded the failure may have died before its
        // dead-letter was written: write it again (a reader may see it twice).
        p.action = BrokerAction::kDeadLetter;
        p.reason = std::string("completed earlier as ") +
                   std::string(CompletionStatusName(g.result().status));
      }
      return p;
    case ClaimOutcome::kBusy:
      p.action = BrokerAction::kRetry;
      p.retry_after = std::max(Millis(1), g.result().lease_left);
      p.reason = "in progress elsewhere";
      return p;
    case ClaimOutcome::kMismatch:
      p.action = BrokerAction::kDeadLetter;
      p.reason = "same key, different payload (fingerprint mismatch)";
      return p;
    case ClaimOutcome::kExhausted: {
      p.action = BrokerAction::kDeadLetter;
      p.reason = "attempts exhausted after " + std::to_string(g.attempt());
      // A release records no reason in the store: this Buffer's own memory of
      // the key's last failure, when it ran that attempt.
      const std::string why = notes_->TakeFailure(key, g.attempt());
      p.reason += why.empty() ? " (no failure of its last attempt was seen here: it ended in "
                                "another worker, or without an outcome: a crash, a kill, a "
                                "lease that ran out)"
                              : "; the last failure: " + why;
      return p;
    }
    case ClaimOutcome::kAcquired:
      break;
  }

  if (g.lost()) {
    // Claimed, then queued while no heartbeat got through for a whole lease (a
    // stalled store, a starved process): another owner may already hold the key.
    // Never start the work on a claim that cannot be shown to be held.
    // Giving the claim up, not an outcome: one release try (the lease is over, so
    // the retry policy would send no more than that either).
    Resolve(&p, HandlerResult::Retry("the lease ran out before the handler started"),
            g.ReleaseOnce(), false);
    if (options_.max_attempts > 0) notes_->SetFailure(key, g.attempt(), p.reason);
    return p;
  }
  HandlerResult hr;
  p.ran = true;
  try {
    hr = handler(g);
  } catch (const std::exception& e) {
    hr = HandlerResult::Retry(std::string("handler threw: ") + e.what());
  } catch (...) {
    hr = HandlerResult::Retry("handler threw a non-standard exception");
  }

  if (hr.kind == HandlerResult::Kind::kRetry) {
    // A handler that gave its claim up itself (ReleaseOnce, Abandon: e.g. one
    // stopped by a drain whose time is gone) leaves nothing to release.
    Resolve(&p, hr, g.active() ? g.Release() : StatusOr<WriteResult>(WriteResult::kOk), false);
    if (options_.max_attempts > 0) notes_->SetFailure(key, g.attempt(), hr.result);
    return p;
  }
  // Made in the variant returned (no move of it on the way out: a PendingOutcome
  // is large, and this runs once per message).
  std::variant<Processed, PendingOutcome> out(std::in_place_type<PendingOutcome>);
  PendingOutcome& po = std::get<PendingOutcome>(out);
  po.guard_ = std::move(g);
  po.handler_result_ = std::move(hr);
  po.processed_ = std::move(p);
  po.ack_ = ack;
  return out;
}

std::vector<Processed> Buffer::CompleteBatch(std::span<PendingOutcome> pending) {
  const size_t n = pending.size();
  std::vector<StatusOr<WriteResult>> w(n, Status::Internal("unset"));
  std::vector<bool> acked(n, false);
  std::vector<CompleteRequest> reqs;
  std::vector<size_t> where;  // reqs[j] writes pending[where[j]]
  reqs.reserve(n);
  where.reserve(n);
  for (size_t i = 0; i < n; ++i) {
    ClaimGuard& g = pending[i].guard_;
    HandlerResult& hr = pending[i].handler_result_;
    if (g.held_ == nullptr) {
      w[i] = Status::FailedPrecondition("complete on a claim of '" + g.key_ +
                                        "' that is not held (not acquired, or already ended)");
      continue;
    }
    if (g.held_->lost.load()) {  // the heartbeat saw another owner: write nothing
      g.Finish();
      w[i] = WriteResult::kLost;
      continue;
    }
    FitInARecord(&hr);
    CompleteRequest q;
    q.key = g.key_;
    q.token = g.result_.token;
    q.retention = options_.retention;
    const bool done = hr.kind == HandlerResult::Kind::kDone;
    q.status = done ? CompletionStatus::kOk : CompletionStatus::kFailed;
    q.result = hr.result;
    q.ack = done ? pending[i].ack_ : nullptr;
    reqs.push_back(q);
    where.push_back(i);
  }
  if (!reqs.empty()) {
    // Retried as OutcomeRetry says: the batch while every claim of it is known to
    // be held (the earliest deadline), each alone while its own claim is, all
    // within one time bound.
    const internal::OutcomeRetry retry(options_, std::chrono::steady_clock::now(),
                                       breaker().open());
    bool gave_up_on_time = false;
    auto held_until = [&] {
      auto t = std::chrono::steady_clock::time_point::max();
      for (size_t i : where) t = std::min(t, pending[i].guard_.lease_deadline());
      return t;
    };
    // One completion with the single calls, so that a StoreWrapper overriding only
    // Complete / CompleteWithAck sees every completion ProcessOnce makes.
    auto one = [this](const CompleteRequest& q) { return CompleteOne(*store_, q); };
    std::vector<StatusOr<AckedWrite>> res(reqs.size(), Status::Internal("unset"));
    // Whether a LOST of request j may be an earlier try's echo (see below).
    std::vector<bool> retried(reqs.size(), false);
    if (reqs.size() == 1) {
      int tries = 0;
      res[0] = retry.Run(held_until, [&] { return ++tries, one(reqs[0]); }, &gave_up_on_time);
      retried[0] = tries > 1;
    } else {
      int tries = 0;
      StatusOr<std::vector<AckedWrite>> b = retry.Run(
          held_until, [&] { return ++tries, store_->CompleteBatch(reqs); }, &gave_up_on_time);
      if (tries > 1) retried.assign(reqs.size(), true);
      if (b.ok() && b->size() != reqs.size()) {
        b = Status::Internal("store " + store_->Describe() + ": complete batch answered " +
                             std::to_string(b->size()) + " results for " +
                             std::to_string(reqs.size()) + " requests");
      }
      if (b.ok()) {
        for (size_t j = 0; j < reqs.size(); ++j) res[j] = (*b)[j];
      } else if (!b.status().retryable()) {
        // The error of one request fails the whole call (Store::CompleteBatch is all
        // or nothing in its answer, not in what it wrote), so each is written alone:
        // one the failed call did write answers LOST (its record is no longer in
        // progress), and then OK once its record is read and shows this outcome
        // under its token, fence and attempt (below); one it
        // did not write is recorded now, instead of being left to a takeover that
        // would run its handler again. A retryable error (the store unreachable
        // after every try) is every request's alike, and is theirs as it stands.
        // The failed call was each one's first try.
        retried.assign(reqs.size(), true);
        for (size_t j = 0; j < reqs.size(); ++j) {
          bool on_time = false;
          res[j] = retry.Run([&] { return pending[where[j]].guard_.lease_deadline(); },
                             [&] { return one(reqs[j]); }, &on_time);
          gave_up_on_time = gave_up_on_time || on_time;
        }
      } else {
        for (size_t j = 0; j < reqs.size(); ++j) res[j] = b.status();
      }
    }
    bool any_ok = false;
    for (size_t j = 0; j < where.size(); ++j) {
      const size_t i = where[j];
      if (res[j].ok()) any_ok = true;
      // A LOST after an earlier try: that try may have recorded it and its reply
      // been lost. OK (not acked: the caller acks) when the record shows it.
      if (retried[j] && res[j].ok() && res[j]->write == WriteResult::kLost &&
          RecordShowsOwnWrite(*store_, reqs[j].key, pending[i].guard_.result_,
                              RecordState::kCompleted, reqs[j].status, reqs[j].result)) {
        res[j] = AckedWrite{WriteResult::kOk, false};
      }
      if (res[j].ok()) {
        w[i] = res[j]->write;
        acked[i] = res[j]->acked;
      } else {
        w[i] = res[j].status();
      }
      // Ends ownership whatever the answer: on a lasting error the lease will run
      // out and the message be redelivered, which is the fail-closed outcome.
      pending[i].guard_.Finish();
    }
    breaker().Settle(any_ok, gave_up_on_time);
  }
  std::vector<Processed> out;
  out.reserve(n);
  for (size_t i = 0; i < n; ++i) {
    out.push_back(std::move(pending[i].processed_));
    Resolve(&out.back(), pending[i].handler_result_, w[i], acked[i]);
    if (w[i].ok() && *w[i] == WriteResult::kOk) notes_->Done(pending[i].guard_.key_);
  }
  return out;
}

// The one mapping of a handler's outcome and its write to the broker's action.
void Buffer::Resolve(Processed* p, const HandlerResult& hr, const StatusOr<WriteResult>& w,
                     bool acked) const {
  switch (hr.kind) {
    case HandlerResult::Kind::kDone:
      p->result = hr.result;
      p->action = BrokerAction::kAck;
      break;
    case HandlerResult::Kind::kFail:
      p->reason = hr.result;
      p->action = BrokerAction::kDeadLetter;
      break;
    case HandlerResult::Kind::kRetry:
      p->reason = hr.result;
      p->action = BrokerAction::kRetry;
      p->retry_after = options_.retry_delay;
      break;
  }
  p->acked_with_complete = false;
  if (!w.ok()) {
    p->status = w.status();
    p->action = BrokerAction::kRetry;
    p->retry_after = options_.retry_delay;
    p->reason = "store error recording the outcome: " + w.status().ToString();
    return;
  }
  p->completion = *w;
  if (*w == WriteResult::kLost && hr.kind != HandlerResult::Kind::kRetry) {
    // Another owner took over while the handler ran: it decides the outcome. Do
    // not ack this delivery; the next one sees DUPLICATE or BUSY.
    p->action = BrokerAction::kRetry;
    p->retry_after = options_.retry_delay;
    p->reason = "lease lost to another owner before the outcome was recorded";
    return;
  }
  p->acked_with_complete = acked && *w == WriteResult::kOk && hr.kind == HandlerResult::Kind::kDone;
}

}  // namespace dedup
