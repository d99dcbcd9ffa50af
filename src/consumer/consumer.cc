// Copyright dedup authors. Licensed under the Apache License 2.0.
//
// One fetch thread (the caller of Run) takes batches from the source, drops
// deliveries whose id this Consumer already holds and stages the rest; a handler
// thread claims a staged batch with one Buffer::ClaimBatch (while the fetch
// thread fetches the next) and queues it; `concurrency` handler threads run each
// through Buffer::ProcessClaimed (or the Processor) and settle it with the broker.
// The policy (outcome -> broker action) lives in ProcessOnce alone; this file only
// carries out the action and counts.

#include <semaphore.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <ctime>
#include <deque>
#include <mutex>
#include <optional>
#include <string_view>
#include <thread>
#include <unordered_map>
#include <utility>
#include <variant>
#include <vector>

#include "core/duration.h"
#include "core/key_hash.h"
#include "core/printable.h"
#include "dedup/consumer.h"

namespace dedup {

std::string ConsumerMetrics::ToPrometheus() const {
  const std::pair<const char*, uint64_t> rows[] = {
      {"messages", messages},         {"acquired", acquired},
      {"duplicates", duplicates},     {"busy", busy},
      {"takeovers", takeovers},       {"lost_leases", lost_leases},
      {"retries", retries},           {"dead_lettered", dead_lettered},
      {"store_errors", store_errors}, {"claim_errors", claim_errors},
      {"acked", acked},
      {"redelivered", redelivered},   {"held_back", held_back},
      {"waited_for_copy", waited_for_copy},
      {"broker_errors", broker_errors}, {"ack_errors", ack_errors},
      {"retry_errors", retry_errors}, {"dead_letter_errors", dead_letter_errors},
      {"hand_back_errors", hand_back_errors},
      {"acked_with_complete", acked_with_complete},
      {"claim_batches", claim_batches}, {"claimed_in_batches", claimed_in_batches},
      {"ack_batches", ack_batches}, {"acked_in_batches", acked_in_batches},
      {"complete_batches", complete_batches}, {"completed_in_batches", completed_in_batches}};
  std::string out;
  for (const auto& [name, v] : rows) {
    out += "# TYPE dedup_worker_" + std::string(name) + "_total counter\n";
    out += "dedup_worker_" + std::string(name) + "_total " + std::to_string(v) + "\n";
  }
  return out;
}

std::string ConsumerMetrics::Summary() const {
  return "messages=" + std::to_string(messages) + " acquired=" + std::to_string(acquired) +
         " duplicates=" + std::to_string(duplicates) + " busy=" + std::to_string(busy) +
         " takeovers=" + std::to_string(takeovers) + " lost_leases=" +
         std::to_string(lost_leases) + " retries=" + std::to_string(retries) +
         " dead_lettered=" + std::to_string(dead_lettered) + " store_errors=" +
         std::to_string(store_errors) + " acked=" + std::to_string(acked) +
         " redelivered=" + std::to_string(redelivered) + " held_back=" +
         std::to_string(held_back) + " waited_for_copy=" + std::to_string(waited_for_copy) +
         " broker_errors=" + std::to_string(broker_errors) +
         " ack_errors=" + std::to_string(ack_errors) + " retry_errors=" +
         std::to_string(retry_errors) + " dead_letter_errors=" + std::to_string(dead_letter_errors) +
         " hand_back_errors=" + std::to_string(hand_back_errors) +
         " acked_with_complete=" + std::to_string(acked_with_complete);
}

// A dead letter's reason in the log: a handler's failure text may be 1 MiB.
constexpr size_t kMaxLoggedReasonBytes = 1024;
// A key in a log line: enough to find it, not a hostile producer's 60 KB.
constexpr size_t kMaxLoggedKeyBytes = 256;

class Consumer::Impl {
 public:
  Impl(MessageSource* source, Buffer* buffer, Handler handler, Processor process,
       ConsumerOptions o, std::atomic<bool>* stop, Store* process_store = nullptr)
      : source_(source), buffer_(buffer),
        store_to_stop_(buffer != nullptr ? buffer->store() : process_store),
        handler_(std::move(handler)),
        process_(std::move(process)), o_(std::move(o)), stop_(stop) {
    adaptive_prefetch_ = o_.prefetch < 0 && o_.prefetch_time.count() > 0;
    if (buffer_ != nullptr) progress_every_ = buffer_->heartbeat_interval();
    if (o_.prefetch < 0) o_.prefetch = o_.concurrency;
    prefetch_ = o_.prefetch;
    // Not shared between processes, starting at 0: cannot fail. No file
    // descriptor: `dedup simulate` holds up to 1024 Consumers at once.
    (void)sem_init(&stop_sem_, 0, 0);
  }
  ~Impl() { sem_destroy(&stop_sem_); }
  Impl(const Impl&) = delete;
  Impl& operator=(const Impl&) = delete;

  // Consumer::Stop(), maybe from a signal handler: only atomics, clock_gettime
  // and sem_post, all async-signal-safe. The first call's moment is the drain's
  // start; the post wakes the drain thread (DrainOnStop), which does not wait
  // for the fetch thread to come back from a Fetch or a claim. The stop flag
  // comes last: once it is seen, Run() may return and its caller destroy the
  // Consumer, so nothing of it is touched after that.
  void RequestStop() {
    const int saved_errno = errno;
    int64_t none = 0;
    (void)stop_ns_.compare_exchange_strong(none, MonotonicNs());
    (void)sem_post(&stop_sem_);  // fails only past SEM_VALUE_MAX posts: one is enough
    stop_->store(true, std::memory_order_release);
    errno = saved_errno;
  }

  Status Run() {
    for (int i = 0; i < o_.concurrency; ++i) threads_.emplace_back([this] { HandlerLoop(); });
    drainer_ = std::thread([this] { DrainOnStop(); });
    if (o_.max_ack_delay.count() > 0) acker_ = std::thread([this] { AckLoop(); });
    if (buffer_ != nullptr && !process_ && o_.batch_completions) {
      completer_ = std::thread([this] { CompleteLoop(); });
    }
    Millis backoff(50);
    auto next_progress = std::chrono::steady_clock::now() + progress_every_;
    // Acquire: what Stop() did before it set the flag (it touches nothing of
    // the Consumer after) happens before Run() returns and the Consumer goes.
    while (!stop_->load(std::memory_order_acquire)) {
      if (progress_every_.count() > 0 && std::chrono::steady_clock::now() >= next_progress) {
        next_progress = std::chrono::steady_clock::now() + progress_every_;
        SendInProgress();
      }
      int free = 0;
      {
        std::unique_lock lock(mu_);
        if (!FetchWanted()) {
          fetch_waiting_ = true;
          room_cv_.wait_for(lock, Millis(50), [this] { return FetchWanted(); });
          fetch_waiting_ = false;
          continue;
        }
        free = Room();
      }
      StatusOr<std::vector<std::unique_ptr<Delivery>>> batch =
          source_->Fetch(static_cast<size_t>(free), o_.fetch_wait);
      if (!batch.ok()) {
        n_.broker_errors.fetch_add(1, std::memory_order_relaxed);
        Log("fetch: " + batch.status().ToString());
        // Sleep in short steps so that Stop() is seen.
        for (auto until = std::chrono::steady_clock::now() + backoff;
             std::chrono::steady_clock::now() < until && !stop_->load();) {
          std::this_thread::sleep_for(Millis(10));
        }
        backoff = std::min(backoff * 2, Millis(1'000));
        continue;
      }
      backoff = Millis(50);
      Enqueue(std::move(batch).value());
    }
    // The loop ends only once stopped; this makes sure DrainOnStop is awake even
    // if the stop flag was set without Stop() (a no-op when Stop() ran).
    RequestStop();
    {
      std::lock_guard lock(mu_);
      fetching_ = false;  // nothing more is queued or staged: HandBackUnstarted may start
    }
    room_cv_.notify_all();
    FinishDrain();
    return GivenUp();
  }

  ConsumerMetrics Metrics() const {
    ConsumerMetrics m;
    m.messages = n_.messages.load();
    m.acquired = n_.acquired.load();
    m.duplicates = n_.duplicates.load();
    m.busy = n_.busy.load();
    m.takeovers = n_.takeovers.load();
    m.lost_leases = n_.lost_leases.load();
    m.retries = n_.retries.load();
    m.dead_lettered = n_.dead_lettered.load();
    m.store_errors = n_.store_errors.load();
    m.claim_errors = n_.claim_errors.load();
    m.acked = n_.acked.load();
    m.redelivered = n_.redelivered.load();
    m.held_back = n_.held_back.load();
    m.waited_for_copy = n_.waited_for_copy.load();
    m.broker_errors = n_.broker_errors.load();
    m.ack_errors = n_.ack_errors.load();
    m.retry_errors = n_.retry_errors.load();
    m.dead_letter_errors = n_.dead_letter_errors.load();
    m.hand_back_errors = n_.hand_back_errors.load();
    m.acked_with_complete = n_.acked_with_complete.load();
    m.claim_batches = n_.claim_batches.load();
    m.claimed_in_batches = n_.claimed_in_batches.load();
    m.ack_batches = n_.ack_batches.load();
    m.acked_in_batches = n_.acked_in_batches.load();
    m.complete_batches = n_.complete_batches.load();
    m.completed_in_batches = n_.completed_in_batches.load();
    return m;
  }

  const ConsumerOptions& options() const { return o_; }

 private:
  // A handler's outcome waiting for the completer.
  struct Done {
    std::unique_ptr<Delivery> delivery;
    PendingOutcome pending;
    std::chrono::steady_clock::time_point ended;  // when its handler ended
  };

  // A delivery waiting for the acker.
  struct WaitingAck {
    std::unique_ptr<Delivery> delivery;
    std::chrono::steady_clock::time_point ended;  // when its handler ended
  };

  struct Job {
    std::unique_ptr<Delivery> delivery;
    std::optional<StatusOr<ClaimGuard>> claim;  // made by a batch claim
  };

  // A key of which this Consumer holds a copy (a delivery fetched, queued,
  // claimed or in its claim, running, or its outcome waiting for the completer)
  // whose outcome is not yet known, and the later deliveries of the key waiting
  // for it. Claimed now, such a delivery would be BUSY against this very
  // Consumer's claim and come back only after the lease; claimed once the copy's
  // outcome is written, it gets what a single claim gets then (DUPLICATE, or a
  // fresh claim when the copy gave its claim up).
  struct HeldKey {
    const Delivery* holder = nullptr;  // the copy whose outcome they wait for
    bool deferred = false;             // its outcome waits for the completer
    std::optional<Job> waiting;        // a later delivery of the key (one at most)
  };

  std::atomic<int64_t> last_retry_log_ns_{0};  // NoteRetry's rate bound
  std::atomic<uint64_t> unlogged_retries_{0};

  struct Counters {
    std::atomic<uint64_t> messages{0}, acquired{0}, duplicates{0}, busy{0}, takeovers{0},
        lost_leases{0}, retries{0}, dead_lettered{0}, store_errors{0}, claim_errors{0}, acked{0},
        redelivered{0}, held_back{0}, waited_for_copy{0}, broker_errors{0}, ack_errors{0},
        retry_errors{0}, dead_letter_errors{0}, hand_back_errors{0}, acked_with_complete{0},
        claim_batches{0}, claimed_in_batches{0}, ack_batches{0}, acked_in_batches{0},
        complete_batches{0}, completed_in_batches{0};
  };

  void Log(const std::string& line) const {
    if (o_.log) return o_.log(line);
    std::fprintf(stderr, "%s: %s\n", o_.log_name.c_str(), line.c_str());
  }

  // Delivery::InProgress() for every delivery held (queued, claimed ahead,
  // running, waiting for its ack), once per heartbeat interval of the Buffer:
  // the broker's own redelivery timer (JetStream's AckWait) must not run out
  // while the claim is kept alive, least of all for what the prefetch window
  // fetched ahead and waits its turn. Under mu_: a delivery leaves held_ before
  // it is destroyed.
  void SendInProgress() {
    std::lock_guard lock(mu_);
    for (const auto& [id, d] : held_) {
      if (!d->InProgress().ok()) n_.broker_errors.fetch_add(1, std::memory_order_relaxed);
    }
  }

  // Deliveries waiting for a copy of their key (HeldKey, one per key held) do
  // not count against the window: counted in it, the copies of a key sent many
  // times while its handler ran long took the whole window, and no other key
  // was fetched until that handler ended.
  int Room() const {
    return o_.concurrency + prefetch_ - static_cast<int>(queue_.size()) - running_;
  }
  // Whether the fetch thread fetches now (mu_ held): once half the window
  // (concurrency + prefetch) is free, or as soon as a handler thread would have
  // nothing to do. Not at every freed slot: with slow handlers (processes) that
  // was one broker round trip and two wake-ups per message, for a batch of one.
  bool FetchWanted() const {
    const int room = Room();
    if (room <= 0) return false;
    const int window = o_.concurrency + prefetch_;
    const int waiting = static_cast<int>(queue_.size() + staged_.size()) + claiming_;
    return room >= std::max(1, window / 2) || running_ + waiting < o_.concurrency;
  }

  // ConsumerOptions::prefetch_time (mu_ held): the prefetch that covers about
  // prefetch_time of handler work at the average handler time (a moving average
  // of the last few dozen), within [concurrency, 16 x concurrency].
  void AdaptPrefetch(std::chrono::steady_clock::duration took) {
    const int64_t ns = std::max<int64_t>(1, std::chrono::nanoseconds(took).count());
    handler_ns_ = handler_ns_ == 0 ? ns : handler_ns_ + (ns - handler_ns_) / 16;
    const int64_t budget = std::chrono::nanoseconds(o_.prefetch_time).count();
    const int64_t c = o_.concurrency;
    const int64_t want = c * (budget / std::max<int64_t>(1, handler_ns_));
    prefetch_ = static_cast<int>(std::clamp<int64_t>(want, c, std::min<int64_t>(16 * c, 65536)));
  }

  void Enqueue(std::vector<std::unique_ptr<Delivery>> batch) {
    // Drop what this Consumer already holds (queued or running); set aside what
    // must wait for a copy of its key held here (HeldKey).
    std::vector<Job> jobs;
    jobs.reserve(batch.size());
    int set_aside = 0;
    bool hurry = false;  // a copy waited for has its outcome with the completer
    {
      std::lock_guard lock(mu_);
      for (auto& d : batch) {
        if (d == nullptr) continue;
        if (!held_.emplace(d->id(), d.get()).second) {
          n_.held_back.fetch_add(1, std::memory_order_relaxed);
          continue;
        }
        if (Guarded(*d)) {
          auto [it, fresh] = held_keys_.try_emplace(d->key());
          if (fresh) it->second.holder = d.get();
          // One delivery waits per key (a message published twice); a further
          // one is claimed at once, as any delivery: BUSY against this
          // Consumer's own claim, back after the lease left (or DUPLICATE, once
          // the copy's outcome is written). Waiting copies hold deliveries the
          // broker counts as unacked (RabbitMQ's prefetch, NATS's
          // max_ack_pending): the copies of a key published many times while
          // its handler ran long took all of them, and no other key came.
          if (!fresh && !it->second.waiting) {
            it->second.waiting = Job{std::move(d), std::nullopt};
            hurry = hurry || it->second.deferred;
            ++set_aside;
            n_.waited_for_copy.fetch_add(1, std::memory_order_relaxed);
            continue;
          }
        }
        jobs.push_back(Job{std::move(d), std::nullopt});
      }
    }
    unfinished_.fetch_add(static_cast<int>(jobs.size()) + set_aside, std::memory_order_relaxed);
    if (hurry) HurryCompleter();
    if (jobs.empty()) return;
    if (buffer_ != nullptr && o_.batch_claims && ClaimableCount(jobs) > 1) {
      // The claim stage: a handler thread claims the batch with one ClaimBatch
      // while this thread fetches the next one. One batch at a time waits there
      // (beyond the concurrency + prefetch window). When the stage still holds
      // the previous batch, this thread claims its own batch itself and queues
      // it, instead of sleeping until the stage is free: that sleep only delayed
      // the next fetch, and the two claims now run at once. Either way every
      // claim is decided before its handler runs, and what this thread queues
      // counts against the window. So it does too when no handler thread is
      // idle to take the stage: the batch would wait there unclaimed until a
      // handler ends, not "claimed ahead" (ConsumerOptions::prefetch).
      bool staged = false;
      {
        std::lock_guard lock(mu_);
        // Stopped: no handler takes it any more; HandBackUnstarted gives it back.
        if ((staged_.empty() && claiming_ == 0 && idle_ > 0) ||
            stop_->load(std::memory_order_relaxed)) {
          for (Job& j : jobs) staged_.push_back(std::move(j));
          staged = true;
        }
      }
      if (staged) {
        work_cv_.notify_one();
        return;
      }
      ClaimAll(jobs);
    }
    Push(std::move(jobs));
  }

  // Queues claimed (or unclaimable) jobs and wakes as many idle handlers as there
  // are jobs, not every handler: each wakeup is a context switch.
  void Push(std::vector<Job> jobs) {
    int wake = 0;
    {
      std::lock_guard lock(mu_);
      for (Job& j : jobs) queue_.push_back(std::move(j));
      wake = std::min(static_cast<int>(jobs.size()), idle_);
    }
    Wake(wake);
  }

  // Wakes n idle handlers: one signal for one, one broadcast for several (a signal
  // each would let every woken thread preempt this one in turn).
  void Wake(int n) {
    if (n == 1) work_cv_.notify_one();
    if (n > 1) work_cv_.notify_all();
  }

  static size_t ClaimableCount(const std::vector<Job>& jobs) {
    size_t n = 0;
    for (const Job& j : jobs) {
      if (j.delivery->key_error().empty() && !j.delivery->key().empty()) ++n;
    }
    return n;
  }

  // Whether the delivery's key is claimed through the Buffer here, so that a
  // later delivery of the key waits for its outcome (HeldKey). Not with a
  // Processor (MakeWith): the guard it compares must meet every copy as it comes.
  bool Guarded(const Delivery& d) const {
    return buffer_ != nullptr && !process_ && d.key_error().empty() && !d.key().empty();
  }

  // The copy of `key` (a Guarded delivery) has its outcome: written, its claim
  // given up, or its claim answered without running. The delivery
  // waiting for it goes to the front of the queue (fetched before what is
  // queued behind it), to be claimed alone; the key stays held by it. mu_ held;
  // true when a handler should be woken.
  // Not the copy waited for (one claimed at once past the waiting bound, or a
  // key handed back by the drain): nothing.
  bool EndCopyLocked(const Delivery& d) {
    auto it = held_keys_.find(d.key());
    if (it == held_keys_.end() || it->second.holder != &d) return false;
    if (!it->second.waiting) {
      held_keys_.erase(it);
      return false;
    }
    it->second.holder = it->second.waiting->delivery.get();
    queue_.push_front(std::move(*it->second.waiting));
    it->second.waiting.reset();
    it->second.deferred = false;
    return true;
  }

  void EndCopy(const Delivery& d) {
    bool wake = false;
    {
      std::lock_guard lock(mu_);
      wake = EndCopyLocked(d) && idle_ > 0;
    }
    if (wake) work_cv_.notify_one();
  }

  // The copy's outcome goes to the completer; true when a delivery of the key
  // waits for it (the completer is then asked not to wait for more).
  bool DeferCopy(const Delivery& d) {
    std::lock_guard lock(mu_);
    auto it = held_keys_.find(d.key());
    if (it == held_keys_.end() || it->second.holder != &d) return false;
    it->second.deferred = true;
    return it->second.waiting.has_value();
  }

  // Asks the completer to write what waits now (or its next outcome at once):
  // a delivery waits for one of them.
  void HurryCompleter() {
    if (!completer_.joinable()) return;
    {
      std::lock_guard lock(done_mu_);
      ++hurry_;
    }
    done_cv_.notify_one();
  }

  // One Buffer::ClaimBatch for the keyed deliveries of the batch (a key held
  // here already is not among them: it waits, HeldKey).
  void ClaimAll(std::vector<Job>& jobs) {
    std::vector<ClaimItem> items;
    std::vector<size_t> where;
    items.reserve(jobs.size());
    where.reserve(jobs.size());
    for (size_t i = 0; i < jobs.size(); ++i) {
      const Delivery& d = *jobs[i].delivery;
      if (!d.key_error().empty() || d.key().empty()) continue;
      items.push_back(ClaimItem{d.key(), d.payload()});
      where.push_back(i);
    }
    if (items.size() < 2) return;
    std::vector<StatusOr<ClaimGuard>> claims = buffer_->ClaimBatch(items);
    n_.claim_batches.fetch_add(1, std::memory_order_relaxed);
    n_.claimed_in_batches.fetch_add(items.size(), std::memory_order_relaxed);
    for (size_t j = 0; j < where.size(); ++j) jobs[where[j]].claim.emplace(std::move(claims[j]));
  }

  void HandlerLoop() {
    while (true) {
      Job job;
      {
        std::unique_lock lock(mu_);
        // Once stopped, nothing new starts: what is queued is handed back by
        // HandBackUnstarted, which waits for the fetch thread's last Fetch or claim.
        ++idle_;
        work_cv_.wait(lock, [this] {
          return ((!queue_.empty() || !staged_.empty()) &&
                  !stop_->load(std::memory_order_relaxed)) ||
                 draining_;
        });
        --idle_;
        if (stop_->load(std::memory_order_relaxed) || (queue_.empty() && staged_.empty())) {
          if (draining_) return;  // draining: HandBackUnstarted takes what is left
          continue;
        }
        if (!staged_.empty()) {
          // The claim stage: this thread claims the staged batch (first, so that
          // its answers are back when the queue runs dry), queues it and takes
          // a job itself.
          std::vector<Job> jobs = std::move(staged_);
          staged_.clear();
          claiming_ = static_cast<int>(jobs.size());
          lock.unlock();
          ClaimAll(jobs);
          lock.lock();
          claiming_ = 0;
          for (Job& j : jobs) queue_.push_back(std::move(j));
          const int wake = std::min(static_cast<int>(queue_.size()) - 1, idle_);
          // The fetch thread never waits for the stage (Enqueue): it is woken
          // here only when it waits for room and may now fetch, or for
          // HandBackUnstarted, which waits for claims in flight once stopped.
          const bool notify_room =
              (fetch_waiting_ && FetchWanted()) || stop_->load(std::memory_order_relaxed);
          lock.unlock();
          Wake(wake);
          if (notify_room) room_cv_.notify_all();
          lock.lock();
          // Stopped: HandBackUnstarted gives them back. Empty: the woken
          // handlers took them.
          if (stop_->load(std::memory_order_relaxed) || queue_.empty()) continue;
        }
        job = std::move(queue_.front());
        queue_.pop_front();
        ++running_;
      }
      const auto started = adaptive_prefetch_ ? std::chrono::steady_clock::now()
                                              : std::chrono::steady_clock::time_point();
      Handle(job);
      bool notify_room = false;
      {
        std::lock_guard lock(mu_);
        --running_;
        if (adaptive_prefetch_) AdaptPrefetch(std::chrono::steady_clock::now() - started);
        // The fetch thread waits for room (woken only when it will fetch: each
        // wake-up is a context switch); StopLateHandlers for no handler
        // running, once stopping (before, at concurrency 1, that was a wake-up
        // per message).
        notify_room = (fetch_waiting_ && FetchWanted()) ||
                      (running_ == 0 && (draining_ || stop_->load(std::memory_order_relaxed)));
      }
      if (notify_room) room_cv_.notify_all();
      if (unfinished_.fetch_sub(1, std::memory_order_acq_rel) == 1 && completer_.joinable()) {
        // No handler is running and none queued: what waits will not grow soon.
        { std::lock_guard lock(done_mu_); }
        done_cv_.notify_one();
      }
    }
  }

  // Settles the delivery (out of the held set first), or hands it to the acker
  // or the completer, which settle it later.
  void Handle(Job& job) {
    Delivery& d = *job.delivery;
    n_.messages.fetch_add(1, std::memory_order_relaxed);
    if (d.delivery_count() > 1) n_.redelivered.fetch_add(1, std::memory_order_relaxed);
    if (!d.key_error().empty()) {
      Unhold(std::span<const std::unique_ptr<Delivery>>(&job.delivery, 1));
      Settle(d, BrokerAction::kDeadLetter, Millis(0), d.key_error(), false);
      return;
    }
    Consumer::WatchStop(d, &handlers_stop_);
    Processed p;
    if (process_) {
      p = process_(d);
    } else {
      auto run = [&](ClaimGuard& g) {
        // Stopped by a drain whose time is gone: no outcome, so the claim is
        // given up with one release try (as for what never started), not the
        // retries of an outcome write; also when the handler throws (Buffer
        // takes that as Retry).
        HandlerResult r;
        try {
          r = handler_(d, g);
        } catch (...) {
          if (handlers_stop_.load()) NoteGivenUp(g.ReleaseOnce().status(), false);
          throw;
        }
        if (r.kind == HandlerResult::Kind::kRetry && handlers_stop_.load()) {
          NoteGivenUp(g.ReleaseOnce().status(), false);
        }
        return r;
      };
      const BrokerAck* ack = d.fused_ack();
      std::variant<Processed, PendingOutcome> r =
          job.claim.has_value()
              ? buffer_->ProcessClaimedDeferred(d.key(), std::move(*job.claim), run, ack)
              : buffer_->ProcessOnceDeferred(d.key(), d.payload(), run, ack);
      if (PendingOutcome* pending = std::get_if<PendingOutcome>(&r)) {
        if (!completer_.joinable()) {
          p = buffer_->CompleteBatch(std::span<PendingOutcome>(pending, 1))[0];
        } else {
          if (DeferCopy(d)) HurryCompleter();
          Defer(std::move(job.delivery), std::move(*pending));
          return;
        }
      } else {
        p = std::move(std::get<Processed>(r));
      }
      EndCopy(d);
    }
    Count(p);
    // Stopped by the drain without an outcome (its claim is released): back to
    // the broker at once, not after the retry delay.
    if (p.ran && p.action == BrokerAction::kRetry && handlers_stop_.load()) {
      p.retry_after = Millis(0);
    }
    if (p.action == BrokerAction::kAck && !p.acked_with_complete && acker_.joinable()) {
      {
        std::lock_guard lock(ack_mu_);
        acks_.push_back(WaitingAck{std::move(job.delivery), std::chrono::steady_clock::now()});
      }
      ack_cv_.notify_one();
      return;
    }
    Unhold(std::span<const std::unique_ptr<Delivery>>(&job.delivery, 1));
    NoteRetry(d, p);
    Settle(d, p.action, p.retry_after, p.reason, p.acked_with_complete);
  }

  // Hands a handler's outcome to the completer. Waits while the completer is a
  // few batches behind, so that outcomes never pile up without bound.
  void Defer(std::unique_ptr<Delivery> d, PendingOutcome&& pending) {
    const auto ended = std::chrono::steady_clock::now();
    bool wake = false;
    {
      std::unique_lock lock(done_mu_);
      space_cv_.wait(lock, [this] {
        return static_cast<int>(done_.size()) < 4 * o_.max_ack_batch || done_stop_;
      });
      wake = done_.empty();
      done_.emplace_back(std::move(d), std::move(pending), ended);
      wake = wake || static_cast<int>(done_.size()) == o_.max_ack_batch;
    }
    // Only what changes the completer's mind wakes it (a first outcome starts its
    // clock; a full batch ends the wait; HandlerLoop wakes it when none is left
    // running): a wakeup per outcome would cost a context switch each.
    if (wake) done_cv_.notify_one();
  }

  // The completer: takes the waiting outcomes when max_ack_batch wait, the oldest
  // has waited max_ack_delay, no handler is running (nothing more is coming
  // soon), or a delivery waits for one of them (HurryCompleter), records them with one Buffer::CompleteBatch, then settles them (one
  // AckBatch for the acks the store did not fuse).
  void CompleteLoop() {
    std::unique_lock lock(done_mu_);
    while (true) {
      done_cv_.wait(lock, [this] { return !done_.empty() || done_stop_; });
      if (done_.empty()) return;  // stopping and nothing left
      // The oldest one's wait: counted from its handler's end (outcomes left
      // from a batch taken earlier have waited since before it was taken).
      done_cv_.wait_until(lock, done_.front().ended + o_.max_ack_delay, [this] {
        return static_cast<int>(done_.size()) >= o_.max_ack_batch || done_stop_ ||
               hurry_ > 0 || unfinished_.load(std::memory_order_acquire) == 0;
      });
      hurry_ = 0;
      // Straight into the two arrays FlushCompletions works on: a PendingOutcome
      // is large, and each move of it costs about a thousand instructions.
      const size_t n = std::min(done_.size(), static_cast<size_t>(o_.max_ack_batch));
      std::vector<std::unique_ptr<Delivery>> deliveries;
      std::vector<PendingOutcome> pending;
      deliveries.reserve(n);
      pending.reserve(n);
      for (size_t i = 0; i < n; ++i) {
        deliveries.push_back(std::move(done_.front().delivery));
        pending.push_back(std::move(done_.front().pending));
        done_.pop_front();
      }
      lock.unlock();
      space_cv_.notify_all();
      FlushCompletions(deliveries, pending);
      lock.lock();
    }
  }

  void FlushCompletions(std::vector<std::unique_ptr<Delivery>>& deliveries,
                        std::vector<PendingOutcome>& pending) {
    std::vector<Processed> ps = buffer_->CompleteBatch(pending);
    n_.complete_batches.fetch_add(1, std::memory_order_relaxed);
    n_.completed_in_batches.fetch_add(deliveries.size(), std::memory_order_relaxed);
    int wake = 0;
    {
      std::lock_guard lock(mu_);
      for (const auto& d : deliveries) wake += EndCopyLocked(*d) ? 1 : 0;
      wake = std::min(wake, idle_);
    }
    Wake(wake);
    Unhold(deliveries);
    std::vector<Delivery*> acks;
    for (size_t i = 0; i < deliveries.size(); ++i) {
      const Processed& p = ps[i];
      Count(p);
      if (p.action == BrokerAction::kAck && !p.acked_with_complete) {
        acks.push_back(deliveries[i].get());
      } else {
        NoteRetry(*deliveries[i], p);
        Settle(*deliveries[i], p.action, p.retry_after, p.reason, p.acked_with_complete);
      }
    }
    if (!acks.empty()) AckAll(acks);
  }

  // Sends the waiting acks in batches: when max_ack_batch wait, or the oldest
  // has waited max_ack_delay.
  void AckLoop() {
    std::unique_lock lock(ack_mu_);
    while (true) {
      ack_cv_.wait(lock, [this] { return !acks_.empty() || ack_stop_; });
      if (acks_.empty()) return;  // stopping and nothing left
      ack_cv_.wait_until(lock, acks_.front().ended + o_.max_ack_delay, [this] {
        return static_cast<int>(acks_.size()) >= o_.max_ack_batch || ack_stop_;
      });
      std::vector<std::unique_ptr<Delivery>> batch;
      const size_t n = std::min(acks_.size(), static_cast<size_t>(o_.max_ack_batch));
      batch.reserve(n);
      for (size_t i = 0; i < n; ++i) {
        batch.push_back(std::move(acks_.front().delivery));
        acks_.pop_front();
      }
      lock.unlock();
      FlushAcks(batch);
      lock.lock();
    }
  }

  // One MessageSource::AckBatch, counted per delivery as the broker answered:
  // the acks it took in acked, the others in ack_errors, with one log line per
  // distinct error naming the deliveries it failed.
  void AckAll(std::span<Delivery* const> deliveries) {
    std::vector<Status> st = source_->AckBatch(deliveries);
    if (st.size() != deliveries.size()) {
      // A source that answers for other deliveries than it was given: none is known.
      st.assign(deliveries.size(),
                Status::Internal("AckBatch answered " + std::to_string(st.size()) +
                                 " statuses for " + std::to_string(deliveries.size()) +
                                 " deliveries"));
    }
    n_.ack_batches.fetch_add(1, std::memory_order_relaxed);
    size_t ok = 0;
    // Each distinct error, the deliveries it failed (in the batch's order).
    std::vector<std::pair<std::string, std::vector<std::string>>> failed;
    for (size_t i = 0; i < st.size(); ++i) {
      if (st[i].ok()) {
        ++ok;
        continue;
      }
      // Not acked: the broker delivers it again; its outcome is recorded, so
      // the next delivery gets DUPLICATE and acks.
      const std::string why = st[i].ToString();
      auto it = std::find_if(failed.begin(), failed.end(),
                             [&](const auto& f) { return f.first == why; });
      if (it == failed.end()) {
        failed.emplace_back(why, std::vector<std::string>());
        it = failed.end() - 1;
      }
      it->second.push_back(deliveries[i]->id());
    }
    n_.acked.fetch_add(ok, std::memory_order_relaxed);
    n_.acked_in_batches.fetch_add(ok, std::memory_order_relaxed);
    const size_t errors = deliveries.size() - ok;
    n_.broker_errors.fetch_add(errors, std::memory_order_relaxed);
    n_.ack_errors.fetch_add(errors, std::memory_order_relaxed);
    constexpr size_t kIdsShown = 8;
    for (const auto& [why, ids] : failed) {
      std::string shown;
      for (size_t i = 0; i < ids.size() && i < kIdsShown; ++i) {
        shown += (i == 0 ? "" : ", ") + internal::Printable(ids[i]);
      }
      if (ids.size() > kIdsShown) shown += ", ...";
      Log("ack of " + std::to_string(ids.size()) + " deliveries (" + shown + ") of a batch of " +
          std::to_string(deliveries.size()) + ": " + why);
    }
  }

  void FlushAcks(std::vector<std::unique_ptr<Delivery>>& batch) {
    std::vector<Delivery*> ptrs;
    ptrs.reserve(batch.size());
    for (auto& d : batch) ptrs.push_back(d.get());
    Unhold(batch);
    AckAll(ptrs);
  }

  // Takes the deliveries out of the held set, right BEFORE they are settled: once
  // the broker has a settlement (a Retry(after) that comes due, a failed ack
  // left pending), it may hand the message out again at any moment, with the same
  // id, and this Consumer must take that delivery, not drop it as held here (no
  // one would settle it: it would wait for the broker's own redelivery, a
  // visibility timeout or reclaim min-idle later). Only the entry of this very
  // delivery is removed: one of a later delivery of the id stays.
  void Unhold(std::span<const std::unique_ptr<Delivery>> deliveries) {
    std::lock_guard lock(mu_);
    for (const auto& d : deliveries) {
      auto it = held_.find(d->id());
      if (it != held_.end() && it->second == d.get()) held_.erase(it);
    }
  }

  void Count(const Processed& p) {
    if (!p.status.ok()) {
      NoteGivenUp(p.status, p.claim.outcome != ClaimOutcome::kAcquired);
      if (p.action != BrokerAction::kDeadLetter) n_.store_errors.fetch_add(1);
      // A claim the store could not answer (p.claim is then the default, never
      // ACQUIRED) is a claim error and nothing more. One it answered ACQUIRED
      // whose outcome write then failed still ran its handler: counted below
      // (acquired), not as a claim error.
      if (p.claim.outcome != ClaimOutcome::kAcquired) {
        if (p.action != BrokerAction::kDeadLetter) n_.claim_errors.fetch_add(1);
        return;
      }
    }
    switch (p.claim.outcome) {
      case ClaimOutcome::kAcquired:
        n_.acquired.fetch_add(1, std::memory_order_relaxed);
        if (p.claim.attempt > 1) n_.takeovers.fetch_add(1, std::memory_order_relaxed);
        break;
      case ClaimOutcome::kDuplicate: n_.duplicates.fetch_add(1, std::memory_order_relaxed); break;
      case ClaimOutcome::kBusy: n_.busy.fetch_add(1, std::memory_order_relaxed); break;
      default: break;
    }
    if (p.ran && p.completion == WriteResult::kLost) n_.lost_leases.fetch_add(1);
  }

  // Why a message goes back for later, in the log: a handler that failed (its
  // exit, a SQL error), a store error. Without it a worker retried a failing
  // handler for ever with nothing but a counter to show. At most one line a
  // second, saying how many were left out since the last; a claim BUSY against
  // another owner (the normal wait for a lease) is not logged.
  void NoteRetry(const Delivery& d, const Processed& p) {
    if (p.action != BrokerAction::kRetry) return;
    if (p.status.ok() && !p.ran && p.claim.outcome == ClaimOutcome::kBusy) return;
    const int64_t now = std::chrono::duration_cast<std::chrono::nanoseconds>(
                            std::chrono::steady_clock::now().time_since_epoch())
                            .count();
    int64_t last = last_retry_log_ns_.load(std::memory_order_relaxed);
    if (last != 0 && now - last < 1'000'000'000) {
      unlogged_retries_.fetch_add(1, std::memory_order_relaxed);
      return;
    }
    if (!last_retry_log_ns_.compare_exchange_strong(last, now, std::memory_order_relaxed)) {
      unlogged_retries_.fetch_add(1, std::memory_order_relaxed);
      return;
    }
    const uint64_t left_out = unlogged_retries_.exchange(0, std::memory_order_relaxed);
    Log("retry of " + internal::Printable(d.id()) + " (key '" +
        internal::Printable(internal::CutAtCharacter(d.key(), kMaxLoggedKeyBytes)) + "') in " +
        std::to_string(p.retry_after.count()) + " ms: " +
        internal::Printable(internal::CutAtCharacter(p.reason, kMaxLoggedReasonBytes)) +
        (left_out == 0 ? std::string()
                       : " (" + std::to_string(left_out) +
                             " more retries since the last such line, not shown)"));
  }

  void Settle(Delivery& d, BrokerAction action, Millis retry_after, const std::string& reason,
              bool acked_with_complete) {
    Status s;
    switch (action) {
      case BrokerAction::kAck:
        if (acked_with_complete) {
          d.MarkAcked();
          n_.acked_with_complete.fetch_add(1, std::memory_order_relaxed);
        } else {
          s = d.Ack();
        }
        if (s.ok()) n_.acked.fetch_add(1, std::memory_order_relaxed);
        break;
      case BrokerAction::kRetry:
        s = d.Retry(retry_after);
        if (s.ok()) n_.retries.fetch_add(1, std::memory_order_relaxed);
        break;
      case BrokerAction::kDeadLetter:
        s = d.DeadLetter(reason);
        if (s.ok()) {
          n_.dead_lettered.fetch_add(1, std::memory_order_relaxed);
          // The key cut as the reason is: a producer's 60 KB keys made 60 KB log lines.
          Log("dead-lettered " + internal::Printable(d.id()) + " (key '" +
              internal::Printable(internal::CutAtCharacter(d.key(), kMaxLoggedKeyBytes)) + "'): " +
              internal::Printable(internal::CutAtCharacter(reason, kMaxLoggedReasonBytes)));
        }
        break;
    }
    if (!s.ok()) {
      // Not settled: the broker delivers it again (the outcome, if any, is
      // recorded, so the next delivery gets DUPLICATE).
      n_.broker_errors.fetch_add(1, std::memory_order_relaxed);
      (action == BrokerAction::kAck     ? n_.ack_errors
       : action == BrokerAction::kRetry ? n_.retry_errors
                                        : n_.dead_letter_errors)
          .fetch_add(1, std::memory_order_relaxed);
      Log(std::string(BrokerActionName(action)) + " of " + d.id() + ": " + s.ToString());
    }
  }

  // The drain is bounded by drain_timeout from its start, the moment Stop() was
  // called: this thread waits for it (the semaphore Stop() posts) and begins the
  // drain at once, while the fetch thread may still wait in a Fetch or a claim
  // of its own (a broker or store that hangs would otherwise start the clock a
  // timeout late). What never started is handed back on a thread of its own
  // while the running handlers go on, and Delivery::InProgress() goes on being
  // sent until the drain ends (a handler still running must not pass the
  // broker's redelivery timer, e.g. JetStream's AckWait, while this worker
  // drains).
  void DrainOnStop() {
    while (!stop_->load(std::memory_order_acquire)) {
      if (stop_ns_.load(std::memory_order_acquire) != 0) {
        // Between Stop()'s wake-up and its stop flag (set last, see RequestStop):
        // no handler may see the drain begin before the flag.
        std::this_thread::sleep_for(Millis(1));
        continue;
      }
      // EINTR: a signal handler ran on this thread; look again.
      (void)sem_wait(&stop_sem_);
    }
    const int64_t since_stop_ns = std::max<int64_t>(0, MonotonicNs() - stop_ns_.load());
    const auto deadline = std::chrono::steady_clock::now() + o_.drain_timeout -
                          std::chrono::nanoseconds(since_stop_ns);
    if (progress_every_.count() > 0) progress_ = std::thread([this] { DrainProgressLoop(); });
    {
      std::lock_guard lock(mu_);
      draining_ = true;
    }
    work_cv_.notify_all();
    if (store_to_stop_ != nullptr && o_.stop_store_waits) {
      store_stopper_ = std::thread([this, deadline] { StopStoreWaitsAt(deadline); });
    }
    std::thread hand_back([this] { HandBackUnstarted(); });
    StopLateHandlers(deadline);
    hand_back.join();
  }

  // At the drain's deadline, unless the drain is over: the store waits no more
  // than kDrainStoreGrace for any answer (ConsumerOptions::stop_store_waits).
  void StopStoreWaitsAt(std::chrono::steady_clock::time_point deadline) {
    {
      std::unique_lock lock(mu_);
      if (drain_cv_.wait_until(lock, deadline, [this] { return drained_; })) return;
    }
    store_told_.store(true);
    store_to_stop_->StopWaiting(ConsumerOptions::kDrainStoreGrace);
  }

  // A store call that failed: given up, when the store was told to stop waiting
  // and answers Aborted. `claim`: a claim, else a write of a claim it had made
  // (an outcome, a release).
  void NoteGivenUp(const Status& s, bool claim) {
    if (s.ok() || s.code() != StatusCode::kAborted || !store_told_.load()) return;
    (claim ? given_up_claims_ : given_up_writes_).fetch_add(1);
    std::lock_guard lock(given_up_mu_);
    if (given_up_first_.empty()) given_up_first_ = s.ToString();
  }

  // Run()'s answer: Aborted saying what the drain gave up, else OK.
  Status GivenUp() {
    const uint64_t claims = given_up_claims_.load(), writes = given_up_writes_.load();
    if (claims + writes == 0) return Status::Ok();
    std::string first;
    {
      std::lock_guard lock(given_up_mu_);
      first = given_up_first_;
    }
    std::string what = "store calls given up at the drain deadline (" +
                       std::to_string(o_.drain_timeout.count()) + " ms, then " +
                       std::to_string(ConsumerOptions::kDrainStoreGrace.count()) +
                       " ms without an answer) for " + std::to_string(claims + writes) +
                       " deliveries: " + std::to_string(claims) + " claim(s), " +
                       std::to_string(writes) +
                       " outcome write(s) or release(s); their deliveries were not acked and "
                       "nothing was recorded as done for them (a claim the store may have "
                       "made stays held until its lease ends, then is taken over); first: " +
                       first;
    Log("drain: " + what);
    return Status::Aborted("drain: " + what);
  }

  // The rest of the drain, on the fetch thread once its loop has ended: waits
  // for DrainOnStop, the handlers, then what the completer and the acker hold.
  void FinishDrain() {
    drainer_.join();
    for (auto& t : threads_) t.join();
    threads_.clear();
    if (completer_.joinable()) {
      {
        std::lock_guard lock(done_mu_);
        done_stop_ = true;
      }
      done_cv_.notify_all();
      completer_.join();  // records and settles what is left first
    }
    if (acker_.joinable()) {
      {
        std::lock_guard lock(ack_mu_);
        ack_stop_ = true;
      }
      ack_cv_.notify_all();
      acker_.join();  // sends what is left first
    }
    {
      std::lock_guard lock(mu_);
      drained_ = true;
    }
    drain_cv_.notify_all();
    if (progress_.joinable()) progress_.join();
    if (store_stopper_.joinable()) store_stopper_.join();
  }

  static int64_t MonotonicNs() {
    timespec ts{};
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return static_cast<int64_t>(ts.tv_sec) * 1'000'000'000 + ts.tv_nsec;
  }

  // SendInProgress during the drain: at once, then every heartbeat interval
  // until the drain ends (the fetch loop that sent it before has ended).
  void DrainProgressLoop() {
    std::unique_lock lock(mu_);
    while (!drained_) {
      lock.unlock();
      SendInProgress();
      lock.lock();
      drain_cv_.wait_for(lock, progress_every_, [this] { return drained_; });
    }
  }

  // Gives back what never started (queued, claimed ahead, or staged): its claim
  // released with one try, then the delivery handed back with Retry(0), so the
  // broker may deliver it again at once. It does not wait on a store that does
  // not answer: once a release has failed (each further try would wait as long),
  // the claims left are abandoned (no release sent: each stays held until its lease runs
  // out, as a crashed worker's) and their deliveries still handed back, unacked.
  // The drain's deadline alone abandons nothing: a store that answers gets its
  // releases (SPEC: a worker asked to stop releases its claims). Nor does it
  // wait on a broker that does not answer: once a hand-back has failed, the
  // deliveries left are not handed back (they come back with the broker's own
  // redelivery: JetStream's AckWait, the Streams reclaim min-idle, RabbitMQ's
  // requeue when the connection closes).
  void HandBackUnstarted() {
    std::deque<Job> unstarted;
    {
      std::unique_lock lock(mu_);
      // A claim in flight queues its batch when it returns, and so may the
      // fetch thread (its Fetch, or a claim of its own): wait for them.
      room_cv_.wait(lock, [this] { return claiming_ == 0 && !fetching_; });
      unstarted.swap(queue_);
      for (Job& j : staged_) unstarted.push_back(std::move(j));
      staged_.clear();
      // Deliveries waiting for a copy of their key: nothing claimed, handed back
      // at once (the copy may still run: its end finds no key held).
      for (auto& [key, h] : held_keys_) {
        if (h.waiting) unstarted.push_back(std::move(*h.waiting));
      }
      held_keys_.clear();
    }
    unfinished_.fetch_sub(static_cast<int>(unstarted.size()), std::memory_order_acq_rel);
    size_t abandoned = 0, failed_hand_backs = 0, not_tried = 0;
    std::string why, broker_why;
    for (Job& j : unstarted) {
      if (j.claim.has_value() && !j.claim->ok()) NoteGivenUp(j.claim->status(), true);
      if (j.claim.has_value() && j.claim->ok() && (*j.claim)->active()) {
        ClaimGuard& g = **j.claim;
        if (why.empty()) {
          StatusOr<WriteResult> r = g.ReleaseOnce();
          NoteGivenUp(r.status(), false);
          if (!r.ok()) {
            why = "a release failed: " + r.status().ToString();
            ++abandoned;  // this one stays held too
          }
        } else {
          g.Abandon();
          ++abandoned;
        }
      }
      j.claim.reset();
      if (broker_why.empty()) {
        Status s = j.delivery->Retry(Millis(0));
        if (!s.ok()) {
          n_.broker_errors.fetch_add(1, std::memory_order_relaxed);
          n_.hand_back_errors.fetch_add(1, std::memory_order_relaxed);
          broker_why = s.ToString();
          ++failed_hand_backs;
        }
      } else {
        ++not_tried;  // not settled: counted as a failed one would be
        n_.broker_errors.fetch_add(1, std::memory_order_relaxed);
        n_.hand_back_errors.fetch_add(1, std::memory_order_relaxed);
      }
      std::lock_guard lock(mu_);
      held_.erase(j.delivery->id());
    }
    if (abandoned > 0) {
      Log("drain: " + std::to_string(abandoned) + " claim(s) of deliveries not started were "
          "not released (" + why + "): left to run out with their lease; deliveries handed "
          "back unacked");
    }
    if (!broker_why.empty()) {
      // One line with the count (hand_back_errors): they come back only on the
      // broker's own timer, which may be long (an AckWait of the lease + 1 s).
      Log("drain: " + std::to_string(failed_hand_backs + not_tried) + " deliveries not started "
          "were not handed back (" + std::to_string(failed_hand_backs) + " hand-back failed: " +
          broker_why + "; " + std::to_string(not_tried) + " not tried after it): the broker "
          "redelivers them unacked on its own timer");
    }
  }

  // Waits until `deadline` for the running handlers to end; then asks those
  // left to stop (Delivery::stop_requested(), stop_handlers).
  void StopLateHandlers(std::chrono::steady_clock::time_point deadline) {
    int left = 0;
    {
      std::unique_lock lock(mu_);
      room_cv_.wait_until(lock, deadline, [this] { return running_ == 0; });
      left = running_;
    }
    if (left == 0) return;
    handlers_stop_.store(true);
    Log("drain: " + std::to_string(left) + " handler(s) still running after " +
        std::to_string(o_.drain_timeout.count()) + " ms: stopping them (claims released, "
        "deliveries handed back)");
    if (o_.stop_handlers) o_.stop_handlers();
  }

  MessageSource* const source_;
  Buffer* const buffer_;
  // Told to stop waiting at the drain deadline (stop_store_waits): the Buffer's
  // store, or MakeWith's `store`; null: none.
  Store* const store_to_stop_;
  const Handler handler_;
  const Processor process_;
  ConsumerOptions o_;
  std::atomic<bool>* const stop_;
  // Stop(): its first call's CLOCK_MONOTONIC time (0 = not yet), and the
  // semaphore it posts to wake DrainOnStop.
  std::atomic<int64_t> stop_ns_{0};
  sem_t stop_sem_;
  std::thread drainer_;   // DrainOnStop
  std::thread progress_;  // DrainProgressLoop
  std::thread store_stopper_;  // StopStoreWaitsAt
  // The store was told to stop waiting; the calls it then gave up (Aborted).
  std::atomic<bool> store_told_{false};
  std::atomic<uint64_t> given_up_claims_{0}, given_up_writes_{0};
  std::mutex given_up_mu_;
  std::string given_up_first_;

  std::vector<std::thread> threads_;
  std::mutex mu_;
  std::condition_variable work_cv_, room_cv_;
  std::deque<Job> queue_;
  // The claim stage: a fetched batch waiting for a handler thread to claim it
  // with one ClaimBatch, and the size of the one being claimed (neither counts
  // against concurrency + prefetch: the next Fetch overlaps the claim).
  std::vector<Job> staged_;
  int claiming_ = 0;
  int idle_ = 0;                // handler threads waiting for work
  bool fetch_waiting_ = false;  // the fetch thread waits for room
  int running_ = 0;
  // Deliveries fetched ahead: o_.prefetch, or adapted (prefetch_time).
  int prefetch_ = 0;
  bool adaptive_prefetch_ = false;
  int64_t handler_ns_ = 0;  // moving average of the handler time (adaptive only)
  bool fetching_ = true;    // the fetch loop runs (it may still queue or stage)
  bool draining_ = false;
  bool drained_ = false;                // the drain has ended: DrainProgressLoop stops
  std::condition_variable drain_cv_;    // wakes DrainProgressLoop
  std::atomic<bool> handlers_stop_{false};  // drain_timeout passed: handlers stop
  // Keys with a copy held here (Guarded deliveries).
  std::unordered_map<std::string, HeldKey, internal::KeyHash, internal::KeyEq> held_keys_;
  // ids queued, running or waiting for their ack, and their deliveries
  std::unordered_map<std::string, Delivery*> held_;
  Millis progress_every_{0};  // SendInProgress: the Buffer's heartbeat interval
  Counters n_;

  // Outcomes waiting for the completer.
  std::thread completer_;
  std::mutex done_mu_;
  std::condition_variable done_cv_, space_cv_;
  std::deque<Done> done_;
  bool done_stop_ = false;
  int hurry_ = 0;  // HurryCompleter: write what waits now
  // Deliveries enqueued whose handler has not finished yet.
  std::atomic<int> unfinished_{0};

  std::thread acker_;
  std::mutex ack_mu_;
  std::condition_variable ack_cv_;
  std::deque<WaitingAck> acks_;
  bool ack_stop_ = false;
};

namespace {

Status ValidateConsumerOptions(const ConsumerOptions& o) {
  if (o.concurrency < 1 || o.concurrency > 4096) {
    return Status::InvalidArgument("consumer: concurrency must be 1 to 4096, got " +
                                   std::to_string(o.concurrency));
  }
  // -1 is the one negative value (concurrency, adaptive with prefetch_time);
  // -2 and below were read as -1 without a word.
  if (o.prefetch < -1 || o.prefetch > 65536) {
    return Status::InvalidArgument("consumer: prefetch must be -1 (= concurrency) or 0 to 65536, got " +
                                   std::to_string(o.prefetch));
  }
  if (o.max_ack_delay.count() < 0 || o.max_ack_delay > Millis(1'000)) {
    return Status::InvalidArgument("consumer: max ack delay must be 0 to 1000 ms, got " +
                                   std::to_string(o.max_ack_delay.count()) + " ms");
  }
  if (o.max_ack_batch < 1 || o.max_ack_batch > 100'000) {
    return Status::InvalidArgument("consumer: max ack batch must be 1 to 100000, got " +
                                   std::to_string(o.max_ack_batch));
  }
  if (o.drain_timeout.count() < 0 || o.drain_timeout > ConsumerOptions::kMaxDrainTimeout) {
    return Status::InvalidArgument("consumer: drain timeout must be 0 to " +
                                   internal::FormatDuration(ConsumerOptions::kMaxDrainTimeout) +
                                   ", got " +
                                   std::to_string(o.drain_timeout.count()) + " ms");
  }
  if (o.prefetch_time.count() < 0 || o.prefetch_time > ConsumerOptions::kMaxPrefetchTime) {
    return Status::InvalidArgument("consumer: prefetch time must be 0 to " +
                                   internal::FormatDuration(ConsumerOptions::kMaxPrefetchTime) +
                                   ", got " +
                                   std::to_string(o.prefetch_time.count()) + " ms");
  }
  if (o.fetch_wait.count() <= 0) {
    return Status::InvalidArgument("consumer: fetch wait must be positive, got " +
                                   std::to_string(o.fetch_wait.count()) + " ms");
  }
  return Status::Ok();
}

}  // namespace

Consumer::Consumer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Consumer::~Consumer() = default;

StatusOr<std::unique_ptr<Consumer>> Consumer::Make(MessageSource* source, Buffer* buffer,
                                                   Handler handler, ConsumerOptions options) {
  if (source == nullptr) return Status::InvalidArgument("consumer: no message source");
  if (buffer == nullptr) return Status::InvalidArgument("consumer: no buffer");
  if (!handler) return Status::InvalidArgument("consumer: no handler");
  DEDUP_RETURN_IF_ERROR(ValidateConsumerOptions(options));
  std::unique_ptr<Consumer> c(new Consumer(nullptr));
  c->impl_ = std::make_unique<Impl>(source, buffer, std::move(handler), Processor(),
                                    std::move(options), &c->stop_);
  return c;
}

StatusOr<std::unique_ptr<Consumer>> Consumer::MakeWith(MessageSource* source, Processor process,
                                                       ConsumerOptions options, Store* store) {
  if (source == nullptr) return Status::InvalidArgument("consumer: no message source");
  if (!process) return Status::InvalidArgument("consumer: no processor");
  DEDUP_RETURN_IF_ERROR(ValidateConsumerOptions(options));
  std::unique_ptr<Consumer> c(new Consumer(nullptr));
  c->impl_ = std::make_unique<Impl>(source, nullptr, Handler(), std::move(process),
                                    std::move(options), &c->stop_, store);
  return c;
}

Status Consumer::Run() { return impl_->Run(); }
void Consumer::Stop() { impl_->RequestStop(); }
ConsumerMetrics Consumer::metrics() const { return impl_->Metrics(); }
const ConsumerOptions& Consumer::options() const { return impl_->options(); }

// Sequentially consistent throughout, Dekker's way: Stop() counts itself in, then
// reads the Consumer; Detach() clears the Consumer, then reads the count. One of
// them sees the other's write: either Stop() finds no Consumer, or Detach() waits
// for that Stop() to count itself out (release: what it did to the Consumer
// happens before the Consumer goes). Attach() and the sticky flag likewise: either
// Stop() finds the Consumer, or Attach() sees the flag (or both: Stop() twice).
void ConsumerStopper::Stop() {
  stop_.store(true);
  inside_.fetch_add(1);
  if (Consumer* c = consumer_.load()) c->Stop();
  inside_.fetch_sub(1, std::memory_order_release);
}

void ConsumerStopper::Attach(Consumer* c) {
  consumer_.store(c);
  if (stop_.load()) c->Stop();
}

// A Stop() inside is a few instructions from done, unless its thread lost the
// CPU: a few yields, then short sleeps. Yielding alone could wait for ever: under
// SCHED_FIFO sched_yield() hands the CPU only to threads of the same priority,
// so a Stop() on a lower-priority thread of this CPU would never run again.
void ConsumerStopper::Detach() {
  consumer_.store(nullptr);
  constexpr int kYields = 64;
  for (int i = 0; inside_.load() != 0; ++i) {
    if (i < kYields) {
      std::this_thread::yield();
    } else {
      std::this_thread::sleep_for(std::chrono::microseconds(100));
    }
  }
}

}  // namespace dedup
