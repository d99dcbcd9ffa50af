// Copyright dedup authors. Licensed under the Apache License 2.0.
//
// The simulation behind `dedup simulate`: the in-process at-least-once broker
// (src/brokers/memory), N workers, each the very Consumer production runs
// (src/consumer) with its own Buffer, and a seeded fault schedule, run against a
// real Store (or, for comparison, against an honest emulation of the textbook
// `SET key NX EX ttl` guard, textbook_guard.h). Every side effect is written to a ledger kept apart from the store, and
// the report says, per message, how often its effect was applied.
//
// What the simulation models:
//   * The broker delivers each published message at least once: a delivery that
//     is not acked within the visibility timeout is delivered again (to any
//     worker); a fraction of messages is published twice, the copy delayed by up
//     to `duplicate_delay`. It honours each BrokerAction: ack, retry after
//     `retry_after` (never acked), dead-letter. Acks are per message, like Redis
//     Streams' XACK: an ack from an earlier delivery still removes the message.
//   * A worker stands for a worker process: a Consumer (concurrency 1) on its own
//     broker connection (MemorySource) with its own Buffer (and so its own
//     heartbeat). A crash makes it stop what it is doing, without a release, a
//     complete or an ack: the FaultInjectionStore refuses every write of the
//     crashed claim's token, and the connection's unsettled deliveries are
//     abandoned (MemorySource::Crash), acks waiting to be coalesced included
//     (the Consumer's max_ack_delay, as in production): those messages come
//     back and meet DUPLICATE. The worker then "restarts" and takes the next
//     delivery.
//   * Faults are decided by a hash of (seed, published message, delivery number),
//     so the same seed gives the same fault schedule whatever the thread timing,
//     and the textbook pattern meets exactly the faults dedup met.
//
// Thread timing is not reproducible; the report's must-be-zero counts
// (applied_twice_otherwise, lost, unfinished) must be zero under any timing for
// the dedup pattern.

#ifndef DEDUP_SRC_SIM_SIMULATION_H_
#define DEDUP_SRC_SIM_SIMULATION_H_

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <string>

#include "dedup/clock.h"
#include "dedup/status.h"

namespace dedup::sim {

enum class Pattern : uint8_t {
  kDedup = 0,     // dedup::Consumer + Buffer on the chosen store
  kTextbook = 1,  // SET key processing NX EX ttl; DEL on failure; key exists = done
};
std::string_view PatternName(Pattern p);  // "dedup", "textbook"

// Counters a progress display can show while the simulation runs.
struct SimulateProgress {
  uint64_t published = 0;  // broker messages, duplicates included
  uint64_t finished = 0;   // acked or dead-lettered
  uint64_t deliveries = 0;
  std::chrono::milliseconds elapsed{0};
};

struct SimulateOptions {
  // Which guard the workers use. Default: kDedup.
  Pattern pattern = Pattern::kDedup;
  // Store for the dedup pattern, any URI OpenStore accepts. Default: empty = a
  // RocksDB store in a fresh temporary directory, removed afterwards (memory:
  // when this build has no RocksDB store). Ignored by the textbook pattern.
  std::string store_uri;
  // Distinct messages (keys) published. Default: 10000.
  uint64_t messages = 10'000;
  // Workers (one Consumer each, concurrency 1). Default: 8.
  int workers = 8;
  // Seeds the duplicate publishes and the fault schedule. Default: 1.
  uint64_t seed = 1;

  // The dedup claim's lease (heartbeat every lease/3). Default: 200 ms.
  Millis lease{200};
  // How long the dedup store keeps a completed record. Default: 1 h.
  Millis retention{3'600'000};
  // The textbook key's one TTL, both lease and memory of "done". Default: 400 ms
  // (the seed's 60 s is twice dedup's 30 s default lease; so is this).
  Millis textbook_ttl{400};
  // A delivery not acked within this is delivered again. Default: 250 ms.
  Millis visibility_timeout{250};
  // Delay before a message is delivered again after a released (transient)
  // failure or a store error. Default: 50 ms.
  Millis retry_delay{50};

  // Fraction of messages published twice. Default: 0.05.
  double duplicate_fraction = 0.05;
  // The second copy becomes visible after a uniform random delay up to this.
  // Default: 1000 ms.
  Millis duplicate_delay{1000};

  // Per delivery, fraction of deliveries (that reach the handler) where the
  // worker crashes ...
  // ... after the claim, before the work. Default: 0.002.
  double crash_before_work = 0.002;
  // ... after the side effect, before complete. Default: 0.002.
  double crash_after_effect = 0.002;
  // ... after complete, before the ack. Default: 0.002.
  double crash_after_complete = 0.002;
  // Fraction of deliveries whose handler fails transiently (kRetry). Default: 0.005.
  double transient_failure = 0.005;
  // Fraction of deliveries whose handler runs for `slow_handler_time`.
  // Default: 0.0005.
  double slow_handler = 0.0005;
  // How long a slow handler runs: longer than the lease and the textbook TTL.
  // Default: 500 ms.
  Millis slow_handler_time{500};
  // Fraction of messages whose handler always fails permanently (dead-letter).
  // Default: 0.001.
  double poison = 0.001;

  // The run is stopped after this; what is not done by then is reported as
  // unfinished. Default: 300 s.
  Millis timeout{300'000};
  // When set and it becomes true (e.g. on SIGINT), the run stops early; what is
  // not done counts as unfinished. Checked every 100 ms. Not owned.
  const std::atomic<bool>* cancel = nullptr;
  // Called every `progress_interval` from a separate thread while it runs, when set.
  std::function<void(const SimulateProgress&)> on_progress;
  // Default: 200 ms.
  Millis progress_interval{200};
};

struct SimulateReport {
  Pattern pattern = Pattern::kDedup;
  std::string store;  // Describe() of the store, or "textbook (in-process map)"
  uint64_t seed = 0;
  int workers = 0;

  uint64_t messages = 0;    // distinct keys
  uint64_t published = 0;   // broker messages, duplicates included
  uint64_t deliveries = 0;  // receives by a worker, redeliveries included
  uint64_t acked = 0;       // broker messages acked
  uint64_t dead_lettered = 0;          // broker messages dead-lettered
  uint64_t duplicates_suppressed = 0;  // guard said done: acked without running
  uint64_t busy_deferrals = 0;         // in progress elsewhere: retried, not acked
  uint64_t takeovers = 0;  // claimed after the previous owner's lease/TTL ran out
  uint64_t retries = 0;    // handler failed transiently: released, retried
  uint64_t store_errors = 0;      // store could not decide: retried (fail closed)
  uint64_t lease_lost = 0;        // outcome not recorded: another owner took over
  uint64_t redeliveries = 0;      // visibility timeouts that fired
  uint64_t heartbeats = 0;        // extends sent by the Buffers

  // Faults injected (each counted when it happened).
  uint64_t crashed_before_work = 0;
  uint64_t crashed_after_effect = 0;
  uint64_t crashed_after_complete = 0;
  uint64_t slow_handlers = 0;
  uint64_t transient_failures = 0;
  uint64_t poison_messages = 0;  // distinct keys whose handler always fails

  // Per message (key), how often its effect was applied. These add up to `messages`.
  uint64_t exactly_once = 0;
  uint64_t reapplied_after_crash = 0;    // every extra application followed an
                                         // injected crash between effect and
                                         // complete: the documented limit
  uint64_t applied_twice_otherwise = 0;  // must be 0
  uint64_t lost = 0;  // never applied, yet every copy acked: must be 0
  uint64_t not_applied_dead_lettered = 0;  // poison: dead-lettered, never applied
  uint64_t not_applied_unfinished = 0;  // never applied, still at the broker when the
                                        // run stopped early (see `unfinished`)
  uint64_t unfinished = 0;  // broker messages neither acked nor dead-lettered at the
                            // end (timeout, or cancelled): must be 0
  // Applications whose fence was not above an earlier application of the same
  // key: a downstream fence check would refuse them. Dedup pattern only (the
  // textbook guard has no fence): must be 0.
  uint64_t stale_fence_effects = 0;
  // Broker messages dead-lettered although their handler never failed
  // permanently (not poison): a good message thrown away. Must be 0.
  uint64_t dead_lettered_not_poison = 0;

  std::chrono::milliseconds elapsed{0};

  // True when every must-be-zero count is zero.
  bool passed() const {
    return applied_twice_otherwise == 0 && lost == 0 && unfinished == 0 &&
           stale_fence_effects == 0 && dead_lettered_not_poison == 0;
  }
};

// Runs one simulation. A non-OK status means it could not start (bad options, a
// store URI that does not open); the message names the problem.
[[nodiscard]] StatusOr<SimulateReport> RunSimulation(const SimulateOptions& options);

// The report as a table for people, and as one JSON object.
std::string FormatReport(const SimulateReport& report);
std::string ReportToJson(const SimulateReport& report);

}  // namespace dedup::sim

#endif  // DEDUP_SRC_SIM_SIMULATION_H_
