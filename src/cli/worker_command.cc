// Copyright dedup authors. Licensed under the Apache License 2.0.
//
// `dedup worker`: consumes a Redis stream and runs a command once per message key.
//
//   dedup worker --broker 'redis://127.0.0.1:6390?stream=jobs&group=g'
//                --store rocksdb:/var/lib/dedup --exec './handle.sh'
//
// The command runs under /bin/sh -c (or directly with --no-shell) with the
// message's fields as a JSON object on stdin and DEDUP_KEY, DEDUP_FENCE,
// DEDUP_ATTEMPT, DEDUP_ENTRY_ID and DEDUP_WORKER_PID in its environment.
//   exit 0            done: the outcome is recorded, then the entry is acked
//   exit 75           retry later (EX_TEMPFAIL): claim released, entry left pending
//   killed by signal  retry later, as 75
//   anything else     permanent failure: completed as failed, dead-lettered
// --keep-output stores the command's stdout (at most 1 MiB) as the result.
// --sql-output (postgres:// stores): the command's stdout is SQL, run in the
// transaction that records the completion, so its effect happens exactly once
// (docs/POSTGRES.md).

#ifdef DEDUP_WITH_REDIS_STREAMS

#include <nlohmann/json.hpp>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <cstdio>
#include <ctime>
#include <map>
#include <memory>
#include <sstream>

#include "brokers/redis_streams/textbook_guard.h"
#include "cli/command.h"
#include "cli/common.h"
#include "cli/flags.h"
#include "dedup/buffer.h"
#ifdef DEDUP_WITH_POSTGRES
#include "dedup/postgres_store.h"
#endif
#include "dedup/store.h"
#include "dedup/worker.h"

namespace dedup::cli {
namespace {

std::atomic<Worker*> g_worker{nullptr};

void StopWorker(int) {
  if (Worker* w = g_worker.load()) w->Stop();
}

struct WorkerFlags {
  std::string broker;
  std::string store;
  std::string exec;
  bool no_shell = false;
  int concurrency = 4;
  Millis lease{kDefaultLease};
  Millis retention{kDefaultRetention};
  Millis retry_delay{1'000};
  uint32_t max_attempts = 0;
  bool keep_output = false;
  bool sql_output = false;
  bool fingerprint = false;
  int metrics_port = 0;
  Millis summary_interval{10'000};
  std::string pattern = "dedup";
  Millis textbook_ttl{60'000};
};

std::vector<std::string> SplitWords(const std::string& s) {
  std::istringstream in(s);
  std::vector<std::string> out;
  for (std::string w; in >> w;) out.push_back(w);
  return out;
}

// Runs the handler command for one message.
HandlerResult RunHandler(const WorkerFlags& f, const StreamMessage& m, uint64_t fence,
                         uint32_t attempt) {
  // An environment variable ends at its first NUL: DEDUP_KEY would be cut, and the
  // handler would act on another key's name. Refused (dead-lettered), never run.
  if (m.key.find('\0') != std::string::npos) {
    return HandlerResult::Fail("key contains a NUL byte, which DEDUP_KEY cannot carry; "
                               "handler not run");
  }
  nlohmann::json payload = nlohmann::json::object();
  for (const auto& [k, v] : m.fields) payload[k] = v;
  ChildOptions c;
  c.argv = f.no_shell ? SplitWords(f.exec) : std::vector<std::string>{"/bin/sh", "-c", f.exec};
  c.stdin_data = payload.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  c.env = {"DEDUP_KEY=" + m.key, "DEDUP_FENCE=" + std::to_string(fence),
           "DEDUP_ATTEMPT=" + std::to_string(attempt), "DEDUP_ENTRY_ID=" + m.id,
           "DEDUP_WORKER_PID=" + std::to_string(getpid())};
  c.capture_stdout = f.keep_output;
  c.max_output = kMaxResultBytes;
  auto r = RunChild(c);
  if (!r.ok()) return HandlerResult::Retry("cannot start handler: " + r.status().ToString());
  if (r->signal != 0) {
    return HandlerResult::Retry("handler killed by signal " + std::to_string(r->signal));
  }
  if (r->exit_code == 0 && f.keep_output && r->truncated) {
    // Never keep (or, with --sql-output, run) a cut-off output.
    return HandlerResult::Fail("handler output exceeds " + std::to_string(kMaxResultBytes) + " bytes");
  }
  if (r->exit_code == 0) return HandlerResult::Done(f.keep_output ? r->output : std::string());
  if (r->exit_code == kExitTempFail) return HandlerResult::Retry("handler exit 75 (retry later)");
  return HandlerResult::Fail("handler exit " + std::to_string(r->exit_code));
}

#ifdef DEDUP_WITH_POSTGRES
// --sql-output: runs the handler, then its stdout as SQL in the completion's
// transaction, with dedup.key, dedup.fence and dedup.attempt set for that
// transaction (current_setting('dedup.fence')::bigint).
HandlerResult RunSqlHandler(const WorkerFlags& f, const StreamMessage& m, PostgresTransaction& tx) {
  WorkerFlags g = f;
  g.keep_output = true;
  HandlerResult hr = RunHandler(g, m, tx.fence(), tx.attempt());
  if (hr.kind != HandlerResult::Kind::kDone) return hr;
  auto set = tx.Exec("SELECT set_config('dedup.key', $1, true), set_config('dedup.fence', $2, true), "
                     "set_config('dedup.attempt', $3, true)",
                     {m.key, std::to_string(tx.fence()), std::to_string(tx.attempt())});
  if (!set.ok()) return HandlerResult::Retry(set.status().ToString());
  Status run = tx.ExecScript(hr.result);
  if (!run.ok()) return HandlerResult::Retry("handler SQL: " + run.ToString());
  return HandlerResult::Done();
}
#endif

int RunWorkerCommand(const WorkerFlags& f) {
  auto wo = WorkerOptionsFromUri(f.broker);
  if (!wo.ok()) {
    std::fprintf(stderr, "dedup worker: --broker: %s\n", wo.status().ToString().c_str());
    return kExitUsage;
  }
  if (wo->group.empty()) wo->group = "dedup";
  wo->concurrency = f.concurrency;
  if (f.sql_output && wo->reclaim_min_idle.count() <= 0) wo->reclaim_min_idle = f.lease + Millis(5'000);
  auto worker = Worker::Open(*wo);
  if (!worker.ok()) {
    std::fprintf(stderr, "dedup worker: %s\n", worker.status().ToString().c_str());
    return worker.status().retryable() ? kExitTempFail : kExitUsage;
  }
  Worker& w = **worker;

  MetricsServer metrics;
  if (f.metrics_port > 0) {
    Status s = metrics.Start(f.metrics_port, [&w] { return w.metrics().ToPrometheus(); });
    if (!s.ok()) {
      std::fprintf(stderr, "dedup worker: %s\n", s.ToString().c_str());
      return kExitUsage;
    }
  }
  g_worker.store(&w);
  OnStopSignals(&StopWorker);

  // A summary line every summary_interval while running.
  std::atomic<bool> done{false};
  std::thread summary([&] {
    auto next = std::chrono::steady_clock::now() + f.summary_interval;
    while (!done.load()) {
      std::this_thread::sleep_for(Millis(100));
      if (f.summary_interval.count() > 0 && std::chrono::steady_clock::now() >= next) {
        next += f.summary_interval;
        std::fprintf(stderr, "dedup worker %s: %s\n", w.options().consumer.c_str(),
                     w.metrics().Summary().c_str());
      }
    }
  });

  std::fprintf(stderr, "dedup worker %s: stream %s group %s, pattern %s, concurrency %d\n",
               w.options().consumer.c_str(), w.options().stream.c_str(),
               w.options().group.c_str(), f.pattern.c_str(), f.concurrency);
  Status run;
  std::unique_ptr<Store> store;
  if (f.pattern == "textbook") {
    streams::TextbookOptions to;
    to.conn.host = wo->host;
    to.conn.port = wo->port;
    to.conn.user = wo->user;
    to.conn.password = wo->password;
    to.conn.has_password = wo->has_password;
    to.conn.db = wo->db;
    to.conn.timeout = wo->timeout;
    to.ttl = f.textbook_ttl;
    to.retry_delay = f.retry_delay;
    streams::TextbookGuard guard(to);
    run = w.RunWith([&](const StreamMessage& m) {
      return guard.Process(m, [&] { return RunHandler(f, m, 0, 0); });
    });
  } else if (f.sql_output) {
#ifdef DEDUP_WITH_POSTGRES
    auto opened = OpenPostgresStore(f.store);
    if (!opened.ok()) {
      done.store(true);
      summary.join();
      g_worker.store(nullptr);
      std::fprintf(stderr, "dedup worker: --store (--sql-output needs postgres://): %s\n",
                   opened.status().ToString().c_str());
      return opened.status().retryable() ? kExitTempFail : kExitUsage;
    }
    std::unique_ptr<PostgresStore> pg = std::move(opened).value();
    BufferOptions bo;
    bo.lease = f.lease;
    bo.retention = f.retention;
    bo.max_attempts = f.max_attempts;
    bo.retry_delay = f.retry_delay;
    bo.fingerprint_payloads = f.fingerprint;
    Buffer buffer(pg.get(), bo);
    run = w.RunWith([&](const StreamMessage& m) {
      return ProcessOnceInTransaction(buffer, *pg, m.key, m.CanonicalPayload(),
                                      [&](PostgresTransaction& tx) { return RunSqlHandler(f, m, tx); });
    });
#endif
  } else {
    auto opened = OpenStore(f.store);
    if (!opened.ok()) {
      done.store(true);
      summary.join();
      g_worker.store(nullptr);
      std::fprintf(stderr, "dedup worker: --store: %s\n", opened.status().ToString().c_str());
      return opened.status().retryable() ? kExitTempFail : kExitUsage;
    }
    store = std::move(opened).value();
    BufferOptions bo;
    bo.lease = f.lease;
    bo.retention = f.retention;
    bo.max_attempts = f.max_attempts;
    bo.retry_delay = f.retry_delay;
    bo.fingerprint_payloads = f.fingerprint;
    auto made = Buffer::Create(store.get(), bo);
    if (!made.ok()) {
      done.store(true);
      summary.join();
      g_worker.store(nullptr);
      std::fprintf(stderr, "dedup worker: --%s\n", made.status().message().c_str());
      return kExitUsage;
    }
    Buffer& buffer = **made;
    run = w.Run(&buffer, [&](const StreamMessage& m, ClaimGuard& g) {
      return RunHandler(f, m, g.fence(), g.attempt());
    });
  }
  done.store(true);
  summary.join();
  g_worker.store(nullptr);
  std::fprintf(stderr, "dedup worker %s: stopped: %s\n", w.options().consumer.c_str(),
               w.metrics().Summary().c_str());
  if (!run.ok()) {
    std::fprintf(stderr, "dedup worker: %s\n", run.ToString().c_str());
    return kExitCheckFailed;
  }
  return kExitOk;
}

}  // namespace

void RegisterWorker(CLI::App& root, CommandContext& ctx) {
  auto f = std::make_shared<WorkerFlags>();
  CLI::App* app = root.add_subcommand(
      "worker",
      "Consume a Redis stream through a consumer group and run --exec once per message "
      "key (payload as JSON on stdin; exit 0 done, 75 retry later, else dead-letter).");
  app->add_option("--broker", f->broker,
                  "redis://HOST:PORT?stream=S[&group=G&consumer=C&key=id|sha256|FIELD"
                  "&dead=S:dead&prefix=P]")
      ->required();
  app->add_option("--store", f->store, "Store URI of the buffer (memory:, rocksdb:PATH, "
                                       "redis://...); not used by --pattern textbook");
  app->add_option("--exec", f->exec, "Command run per message (via /bin/sh -c)")->required();
  app->add_flag("--no-shell", f->no_shell,
                "Run --exec directly, split on spaces (saves a shell per message)");
  app->add_option("--concurrency", f->concurrency, "Handlers at once")
      ->check(CLI::Range(1, 1024))
      ->capture_default_str();
  AddDurationOption(*app, "--lease", &f->lease, "Claim lease (heartbeat every lease/3)",
                    DurationBound::kPositive);
  AddDurationOption(*app, "--retention", &f->retention, "How long a completed key is kept",
                    DurationBound::kPositive);
  AddDurationOption(*app, "--retry-delay", &f->retry_delay,
                    "Delay before a retried message is delivered again", DurationBound::kPositive);
  app->add_option("--max-attempts", f->max_attempts, "Dead-letter after this many attempts "
                                                     "(0 = unlimited)")
      ->capture_default_str();
  app->add_flag("--keep-output", f->keep_output,
                "Store the command's stdout (at most 1 MiB) as the result");
#ifdef DEDUP_WITH_POSTGRES
  app->add_flag("--sql-output", f->sql_output,
                "The command prints SQL; it runs in the transaction that records the "
                "completion (postgres:// --store only): its effect happens exactly once");
#endif
  app->add_flag("--fingerprint", f->fingerprint,
                "Same key with a different payload is dead-lettered (MISMATCH)");
  app->add_option("--metrics-port", f->metrics_port,
                  "Serve Prometheus metrics on 127.0.0.1:PORT/metrics (0 = off)")
      ->check(CLI::Range(0, 65535));
  AddDurationOption(*app, "--summary-interval", &f->summary_interval,
                    "A summary log line this often (0 = only at exit)");
  const std::map<std::string, std::string> patterns = {{"dedup", "dedup"},
                                                       {"textbook", "textbook"}};
  app->add_option("--pattern", f->pattern,
                  "dedup: the Buffer; textbook: SET key NX EX ttl / DEL on failure / "
                  "exists = ack, for comparison only")
      ->transform(CLI::CheckedTransformer(patterns, CLI::ignore_case))
      ->capture_default_str();
  AddDurationOption(*app, "--textbook-ttl", &f->textbook_ttl,
                    "--pattern textbook: the key's one TTL");
  app->callback([f, &ctx] {
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
