// Copyright dedup authors. Licensed under the Apache License 2.0.

#include "sim/simulation.h"

#include <fmt/format.h>
#include <stdlib.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <random>
#include <thread>
#include <vector>

#include "brokers/memory/memory_broker.h"
#include "dedup/buffer.h"
#include "dedup/consumer.h"
#include "dedup/store.h"
#include "sim/fault_injection_store.h"
#include "sim/fault_schedule.h"
#include "sim/ledger.h"
#include "sim/textbook_guard.h"

namespace dedup::sim {

std::string_view PatternName(Pattern p) {
  return p == Pattern::kTextbook ? "textbook" : "dedup";
}

namespace {

using SteadyClock = std::chrono::steady_clock;

// Counts the handlers see; the guard's own counts come from the Consumers.
struct Counters {
  std::atomic<uint64_t> takeovers{0}, crashed_before_work{0}, crashed_after_effect{0},
      crashed_after_complete{0}, slow_handlers{0}, transient_failures{0};
};

class Simulation {
 public:
  Simulation(const SimulateOptions& o, FaultInjectionStore* store)
      : o_(o), faults_(o), ledger_(o.messages), store_(store),
        textbook_(&textbook_keys_, TextbookOptions{o.textbook_ttl, "task_id:", o.retry_delay}) {
    run_prefix_ = "simulate/" + Token::Random().ToHex() + "/";
  }

  StatusOr<SimulateReport> Run() {
    MemoryBrokerOptions bo_;
    bo_.visibility_timeout = o_.visibility_timeout;
    MemoryBroker broker(bo_);
    Publish(broker);

    // One worker = one Consumer (concurrency 1, nothing fetched ahead) on its own
    // connection, with its own Buffer: what one worker process would be.
    std::vector<std::unique_ptr<MemorySource>> sources;
    std::vector<std::unique_ptr<Buffer>> buffers;
    std::vector<std::unique_ptr<Consumer>> consumers;
    ConsumerOptions co;
    co.concurrency = 1;
    co.prefetch = 0;
    co.fetch_wait = Millis(100);
    co.log = [](const std::string&) {};  // a crashed worker's failed settlements are expected
    BufferOptions bo;
    bo.lease = o_.lease;
    bo.retention = o_.retention;
    bo.retry_delay = o_.retry_delay;
    for (int w = 0; w < o_.workers; ++w) {
      sources.push_back(broker.Connect("worker " + std::to_string(w)));
      MemorySource* source = sources.back().get();
      StatusOr<std::unique_ptr<Consumer>> c = Status::Internal("unset");
      if (o_.pattern == Pattern::kDedup) {
        StatusOr<std::unique_ptr<Buffer>> b = Buffer::Create(store_, bo);
        if (!b.ok()) return b.status();
        buffers.push_back(std::move(b).value());
        c = Consumer::Make(source, buffers.back().get(),
                           [this, source](const Delivery& d, ClaimGuard& g) {
                             return Dedup(*source, d, g);
                           },
                           co);
      } else {
        c = Consumer::MakeWith(source, [this, source](const Delivery& d) {
          return Textbook(*source, d);
        }, co);
      }
      if (!c.ok()) return c.status();
      consumers.push_back(std::move(c).value());
    }

    const auto start = SteadyClock::now();
    std::vector<std::thread> threads;
    for (auto& c : consumers) threads.emplace_back([&c] { (void)c->Run(); });

    std::atomic<bool> done{false};
    std::thread progress;
    std::mutex progress_mu;
    std::condition_variable progress_cv;
    if (o_.on_progress) {
      progress = std::thread([&] {
        std::unique_lock lock(progress_mu);
        while (!progress_cv.wait_for(lock, o_.progress_interval, [&] { return done.load(); })) {
          MemoryBroker::Counts c = broker.counts();
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
    for (auto& c : consumers) c->Stop();
    broker.Stop();
    for (std::thread& t : threads) t.join();
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
    const MemoryBroker::Counts c = broker.counts();
    r.published = c.published;
    r.deliveries = c.deliveries;
    r.acked = c.acked;
    r.dead_lettered = c.dead;
    r.redeliveries = c.redeliveries;
    r.unfinished = c.open;
    ConsumerMetrics sum;
    for (const auto& consumer : consumers) {
      const ConsumerMetrics m = consumer->metrics();
      sum.duplicates += m.duplicates;
      sum.busy += m.busy;
      // Every retry outcome, taken by the broker or not (a crashed worker's
      // Retry() answers Unavailable).
      sum.retries += m.retries + m.retry_errors;
      sum.store_errors += m.store_errors;
      sum.lost_leases += m.lost_leases;
    }
    // A crashed worker's refused release / complete shows in its Consumer as a
    // store error; it is a crash, counted below, not an unreachable store.
    const uint64_t refused = store_->refused_outcomes();
    r.duplicates_suppressed = sum.duplicates;
    r.busy_deferrals = sum.busy;
    r.store_errors = sum.store_errors > refused ? sum.store_errors - refused : 0;
    // Retries the handler asked for (or a lost lease forced): every kRetry that was
    // neither BUSY nor a store error.
    r.retries = sum.retries - std::min(sum.retries, sum.busy + sum.store_errors);
    r.lease_lost = sum.lost_leases;
    r.takeovers = n_.takeovers;
    r.crashed_before_work = n_.crashed_before_work;
    r.crashed_after_effect = n_.crashed_after_effect;
    r.crashed_after_complete = n_.crashed_after_complete;
    r.slow_handlers = n_.slow_handlers;
    r.transient_failures = n_.transient_failures;
    for (uint64_t i = 0; i < o_.messages; ++i) r.poison_messages += faults_.Poison(i) ? 1 : 0;
    for (const auto& b : buffers) r.heartbeats += b->stats().heartbeats;
    for (const auto& [msg, reason] : broker.DeadLetters()) {
      ledger_.MarkDeadLettered(key_of_[msg]);
      if (!faults_.Poison(key_of_[msg])) ++r.dead_lettered_not_poison;
    }
    std::vector<bool> open_keys(o_.messages, false);
    const std::vector<bool> open_msgs = broker.OpenMessages();
    for (size_t m = 0; m < open_msgs.size(); ++m) {
      if (open_msgs[m]) open_keys[key_of_[m]] = true;
    }
    ledger_.Tally(open_keys, r);
    r.stale_fence_effects = ledger_.stale_fence();
    r.elapsed = elapsed;
    return r;
  }

 private:
  std::string Key(uint64_t key_id) const { return run_prefix_ + std::to_string(key_id); }

  void Publish(MemoryBroker& broker) {
    std::mt19937_64 rng(o_.seed);
    std::uniform_real_distribution<double> coin(0.0, 1.0);
    std::uniform_int_distribution<int64_t> delay(
        1, std::max<int64_t>(1, o_.duplicate_delay.count()));
    key_of_.reserve(o_.messages + o_.messages / 8);
    for (uint64_t i = 0; i < o_.messages; ++i) {
      broker.Publish(Key(i), Key(i));
      key_of_.push_back(i);
      if (coin(rng) < o_.duplicate_fraction) {
        broker.Publish(Key(i), Key(i), Millis(delay(rng)));
        key_of_.push_back(i);
      }
    }
  }

  // The published message and which delivery of it this is.
  struct Where {
    uint64_t msg, key_id;
    uint32_t number;
  };
  Where Locate(const Delivery& d) const {
    const uint64_t msg = std::stoull(d.id());
    return {msg, key_of_[msg], d.delivery_count()};
  }

  HandlerResult Dedup(MemorySource& source, const Delivery& d, ClaimGuard& g) {
    const Where at = Locate(d);
    const Fault f = faults_.For(at.msg, at.number);
    if (ledger_.IsTakeover(at.key_id, g.attempt())) ++n_.takeovers;
    if (f == Fault::kCrashBeforeWork) {
      ++n_.crashed_before_work;
      Crash(source, g.token());
      return HandlerResult::Retry("simulated crash before the work");
    }
    if (faults_.Poison(at.key_id)) return HandlerResult::Fail("poison message (simulated)");
    if (f == Fault::kTransient) {
      ++n_.transient_failures;
      ledger_.MarkReleased(at.key_id, g.attempt());
      return HandlerResult::Retry("transient failure (simulated)");
    }
    if (f == Fault::kSlow) {
      ++n_.slow_handlers;
      std::this_thread::sleep_for(o_.slow_handler_time);
    }
    // A careful handler checks before its side effect that it still owns the key.
    if (g.lost()) return HandlerResult::Retry("lease lost before the side effect");
    ledger_.Apply(at.key_id, g.fence(), g.attempt(), f == Fault::kCrashAfterEffect);
    if (f == Fault::kCrashAfterEffect) {
      ++n_.crashed_after_effect;
      Crash(source, g.token());
    } else if (f == Fault::kCrashAfterComplete) {
      // Completed, then the process dies before the ack.
      store_->AfterComplete(g.token(), [this, &source] {
        ++n_.crashed_after_complete;
        source.Crash();
      });
    }
    return HandlerResult::Done();
  }

  // The worker's process dies: its claim's writes are refused from now on, and
  // its connection's unsettled deliveries are abandoned.
  void Crash(MemorySource& source, Token token) {
    store_->KillOwner(token);
    source.Crash();
  }

  Processed Textbook(MemorySource& source, const Delivery& d) {
    const Where at = Locate(d);
    const Fault f = faults_.For(at.msg, at.number);
    bool takeover = false;
    Processed p = textbook_.Process(
        d.key(),
        [&]() -> HandlerResult {
          if (f == Fault::kCrashBeforeWork) {
            ++n_.crashed_before_work;
            source.Crash();  // the key stays until its TTL; no DEL, no ack
            return HandlerResult::Done();
          }
          if (faults_.Poison(at.key_id)) return HandlerResult::Fail("poison message (simulated)");
          if (f == Fault::kTransient) {
            ++n_.transient_failures;
            return HandlerResult::Retry("transient failure (simulated)");
          }
          if (f == Fault::kSlow) {
            ++n_.slow_handlers;
            std::this_thread::sleep_for(o_.slow_handler_time);
          }
          ledger_.Apply(at.key_id, 0, at.number, f == Fault::kCrashAfterEffect);
          if (f == Fault::kCrashAfterEffect) {
            ++n_.crashed_after_effect;
            source.Crash();
          } else if (f == Fault::kCrashAfterComplete) {  // the work returned; no ack
            ++n_.crashed_after_complete;
            source.Crash();
          }
          return HandlerResult::Done();
        },
        &takeover);
    if (takeover) ++n_.takeovers;
    return p;
  }

  const SimulateOptions& o_;
  const FaultSchedule faults_;
  Ledger ledger_;
  FaultInjectionStore* const store_;
  InProcessTextbookKeys textbook_keys_;
  TextbookGuard textbook_;
  std::string run_prefix_;
  std::vector<uint64_t> key_of_;  // published message -> key id
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
    OpenOptions open;
    open.on_warning = [](const std::string& m) {
      std::fprintf(stderr, "dedup simulate: %s\n", m.c_str());
    };
    StatusOr<std::unique_ptr<Store>> opened = OpenStore(uri, open);
    if (!opened.ok()) return opened.status();
    store = std::move(opened).value();
  }
  // The textbook pattern never calls the store; the wrapper needs a target anyway.
  FaultInjectionStore faulty(store.get());
  Simulation sim(options, &faulty);
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
  line("dead-lettered, not poison", r.dead_lettered_not_poison, "must be 0");
  line("broker messages unfinished", r.unfinished, "must be 0 (timeout, interrupt)");
  if (r.pattern == Pattern::kDedup) {
    line("effects with a stale fence", r.stale_fence_effects, "must be 0");
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
      {"dead_lettered_not_poison", r.dead_lettered_not_poison},
      {"unfinished", r.unfinished},
      {"passed", r.passed()},
  };
  return j.dump(2);
}

}  // namespace dedup::sim
