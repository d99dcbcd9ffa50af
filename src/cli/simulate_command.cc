// Copyright dedup authors. Licensed under the Apache License 2.0.
//
// `dedup simulate`: flags to SimulateOptions, the report to stdout.

#include <fmt/format.h>
#include <signal.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <atomic>
#include <cstdio>
#include <memory>

#include "cli/command.h"
#include "cli/flags.h"
#include "sim/simulation.h"

namespace dedup::cli {

using sim::Pattern;
using sim::RunSimulation;
using sim::SimulateOptions;
using sim::SimulateProgress;
using sim::SimulateReport;

namespace {

// Ctrl-C stops the run cleanly: workers finish what they hold, the report says
// what was left unfinished, and the temporary store directory is removed.
std::atomic<bool> g_interrupted{false};
extern "C" void OnInterrupt(int) { g_interrupted.store(true); }

struct SimulateFlags {
  SimulateOptions options;
  bool json = false;
  bool no_progress = false;
};

int RunSimulateCommand(const SimulateFlags& flags) {
  SimulateOptions o = flags.options;
  o.cancel = &g_interrupted;
  struct sigaction sa = {};
  sa.sa_handler = OnInterrupt;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
  const bool tty = isatty(STDOUT_FILENO) == 1;
  if (tty && !flags.json && !flags.no_progress) {
    o.on_progress = [](const SimulateProgress& p) {
      std::fprintf(stdout, "\r  %llu/%llu messages finished, %llu deliveries, %.1f s",
                   static_cast<unsigned long long>(p.finished),
                   static_cast<unsigned long long>(p.published),
                   static_cast<unsigned long long>(p.deliveries),
                   static_cast<double>(p.elapsed.count()) / 1000.0);
      std::fflush(stdout);
    };
  }
  StatusOr<SimulateReport> report = RunSimulation(o);
  if (o.on_progress) std::fputs("\r\033[K", stdout);
  if (!report.ok()) {
    std::fprintf(stderr, "dedup simulate: %s\n", report.status().ToString().c_str());
    return kExitUsage;
  }
  if (flags.json) {
    std::fputs((sim::ReportToJson(*report) + "\n").c_str(), stdout);
  } else {
    std::fputs(sim::FormatReport(*report).c_str(), stdout);
  }
  return report->passed() ? kExitOk : kExitCheckFailed;
}

}  // namespace

void RegisterSimulate(CLI::App& root, CommandContext& ctx) {
  // Owned by the callback, which lives as long as the app.
  auto flags = std::make_shared<SimulateFlags>();
  SimulateOptions& o = flags->options;
  CLI::App* app = root.add_subcommand(
      "simulate",
      "Run an in-process at-least-once broker and N workers with injected crashes, "
      "and report how often each message's effect was applied. Exit 1 if a "
      "must-be-zero count is not zero.");

#ifdef DEDUP_WITH_ROCKSDB
  const char* store_default = "rocksdb:<fresh temporary directory, removed at exit>";
#else
  const char* store_default = "memory:";
#endif
  app->add_option("--store", o.store_uri, "Store URI for the dedup pattern")
      ->type_name("URI")
      ->default_str(store_default);
  app->add_option_function<std::string>(
         "--pattern",
         [&o](const std::string& name) {
           o.pattern = name == "textbook" ? Pattern::kTextbook : Pattern::kDedup;
         },
         "dedup: dedup::Buffer on --store; textbook: the seed's guard (SET key NX EX "
         "ttl, DEL on failure, key exists = done) under the same fault schedule")
      ->check(CLI::IsMember({"dedup", "textbook"}))
      ->type_name("dedup|textbook")
      ->default_str("dedup");
  app->add_option("--messages", o.messages, "Distinct messages (keys) to publish")
      ->check(CLI::Range(uint64_t{1}, uint64_t{100'000'000}))
      ->capture_default_str();
  app->add_option("--workers", o.workers, "Workers (one Consumer each, concurrency 1)")
      ->check(CLI::Range(1, 1024))
      ->capture_default_str();
  app->add_option("--seed", o.seed, "Seeds duplicate publishes and the fault schedule")
      ->capture_default_str();
  app->add_flag("--json", flags->json, "Print the report as JSON");
  app->add_flag("--no-progress", flags->no_progress, "No progress line, even on a terminal");

  AddDurationOption(*app, "--lease", &o.lease, "Claim lease (heartbeat every lease/3)",
                    DurationBound::kPositive)
      ->group("Timing");
  AddDurationOption(*app, "--retention", &o.retention, "How long a completed record is kept",
                    DurationBound::kPositive)
      ->group("Timing");
  CLI::Option* textbook_ttl =
      AddDurationOption(*app, "--textbook-ttl", &o.textbook_ttl,
                        "Textbook pattern: the key's one TTL (lease and memory of done)",
                        DurationBound::kPositive)
          ->group("Timing");
  AddDurationOption(*app, "--visibility-timeout", &o.visibility_timeout,
                    "Broker redelivers a message not acked within this",
                    DurationBound::kPositive)
      ->group("Timing");
  AddDurationOption(*app, "--retry-delay", &o.retry_delay,
                    "Redelivery delay after a transient failure or a store error",
                    DurationBound::kPositive)
      ->group("Timing");
  AddDurationOption(*app, "--duplicate-delay", &o.duplicate_delay,
                    "A duplicate publish becomes visible up to this much later")
      ->group("Timing");
  AddDurationOption(*app, "--slow-handler-time", &o.slow_handler_time,
                    "How long a slow handler runs (longer than the lease)")
      ->group("Timing");
  AddDurationOption(*app, "--timeout", &o.timeout,
                    "Stop the run after this; what is left counts as unfinished",
                    DurationBound::kPositive)
      ->group("Timing");

  AddFractionOption(*app, "--duplicates", &o.duplicate_fraction,
                    "Fraction of messages published twice")
      ->group("Faults");
  AddFractionOption(*app, "--crash-before-work", &o.crash_before_work,
                    "Per delivery: crash after the claim, before the work")
      ->group("Faults");
  AddFractionOption(*app, "--crash-after-effect", &o.crash_after_effect,
                    "Per delivery: crash after the side effect, before complete")
      ->group("Faults");
  AddFractionOption(*app, "--crash-after-complete", &o.crash_after_complete,
                    "Per delivery: crash after complete, before the ack")
      ->group("Faults");
  AddFractionOption(*app, "--transient", &o.transient_failure,
                    "Per delivery: the handler fails transiently (retry)")
      ->group("Faults");
  AddFractionOption(*app, "--slow", &o.slow_handler,
                    "Per delivery: the handler runs --slow-handler-time")
      ->group("Faults");
  AddFractionOption(*app, "--poison", &o.poison,
                    "Per message: the handler always fails permanently (dead-letter)")
      ->group("Faults");

  app->callback([flags, textbook_ttl, &ctx] {
    // Ignored by the dedup pattern: refused, so that a forgotten --pattern textbook
    // is not a run of the other pattern (as dedup worker refuses it).
    if (textbook_ttl->count() > 0 && flags->options.pattern != Pattern::kTextbook) {
      std::fprintf(stderr, "dedup simulate: --textbook-ttl needs --pattern textbook\n");
      ctx.exit_code = kExitUsage;
      return;
    }
    ctx.exit_code = RunSimulateCommand(*flags);
  });
}

}  // namespace dedup::cli
