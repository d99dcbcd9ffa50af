// Copyright dedup authors. Licensed under the Apache License 2.0.
//
// `dedup bench`: what the guard costs per message on each store, next to what a
// user would write instead, measured in one run on this machine.
//
//   dedup bench                      # a few minutes on 2 cores
//   dedup bench --quick --json       # seconds: the CI smoke test
//   dedup bench --full --plots docs --markdown docs/PERFORMANCE.figures.md
//
// The measuring lives in src/bench/ (plan, contenders, results, renderers, Redis
// fixture); this command parses flags, shows progress and prints.

#include <signal.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "bench/bench.h"
#include "bench/render.h"
#include "cli/command.h"
#include "cli/flags.h"

namespace dedup::cli {

namespace {

extern "C" void OnBenchInterrupt(int) { bench::RequestStop(); }

struct BenchFlags {
  bench::BenchOptions options;
  bool json = false, no_progress = false;
  std::string plots_dir;
  std::string markdown;
  Millis round{0};
};

// Progress on stderr, only when it is a terminal.
struct Progress {
  bool on = false;
  bench::Clk::time_point start = bench::Clk::now();
  void Say(const std::string& what) {
    if (!on) return;
    std::fprintf(stderr, "\r\033[K  [%5.1f s] %s", bench::Seconds(bench::Clk::now() - start), what.c_str());
    std::fflush(stderr);
  }
  void Done() {
    if (on) std::fputs("\r\033[K", stderr);
  }
};

int RunBench(BenchFlags& f) {
  struct sigaction sa = {};
  sa.sa_handler = OnBenchInterrupt;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
  if (!f.options.redis_uri.empty() && f.options.no_redis) {
    std::fprintf(stderr, "dedup bench: --redis and --no-redis together\n");
    return kExitUsage;
  }
  for (const std::string& name : f.options.only) {
    bool known = false;
    for (const bench::PhaseEntry& p : bench::Phases()) known = known || name == p.name;
    if (!known) {
      std::fprintf(stderr, "dedup bench: --phase: no phase named '%s'\n", name.c_str());
      return kExitUsage;
    }
  }
  f.options.round_s = static_cast<double>(f.round.count()) / 1000.0;
  auto progress = std::make_shared<Progress>();
  progress->on = isatty(STDERR_FILENO) == 1 && !f.no_progress;
  bench::Results r = bench::Run(f.options, [progress](const std::string& s) { progress->Say(s); });
  progress->Done();
  if (!r.usage_error.empty()) {
    std::fprintf(stderr, "dedup bench: %s\n", r.usage_error.c_str());
    return kExitUsage;
  }
  if (!f.plots_dir.empty()) {
    for (auto& p : bench::RenderPlots(r, f.plots_dir)) r.skipped.push_back(p);
  }
  if (!f.markdown.empty()) {
    std::ofstream md(f.markdown);
    md << bench::RenderMarkdown(r);
    if (!md) {
      std::fprintf(stderr, "dedup bench: cannot write %s\n", f.markdown.c_str());
      return kExitUsage;
    }
  }
  if (f.json) {
    std::fputs((bench::RenderJson(r).dump(2) + "\n").c_str(), stdout);
  } else {
    std::fputs(bench::RenderTable(r).c_str(), stdout);
  }
  if (r.interrupted) {
    std::fprintf(stderr, "dedup bench: interrupted; figures above are partial\n");
    return kExitCheckFailed;
  }
  // Errors in the measured operations make the figures suspect: say so in the code.
  if (std::string which; r.FailedCalls(&which)) {
    std::fprintf(stderr, "dedup bench: %s\n", which.c_str());
    return kExitCheckFailed;
  }
  return kExitOk;
}

}  // namespace

void RegisterBench(CLI::App& root, CommandContext& ctx) {
  auto flags = std::make_shared<BenchFlags>();
  bench::BenchOptions& o = flags->options;
  CLI::App* app = root.add_subcommand(
      "bench",
      "Measure what the guard costs per message on each store (memory, RocksDB, Redis), "
      "next to what a user would write instead, interleaved in one run; print a table, "
      "JSON, Markdown and plots. Default: a few minutes; --quick: seconds; --full: the whole "
      "matrix and 10^7 retained records.");
  auto* quick = app->add_flag("--quick", o.quick, "Seconds: a smoke test (CI)");
  app->add_flag("--full", o.full, "The whole matrix, 1M Redis records and 10^7 retained records")
      ->excludes(quick);
  app->add_option("--redis", o.redis_uri,
                  "Benchmark this Redis (redis://[user:password@]host:port) instead of starting one "
                  "on 127.0.0.1:6420-6429. Keys written expire within 10 minutes; nothing is flushed.")
      ->type_name("URI");
  app->add_flag("--no-redis", o.no_redis, "Leave the Redis store, redis-benchmark and the worker out");
  app->add_flag("--no-rocksdb", o.no_rocksdb, "Leave the RocksDB store out");
  app->add_flag("--no-worker", o.no_worker, "Leave the Redis Streams worker comparison out");
  app->add_option("--workers", o.workers,
                  "Concurrent workers to measure at, comma-separated (default 1,2,8,32; --quick 1,2)")
      ->check(CLI::Range(1, 256))
      ->delimiter(',');
  app->add_option("--rounds", o.rounds,
                  "Interleaved rounds per contender (default 5; --quick 2, --full 9)")
      ->check(CLI::Range(1, 100));
  AddDurationOption(*app, "--round", &flags->round,
                    "Length of one contender's round (default 200ms; --quick 50ms, --full 300ms)",
                    DurationBound::kPositive)
      ->default_str("");
  app->add_flag("--json", flags->json, "Print everything as JSON instead of the table");
  app->add_option("--plots", flags->plots_dir, "Write PNG plots (gnuplot) into this directory")
      ->type_name("DIR");
  app->add_option("--markdown", flags->markdown, "Also write the figures as Markdown to this file")
      ->type_name("FILE");
  app->add_flag("--no-progress", flags->no_progress, "No progress line, even on a terminal");
  std::string phase_names;
  for (const bench::PhaseEntry& p : bench::Phases()) {
    phase_names += phase_names.empty() ? "" : ", ";
    phase_names += p.name;
  }
  app->add_option("--phase", o.only,
                  "Run only these phases (" + phase_names +
                      "); postgres runs on the server in DEDUP_BENCH_POSTGRES_URI, skipped "
                      "without it (scripts/bench.sh starts one)")
      ->delimiter(',');
  // Set by bench::RunPhaseInChild in the process it starts; not for users.
  app->add_flag("--isolated-child", o.isolated_child)->group("");
  app->callback([flags, app, &ctx] {
    std::string line = "dedup bench";
    for (const auto* opt : app->get_options()) {
      if (opt->count() == 0 || opt->get_name() == "--help") continue;
      line += " " + opt->get_name();
      if (opt->get_items_expected_max() == 0) continue;  // a flag
      // Never print a password that may be in the Redis URI.
      if (opt->get_name() == "--redis") {
        line += " URI";
        continue;
      }
      for (const auto& r : opt->results()) line += " " + r;
    }
    flags->options.command_line = line;
    ctx.exit_code = RunBench(*flags);
  });
}

}  // namespace dedup::cli
