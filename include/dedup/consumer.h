// Copyright dedup authors. Licensed under the Apache License 2.0.
//
// The consumer seam: every broker plugs into dedup through a MessageSource that
// fetches batches of Deliveries, and one broker-neutral Consumer runs them through
// a Buffer. Data flows one way, with no side channel:
//
//   broker ──> MessageSource ──> Consumer ──> Buffer ──> Store
//
// A *delivery* is one receipt of a message from a broker; a *message* may be
// delivered many times; its *key* identifies the work (never the broker's
// delivery id, which differs for every publish or redelivery).
//
// What the Consumer tells the broker follows the worker's table of what to do
// with each result (docs/WORKER.md), through Buffer::ProcessOnce's BrokerAction:
//
//   kAck         Delivery::Ack() — only after the outcome is recorded (or the claim
//                was DUPLICATE of recorded work); never for BUSY or a store error
//   kRetry       Delivery::Retry(after) — the broker delivers it again no earlier
//                than `after` (stays pending / NAK with delay / retry queue)
//   kDeadLetter  Delivery::DeadLetter(reason) — moved aside with the reason, then
//                acked so the broker stops delivering it
//
// A delivery whose message has no key (key_error() not empty) is dead-lettered
// with that reason; it is never processed unguarded.
//
// Guarantees a MessageSource must give (checked by tests/consumer_conformance_test):
//   * A delivery not acked (retried, dead-lettered later, or abandoned by a
//     crashed worker) is delivered again, to this or another worker.
//   * Ack/Retry/DeadLetter are called at most once per Delivery, from any thread.
//   * Fetch is called from one thread at a time.
//   * A delivery whose id() equals that of one the Consumer still holds (queued
//     or running: e.g. a stream entry reclaimed from this very consumer) is
//     dropped by the Consumer without being settled; the held one settles the
//     message. Sources whose ids are unique per delivery never see this.
//
// A delivery whose key the Consumer holds already (another delivery of it, e.g.
// a message published twice, fetched earlier and not yet decided: queued,
// claimed, running, or its outcome waiting to be written) is not claimed at
// once: that claim would be BUSY against the Consumer's own and come back only
// after the lease. It waits, unclaimed, until the earlier copy's outcome is
// written (or its claim given up), then is claimed alone: DUPLICATE, acked
// without running (or ACQUIRED, when the earlier copy released its claim). One
// delivery waits so per key, beside the fetch window, not in it; a further one
// is claimed at once (BUSY against the Consumer's own claim: back after the
// lease left), so that the copies of a key sent many times while its handler
// runs long take neither the window nor what the broker hands out unacked
// (RabbitMQ's prefetch, NATS's max_ack_pending) from the other keys. It gets
// InProgress() like every held delivery, and at Stop() is handed back at once
// (Retry(0)) with what never started.

#ifndef DEDUP_CONSUMER_H_
#define DEDUP_CONSUMER_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "dedup/broker_ack.h"
#include "dedup/buffer.h"
#include "dedup/clock.h"
#include "dedup/status.h"

namespace dedup {


// One receipt of a message. Made by a MessageSource; owned by the Consumer.
class Delivery {
 public:
  virtual ~Delivery() = default;

  // The dedup key (any namespace prefix included). Empty when the message has no
  // key; key_error() then says why.
  const std::string& key() const { return key_; }
  const std::string& key_error() const { return key_error_; }
  // The bytes the handler receives and payload fingerprints are taken of.
  const std::string& payload() const { return payload_; }
  // The broker's id of this delivery (stream entry id, delivery tag, sequence).
  const std::string& id() const { return id_; }
  // How many times the broker has delivered this message, counting this one;
  // 0 when the broker does not say.
  uint32_t delivery_count() const { return delivery_count_; }
  // Named values the broker carries with the message (stream fields, AMQP headers,
  // NATS headers), for handlers that want them.
  const std::vector<std::pair<std::string, std::string>>& attributes() const {
    return attributes_;
  }

  // Settles the delivery. Exactly one of them is called, once.
  [[nodiscard]] virtual Status Ack() = 0;
  [[nodiscard]] virtual Status Retry(Millis after) = 0;
  [[nodiscard]] virtual Status DeadLetter(std::string_view reason) = 0;

  // Tells the broker the message is still being worked on (JetStream's +WPI;
  // on Redis Streams an XCLAIM JUSTID that resets the entry's idle time, so
  // that no XAUTOCLAIM takes it), so it does not redeliver while the lease is
  // being extended. Called with the Consumer's lock held: it must not wait on
  // the network (queue the signal, or send it without waiting for an answer). The Consumer calls
  // it once per heartbeat interval of its Buffer (from its fetch thread, and
  // while it drains from a thread of the drain, until the drain ends), for every
  // delivery it holds (fetched ahead and queued, running, or waiting for its
  // ack), possibly while another thread settles the same delivery: after the
  // settlement it must do no harm. (A Consumer made with MakeWith has no Buffer
  // and sends none.) Default: nothing.
  [[nodiscard]] virtual Status InProgress() { return Status::Ok(); }

  // The ack a store may fuse with the completion, or nullptr when this broker's
  // ack cannot be done by a store. After a fused completion answered OK, the
  // Consumer calls MarkAcked() instead of Ack().
  virtual const BrokerAck* fused_ack() const { return nullptr; }
  virtual void MarkAcked() {}

  // True once the Consumer running this delivery asks its handler to stop: a
  // graceful drain whose ConsumerOptions::drain_timeout has passed. A handler that
  // sees it should return without completing (HandlerResult::Retry): its claim is
  // released, nothing is recorded, and the delivery goes back to the broker at once.
  bool stop_requested() const {
    return stop_ != nullptr && stop_->load(std::memory_order_relaxed);
  }

 protected:
  std::string key_;
  std::string key_error_;
  std::string payload_;
  std::string id_;
  uint32_t delivery_count_ = 0;
  std::vector<std::pair<std::string, std::string>> attributes_;

 private:
  friend class Consumer;
  const std::atomic<bool>* stop_ = nullptr;  // the Consumer's "handlers stop" flag
};

// A broker's side of the seam: fetches batches of deliveries.
class MessageSource {
 public:
  virtual ~MessageSource() = default;

  // Up to `max` deliveries, waiting at most `wait` for the first one; an empty
  // batch when none came. Unavailable when the broker cannot be reached (the
  // Consumer backs off and calls again; the source reconnects).
  [[nodiscard]] virtual StatusOr<std::vector<std::unique_ptr<Delivery>>> Fetch(size_t max,
                                                                              Millis wait) = 0;

  // Settles several deliveries that all get Ack(), in as few round trips as the
  // broker allows. One Status per delivery, in their order: each one's own
  // where the broker answers per delivery (RabbitMQ: an ack of a delivery whose
  // connection is gone fails alone, the others are taken), one for several
  // where one answer covers them (a Redis XACK, a NATS flush). Default: Ack()
  // each.
  [[nodiscard]] virtual std::vector<Status> AckBatch(std::span<Delivery* const> deliveries) {
    std::vector<Status> out;
    out.reserve(deliveries.size());
    for (Delivery* d : deliveries) out.push_back(d->Ack());
    return out;
  }

  // "redis-streams 127.0.0.1:6379 stream=jobs group=billing" (never a password).
  virtual std::string Describe() const = 0;
};

// ---- the Consumer ------------------------------------------------------------

// Counters since the Consumer started. Names match the Prometheus metrics
// dedup_worker_<name>_total.
struct ConsumerMetrics {
  uint64_t messages = 0;       // deliveries handed to the guard
  uint64_t acquired = 0;       // claims ACQUIRED (handler ran)
  uint64_t duplicates = 0;     // claims DUPLICATE (acked without running)
  uint64_t busy = 0;           // claims BUSY (deferred, not acked)
  // ACQUIRED with attempt > 1: a claim after an earlier attempt of the key,
  // whether that one was given up (a handler's Retry, a release) or its lease
  // ran out (a crash, a kill): every later attempt, not only takeovers of a
  // lease. Compare with retries to tell them apart.
  uint64_t takeovers = 0;
  uint64_t lost_leases = 0;    // outcome not recorded: another owner took over
  // Deliveries given back for a later delivery (Retry() of a retry outcome:
  // BUSY, a released claim, a store error ...), the broker took it. Not the
  // drain's hand-back of deliveries never started.
  uint64_t retries = 0;
  uint64_t dead_lettered = 0;  // deliveries moved to the dead-letter queue (the broker took it)
  uint64_t store_errors = 0;   // the store could not decide (fail closed)
  // Of store_errors: claims the store could not answer (the rest: outcome
  // writes it refused after the claim was ACQUIRED, counted in `acquired`).
  // Each claim is counted once in acquired, duplicates, busy or claim_errors
  // (MISMATCH, EXHAUSTED and keys that cannot be claimed in none).
  uint64_t claim_errors = 0;
  uint64_t acked = 0;          // acks of done or duplicate work
  uint64_t redelivered = 0;    // deliveries the broker says it made before
  uint64_t held_back = 0;      // deliveries dropped: the same id is held here
  // Deliveries whose key this Consumer held already (an earlier copy fetched,
  // running, or its outcome not yet written): they waited for that copy's
  // outcome before their own claim, instead of a claim BUSY against it.
  uint64_t waited_for_copy = 0;
  uint64_t broker_errors = 0;  // fetches, settlements and in-progress signals that failed
  // Of broker_errors: settlements of an outcome the broker did not take (or
  // whose answer was lost), by what they were: Ack() or AckBatch (each delivery
  // whose status in the batch's answer is an error), Retry(), DeadLetter(). Each such delivery is counted in
  // one of these and not in acked, retries or dead_lettered; the broker delivers
  // it again on its own timer (its outcome, if recorded, answers DUPLICATE).
  uint64_t ack_errors = 0;
  uint64_t retry_errors = 0;
  uint64_t dead_letter_errors = 0;
  // Of broker_errors: deliveries the drain did not hand back (Retry(0) of what
  // never started): its hand-back failed, or was not tried after one had (the
  // broker does not answer). They come back only on the broker's own timer
  // (JetStream's AckWait, the Streams reclaim min-idle, RabbitMQ's requeue when
  // the connection closes), not at once as a hand-back would make them.
  uint64_t hand_back_errors = 0;
  // Of `acked`: done by the store's completion in the same round trip
  // (Store::CanCompleteWithAck; docs/WORKER.md).
  uint64_t acked_with_complete = 0;
  // Batch claims sent (Buffer::ClaimBatch) and the deliveries they claimed.
  uint64_t claim_batches = 0;
  uint64_t claimed_in_batches = 0;
  // AckBatch calls and the acks they carried that the broker took.
  uint64_t ack_batches = 0;
  uint64_t acked_in_batches = 0;
  // Buffer::CompleteBatch calls of the completer and the outcomes they recorded.
  uint64_t complete_batches = 0;
  uint64_t completed_in_batches = 0;

  // Prometheus text exposition format, one counter per field.
  std::string ToPrometheus() const;
  // "messages=.. acquired=.. ..." for a log line.
  std::string Summary() const;
};

struct ConsumerOptions {
  // Handlers run at once. 1 to 4096. Default: 4.
  int concurrency = 4;
  // Deliveries fetched ahead of the running ones (waiting in the queue, their
  // keys already claimed when batch_claims). With batch_claims, one more fetched
  // batch (at most concurrency + prefetch deliveries) may wait for or be in its
  // claim, so that the next fetch overlaps the claim. A fetch starts once half of
  // concurrency + prefetch is free, or as soon as a handler would be idle.
  // -1 or 0 to 65536. Default: -1 = concurrency (more with prefetch_time).
  int prefetch = -1;
  // With prefetch -1: fetch ahead as many deliveries as the handlers finish in
  // about this long (from the average time of the recent ones), at least
  // concurrency and at most 16 x concurrency. Handlers that take prefetch_time
  // or longer get concurrency, as without it; short ones (processes that run a
  // millisecond) get fetched and claimed in batches, one broker round trip for
  // several. What it costs: while handlers keep their pace, a fetched delivery
  // waits about prefetch_time longer here than an idle consumer elsewhere would
  // make it wait; when they suddenly slow down, what was fetched waits its
  // turn. 0 = off; at most kMaxPrefetchTime. Default: 0 (`dedup worker`: 5 ms,
  // --prefetch-time).
  static constexpr Millis kMaxPrefetchTime{60'000};
  Millis prefetch_time{0};
  // How long one Fetch waits for a first delivery; also how soon Stop() is seen
  // by an idle consumer. Positive. Default: 250 ms.
  Millis fetch_wait{250};
  // Claim the keys of a fetched batch with one Buffer::ClaimBatch (one store
  // round trip) instead of one claim per delivery. Default: true.
  bool batch_claims = true;
  // Acks of finished messages are coalesced into one MessageSource::AckBatch
  // (one XACK for several entries): an ack waits at most this long after its
  // handler ended, less when max_ack_batch are waiting (and, while an earlier
  // AckBatch is still out, for that one: those then late go at once after it).
  // 0 = every ack is sent by its handler's thread at once. 0 to 1000 ms.
  // Default: 2 ms.
  Millis max_ack_delay{2};
  // At most this many deliveries per AckBatch. 1 to 100000. Default: 64.
  int max_ack_batch = 64;
  // Outcomes of finished handlers (done, failed) are recorded by one completer
  // thread with one Buffer::CompleteBatch for several (one store round trip or
  // write; fused with the acks where the store can), then acked with one
  // AckBatch. An outcome waits at most max_ack_delay after its handler ended
  // (not at all when no other handler is running), and for one batch write (and
  // for the one before it, if the completer is still writing and acking that
  // one: those then late go at once after it); its claim stays heartbeated
  // until written. At most max_ack_batch per batch.
  // false: each handler's thread records its own outcome. Default: true.
  bool batch_completions = true;
  // Graceful drain: how long handlers still running at Stop() may go on. After
  // it, Delivery::stop_requested() turns true and stop_handlers is called; what
  // then ends without completing is released and handed back to the broker at
  // once (Retry(0)). 0 = at once; 0 to kMaxDrainTimeout (24 h). Default: 5 s.
  static constexpr Millis kMaxDrainTimeout{86'400'000};
  Millis drain_timeout{5'000};
  // Called once, from the Consumer's drain thread (the drain starts at Stop(),
  // while Run()'s thread may still wait in a Fetch), when drain_timeout has
  // passed with handlers still running: stops what the handlers run (`dedup
  // worker --exec` passes its handler processes' stop, internal to the tool:
  // SIGTERM, then SIGKILL after a grace).
  // Default: empty (in-process handlers watch Delivery::stop_requested()).
  std::function<void()> stop_handlers;
  // Once drain_timeout has passed, the Buffer's store (MakeWith: its `store`,
  // when given) is told that this Consumer is stopping (Store::StopWaiting with kDrainStoreGrace), unless the drain is
  // over by then: a claim, outcome write or release still waiting on a server
  // that hangs is given up kDrainStoreGrace later (later calls get as long), its
  // outcome unknown. Its delivery is not acked and nothing is recorded as done
  // for it here; a claim the store may have made stays held until its lease
  // ends, and is then taken over. Run() then returns Aborted saying what was
  // given up. A store that answers within the grace is not affected. The store
  // object as a whole is told, for good (Store::StopWaiting): every other user
  // of it (a second Consumer, the program's own calls) then waits no more than
  // the grace either, and on a server that once let a call run out so, not at
  // all. So only a Consumer that is its store's one user may set it: `dedup
  // worker` does. Default: false (the store is not told; its calls wait as its
  // timeouts say).
  static constexpr Millis kDrainStoreGrace{250};
  bool stop_store_waits = false;
  // Prefixed to every log line on stderr. Default: "dedup consumer".
  std::string log_name = "dedup consumer";
  // Where log lines go instead of stderr (dead letters, failed settlements and
  // fetches). Called from any of the Consumer's threads. Default: empty = stderr.
  std::function<void(const std::string& line)> log;
};

// Runs deliveries from a MessageSource through a guard with `concurrency`
// handler threads, and settles each with the broker per ProcessOnce's action:
//   kAck: Ack() (or MarkAcked() when the store acked with the completion)
//   kRetry: Retry(retry_after)   kDeadLetter: DeadLetter(reason)
// A delivery without a key is dead-lettered with its key_error().
//
// Run() blocks until Stop(); Stop() is async-signal-safe (call it from a SIGTERM
// handler). On stop the Consumer fetches no more and starts the drain timer
// (graceful drain): running handlers may finish and be settled for up to
// drain_timeout, while every queued delivery is given back (its claim released
// with one try, then Retry(0)). Once one such release has failed (the store
// does not answer), the claims left are abandoned
// (ClaimGuard::Abandon: held until their lease runs out) and their deliveries
// still given back, unacked; while the store answers they are all released,
// drain_timeout or not. Once one Retry(0) of them has failed (the broker does
// not answer), the deliveries left are not given back but left to the broker's
// own redelivery. Handlers still running at drain_timeout are asked
// to stop (Delivery::stop_requested(), stop_handlers); one that ends without
// completing has its claim released with one try (nothing recorded) and its
// delivery handed back with Retry(0). Run() returns once every handler has ended
// and every outcome is settled: an in-process handler that ignores the request
// is waited for, and an outcome write keeps its retry policy (BufferOptions),
// except that from drain_timeout on the store waits no more than
// kDrainStoreGrace for any answer (ConsumerOptions::stop_store_waits): Run()
// returns Aborted when store calls were given up so, OK otherwise.
class Consumer {
 public:
  using Handler = std::function<HandlerResult(const Delivery&, ClaimGuard&)>;
  // Any guard instead of a Buffer (e.g. the textbook one, for comparison).
  using Processor = std::function<Processed(const Delivery&)>;

  // `source` and `buffer` are not owned and must outlive the Consumer.
  // InvalidArgument names a bad option.
  [[nodiscard]] static StatusOr<std::unique_ptr<Consumer>> Make(MessageSource* source,
                                                                Buffer* buffer, Handler handler,
                                                                ConsumerOptions options = {});
  // `store`, when not null: the store the Processor's calls go to (not owned,
  // must outlive the Consumer), told to stop waiting at the drain deadline as a
  // Buffer's store is (ConsumerOptions::stop_store_waits); without it nothing
  // is told (`dedup worker --sql-output` passes its PostgreSQL store).
  [[nodiscard]] static StatusOr<std::unique_ptr<Consumer>> MakeWith(MessageSource* source,
                                                                    Processor process,
                                                                    ConsumerOptions options = {},
                                                                    Store* store = nullptr);
  ~Consumer();
  Consumer(const Consumer&) = delete;
  Consumer& operator=(const Consumer&) = delete;

  // Runs until Stop(), then drains. Called once, from one thread.
  Status Run();
  // Async-signal-safe. The drain clock starts here, even while the thread in
  // Run() still waits in a Fetch or a claim (a broker or store that hangs).
  // A caller that may call it while another thread returns from Run() and
  // destroys the Consumer (a second SIGTERM) goes through a ConsumerStopper.
  void Stop();
  bool stopping() const { return stop_.load(std::memory_order_relaxed); }

  ConsumerMetrics metrics() const;
  const ConsumerOptions& options() const;

 private:
  class Impl;
  static void WatchStop(Delivery& d, const std::atomic<bool>* stop) { d.stop_ = stop; }
  explicit Consumer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
  std::atomic<bool> stop_{false};
  static_assert(std::atomic<bool>::is_always_lock_free);
};

// Stop() of a Consumer that its owner destroys once Run() has returned, from any
// thread or a signal handler, any number of times (a second SIGTERM). Consumer::
// Stop() alone cannot make that safe: a caller that has read the Consumer's
// address may be preempted (or its signal handler interrupted) until after the
// owner destroyed it. Here Detach() returns only once no Stop() is inside the
// Consumer any more, and none reaches it after; the owner destroys it then.
//
//   stopper.Attach(c);   // before c->Run(); stops c at once if Stop() came first
//   c->Run();
//   stopper.Detach();    // then c may go
//
// Used by `dedup worker`'s SIGTERM / SIGINT handler and Worker::Stop().
class ConsumerStopper {
 public:
  // Async-signal-safe (lock-free atomics and Consumer::Stop()); never waits.
  // Sticky: a Consumer attached later is stopped at once.
  void Stop();
  bool stopping() const { return stop_.load(std::memory_order_relaxed); }
  // Stop() reaches `c` from now on. `c` must stay alive until Detach() returns.
  void Attach(Consumer* c);
  // No Stop() reaches the Consumer once this returns: it waits for any Stop()
  // that read its address, a few instructions at most (yielding the CPU a few
  // times, then sleeping 100 us at a time, so that a Stop() on a thread of lower
  // real-time priority on the same CPU gets to finish).
  void Detach();

 private:
  std::atomic<Consumer*> consumer_{nullptr};
  std::atomic<int> inside_{0};  // Stop() calls that may be using consumer_
  std::atomic<bool> stop_{false};
  static_assert(std::atomic<Consumer*>::is_always_lock_free);
  static_assert(std::atomic<int>::is_always_lock_free);
};

// ---- the broker scheme table ----------------------------------------------------

struct SourceOptions {
  // The Buffer's lease: sources derive their redelivery timers from it (e.g.
  // XAUTOCLAIM min-idle = lease + 5 s). Default: 30 s.
  Millis lease{30'000};
  // Told, once at open, of broker settings that work but are likely not meant
  // (NATS: an existing consumer whose AckWait or MaxAckPending differs from the
  // URI's, or whose AckWait is under the lease's heartbeat interval). Unset:
  // not told.
  std::function<void(const std::string&)> on_warning;
};

// Opens a MessageSource from a broker URI, by scheme (src/brokers/open_source.cc):
//   redis://HOST:PORT?stream=S&group=G[...]    Redis Streams (docs/WORKER.md)
//   amqp://USER:PW@HOST:PORT/VHOST?queue=Q     RabbitMQ (with DEDUP_WITH_RABBITMQ)
//   nats://HOST:PORT?stream=S&consumer=C       NATS JetStream (with DEDUP_WITH_NATS)
// InvalidArgument names what is wrong; Unavailable when the broker cannot be
// reached.
[[nodiscard]] StatusOr<std::unique_ptr<MessageSource>> OpenSource(std::string_view uri,
                                                                  const SourceOptions& options = {});

// What a broker URI is for: a consumer (OpenSource), or `dedup publish`, which
// needs no consumer name (nats:// without consumer=).
enum class SourceUse : uint8_t { kConsume, kPublish };

// The same table's check of a broker URI, without connecting anywhere: the URI
// is parsed and every option validated as its broker's opener would, a password
// file read. Returns the row's scheme ("redis", "amqp", "nats"); InvalidArgument
// with OpenSource's message otherwise.
[[nodiscard]] StatusOr<std::string_view> CheckSourceUri(std::string_view uri,
                                                        SourceUse use = SourceUse::kConsume);

}  // namespace dedup

#endif  // DEDUP_CONSUMER_H_
