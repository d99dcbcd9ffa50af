// Copyright dedup authors. Licensed under the Apache License 2.0.
//
// `dedup worker`: consumes a broker (any scheme of OpenSource: redis://, amqp://,
// nats://) through the Consumer and runs a command once per message key.
//
//   dedup worker --broker 'redis://127.0.0.1:6390?stream=jobs&group=g'
//                --store rocksdb:/var/lib/dedup --exec './handle.sh'
//
// The command runs under /bin/sh -c (or directly with --no-shell) with, on stdin,
// a Redis stream entry's fields as a JSON object, or the message body itself for
// amqp:// and nats:// (whose bodies are bytes the publisher chose), and
// DEDUP_KEY, DEDUP_FENCE, DEDUP_ATTEMPT, DEDUP_ENTRY_ID (the broker's delivery
// id) and DEDUP_WORKER_PID in its environment.
//   exit 0            done: the outcome is recorded, then the entry is acked
//   exit 75           retry later (EX_TEMPFAIL): claim released, entry left pending
//   exit 126, 127     could not be started (the shell's codes): as 75, nothing recorded
//   killed by signal  retry later, as 75
//   lease lost        the handler is stopped (SIGTERM, SIGKILL by the lease's end): as 75
//   anything else     permanent failure: completed as failed, dead-lettered
// Handlers and their children die with the worker, SIGKILL included
// (src/consumer/handler_process.h).
// --keep-output stores the command's stdout (at most 1 MiB) as the result.
// --sql-output (postgres:// stores): the command's stdout is SQL, run in the
// transaction that records the completion, so its effect happens exactly once
// (docs/POSTGRES.md).
// --pattern textbook keeps its keys in the stream's Redis, or, on amqp:// and
// nats://, in the Redis named by --textbook-redis.

#ifdef DEDUP_WITH_REDIS_STREAMS

#include <CLI/CLI.hpp>
#include <csignal>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <map>
#include <memory>
#include <vector>

#include "brokers/redis_streams/streams_source.h"
#include "cli/command.h"
#include "cli/common.h"
#include "cli/flags.h"
#include "consumer/exec_handler.h"
#include "consumer/handler_process.h"
#include "core/printable.h"
#include "core/secret.h"
#include "dedup/buffer.h"
#include "dedup/consumer.h"
#ifdef DEDUP_WITH_POSTGRES
#include "dedup/postgres_store.h"
#endif
#include "dedup/store.h"
#include "dedup/worker.h"
#include "redis/options.h"
#include "sim/redis_textbook_keys.h"
#include "sim/textbook_guard.h"
#ifdef DEDUP_WITH_SERVE
#include "serve/metered_store.h"
#include "serve/metrics.h"
#include "serve/metrics_http.h"
#endif

namespace dedup::cli {
namespace {

// The SIGTERM / SIGINT handler's way to the Consumer: a second signal as Run()
// returns may still be inside its Stop(), which Detach() waits for before the
// Consumer goes (ConsumerStopper).
ConsumerStopper g_stopper;

void StopWorker(int) { g_stopper.Stop(); }

struct WorkerFlags {
  std::string broker;
  std::string store;
  std::string exec;
  bool no_shell = false;
  std::string handler_cgroup;  // --handler-cgroup DIR: each handler in a child cgroup
  int concurrency = 4;
  int prefetch = -1;
  // With --prefetch -1: fetch ahead what the handlers finish in about this long
  // (ConsumerOptions::prefetch_time; docs/WORKER.md, "--prefetch").
  Millis prefetch_time{5};
  Millis lease{kDefaultLease};
  Millis retention{kDefaultRetention};
  Millis retry_delay{1'000};
  uint32_t max_attempts = 0;
  int corrupt_record_tries = BufferOptions{}.corrupt_record_tries;
  Millis complete_retry_time = BufferOptions{}.complete_retry_time;
  bool keep_output = false;
  bool sql_output = false;
  bool fingerprint = false;
  int metrics_port = 0;
  Millis summary_interval{10'000};
  Millis drain_timeout = ConsumerOptions().drain_timeout;
  std::string pattern = "dedup";
  Millis textbook_ttl{60'000};
  std::string textbook_redis;  // --pattern textbook on brokers other than redis://
};

// A redis:// broker (its entries' fields are the handler's stdin; the textbook
// keys live beside the stream), by the broker scheme table's row.
bool IsRedisBroker(const std::string& uri) {
  StatusOr<std::string_view> scheme = CheckSourceUri(uri);
  return scheme.ok() && *scheme == "redis";
}

#ifdef DEDUP_WITH_SERVE
// --metrics-port: the Consumer's counters, claim and handler latencies and the
// build, in Prometheus conventions, on serve's HTTP stack.
const std::string kHandlerHelp = "Time a handler command ran, by outcome (done, retry, fail).";

void ObserveHandler(metrics::Registry& registry, std::chrono::steady_clock::duration took,
                    const HandlerResult& r) {
  const char* outcome = r.kind == HandlerResult::Kind::kDone    ? "done"
                        : r.kind == HandlerResult::Kind::kRetry ? "retry"
                                                                : "fail";
  registry.GetHistogram("dedup_worker_handler_duration_seconds", kHandlerHelp,
                        {{"outcome", outcome}})
      ->Observe(std::chrono::duration<double>(took).count());
}

void RegisterWorkerMetrics(metrics::Registry& registry, const Consumer& w) {
  registry.AddBuildInfo(DEDUP_VERSION);
  const std::pair<const char*, uint64_t ConsumerMetrics::*> rows[] = {
      {"messages", &ConsumerMetrics::messages},
      {"acquired", &ConsumerMetrics::acquired},
      {"duplicates", &ConsumerMetrics::duplicates},
      {"busy", &ConsumerMetrics::busy},
      {"takeovers", &ConsumerMetrics::takeovers},
      {"lost_leases", &ConsumerMetrics::lost_leases},
      {"retries", &ConsumerMetrics::retries},
      {"dead_lettered", &ConsumerMetrics::dead_lettered},
      {"store_errors", &ConsumerMetrics::store_errors},
      {"claim_errors", &ConsumerMetrics::claim_errors},
      {"acked", &ConsumerMetrics::acked},
      {"redelivered", &ConsumerMetrics::redelivered},
      {"held_back", &ConsumerMetrics::held_back},
      {"waited_for_copy", &ConsumerMetrics::waited_for_copy},
      {"broker_errors", &ConsumerMetrics::broker_errors},
      {"ack_errors", &ConsumerMetrics::ack_errors},
      {"retry_errors", &ConsumerMetrics::retry_errors},
      {"dead_letter_errors", &ConsumerMetrics::dead_letter_errors},
      {"hand_back_errors", &ConsumerMetrics::hand_back_errors},
      {"acked_with_complete", &ConsumerMetrics::acked_with_complete},
      {"claim_batches", &ConsumerMetrics::claim_batches},
      {"claimed_in_batches", &ConsumerMetrics::claimed_in_batches},
      {"ack_batches", &ConsumerMetrics::ack_batches},
      {"acked_in_batches", &ConsumerMetrics::acked_in_batches},
      {"complete_batches", &ConsumerMetrics::complete_batches},
      {"completed_in_batches", &ConsumerMetrics::completed_in_batches}};
  for (const auto& [name, field] : rows) {
    registry.AddCounterFunc(std::string("dedup_worker_") + name + "_total",
                            std::string("Consumer count: ") + name + " (docs/WORKER.md).", {},
                            [&w, field = field] { return double(w.metrics().*field); });
  }
  // Claim outcomes once more, as one family with an outcome label.
  const std::pair<const char*, uint64_t ConsumerMetrics::*> outcomes[] = {
      {"acquired", &ConsumerMetrics::acquired},
      {"duplicate", &ConsumerMetrics::duplicates},
      {"busy", &ConsumerMetrics::busy},
      {"error", &ConsumerMetrics::claim_errors}};
  for (const auto& [outcome, field] : outcomes) {
    registry.AddCounterFunc("dedup_worker_claims_total", "Claims by outcome.",
                            {{"outcome", outcome}},
                            [&w, field = field] { return double(w.metrics().*field); });
  }
  for (const char* outcome : {"done", "retry", "fail"}) {
    registry.GetHistogram("dedup_worker_handler_duration_seconds", kHandlerHelp,
                          {{"outcome", outcome}});
  }
}
#endif

#ifdef DEDUP_WITH_POSTGRES
// --sql-output: runs the handler, then its stdout as SQL in the completion's
// transaction, with dedup.key, dedup.fence and dedup.attempt set for that
// transaction (current_setting('dedup.fence')::bigint).
// The handler is stopped when the claim's lease is lost, as without --sql-output.
HandlerResult RunSqlHandler(const ExecHandler& exec, const Delivery& m, PostgresTransaction& tx,
                            const ClaimGuard& claim) {
  // dedup.key is a text setting: a key that is not UTF-8 cannot be handed to the
  // SQL, now or on any retry. Dead-lettered with the reason; the handler not run.
  if (!internal::IsValidUtf8(m.key())) {
    return HandlerResult::Fail("key '" + internal::Printable(m.key()) +
                               "' is not valid UTF-8: --sql-output hands the key to the SQL as "
                               "dedup.key, a text setting, which cannot carry it");
  }
  HandlerResult hr = exec.Run(m, tx.fence(), tx.attempt(), &claim, /*keep_output=*/true);
  if (hr.kind != HandlerResult::Kind::kDone) return hr;
  auto set = tx.Exec("SELECT set_config('dedup.key', $1, true), set_config('dedup.fence', $2, true), "
                     "set_config('dedup.attempt', $3, true)",
                     {m.key(), std::to_string(tx.fence()), std::to_string(tx.attempt())});
  if (!set.ok()) return HandlerResult::Retry(set.status().ToString());
  Status run = tx.ExecScript(hr.result);
  if (!run.ok()) return HandlerResult::Retry("handler SQL: " + run.ToString());
  return HandlerResult::Done();
}
#endif

int RunWorkerCommand(const WorkerFlags& f) {
  // The --broker URI's own checks, without connecting: a typo in it is refused
  // before the store is opened, which would otherwise make a new RocksDB store at
  // --store's path for nothing.
  StatusOr<std::string_view> scheme = CheckSourceUri(f.broker);
  if (!scheme.ok()) {
    std::fprintf(stderr, "dedup worker: --broker: %s\n", scheme.status().ToString().c_str());
    return kExitUsage;
  }
  const bool redis_broker = *scheme == "redis";
  if (f.pattern == "dedup") WarnIfShortLease("dedup worker", f.lease);
  ExecHandlerOptions eo;
  eo.command = f.exec;
  eo.shell = !f.no_shell;
  eo.stdin_format = redis_broker ? ExecHandlerOptions::Stdin::kAttributesJson
                                 : ExecHandlerOptions::Stdin::kPayload;
  eo.keep_output = f.keep_output;
  // Checked once, here, before the supervisor starts; the handler runs this argv.
  StatusOr<std::vector<std::string>> argv = ExecHandler::Argv(eo);
  if (!argv.ok()) {
    const Status& s = argv.status();
    std::fprintf(stderr, "dedup worker: --exec: %s\n",
                 s.code() == StatusCode::kInvalidArgument ? s.message().c_str()
                                                          : s.ToString().c_str());
    return kExitUsage;
  }
#ifdef DEDUP_WITH_SERVE
  // Declared before the handler and the Consumer, whose callbacks it serves.
  metrics::Registry registry;
  if (f.metrics_port > 0) {
    eo.observe = [&registry](std::chrono::steady_clock::duration took, const HandlerResult& r) {
      ObserveHandler(registry, took, r);
    };
  }
#endif
  // First, while this process is small: the watchdog is a fork of it.
  SupervisorOptions sup_options;
  sup_options.cgroup = f.handler_cgroup;
  auto supervisor = HandlerSupervisor::Start(sup_options);
  if (!supervisor.ok()) {
    if (supervisor.status().code() == StatusCode::kInvalidArgument) {
      std::fprintf(stderr, "dedup worker: --handler-cgroup: %s\n",
                   supervisor.status().message().c_str());
      return kExitUsage;
    }
    std::fprintf(stderr, "dedup worker: %s\n", supervisor.status().ToString().c_str());
    return kExitTempFail;
  }
  auto made_exec = ExecHandler::Make(supervisor->get(), std::move(eo), std::move(argv).value());
  if (!made_exec.ok()) {
    std::fprintf(stderr, "dedup worker: --exec: %s\n", made_exec.status().ToString().c_str());
    return kExitUsage;
  }
  const ExecHandler& exec = **made_exec;
  // The metrics port is bound before the store and the broker are opened: a port
  // in use is refused before anything is created (a RocksDB directory, a
  // consumer group). It answers once the Consumer exists.
#ifdef DEDUP_WITH_SERVE
  serve::MetricsEndpoint metrics;
  if (f.metrics_port > 0) {
    if (Status s = metrics.Bind(f.metrics_port); !s.ok()) {
      std::fprintf(stderr, "dedup worker: --metrics-port: %s\n", s.ToString().c_str());
      return ExitCodeFor(s);  // 75: in use by another process
    }
  }
#else
  if (f.metrics_port > 0) {
    std::fprintf(stderr, "dedup worker: --metrics-port needs a build with DEDUP_WITH_SERVE\n");
    return kExitUsage;
  }
#endif
  // The textbook guard keeps its keys in the stream's Redis, or in --textbook-redis.
  streams::ConnOptions textbook_conn;
  if (f.pattern == "textbook" && redis_broker) {
    StatusOr<WorkerOptions> wo = WorkerOptionsFromUri(f.broker);
    if (!wo.ok()) {
      std::fprintf(stderr, "dedup worker: --broker: %s\n", wo.status().ToString().c_str());
      return kExitUsage;
    }
    textbook_conn = StreamConnOptions(*wo);
  } else if (f.pattern == "textbook") {
    // RedisTextbookKeys keeps plain connections of its own (ConnOptions): it
    // honours timeout= and the db, and has no pool, auto-pipelining, spin or
    // cluster routing. Those are refused rather than silently ignored.
    auto u = redis::ParseRedisUri(f.textbook_redis, {}, redis::Connections::kSingle);
    if (f.textbook_redis.empty() || !u.ok() || u->connection.endpoints.size() != 1) {
      std::fprintf(stderr, "dedup worker: --pattern textbook on %s needs --textbook-redis "
                           "redis://HOST:PORT%s%s\n",
                   f.broker.substr(0, f.broker.find(':')).c_str(),
                   u.ok() || f.textbook_redis.empty() ? "" : ": ",
                   u.ok() || f.textbook_redis.empty() ? "" : u.status().ToString().c_str());
      return kExitUsage;
    }
    if (u->connection.cluster) {
      std::fprintf(stderr, "dedup worker: --textbook-redis: redis+cluster:// is not supported "
                           "by --pattern textbook; give one server as redis://HOST:PORT\n");
      return kExitUsage;
    }
    textbook_conn.host = u->connection.endpoints[0].host;
    textbook_conn.port = u->connection.endpoints[0].port;
    textbook_conn.user = u->connection.user;
    textbook_conn.password = u->connection.password;
    textbook_conn.has_password = u->connection.has_password;
    textbook_conn.db = u->connection.db;
    textbook_conn.timeout = u->connection.timeout;
  }
  std::unique_ptr<Store> store;
  BufferOptions bo;
  bo.lease = f.lease;
  bo.retention = f.retention;
  bo.max_attempts = f.max_attempts;
  bo.corrupt_record_tries = f.corrupt_record_tries;
  bo.complete_retry_time = f.complete_retry_time;
  bo.retry_delay = f.retry_delay;
  bo.fingerprint_payloads = f.fingerprint;
#ifdef DEDUP_WITH_POSTGRES
  std::unique_ptr<PostgresStore> pg;
  if (f.pattern == "dedup" && f.sql_output) {
    auto opened = OpenPostgresStore(f.store);
    if (!opened.ok()) {
      std::fprintf(stderr, "dedup worker: --store (--sql-output needs postgres://): %s\n",
                   opened.status().ToString().c_str());
      return ExitCodeFor(opened.status());
    }
    pg = std::move(opened).value();
    if (Status s = pg->CanRunTransactions(f.concurrency); !s.ok()) {
      std::fprintf(stderr, "dedup worker: --store (--sql-output): %s\n", s.ToString().c_str());
      return kExitUsage;
    }
  }
#endif
  if (f.pattern == "dedup" && !f.sql_output) {
    auto opened = OpenStore(f.store, WarnOnStderr("dedup worker"));
    if (!opened.ok()) {
      std::fprintf(stderr, "dedup worker: --store: %s\n", opened.status().ToString().c_str());
      return ExitCodeFor(opened.status());
    }
    store = std::move(opened).value();
    if (f.store.rfind("memory:", 0) == 0) {
      std::fprintf(stderr, "dedup worker: warning: --store memory: keeps nothing past this "
                           "process, and no other worker process sees it: after a restart, "
                           "or in a second worker, messages run again (use rocksdb:PATH, or "
                           "redis:// or postgres:// for several workers)\n");
    }
#ifdef DEDUP_WITH_SERVE
    if (f.metrics_port > 0) {
      store = std::make_unique<serve::OwningMeteredStore>(
          std::move(store),
          registry.GetHistogram("dedup_worker_claim_duration_seconds",
                                 "Time the store took to answer a claim or a batch of claims."));
    }
#endif
  }
  SourceOptions so;
  so.lease = f.lease;
  so.on_warning = [](const std::string& m) {
    std::fprintf(stderr, "dedup worker: warning: %s\n", m.c_str());
  };
  auto source = OpenSource(f.broker, so);
  if (!source.ok()) {
    std::fprintf(stderr, "dedup worker: --broker: %s\n", source.status().ToString().c_str());
    return source.status().retryable() ? kExitTempFail : kExitUsage;
  }
  const std::string name = (*source)->Describe();

  ConsumerOptions co;
  co.concurrency = f.concurrency;
  co.prefetch = f.prefetch;
  co.prefetch_time = f.prefetch_time;
  co.log_name = "dedup worker";
  co.drain_timeout = f.drain_timeout;
  // The store is this Consumer's alone: it may be told to stop waiting.
  co.stop_store_waits = true;
  co.stop_handlers = [&exec] { exec.supervisor().RequestStop(SIGTERM); };
  std::unique_ptr<Buffer> buffer;
  std::unique_ptr<TextbookKeys> textbook_keys;
  std::unique_ptr<TextbookGuard> textbook;
  StatusOr<std::unique_ptr<Consumer>> made = Status::Internal("unset");
  if (f.pattern == "textbook") {
    textbook_keys = std::make_unique<streams::RedisTextbookKeys>(textbook_conn);
    textbook = std::make_unique<TextbookGuard>(
        textbook_keys.get(), TextbookOptions{f.textbook_ttl, "task_id:", f.retry_delay});
    made = Consumer::MakeWith(source->get(), [&](const Delivery& d) {
      return textbook->Process(d.key(), [&] { return exec.Run(d, 0, 0); });
    }, co);
  } else {
    Store* target = store.get();
#ifdef DEDUP_WITH_POSTGRES
    if (pg != nullptr) target = pg.get();
#endif
    auto created = Buffer::Create(target, bo);
    if (!created.ok()) {
      std::fprintf(stderr, "dedup worker: --%s\n", created.status().message().c_str());
      return kExitUsage;
    }
    buffer = std::move(created).value();
    if (f.sql_output) {
#ifdef DEDUP_WITH_POSTGRES
      made = Consumer::MakeWith(source->get(), [&](const Delivery& d) {
        return ProcessOnceInTransaction(*buffer, *pg, d.key(), d.payload(),
                                        [&](PostgresTransaction& tx, const ClaimGuard& g) {
                                          return RunSqlHandler(exec, d, tx, g);
                                        });
      }, co, pg.get());  // told to stop waiting at the drain deadline, as Make's Buffer's store
#endif
    } else {
      made = Consumer::Make(source->get(), buffer.get(), [&](const Delivery& d, ClaimGuard& g) {
        return exec.Run(d, g.fence(), g.attempt(), &g);
      }, co);
    }
  }
  if (!made.ok()) {
    std::fprintf(stderr, "dedup worker: %s\n", made.status().ToString().c_str());
    return kExitUsage;
  }
  Consumer& c = **made;

#ifdef DEDUP_WITH_SERVE
  // Stopped before the Consumer whose counters its answers read is destroyed.
  struct StopMetrics {
    serve::MetricsEndpoint& endpoint;
    ~StopMetrics() { endpoint.Stop(); }
  } stop_metrics{metrics};
  if (f.metrics_port > 0) {
    RegisterWorkerMetrics(registry, c);
    metrics.Serve([&registry] { return registry.Render(); });
  }
#endif
  g_stopper.Attach(&c);
  OnStopSignals(&StopWorker);

  // A summary line every summary_interval while running.
  std::atomic<bool> done{false};
  std::thread summary([&] {
    auto next = std::chrono::steady_clock::now() + f.summary_interval;
    while (!done.load()) {
      std::this_thread::sleep_for(Millis(100));
      if (f.summary_interval.count() > 0 && std::chrono::steady_clock::now() >= next) {
        next += f.summary_interval;
        std::fprintf(stderr, "dedup worker: %s\n", c.metrics().Summary().c_str());
      }
    }
  });

  // The store too: a relative rocksdb: path is shown where it lands.
  std::string store_name = "none (textbook keys in Redis)";
  if (store != nullptr) store_name = store->Describe();
#ifdef DEDUP_WITH_POSTGRES
  if (pg != nullptr) store_name = pg->Describe();
#endif
  if (store_name.rfind("rocksdb:", 0) == 0 && store_name.compare(8, 1, "/") != 0) {
    std::error_code ec;
    const auto abs = std::filesystem::absolute(store_name.substr(8, store_name.find('?') - 8), ec);
    if (!ec) store_name += " (" + abs.string() + ")";
  }
  std::fprintf(stderr, "dedup worker: %s, store %s, pattern %s, concurrency %d\n", name.c_str(),
               store_name.c_str(), f.pattern.c_str(), f.concurrency);
  Status run = c.Run();
  done.store(true);
  summary.join();
  g_stopper.Detach();  // before `made` destroys the Consumer
  std::fprintf(stderr, "dedup worker: stopped: %s\n", c.metrics().Summary().c_str());
  if (!run.ok()) {
    std::fprintf(stderr, "dedup worker: %s\n", run.ToString().c_str());
    // The drain gave up store calls (their messages come back, unacked).
    return run.code() == StatusCode::kAborted ? kExitTempFail : kExitCheckFailed;
  }
  return kExitOk;
}

}  // namespace

void RegisterWorker(CLI::App& root, CommandContext& ctx) {
  auto f = std::make_shared<WorkerFlags>();
  CLI::App* app = root.add_subcommand(
      "worker",
      "Consume a broker (a Redis stream through a consumer group, a RabbitMQ queue, a NATS "
      "JetStream durable consumer) and run --exec once per message key (stream fields as "
      "JSON, or the message body, on stdin; exit 0 done; 75, 126, 127 or a signal retry "
      "later; else dead-letter).");
  app->add_option("--broker", f->broker,
                  "redis://HOST:PORT?stream=S[&group=G&consumer=C&key=id|sha256|FIELD"
                  "&dead=S:dead&prefix=P], amqp://USER:PW@HOST:PORT/VHOST?queue=Q[...] or "
                  "nats://HOST:PORT?stream=S&consumer=C[...] (docs/WORKER.md)")
      ->required();
  std::vector<CLI::Option*> dedup_only;  // refused with --pattern textbook
  dedup_only.push_back(app->add_option(
      "--store", f->store,
      "Store URI of the buffer (memory:, rocksdb:PATH, redis://HOST:PORT, "
      "redis+cluster://..., postgres://...); not used by --pattern textbook"));
  app->add_option("--exec", f->exec, "Command run per message (via /bin/sh -c)")->required();
  app->add_flag("--no-shell", f->no_shell,
                "Run --exec directly, split on spaces (saves a shell per message)");
  AddHandlerCgroupOption(*app, &f->handler_cgroup,
                  "A cgroup v2 directory the worker may write and is not in: each handler "
                  "runs in a child cgroup of it, killed as a whole when the handler ends, "
                  "is stopped or the worker dies (also what left its process group)");
  app->add_option("--concurrency", f->concurrency, "Handlers at once")
      ->check(CLI::Range(1, 1024))
      ->capture_default_str();
  app->add_option("--prefetch", f->prefetch,
                  "Messages fetched (and claimed) ahead of the running handlers "
                  "(-1 = --concurrency, more for short handlers: --prefetch-time)")
      ->check(CLI::Range(-1, 65536))
      ->capture_default_str();
  AddDurationOption(*app, "--prefetch-time", &f->prefetch_time,
                    "With --prefetch -1: fetch ahead as many messages as the handlers finish "
                    "in about this long (their average time), from --concurrency up to 16 x "
                    "--concurrency; 0 = --concurrency only (default 5ms)",
                    DurationBound::kNonNegative, ConsumerOptions::kMaxPrefetchTime);
  dedup_only.push_back(AddDurationOption(*app, "--lease", &f->lease,
                                         "Claim lease (heartbeat every lease/3)",
                                         DurationBound::kPositive));
  dedup_only.push_back(AddDurationOption(*app, "--retention", &f->retention,
                                         "How long a completed key is kept",
                                         DurationBound::kPositive));
  AddDurationOption(*app, "--retry-delay", &f->retry_delay,
                    "Delay before a retried message is delivered again", DurationBound::kPositive);
  dedup_only.push_back(app->add_option("--max-attempts", f->max_attempts,
                                       "Dead-letter after this many attempts (0 = unlimited)")
                           ->capture_default_str());
  dedup_only.push_back(
      app->add_option("--corrupt-record-tries", f->corrupt_record_tries,
                      "Dead-letter a message whose record the store cannot read after this "
                      "many such answers in a row")
          ->check(CLI::Range(1, 1000))
          ->capture_default_str());
  dedup_only.push_back(AddDurationOption(
      *app, "--complete-retry-time", &f->complete_retry_time,
      "How long an outcome (complete, release) the store refuses as unavailable is tried "
      "again, never past the claim's lease (0 = 3 tries)"));
  dedup_only.push_back(app->add_flag("--keep-output", f->keep_output,
                                     "Store the command's stdout (at most 1 MiB) as the result"));
#ifdef DEDUP_WITH_POSTGRES
  app->add_flag("--sql-output", f->sql_output,
                "The command prints SQL; it runs in the transaction that records the "
                "completion (postgres:// --store only): its effect happens exactly once");
#endif
  dedup_only.push_back(app->add_flag("--fingerprint", f->fingerprint,
                                     "Same key with a different payload is dead-lettered "
                                     "(MISMATCH)"));
  app->add_option("--metrics-port", f->metrics_port,
                  "Serve Prometheus metrics on 127.0.0.1:PORT/metrics (0 = off)")
      ->check(CLI::Range(0, 65535))
      ->capture_default_str();
  AddDurationOption(*app, "--drain-timeout", &f->drain_timeout,
                    "On SIGTERM/SIGINT, how long running handlers may finish; then they are "
                    "stopped (SIGTERM, SIGKILL 5 s later), their claims released and their "
                    "messages handed back (0 = at once)",
                    DurationBound::kNonNegative, ConsumerOptions::kMaxDrainTimeout);
  AddDurationOption(*app, "--summary-interval", &f->summary_interval,
                    "A summary log line this often (0 = only at exit)");
  const std::map<std::string, std::string> patterns = {{"dedup", "dedup"},
                                                       {"textbook", "textbook"}};
  app->add_option("--pattern", f->pattern,
                  "dedup: the Buffer; textbook: SET key NX EX ttl / DEL on failure / "
                  "exists = ack, for comparison only")
      ->transform(CLI::CheckedTransformer(patterns, CLI::ignore_case))
      ->capture_default_str();
  CLI::Option* textbook_ttl = AddDurationOption(
      *app, "--textbook-ttl", &f->textbook_ttl,
      "--pattern textbook: the key's one TTL, in whole seconds (SET ... EX takes seconds)");
  CLI::Option* textbook_redis = app->add_option(
      "--textbook-redis", f->textbook_redis,
      "--pattern textbook on amqp:// or nats://: the Redis that keeps its keys "
      "(redis://HOST:PORT[/DB][?timeout=D&password_file=F])");
  app->callback([f, &ctx, textbook_ttl, textbook_redis, dedup_only] {
    // The textbook guard has no store, lease, retention, attempts or result: a
    // flag of the Buffer's given with it would be ignored, and a comparison run
    // would not be the one asked for.
    for (const CLI::Option* opt : dedup_only) {
      if (opt->count() > 0 && f->pattern == "textbook") {
        std::fprintf(stderr,
                     "dedup worker: %s is not used by --pattern textbook (its guard is one "
                     "SET NX EX with --textbook-ttl; leave %s out)\n",
                     opt->get_name().c_str(), opt->get_name().c_str());
        ctx.exit_code = kExitUsage;
        return;
      }
    }
    // The textbook flags do nothing under --pattern dedup: refused, so that a
    // forgotten --pattern textbook is not a run of the other pattern.
    for (const CLI::Option* opt : {textbook_ttl, textbook_redis}) {
      if (opt->count() > 0 && f->pattern != "textbook") {
        std::fprintf(stderr, "dedup worker: %s needs --pattern textbook\n",
                     opt->get_name().c_str());
        ctx.exit_code = kExitUsage;
        return;
      }
    }
    if (textbook_redis->count() > 0 && IsRedisBroker(f->broker)) {
      std::fprintf(stderr, "dedup worker: --textbook-redis is for amqp:// and nats:// brokers; "
                           "on redis:// the textbook keys live in the stream's Redis\n");
      ctx.exit_code = kExitUsage;
      return;
    }
    // SET ... EX takes whole seconds: 0 and 500ms became 1 s, 1.5s became 2 s
    // (RedisTextbookKeys rounds up), a TTL other than the one asked for.
    if (f->textbook_ttl.count() == 0 || f->textbook_ttl.count() % 1000 != 0) {
      std::fprintf(stderr,
                   "dedup worker: --textbook-ttl must be a whole number of seconds, at least "
                   "1s (SET ... EX takes seconds), got %lldms\n",
                   static_cast<long long>(f->textbook_ttl.count()));
      ctx.exit_code = kExitUsage;
      return;
    }
    if (f->sql_output && f->pattern != "dedup") {
      std::fprintf(stderr, "dedup worker: --sql-output needs --pattern dedup\n");
      ctx.exit_code = kExitUsage;
      return;
    }
    if (f->pattern == "dedup" && f->store.empty()) {
      std::fprintf(stderr, "dedup worker: --store is required\n");
      ctx.exit_code = kExitUsage;
      return;
    }
    ctx.exit_code = RunWorkerCommand(*f);
  });
}

}  // namespace dedup::cli

#endif  // DEDUP_WITH_REDIS_STREAMS
