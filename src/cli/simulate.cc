// Copyright dedup authors. Licensed under the Apache License 2.0.

#include "cli/simulate.h"

#include <fmt/format.h>
#include <stdlib.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <deque>
#include <filesystem>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <queue>
#include <random>
#include <thread>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "dedup/buffer.h"
#include "dedup/store.h"

namespace dedup::cli {

std::string_view PatternName(Pattern p) {
  return p == Pattern::kTextbook ? "textbook" : "dedup";
}

namespace {

using SteadyClock = std::chrono::steady_clock;

uint64_t SplitMix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

// A uniform number in [0, 1) decided only by its inputs.
double Uniform(uint64_t seed, uint64_t a, uint64_t b) {
  uint64_t h = SplitMix64(seed ^ SplitMix64(a ^ SplitMix64(b + 0x51ed27)));
  return static_cast<double>(h >> 11) * 0x1.0p-53;
}

// ---- fault schedule ----------------------------------------------------------

enum class Fault : uint8_t {
  kNone,
  kCrashBeforeWork,
  kCrashAfterEffect,
  kCrashAfterComplete,
  kTransient,
  kSlow,
};

class FaultSchedule {
 public:
  explicit FaultSchedule(const SimulateOptions& o) : o_(o) {}

  // The fault of the `number`th delivery (1-based) of published message `msg`.
  Fault For(uint64_t msg, uint32_t number) const {
    double u = Uniform(o_.seed, msg, number);
    const std::pair<double, Fault> table[] = {
        {o_.crash_before_work, Fault::kCrashBeforeWork},
        {o_.crash_after_effect, Fault::kCrashAfterEffect},
        {o_.crash_after_complete, Fault::kCrashAfterComplete},
        {o_.transient_failure, Fault::kTransient},
        {o_.slow_handler, Fault::kSlow},
    };
    for (const auto& [p, f] : table) {
      if (u < p) return f;
      u -= p;
    }
    return Fault::kNone;
  }

  // A poison message's handler fails permanently on every delivery.
  bool Poison(uint64_t key_id) const {
    return Uniform(o_.seed ^ 0x706f69736f6eULL, key_id, 0) < o_.poison;
  }

 private:
  const SimulateOptions& o_;
};

// ---- broker ----------------------------------------------------------------

struct Delivery {
  uint64_t msg = 0;     // published message
  uint64_t key_id = 0;  // the key it carries (a duplicate carries the same key)
  uint32_t gen = 0;     // which delivery of the message this is, for stale retries
  uint32_t number = 0;  // 1 for the first delivery of the message, +1 each later
};

// At-least-once, in process. A delivered message is in flight until acked,
// dead-lettered or retried; if none of that happens within the visibility timeout
// it is delivered again. Workers wait on a condition variable until a message is
// ready or the next timer is due: nothing spins.
class Broker {
 public:
  struct Publication {
    uint64_t key_id;
    Millis delay;
  };

  Broker(const std::vector<Publication>& pubs, Millis visibility_timeout)
      : visibility_(visibility_timeout) {
    const auto now = SteadyClock::now();
    msgs_.reserve(pubs.size());
    for (const Publication& p : pubs) {
      const uint64_t id = msgs_.size();
      msgs_.push_back(Msg{p.key_id, State::kWaiting, 0, 0});
      if (p.delay.count() <= 0) {
        msgs_.back().state = State::kReady;
        ready_.push_back(id);
      } else {
        timers_.push(Timer{now + p.delay, id, 0});
      }
    }
    open_ = msgs_.size();
  }

  // The next delivery, or nullopt once every message is acked or dead-lettered
  // (or Stop() was called).
  std::optional<Delivery> Receive() {
    std::unique_lock lock(mu_);
    for (;;) {
      if (stopped_ || open_ == 0) return std::nullopt;
      const auto now = SteadyClock::now();
      FireTimers(now);
      while (!ready_.empty()) {
        const uint64_t id = ready_.front();
        ready_.pop_front();
        Msg& m = msgs_[id];
        if (m.state != State::kReady) continue;  // acked meanwhile
        m.state = State::kInFlight;
        ++m.gen;
        ++m.deliveries;
        ++deliveries_;
        timers_.push(Timer{now + visibility_, id, m.gen});
        return Delivery{id, m.key_id, m.gen, m.deliveries};
      }
      if (timers_.empty()) {
        cv_.wait(lock);
      } else {
        cv_.wait_until(lock, timers_.top().due);
      }
    }
  }

  // Per message, like XACK: an ack from an earlier delivery still counts.
  void Ack(const Delivery& d) { Finish(d, State::kAcked); }
  void DeadLetter(const Delivery& d) { Finish(d, State::kDead); }

  // Delivers the message again after `after`, unless it has been delivered again
  // already (the visibility timeout fired) or finished.
  void Retry(const Delivery& d, Millis after) {
    std::lock_guard lock(mu_);
    Msg& m = msgs_[d.msg];
    if (m.state != State::kInFlight || m.gen != d.gen) return;
    m.state = State::kWaiting;
    ++m.gen;
    timers_.push(Timer{SteadyClock::now() + std::max(after, Millis(0)), d.msg, m.gen});
    cv_.notify_one();  // the new timer may be the earliest
  }

  void Stop() {
    std::lock_guard lock(mu_);
    stopped_ = true;
    cv_.notify_all();
  }

  // Blocks until every message is finished or `deadline` passes; true if finished.
  bool WaitAllFinished(SteadyClock::time_point deadline) {
    std::unique_lock lock(mu_);
    return done_cv_.wait_until(lock, deadline, [this] { return open_ == 0; });
  }

  // Per key: true while a message carrying it is neither acked nor dead-lettered.
  std::vector<bool> OpenKeys(uint64_t keys) const {
    std::vector<bool> open(keys, false);
    std::lock_guard lock(mu_);
    for (const Msg& m : msgs_) {
      if (m.state != State::kAcked && m.state != State::kDead) open[m.key_id] = true;
    }
    return open;
  }

  struct Counts {
    uint64_t published, open, acked, dead, deliveries, redeliveries;
  };
  Counts counts() const {
    std::lock_guard lock(mu_);
    return {msgs_.size(), open_, acked_, dead_, deliveries_, redeliveries_};
  }

 private:
  enum class State : uint8_t { kWaiting, kReady, kInFlight, kAcked, kDead };
  struct Msg {
    uint64_t key_id;
    State state;
    uint32_t gen;
    uint32_t deliveries;
  };
  struct Timer {
    SteadyClock::time_point due;
    uint64_t msg;
    uint32_t gen;
    bool operator>(const Timer& o) const { return due > o.due; }
  };

  void FireTimers(SteadyClock::time_point now) {
    size_t fired = 0;
    while (!timers_.empty() && timers_.top().due <= now) {
      const Timer t = timers_.top();
      timers_.pop();
      Msg& m = msgs_[t.msg];
      if (m.gen != t.gen) continue;  // stale: acked, retried or redelivered since
      if (m.state == State::kInFlight) {
        ++redeliveries_;  // visibility timeout: nobody acked it
      } else if (m.state != State::kWaiting) {
        continue;
      }
      m.state = State::kReady;
      ready_.push_back(t.msg);
      ++fired;
    }
    if (fired > 1) cv_.notify_all();  // more work than this thread can take
  }

  void Finish(const Delivery& d, State to) {
    std::lock_guard lock(mu_);
    Msg& m = msgs_[d.msg];
    if (m.state == State::kAcked || m.state == State::kDead) return;
    m.state = to;
    ++m.gen;  // its pending timers are stale now
    (to == State::kAcked ? acked_ : dead_)++;
    if (--open_ == 0) {
      cv_.notify_all();
      done_cv_.notify_all();
    }
  }

  const Millis visibility_;
  mutable std::mutex mu_;
  std::condition_variable cv_, done_cv_;
  std::vector<Msg> msgs_;
  std::deque<uint64_t> ready_;
  std::priority_queue<Timer, std::vector<Timer>, std::greater<>> timers_;
  uint64_t open_ = 0, acked_ = 0, dead_ = 0, deliveries_ = 0, redeliveries_ = 0;
  bool stopped_ = false;
};

// ---- ledger ----------------------------------------------------------------

// Where the side effects go: apart from the store, so that the store cannot hide
// what happened. One entry per application: (key, fence, attempt).
class Ledger {
 public:
  struct Effect {
    uint64_t key_id;
    uint64_t fence;    // 0 for the textbook guard, which has none
    uint32_t attempt;  // dedup: the claim's attempt; textbook: the delivery number
  };
  struct PerKey {
    uint32_t applied = 0;
    uint32_t excused = 0;  // applications that followed a crash between effect and complete
    bool last_crashed = false;  // the latest application's worker crashed before complete
    bool dead_lettered = false;
    uint32_t last_released_attempt = 0;
    uint64_t last_fence = 0;
  };

  explicit Ledger(uint64_t keys) : keys_(keys) { effects_.reserve(keys + keys / 8); }

  // `crash_follows`: the simulation will crash this worker before complete.
  void Apply(uint64_t key_id, uint64_t fence, uint32_t attempt, bool crash_follows) {
    std::lock_guard lock(mu_);
    PerKey& k = keys_[key_id];
    if (k.applied > 0 && k.last_crashed) ++k.excused;
    if (fence != 0 && k.applied > 0 && fence <= k.last_fence) ++stale_fence_;
    ++k.applied;
    k.last_crashed = crash_follows;
    k.last_fence = std::max(k.last_fence, fence);
    effects_.push_back({key_id, fence, attempt});
  }
  void MarkDeadLettered(uint64_t key_id) {
    std::lock_guard lock(mu_);
    keys_[key_id].dead_lettered = true;
  }
  void MarkReleased(uint64_t key_id, uint32_t attempt) {
    std::lock_guard lock(mu_);
    keys_[key_id].last_released_attempt = attempt;
  }
  // True when `attempt` follows an attempt that neither we released nor is the
  // first: the previous owner's lease ran out (it crashed, or lost the lease).
  bool IsTakeover(uint64_t key_id, uint32_t attempt) {
    if (attempt <= 1) return false;
    std::lock_guard lock(mu_);
    return keys_[key_id].last_released_attempt != attempt - 1;
  }

  void Tally(const std::vector<bool>& open_keys, SimulateReport& r) const {
    std::lock_guard lock(mu_);
    for (size_t i = 0; i < keys_.size(); ++i) {
      const PerKey& k = keys_[i];
      if (k.applied == 0) {
        if (k.dead_lettered) {
          ++r.not_applied_dead_lettered;
        } else if (open_keys[i]) {
          ++r.not_applied_unfinished;
        } else {
          ++r.lost;
        }
      } else if (k.applied == 1) {
        ++r.exactly_once;
      } else if (k.applied - 1 == k.excused) {
        ++r.reapplied_after_crash;
      } else {
        ++r.applied_twice_otherwise;
      }
    }
  }
  uint64_t stale_fence() const {
    std::lock_guard lock(mu_);
    return stale_fence_;
  }

 private:
  mutable std::mutex mu_;
  std::vector<PerKey> keys_;
  std::vector<Effect> effects_;
  uint64_t stale_fence_ = 0;
};

// ---- crashes -----------------------------------------------------------------

// How a crash is made honest. ClaimGuard releases on destruction, which a dead
// process never does, and keeping a guard alive keeps its heartbeat going, which a
// dead process does not do either. So every worker's Buffer talks to the store
// through this wrapper, and a crash "kills" the claim's token: from that instant
// no write carrying it reaches the store (extend, complete, release all fail, as
// they would for a process that is gone), and the worker neither acks nor retries.
// The record stays IN_PROGRESS until its lease runs out, exactly what a crashed
// worker leaves behind; the broker redelivers after the visibility timeout.
class CrashableStore : public StoreWrapper {
 public:
  using StoreWrapper::StoreWrapper;

  void Kill(Token t) {
    std::lock_guard lock(mu_);
    dead_.insert(t.value);
    any_.store(true, std::memory_order_release);
  }

  StatusOr<WriteResult> Extend(std::string_view key, Token token, Millis lease) override {
    if (Dead(token)) return Gone();
    return StoreWrapper::Extend(key, token, lease);
  }
  StatusOr<WriteResult> Complete(std::string_view key, Token token, Millis retention,
                                 CompletionStatus status, std::string_view result) override {
    if (Dead(token)) return Gone();
    return StoreWrapper::Complete(key, token, retention, status, result);
  }
  StatusOr<WriteResult> Release(std::string_view key, Token token, Millis retention) override {
    if (Dead(token)) return Gone();
    return StoreWrapper::Release(key, token, retention);
  }

 private:
  bool Dead(Token t) {
    if (!any_.load(std::memory_order_acquire)) return false;
    std::lock_guard lock(mu_);
    return dead_.contains(t.value);
  }
  // Aborted, not Unavailable: the Buffer must not retry it.
  static Status Gone() {
    return Status(StatusCode::kAborted, "simulated crash: the owner's process is gone");
  }

  std::mutex mu_;
  std::unordered_set<uint64_t> dead_;
  std::atomic<bool> any_{false};
};

// ---- the textbook guard ------------------------------------------------------

// The seed's guard, against an in-process map read with the same clock the stores
// use: SET key processing NX EX ttl before the work, DEL (unconditional) when the
// work fails, nothing on success; "key exists" means skip and ack.
class TextbookGuard {
 public:
  explicit TextbookGuard(Millis ttl) : ttl_(ttl) {}

  // SET NX EX. `expired_before`: a key was there but its TTL had run out.
  bool SetNx(uint64_t key_id, bool* expired_before) {
    const int64_t now = Clock::System()->NowMillis();
    std::lock_guard lock(mu_);
    auto [it, inserted] = keys_.try_emplace(key_id, now + ttl_.count());
    *expired_before = false;
    if (inserted) return true;
    if (it->second > now) return false;
    *expired_before = true;
    it->second = now + ttl_.count();
    return true;
  }
  void Del(uint64_t key_id) {
    std::lock_guard lock(mu_);
    keys_.erase(key_id);
  }

 private:
  const Millis ttl_;
  std::mutex mu_;
  std::unordered_map<uint64_t, int64_t> keys_;  // key -> expiry (store clock ms)
};

// ---- the run -----------------------------------------------------------------

struct Counters {
  std::atomic<uint64_t> duplicates_suppressed{0}, busy_deferrals{0}, takeovers{0},
      retries{0}, store_errors{0}, lease_lost{0}, crashed_before_work{0},
      crashed_after_effect{0}, crashed_after_complete{0}, slow_handlers{0},
      transient_failures{0};
};

class Simulation {
 public:
  Simulation(const SimulateOptions& o, CrashableStore* store)
      : o_(o), faults_(o), ledger_(o.messages), store_(store), textbook_(o.textbook_ttl) {
    run_prefix_ = "simulate/" + Token::Random().ToHex() + "/";
  }

  SimulateReport Run() {
    std::mt19937_64 rng(o_.seed);
    std::uniform_real_distribution<double> coin(0.0, 1.0);
    std::uniform_int_distribution<int64_t> delay(1, std::max<int64_t>(1, o_.duplicate_delay.count()));
    std::vector<Broker::Publication> pubs;
    pubs.reserve(o_.messages + o_.messages / 8);
    for (uint64_t i = 0; i < o_.messages; ++i) {
      pubs.push_back({i, Millis(0)});
      if (coin(rng) < o_.duplicate_fraction) pubs.push_back({i, Millis(delay(rng))});
    }
    Broker broker(pubs, o_.visibility_timeout);

    // One Buffer per worker: each worker thread stands for a worker process.
    std::vector<std::unique_ptr<Buffer>> buffers;
    if (o_.pattern == Pattern::kDedup) {
      BufferOptions bo;
      bo.lease = o_.lease;
      bo.retention = o_.retention;
      bo.retry_delay = o_.retry_delay;
      for (int w = 0; w < o_.workers; ++w) buffers.push_back(std::make_unique<Buffer>(store_, bo));
    }

    const auto start = SteadyClock::now();
    std::vector<std::thread> workers;
    for (int w = 0; w < o_.workers; ++w) {
      workers.emplace_back([&, w] {
        while (std::optional<Delivery> d = broker.Receive()) {
          if (o_.pattern == Pattern::kDedup) {
            RunDedup(*buffers[w], broker, *d);
          } else {
            RunTextbook(broker, *d);
          }
        }
      });
    }

    std::atomic<bool> done{false};
    std::thread progress;
    std::mutex progress_mu;
    std::condition_variable progress_cv;
    if (o_.on_progress) {
      progress = std::thread([&] {
        std::unique_lock lock(progress_mu);
        while (!progress_cv.wait_for(lock, o_.progress_interval, [&] { return done.load(); })) {
          Broker::Counts c = broker.counts();
          o_.on_progress({c.published, c.published - c.open, c.deliveries,
                          std::chrono::duration_cast<Millis>(SteadyClock::now() - start)});
        }
      });
    }

    const auto deadline = start + o_.timeout;
    while (!broker.WaitAllFinished(std::min(deadline, SteadyClock::now() + Millis(100)))) {
      if (SteadyClock::now() >= deadline) break;
      if (o_.cancel != nullptr && o_.cancel->load()) break;
    }
    broker.Stop();
    for (std::thread& t : workers) t.join();
    const auto elapsed = std::chrono::duration_cast<Millis>(SteadyClock::now() - start);
    {
      std::lock_guard lock(progress_mu);
      done = true;
    }
    progress_cv.notify_all();
    if (progress.joinable()) progress.join();

    SimulateReport r;
    r.pattern = o_.pattern;
    r.store = o_.pattern == Pattern::kDedup ? store_->Describe() : "textbook (in-process map)";
    r.seed = o_.seed;
    r.workers = o_.workers;
    r.messages = o_.messages;
    const Broker::Counts c = broker.counts();
    r.published = c.published;
    r.deliveries = c.deliveries;
    r.acked = c.acked;
    r.dead_lettered = c.dead;
    r.redeliveries = c.redeliveries;
    r.unfinished = c.open;
    r.duplicates_suppressed = n_.duplicates_suppressed;
    r.busy_deferrals = n_.busy_deferrals;
    r.takeovers = n_.takeovers;
    r.retries = n_.retries;
    r.store_errors = n_.store_errors;
    r.lease_lost = n_.lease_lost;
    r.crashed_before_work = n_.crashed_before_work;
    r.crashed_after_effect = n_.crashed_after_effect;
    r.crashed_after_complete = n_.crashed_after_complete;
    r.slow_handlers = n_.slow_handlers;
    r.transient_failures = n_.transient_failures;
    for (uint64_t i = 0; i < o_.messages; ++i) r.poison_messages += faults_.Poison(i) ? 1 : 0;
    for (const auto& b : buffers) r.heartbeats += b->stats().heartbeats;
    ledger_.Tally(broker.OpenKeys(o_.messages), r);
    r.stale_fence_effects = ledger_.stale_fence();
    r.elapsed = elapsed;
    return r;
  }

 private:
  std::string Key(uint64_t key_id) const { return run_prefix_ + std::to_string(key_id); }

  void RunDedup(Buffer& buffer, Broker& broker, const Delivery& d) {
    const Fault f = faults_.For(d.msg, d.number);
    const bool poison = faults_.Poison(d.key_id);
    const std::string key = Key(d.key_id);
    bool crashed = false;
    auto handler = [&](ClaimGuard& g) -> HandlerResult {
      if (ledger_.IsTakeover(d.key_id, g.attempt())) ++n_.takeovers;
      if (f == Fault::kCrashBeforeWork) {
        ++n_.crashed_before_work;
        store_->Kill(g.token());
        crashed = true;
        return HandlerResult::Retry("simulated crash before the work");
      }
      if (poison) return HandlerResult::Fail("poison message (simulated)");
      if (f == Fault::kTransient) {
        ++n_.transient_failures;
        ledger_.MarkReleased(d.key_id, g.attempt());
        return HandlerResult::Retry("transient failure (simulated)");
      }
      if (f == Fault::kSlow) {
        ++n_.slow_handlers;
        std::this_thread::sleep_for(o_.slow_handler_time);
      }
      // A careful handler checks before its side effect that it still owns the key.
      if (g.lost()) return HandlerResult::Retry("lease lost before the side effect");
      ledger_.Apply(d.key_id, g.fence(), g.attempt(), f == Fault::kCrashAfterEffect);
      if (f == Fault::kCrashAfterEffect) {
        ++n_.crashed_after_effect;
        store_->Kill(g.token());
        crashed = true;
      }
      return HandlerResult::Done();
    };
    const Processed p = buffer.ProcessOnce(key, key, handler);
    if (crashed) return;  // no ack, no retry: the visibility timeout redelivers

    if (!p.status.ok()) {
      ++n_.store_errors;
    } else if (p.claim.outcome == ClaimOutcome::kDuplicate) {
      ++n_.duplicates_suppressed;
    } else if (p.claim.outcome == ClaimOutcome::kBusy) {
      ++n_.busy_deferrals;
    } else if (p.ran && p.action == BrokerAction::kRetry) {
      ++n_.retries;
      if (p.completion == WriteResult::kLost) ++n_.lease_lost;
    }
    if (p.ran && p.action == BrokerAction::kAck && f == Fault::kCrashAfterComplete) {
      ++n_.crashed_after_complete;
      return;  // completed, never acked
    }
    Honour(broker, d, p.action, p.retry_after);
  }

  void RunTextbook(Broker& broker, const Delivery& d) {
    const Fault f = faults_.For(d.msg, d.number);
    bool expired_before = false;
    if (!textbook_.SetNx(d.key_id, &expired_before)) {
      // "Duplicate detected. Skipping." and processTask returns: the broker acks.
      ++n_.duplicates_suppressed;
      broker.Ack(d);
      return;
    }
    if (expired_before) ++n_.takeovers;
    if (f == Fault::kCrashBeforeWork) {
      ++n_.crashed_before_work;
      return;  // the key stays until its TTL; no DEL, no ack
    }
    if (faults_.Poison(d.key_id)) {
      textbook_.Del(d.key_id);
      Honour(broker, d, BrokerAction::kDeadLetter, Millis(0));
      return;
    }
    if (f == Fault::kTransient) {
      ++n_.transient_failures;
      ++n_.retries;
      textbook_.Del(d.key_id);  // unconditional: whoever holds the key now
      Honour(broker, d, BrokerAction::kRetry, o_.retry_delay);
      return;
    }
    if (f == Fault::kSlow) {
      ++n_.slow_handlers;
      std::this_thread::sleep_for(o_.slow_handler_time);
    }
    ledger_.Apply(d.key_id, 0, d.number, f == Fault::kCrashAfterEffect);
    if (f == Fault::kCrashAfterEffect) {
      ++n_.crashed_after_effect;
      return;
    }
    if (f == Fault::kCrashAfterComplete) {  // the work returned; crash before the ack
      ++n_.crashed_after_complete;
      return;
    }
    broker.Ack(d);
  }

  void Honour(Broker& broker, const Delivery& d, BrokerAction action, Millis retry_after) {
    switch (action) {
      case BrokerAction::kAck:
        broker.Ack(d);
        break;
      case BrokerAction::kRetry:
        broker.Retry(d, retry_after);
        break;
      case BrokerAction::kDeadLetter:
        ledger_.MarkDeadLettered(d.key_id);
        broker.DeadLetter(d);
        break;
    }
  }

  const SimulateOptions& o_;
  const FaultSchedule faults_;
  Ledger ledger_;
  CrashableStore* const store_;
  TextbookGuard textbook_;
  std::string run_prefix_;
  Counters n_;
};

Status Validate(const SimulateOptions& o) {
  auto fraction = [](double v, const char* name) -> Status {
    if (!(v >= 0.0 && v <= 1.0)) {
      return Status::InvalidArgument(fmt::format("{} must be between 0 and 1, got {}", name, v));
    }
    return Status::Ok();
  };
  auto positive = [](Millis v, const char* name) -> Status {
    if (v.count() <= 0) {
      return Status::InvalidArgument(fmt::format("{} must be > 0 ms, got {}", name, v.count()));
    }
    return Status::Ok();
  };
  if (o.messages == 0) return Status::InvalidArgument("messages must be at least 1");
  if (o.workers < 1 || o.workers > 1024) {
    return Status::InvalidArgument(fmt::format("workers must be 1 to 1024, got {}", o.workers));
  }
  DEDUP_RETURN_IF_ERROR(positive(o.lease, "lease"));
  DEDUP_RETURN_IF_ERROR(positive(o.retention, "retention"));
  DEDUP_RETURN_IF_ERROR(positive(o.textbook_ttl, "textbook TTL"));
  DEDUP_RETURN_IF_ERROR(positive(o.visibility_timeout, "visibility timeout"));
  DEDUP_RETURN_IF_ERROR(positive(o.timeout, "timeout"));
  if (o.retry_delay.count() < 0) return Status::InvalidArgument("retry delay must be >= 0 ms");
  if (o.duplicate_delay.count() < 0) {
    return Status::InvalidArgument("duplicate delay must be >= 0 ms");
  }
  if (o.slow_handler_time.count() < 0) {
    return Status::InvalidArgument("slow handler time must be >= 0 ms");
  }
  DEDUP_RETURN_IF_ERROR(fraction(o.duplicate_fraction, "duplicate fraction"));
  DEDUP_RETURN_IF_ERROR(fraction(o.poison, "poison fraction"));
  const double per_delivery[] = {o.crash_before_work, o.crash_after_effect,
                                 o.crash_after_complete, o.transient_failure, o.slow_handler};
  double sum = 0;
  for (double v : per_delivery) {
    DEDUP_RETURN_IF_ERROR(fraction(v, "a fault fraction"));
    sum += v;
  }
  // Every delivery faulty would never finish; stay well away from that.
  if (sum > 0.5) {
    return Status::InvalidArgument(
        fmt::format("per-delivery fault fractions add up to {}, more than 0.5", sum));
  }
  return Status::Ok();
}

// A fresh directory for the default RocksDB store, removed when this goes away.
class TempDir {
 public:
  ~TempDir() {
    if (!path_.empty()) {
      std::error_code ec;
      std::filesystem::remove_all(path_, ec);
    }
  }
  Status Make() {
    std::error_code ec;
    std::filesystem::path base = std::filesystem::temp_directory_path(ec);
    if (ec) base = "/tmp";
    std::string tmpl = (base / "dedup-simulate-XXXXXX").string();
    if (mkdtemp(tmpl.data()) == nullptr) {
      return Status::Unavailable("cannot make a temporary directory under " + base.string());
    }
    path_ = tmpl;
    return Status::Ok();
  }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

}  // namespace

StatusOr<SimulateReport> RunSimulation(const SimulateOptions& options) {
  DEDUP_RETURN_IF_ERROR(Validate(options));
  TempDir temp;  // destroyed after the store (declared first)
  std::unique_ptr<Store> store;
  if (options.pattern == Pattern::kDedup) {
    std::string uri = options.store_uri;
    if (uri.empty()) {
#ifdef DEDUP_WITH_ROCKSDB
      DEDUP_RETURN_IF_ERROR(temp.Make());
      uri = "rocksdb:" + temp.path();
#else
      uri = "memory:";
#endif
    }
    StatusOr<std::unique_ptr<Store>> opened = OpenStore(uri);
    if (!opened.ok()) return opened.status();
    store = std::move(opened).value();
  }
  // The textbook pattern never calls the store; the wrapper needs a target anyway.
  CrashableStore crashable(store.get());
  Simulation sim(options, &crashable);
  return sim.Run();
}

std::string FormatReport(const SimulateReport& r) {
  std::string out;
  auto line = [&out](std::string_view name, auto value, std::string_view note = {}) {
    out += fmt::format("  {:<36} {:>10}", name, value);
    if (!note.empty()) out += fmt::format("  {}", note);
    out += '\n';
  };
  out += fmt::format("dedup simulate: pattern {}, store {}, seed {}, {} workers, {:.2f} s\n",
                     PatternName(r.pattern), r.store, r.seed, r.workers,
                     static_cast<double>(r.elapsed.count()) / 1000.0);
  out += "broker\n";
  line("messages (distinct keys)", r.messages);
  line("published (with duplicates)", r.published);
  line("deliveries", r.deliveries);
  line("redeliveries (visibility timeout)", r.redeliveries);
  line("acked", r.acked);
  line("dead-lettered", r.dead_lettered);
  out += "guard\n";
  line("duplicates suppressed (acked)", r.duplicates_suppressed);
  line("BUSY deferrals (not acked)", r.busy_deferrals);
  line("takeovers (lease/TTL ran out)", r.takeovers);
  line("retries (released, redelivered)", r.retries);
  line("store errors (fail closed)", r.store_errors);
  line("outcome lost to another owner", r.lease_lost);
  if (r.pattern == Pattern::kDedup) line("heartbeats (extends)", r.heartbeats);
  out += "faults injected\n";
  line("crash after claim, before work", r.crashed_before_work);
  line("crash after effect, before complete", r.crashed_after_effect);
  line("crash after complete, before ack", r.crashed_after_complete);
  line("handler longer than the lease", r.slow_handlers);
  line("handler failed transiently", r.transient_failures);
  line("poison messages (always fail)", r.poison_messages);
  out += "effects per message (ledger)\n";
  line("exactly once", r.exactly_once);
  line("re-applied after crash effect/complete", r.reapplied_after_crash, "documented limit");
  line("applied twice otherwise", r.applied_twice_otherwise, "must be 0");
  line("lost (never applied, acked)", r.lost, "must be 0");
  line("not applied, dead-lettered (poison)", r.not_applied_dead_lettered);
  if (r.not_applied_unfinished > 0) {
    line("not applied, unfinished", r.not_applied_unfinished, "run stopped early");
  }
  line("broker messages unfinished", r.unfinished, "must be 0 (timeout, interrupt)");
  if (r.pattern == Pattern::kDedup) {
    line("effects with a stale fence", r.stale_fence_effects, "a fence check refuses these");
  }
  out += r.passed() ? "result: PASS\n" : "result: FAIL (a must-be-zero count is not zero)\n";
  return out;
}

std::string ReportToJson(const SimulateReport& r) {
  nlohmann::ordered_json j = {
      {"pattern", PatternName(r.pattern)},
      {"store", r.store},
      {"seed", r.seed},
      {"workers", r.workers},
      {"elapsed_ms", r.elapsed.count()},
      {"messages", r.messages},
      {"published", r.published},
      {"deliveries", r.deliveries},
      {"redeliveries", r.redeliveries},
      {"acked", r.acked},
      {"dead_lettered", r.dead_lettered},
      {"duplicates_suppressed", r.duplicates_suppressed},
      {"busy_deferrals", r.busy_deferrals},
      {"takeovers", r.takeovers},
      {"retries", r.retries},
      {"store_errors", r.store_errors},
      {"lease_lost", r.lease_lost},
      {"heartbeats", r.heartbeats},
      {"faults",
       {{"crash_before_work", r.crashed_before_work},
        {"crash_after_effect", r.crashed_after_effect},
        {"crash_after_complete", r.crashed_after_complete},
        {"slow_handler", r.slow_handlers},
        {"transient_failure", r.transient_failures},
        {"poison_messages", r.poison_messages}}},
      {"effects",
       {{"exactly_once", r.exactly_once},
        {"reapplied_after_crash", r.reapplied_after_crash},
        {"applied_twice_otherwise", r.applied_twice_otherwise},
        {"lost", r.lost},
        {"not_applied_dead_lettered", r.not_applied_dead_lettered},
        {"not_applied_unfinished", r.not_applied_unfinished},
        {"stale_fence", r.stale_fence_effects}}},
      {"unfinished", r.unfinished},
      {"passed", r.passed()},
  };
  return j.dump(2);
}

}  // namespace dedup::cli
