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
  Millis lease{30'000};
  Millis retention{24LL * 3600 * 1000};
  Millis retry_delay{1'000};
  uint32_t max_attempts = 0;
  bool keep_output = false;
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
  if (r->exit_code == 0) return HandlerResult::Done(f.keep_output ? r->output : std::string());
  if (r->exit_code == kExitTempFail) return HandlerResult::Retry("handler exit 75 (retry later)");
  return HandlerResult::Fail("handler exit " + std::to_string(r->exit_code));
}

int RunWorkerCommand(const WorkerFlags& f) {
  auto wo = WorkerOptionsFromUri(f.broker);
  if (!wo.ok()) {
    std::fprintf(stderr, "dedup worker: --broker: %s\n", wo.status().ToString().c_str());
    return kExitUsage;
  }
  if (wo->group.empty()) wo->group = "dedup";
  wo->concurrency = f.concurrency;
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
    to.conn.password = wo->password;
    to.conn.has_password = wo->has_password;
    to.ttl = f.textbook_ttl;
    to.retry_delay = f.retry_delay;
    streams::TextbookGuard guard(to);
    run = w.RunWith([&](const StreamMessage& m) {
      return guard.Process(m, [&] { return RunHandler(f, m, 0, 0); });
    });
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
    Buffer buffer(store.get(), bo);
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
  AddDurationOption(*app, "--lease", &f->lease, "Claim lease (heartbeat every lease/3)");
  AddDurationOption(*app, "--retention", &f->retention, "How long a completed key is kept");
  AddDurationOption(*app, "--retry-delay", &f->retry_delay,
                    "Delay before a retried message is delivered again");
  app->add_option("--max-attempts", f->max_attempts, "Dead-letter after this many attempts "
                                                     "(0 = unlimited)")
      ->capture_default_str();
  app->add_flag("--keep-output", f->keep_output,
                "Store the command's stdout (at most 1 MiB) as the result");
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
